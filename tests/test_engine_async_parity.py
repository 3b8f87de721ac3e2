"""AsyncEngine runs on the Rust step loop (the one ``yoco-serve`` runs); what it returns equals what the
synchronous ``Engine`` returns for the same requests: tokens, text, finish and stop reasons, sample and
prompt logprobs, ``n`` seeded completions, every output kind, structured outputs, priorities."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine_util import greedy
from yoco_rs import AsyncEngine, Engine, RequestOutputKind, SamplingParams, StructuredOutputsParams

SETTINGS = dict(max_model_len=256, num_gpu_blocks_override=128, max_num_seqs=4, max_num_batched_tokens=64)
PROMPTS = [[2, 30, 31, 32], [2] + [300] * 37, [2, 40, 41]]


def arun(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def _async_outputs(requests, **engine_kw):
    """Final outputs of ``(prompt, params)`` pairs, all in flight at once."""
    async def main():
        async with AsyncEngine(**SETTINGS, **engine_kw) as eng:
            return await asyncio.gather(*(eng.generate(p, sp) for p, sp in requests))

    return arun(main())


@pytest.fixture(scope="module")
def engine():
    with Engine(**SETTINGS) as e:
        yield e


def _same_positions(a, b):
    """Two vLLM per-position logprob dicts: same tokens, ranks and decoded text; values to 1e-5."""
    assert list(a) == list(b)
    for t in a:
        assert a[t].rank == b[t].rank and a[t].decoded_token == b[t].decoded_token
        assert abs(a[t].logprob - b[t].logprob) < 1e-5


def test_logprobs_prompt_logprobs_and_stop_strings_equal_the_engine(engine):
    free = engine.generate([PROMPTS[0]], greedy(12), use_tqdm=False)[0].outputs[0]
    stop = free.text[len(free.text) // 2:][:3]  # a stop string the greedy text is known to contain
    # ignore_eos: the stops under test, not the model's EOS (the bundled model may emit one first)
    requests = [(PROMPTS[0], greedy(12, logprobs=3, prompt_logprobs=2)),
                (PROMPTS[0], greedy(12, stop=[stop])),
                (PROMPTS[0], greedy(8, stop_token_ids=[free.token_ids[3]]))]
    want = engine.generate([p for p, _ in requests], [sp for _, sp in requests], use_tqdm=False)
    got = _async_outputs(requests)
    for w, g in zip(want, got):
        wo, go = w.outputs[0], g.outputs[0]
        assert (go.token_ids, go.text, go.finish_reason, go.stop_reason) == \
               (wo.token_ids, wo.text, wo.finish_reason, wo.stop_reason)
        assert g.prompt_token_ids == w.prompt_token_ids and g.finished
    assert got[1].outputs[0].stop_reason == stop and got[1].outputs[0].finish_reason == "stop"
    assert got[2].outputs[0].stop_reason == free.token_ids[3]
    wo, go = want[0].outputs[0], got[0].outputs[0]
    assert len(go.logprobs) == len(wo.logprobs) == 12
    for a, b in zip(go.logprobs, wo.logprobs):
        _same_positions(a, b)
    assert abs(go.cumulative_logprob - wo.cumulative_logprob) < 1e-4
    assert got[0].prompt_logprobs[0] is None and len(got[0].prompt_logprobs) == len(PROMPTS[0])
    for a, b in zip(got[0].prompt_logprobs[1:], want[0].prompt_logprobs[1:]):
        _same_positions(a, b)


def test_n_seeded_completions_equal_the_engine(engine):
    sp = SamplingParams(n=3, temperature=1.0, top_k=50, seed=7, max_tokens=10, ignore_eos=True)
    want = engine.generate([PROMPTS[2]], sp, use_tqdm=False)[0]
    (got,) = _async_outputs([(PROMPTS[2], sp)])
    assert [o.index for o in got.outputs] == [0, 1, 2]
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in want.outputs]
    assert len({tuple(o.token_ids) for o in got.outputs}) > 1  # the seeds differ per completion


def test_detokenize_false_returns_the_engine_s_token_ids_with_empty_text(engine):
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, detokenize=False)
    want = engine.generate([PROMPTS[0]], sp, use_tqdm=False)[0].outputs[0]
    delta = sp.replace(output_kind=RequestOutputKind.DELTA)

    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            final = await eng.generate(PROMPTS[0], sp)
            deltas = [o async for o in eng.stream(PROMPTS[0], delta)]
            return final, deltas

    final, deltas = arun(main())
    got = final.outputs[0]
    assert want.text == "" and len(want.token_ids) == 10
    assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, "", "length")
    assert [t for o in deltas for t in o.outputs[0].token_ids] == want.token_ids
    assert all(o.outputs[0].text == "" for o in deltas)


def test_every_output_kind_adds_up_to_the_same_result():
    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            res = {}
            for kind in RequestOutputKind:
                res[kind] = [o async for o in eng.stream(PROMPTS[1], greedy(9, output_kind=kind))]
            return res

    res = arun(main())
    delta, cum, final = (res[k] for k in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE,
                                          RequestOutputKind.FINAL_ONLY))
    assert len(final) == 1 and final[0].finished and len(final[0].outputs[0].token_ids) == 9
    assert sum((o.outputs[0].token_ids for o in delta), []) == final[0].outputs[0].token_ids
    assert "".join(o.outputs[0].text for o in delta) == final[0].outputs[0].text
    assert cum[-1].outputs[0].token_ids == final[0].outputs[0].token_ids
    assert cum[-1].outputs[0].text == final[0].outputs[0].text
    # cumulative outputs grow by their deltas
    for prev, cur in zip(cum, cum[1:]):
        assert cur.outputs[0].token_ids == prev.outputs[0].token_ids + cur.outputs[0].delta_token_ids
    assert len(cum) > 1 and not any(o.finished for o in cum[:-1])


def test_structured_output_equals_the_engine_and_parses(engine):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    sp = SamplingParams(temperature=0, max_tokens=40,
                        structured_outputs=StructuredOutputsParams(json=schema, disable_any_whitespace=True))
    want = engine.generate([PROMPTS[0]], sp, use_tqdm=False)[0].outputs[0]
    (got,) = _async_outputs([(PROMPTS[0], sp)])
    assert got.outputs[0].token_ids == want.token_ids and got.outputs[0].text == want.text
    if want.finish_reason == "stop":
        assert set(json.loads(got.outputs[0].text)) == {"a"}


def test_async_scheduling_on_the_cpu_gives_the_same_tokens(engine):
    requests = [(p, greedy(10)) for p in PROMPTS]
    want = [o.outputs[0].token_ids for o in engine.generate(PROMPTS, greedy(10), use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in _async_outputs(requests, async_scheduling=True)]
    assert got == want


def test_priority_is_validated_and_metrics_count_the_loop_s_work():
    async def main():
        async with AsyncEngine(**SETTINGS, scheduling_policy="priority") as eng:
            with pytest.raises(ValueError, match="priority must be an integer"):
                await eng.add_request(PROMPTS[0], greedy(2), priority="high")
            outs = await asyncio.gather(*(eng.generate(p, greedy(5), priority=i) for i, p in enumerate(PROMPTS)))
            return outs, eng.get_metrics()

    outs, m = arun(main())
    assert all(len(o.outputs[0].token_ids) == 5 for o in outs)
    assert m.generation_tokens == 15 and m.prompt_tokens == sum(map(len, PROMPTS))
    assert m.request_success["length"] == 3 and m.num_steps > 0 and m.kv_blocks_used == 0


def test_metrics_histograms_observe_every_request_of_the_loop():
    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            outs = await asyncio.gather(*(eng.generate(p, greedy(5)) for p in PROMPTS))
            return outs, eng.get_metrics()

    outs, m = arun(main())
    assert all(len(o.outputs[0].token_ids) == 5 for o in outs)
    n = len(PROMPTS)
    for h in (m.time_to_first_token, m.e2e_request_latency, m.request_queue_time, m.request_prefill_time,
              m.request_decode_time):
        assert h.count == n and len(h.counts) == len(h.buckets) + 1 and h.sum > 0
    assert (m.request_generation_tokens.count, m.request_generation_tokens.sum) == (n, 5.0 * n)
    assert (m.request_prompt_tokens.count, m.request_prompt_tokens.sum) == (n, float(sum(map(len, PROMPTS))))
    assert m.inter_token_latency.count == 4 * n  # every token after the first
    assert m.iteration_tokens.count == m.num_steps and m.iteration_tokens.sum == m.scheduled_tokens


def test_the_python_step_loop_is_not_what_runs(monkeypatch):
    """The steps are the Rust loop's: the synchronous engine's ``step`` is never called."""
    def no_python_step(self):
        raise AssertionError("Engine.step ran under AsyncEngine")

    monkeypatch.setattr(Engine, "step", no_python_step)
    (out,) = _async_outputs([(PROMPTS[0], greedy(6))])
    assert out.finished and len(out.outputs[0].token_ids) == 6
