"""Failure containment in ``AsyncEngine``: a failing step fails exactly its requests (the others finish
with the tokens a fresh engine gives), only K failing steps in a row kill the engine, a dying engine
fails every caller (queued ones included) at once, a dropped stream aborts its request, an aborted
request keeps the text of its tokens, and streamed text equals non-streamed text (invalid UTF-8 too)."""

from __future__ import annotations

import asyncio
import gc
import time

import numpy as np
import pytest
import torch

from engine_util import assert_pool_drained, greedy
from yoco_rs import AsyncEngine, Engine, EngineDeadError, RequestFailedError, SamplingParams
from yoco_rs.sampling_params import RequestOutputKind

SETTINGS = dict(max_model_len=256, num_gpu_blocks_override=64, max_num_seqs=2, max_num_batched_tokens=64)
PROMPTS = {"a": [2] + [300] * 37, "b": [2] + [301] * 21, "c": [2] + [302] * 29}


class DeviceLost(RuntimeError):
    pass


@pytest.fixture(scope="module")
def reference():
    """What a fresh engine generates for each prompt (greedy, 12 tokens)."""
    with Engine(**SETTINGS) as e:
        outs = e.generate(list(PROMPTS.values()), greedy(12), use_tqdm=False)
    return {rid: o.outputs[0].token_ids for rid, o in zip(PROMPTS, outs)}


def _fail_steps(engine: AsyncEngine, which, exc=DeviceLost("device lost")) -> list:
    """The executor raises ``exc`` on the steps whose 1-based index is in ``which`` (a set, or 'all')."""
    runner = engine._executor._runner
    real = runner.execute
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if which == "all" or len(calls) in which:
            raise exc
        return real(*a, **k)

    runner.execute = flaky
    return calls


async def _collect(stream):
    outs = []
    try:
        async for o in stream:
            outs.append(o)
    except Exception as e:
        return outs, e
    return outs, None


def test_a_failing_step_fails_exactly_its_requests_and_the_others_finish_correctly(reference):
    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            _fail_steps(eng, {3})  # a and b run (max_num_seqs=2); c waits
            streams = {rid: await eng.add_request(p, greedy(12), request_id=rid) for rid, p in PROMPTS.items()}
            results = await asyncio.gather(*(_collect(s) for s in streams.values()))
            got = dict(zip(streams, results))
            await asyncio.sleep(0.05)
            return got, eng.get_metrics(), eng.is_dead

    got, m, dead = asyncio.run(asyncio.wait_for(main(), 120))
    assert not dead
    for rid in ("a", "b"):
        outs, err = got[rid]
        assert isinstance(err, RequestFailedError), (rid, err)
        assert "DeviceLost: device lost" in str(err) and isinstance(err.__cause__, DeviceLost)
    outs, err = got["c"]
    assert err is None and outs[-1].finished
    assert outs[-1].outputs[0].token_ids == reference["c"]
    assert m.request_success.get("abort", 0) == 2 and m.kv_blocks_used == 0


def test_an_allocation_failure_in_a_step_is_contained():
    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            _fail_steps(eng, {1}, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
            first = await _collect(await eng.add_request([2, 60, 61], greedy(4)))
            second = await _collect(await eng.add_request([2, 60, 61], greedy(4)))
            return first, second, eng.is_dead

    (o1, e1), (o2, e2), dead = asyncio.run(asyncio.wait_for(main(), 120))
    assert isinstance(e1, RequestFailedError) and "out of memory" in str(e1)
    assert e2 is None and len(o2[-1].outputs[0].token_ids) == 4 and not dead


def test_only_k_consecutive_failing_steps_kill_the_engine():
    async def main():
        async with AsyncEngine(max_consecutive_step_failures=2, **SETTINGS) as eng:
            _fail_steps(eng, {1, 3, 4})  # 1 fails alone (contained); 3 and 4 fail in a row (fatal)
            r1 = await _collect(await eng.add_request([2, 60], greedy(1)))
            r2 = await _collect(await eng.add_request([2, 60], greedy(1)))
            alive_after_single_failure = not eng.is_dead
            r3 = await _collect(await eng.add_request([2, 61], greedy(8)))
            try:
                r4 = await _collect(await eng.add_request([2, 62], greedy(8)))
            except EngineDeadError as e:  # the step that killed it ran before add_request returned
                r4 = ([], e)
            for _ in range(200):
                if eng.is_dead:
                    break
                await asyncio.sleep(0.01)
            return r1, r2, r3, r4, alive_after_single_failure, eng.is_dead

    r1, r2, r3, r4, alive, dead = asyncio.run(asyncio.wait_for(main(), 120))
    assert isinstance(r1[1], RequestFailedError) and r2[1] is None and alive
    assert isinstance(r3[1], RequestFailedError)  # step 3: contained, one failure in a row
    assert isinstance(r4[1], EngineDeadError) and dead  # step 4: the second in a row


def test_every_queued_caller_gets_the_error_within_a_second_when_the_engine_dies():
    died = {}

    async def main():
        async with AsyncEngine(max_consecutive_step_failures=1, **SETTINGS) as eng:
            runner = eng._executor._runner

            def dying(*a, **k):  # a slow step that then kills the engine
                time.sleep(0.5)
                died["at"] = time.monotonic()
                raise DeviceLost("device lost")

            runner.execute = dying
            first = await eng.add_request([2, 60], greedy(4))
            await asyncio.sleep(0.1)  # the loop thread is inside the dying step now

            async def queued(i):
                try:
                    s = await eng.add_request([2, 70 + i], greedy(4))
                    async for _ in s:
                        pass
                except Exception as e:
                    return time.monotonic(), e
                return time.monotonic(), None

            tasks = [asyncio.create_task(queued(i)) for i in range(6)]
            await asyncio.sleep(0.05)
            queued_before_death = "at" not in died
            res = await asyncio.gather(*tasks, _collect(first))
            return res, queued_before_death, eng.is_dead

    res, queued_before_death, dead = asyncio.run(asyncio.wait_for(main(), 60))
    assert dead and queued_before_death
    *queued, first = res
    assert isinstance(first[1], EngineDeadError)
    for t, err in queued:
        assert isinstance(err, EngineDeadError), err
        assert t - died["at"] < 1.0


def test_a_dropped_stream_aborts_its_request_promptly():
    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
            s = await eng.add_request([2, 60, 61], params, request_id="dropped")
            await s.__anext__()  # it runs
            del s  # dropped without aclose(): nobody will read it again
            gc.collect()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2:
                m = eng.get_metrics()
                if m.request_success.get("abort", 0) == 1 and m.num_requests_running == 0:
                    break
                await asyncio.sleep(0.01)
            return time.monotonic() - t0, eng.get_metrics(), eng.num_unfinished_requests

    took, m, unfinished = asyncio.run(asyncio.wait_for(main(), 60))
    assert m.request_success.get("abort", 0) == 1, m.request_success
    assert took < 1.0 and unfinished == 0 and m.kv_blocks_used == 0
    assert m.request_success.get("length", 0) == 0  # it did not run on to max_tokens


@pytest.mark.parametrize("kind", [RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA])
def test_an_aborted_request_returns_the_text_of_its_tokens(kind):
    with Engine(**SETTINGS) as e:
        e.add_request("r", [2, 60, 61, 62], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True,
                                                           output_kind=kind))
        text, ids = "", []
        for _ in range(6):
            for o in e.step():
                text += o.outputs[0].text
                ids += o.outputs[0].token_ids
        e.abort_request("r")
        (final,) = e.step()
        assert final.finished and final.outputs[0].finish_reason == "abort"
        if kind == RequestOutputKind.DELTA:
            text += final.outputs[0].text
            ids += final.outputs[0].token_ids
        else:
            text, ids = final.outputs[0].text, final.outputs[0].token_ids
        assert len(ids) >= 4
        assert text and text == _vllm_text(e.tokenizer, [2, 60, 61, 62], ids)
        assert_pool_drained(e)


# ---- streamed text = non-streamed text, invalid UTF-8 included ---------------------------------------------

def invalid_utf8_tokens(tokenizer, k: int = 2) -> list[int]:
    """Ids that decode to U+FFFD on their own (byte-fallback pieces of a lone UTF-8 continuation or lead
    byte), found by scanning the vocabulary: no hard-coded ids, so a new tokenizer keeps the test."""
    hf = tokenizer.hf
    vocab = hf.get_vocab_size(with_added_tokens=False)
    texts = hf.decode_batch([[i] for i in range(vocab)], skip_special_tokens=True)
    bad = [i for i, t in enumerate(texts) if t == "\ufffd"]
    assert len(bad) >= k, "the tokenizer has no byte-fallback tokens"
    return bad[:k]


def plain_tokens(tokenizer, k: int = 2) -> list[int]:
    """Ids of short ASCII words (decode to themselves, no leading space), found by encoding."""
    return [tokenizer.hf.encode(w, add_special_tokens=False).ids[0] for w in ("6", "b")[:k]]


def _vllm_text(tokenizer, prompt, ids) -> str:
    """vLLM's incremental rule as an independent reference: after each token, the text grows to the
    decoding of all tokens so far unless that ends in U+FFFD (an incomplete character is held back);
    whatever is still held back at the end is never emitted."""
    text = ""
    for i in range(1, len(ids) + 1):
        full = tokenizer.decode(ids[:i], skip_special_tokens=True)
        if not full.endswith("\ufffd"):
            text = full
    return text


def _scripted(engine: Engine, script: list[int]):
    """The sampler returns ``script[j]`` as each row's j-th output token (tokens forced, whatever the model says)."""
    sampler = engine._sampler
    real = sampler.sample

    def sample(logits, cross_pos, rows):
        out = real(logits, cross_pos, rows)
        idx = np.minimum(sampler.num_out[np.asarray(rows, dtype=np.int64)] - 1, len(script) - 1)
        out.sampled = torch.tensor([script[j] for j in idx.tolist()], dtype=torch.int32)
        return out

    sampler.sample = sample


def test_streamed_text_equals_non_streamed_text_with_invalid_utf8():
    with Engine(**SETTINGS) as e:
        bad = invalid_utf8_tokens(e.tokenizer)
        six, b = plain_tokens(e.tokenizer)
        scripts = {"tail": [six, bad[0], bad[1]], "inner": [six, bad[0], b, bad[1]]}
        for name, script in scripts.items():
            _scripted(e, script)
            kinds = {"stream": RequestOutputKind.DELTA, "final": RequestOutputKind.FINAL_ONLY}
            for rid, kind in kinds.items():
                e.add_request(rid, [2, 60], SamplingParams(temperature=0, max_tokens=len(script), ignore_eos=True,
                                                           output_kind=kind))
            texts = {"stream": "", "final": None}
            ids = {}
            while e.has_unfinished_requests():
                for o in e.step():
                    if o.request_id == "stream":
                        texts["stream"] += o.outputs[0].text
                    elif o.finished:
                        texts["final"] = o.outputs[0].text
                        ids = o.outputs[0].token_ids
            assert ids == script
            expected = _vllm_text(e.tokenizer, [2, 60], script)
            assert texts["stream"] == texts["final"] == expected, (name, texts, expected)
            e._sampler.sample = type(e._sampler).sample.__get__(e._sampler)
        # what vLLM gives: the trailing invalid run is held back, an inner one shows as U+FFFD
        assert _vllm_text(e.tokenizer, [], scripts["tail"]) == "6"
        assert _vllm_text(e.tokenizer, [], scripts["inner"]).startswith("6\ufffd")
