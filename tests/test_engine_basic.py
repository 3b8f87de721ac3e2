"""Engine end to end on tiny models (float32, CPU): vLLM-shaped outputs, stopping rules, validation,
abort, n > 1, logprobs, chat, metrics."""

import numpy as np
import pytest
import torch

from engine_util import assert_pool_drained, greedy, run_until_done
from yoco_rs import Engine, RequestOutputKind, SamplingParams
from yoco_rs.errors import EngineClosedError


@pytest.fixture(scope="module")
def engine():
    e = Engine(max_model_len=256, num_gpu_blocks_override=128, max_num_seqs=8, max_num_batched_tokens=64)
    yield e
    e.close()


def test_greedy_generation_matches_transformers_generate(engine):
    from transformers import Gemma3nForCausalLM

    hf = Gemma3nForCausalLM.from_pretrained(engine.config.model, dtype=torch.float32).eval()
    prompts = ["Hello world, the cache is warm", "One two three", "x"]
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, min_tokens=12), use_tqdm=False)
    for p, o in zip(prompts, outs):
        ids = engine.encode(p)
        assert o.prompt_token_ids == ids
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12, min_new_tokens=12)
        assert o.outputs[0].token_ids == ref[0, len(ids):].tolist(), p
        assert o.outputs[0].finish_reason == "length" and o.finished
    assert_pool_drained(engine)


def test_outputs_come_back_in_prompt_order_with_per_prompt_params(engine):
    prompts = [[2, 100 + i] for i in range(5)]
    params = [greedy(1 + i) for i in range(5)]
    outs = engine.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [1, 2, 3, 4, 5]
    assert [o.prompt_token_ids for o in outs] == prompts


def _first_tokens(engine, prompt, n):
    return engine.generate(prompt, greedy(n), use_tqdm=False)[0].outputs[0]


def test_stop_token_ids_keep_the_token_and_report_it(engine):
    base = _first_tokens(engine, [2, 500, 600], 8)
    stop = base.token_ids[3]
    first = base.token_ids.index(stop)
    out = engine.generate([2, 500, 600], greedy(8, stop_token_ids=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == base.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_eos_stops_unless_ignore_eos_and_min_tokens_suppresses_it(engine, tmp_path):
    import json
    import shutil

    base = _first_tokens(engine, [2, 700, 800, 900], 10)
    eos = base.token_ids[4]
    # The same checkpoint with that token made an EOS id by its generation config.
    model = shutil.copytree(engine.config.model, tmp_path / "m")
    gen = json.loads((model / "generation_config.json").read_text())
    ids = gen.get("eos_token_id")
    gen["eos_token_id"] = (ids if isinstance(ids, list) else [ids]) + [eos]
    (model / "generation_config.json").write_text(json.dumps(gen))
    with Engine(str(model), max_model_len=256, num_gpu_blocks_override=128, max_num_seqs=8,
                max_num_batched_tokens=64) as e:
        assert eos in e.tokenizer.eos_token_ids
        stopped = e.generate([2, 700, 800, 900], SamplingParams(temperature=0.0, max_tokens=10),
                             use_tqdm=False)[0].outputs[0]
        first = base.token_ids.index(eos)
        assert stopped.token_ids == base.token_ids[: first + 1]
        assert stopped.finish_reason == "stop" and stopped.stop_reason is None
        ignored = e.generate([2, 700, 800, 900], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0]
        assert ignored.token_ids == base.token_ids and ignored.finish_reason == "length"
        late = e.generate([2, 700, 800, 900], SamplingParams(temperature=0.0, max_tokens=10, min_tokens=10),
                          use_tqdm=False)[0].outputs[0]
        assert len(late.token_ids) == 10 and eos not in late.token_ids


def test_stop_strings_cut_the_text_and_finish_in_the_core(engine):
    base = _first_tokens(engine, [2, 1000, 1001], 16)
    text = base.text
    stop = text[5:8]
    assert stop and stop in text
    out = engine.generate([2, 1000, 1001], greedy(16, stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.text == text[: text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert len(out.token_ids) < 16
    keep = engine.generate([2, 1000, 1001], greedy(16, stop=[stop], include_stop_str_in_output=True),
                           use_tqdm=False)[0].outputs[0]
    assert keep.text == text[: text.index(stop) + len(stop)]
    assert_pool_drained(engine)


def test_max_tokens_none_runs_to_the_context_length(engine):
    out = engine.generate([2] + [300] * 240, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 256 - 241 and out.finish_reason == "length"


def test_too_long_prompt_is_rejected_with_the_numbers(engine):
    with pytest.raises(ValueError, match=r"maximum context length is 256 tokens.*requested 20 output tokens.*"
                                         r"at least 250 input tokens.*total of at least 270"):
        engine.generate([[2] * 250], greedy(20), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_token_ids must be in \\[0, 4096\\)"):
        engine.generate([[2, 5000]], greedy(2), use_tqdm=False)
    with pytest.raises(ValueError, match="logprobs must be <= max_logprobs"):
        engine.generate("hi", SamplingParams(logprobs=50), use_tqdm=False)
    assert not engine.has_unfinished_requests()


def test_a_bad_request_in_a_batch_rejects_the_batch_before_anything_runs(engine):
    with pytest.raises(ValueError):
        engine.generate(["fine", ""], greedy(2), use_tqdm=False)
    assert not engine.has_unfinished_requests()
    assert_pool_drained(engine)


def test_duplicate_request_id_is_rejected(engine):
    engine.add_request("dup", [2, 3, 4], greedy(3))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", [2, 3, 4], greedy(3))
    run_until_done(engine)


def test_n_samples_are_distinct_and_reproducible_with_a_seed(engine):
    p = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
    a = engine.generate([2, 50, 60], p, use_tqdm=False)[0]
    b = engine.generate([2, 50, 60], p, use_tqdm=False)[0]
    assert [o.index for o in a.outputs] == [0, 1, 2]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) == 3


def test_logprobs_hold_top_k_plus_the_sampled_token(engine):
    out = engine.generate([2, 40, 41], greedy(4, logprobs=2), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 4
    total = 0.0
    for tok, pos in zip(out.token_ids, out.logprobs):
        assert next(iter(pos)) == tok  # sampled token first
        assert pos[tok].rank == 1  # greedy
        assert len(pos) == 2 and all(lp.logprob <= 0 for lp in pos.values())
        assert pos[tok].decoded_token == engine.tokenizer.decode([tok], skip_special_tokens=False)
        total += pos[tok].logprob
    assert out.cumulative_logprob == pytest.approx(total)


def test_prompt_logprobs_match_a_full_forward(engine):
    from transformers import Gemma3nForCausalLM

    hf = Gemma3nForCausalLM.from_pretrained(engine.config.model, dtype=torch.float32).eval()
    prompt = [2] + list(range(100, 190))  # longer than max_num_batched_tokens=64: chunked
    out = engine.generate([prompt], greedy(2, prompt_logprobs=1), use_tqdm=False)[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)
    plp = out.prompt_logprobs
    assert plp[0] is None and len(plp) == len(prompt)
    for i in range(1, len(prompt)):
        assert plp[i][prompt[i]].logprob == pytest.approx(ref[i - 1, prompt[i]].item(), abs=1e-4)
        assert plp[i][prompt[i]].rank == int((ref[i - 1] > ref[i - 1, prompt[i]]).sum()) + 1


def test_chat_applies_the_template(engine):
    msgs = [{"role": "user", "content": "Hi there"}]
    out = engine.chat(msgs, greedy(3), use_tqdm=False)[0]
    assert out.prompt_token_ids == engine.apply_chat_template(msgs, tokenize=True)
    assert out.prompt.endswith("<start_of_turn>model\n")


def test_abort_mid_generation_frees_every_block(engine):
    for i in range(3):
        engine.add_request(f"ab{i}", [2] + [400 + i] * 40, greedy(50))
    for _ in range(4):
        engine.step()
    m = engine.get_metrics()
    assert m.kv_blocks_used > 0 and m.num_requests_running + m.num_requests_waiting == 3
    engine.abort_request("ab1")
    outs = engine.step()
    aborted = [o for o in outs if o.request_id == "ab1"]
    assert aborted and aborted[0].finished and aborted[0].outputs[0].finish_reason == "abort"
    engine.abort_request(["ab0", "ab2"])
    engine.step()
    assert not engine.has_unfinished_requests()
    assert_pool_drained(engine)


def test_abort_frees_the_blocks_before_it_returns(engine):
    engine.add_request("now", [2] + [410] * 40, greedy(50))
    engine.step()
    assert engine.get_metrics().kv_blocks_used > 0
    engine.abort_request("now")
    m = engine.get_metrics()
    assert m.kv_blocks_used == 0 and m.num_requests_running == 0
    assert engine.has_unfinished_requests()  # its final output is the next step's
    (out,) = engine.step()
    assert out.request_id == "now" and out.finished and out.outputs[0].finish_reason == "abort"
    assert len(out.outputs[0].token_ids) == 1
    assert_pool_drained(engine)


def test_an_abort_asked_for_while_a_step_runs_takes_effect_at_the_next_step(engine):
    runner = engine._runner
    real = runner.execute
    calls = []

    def execute(batch, *a, **k):  # the executor calls back into the engine mid-step
        if not calls:
            engine.abort_request("x")
        calls.append(1)
        return real(batch, *a, **k)

    engine.add_request("x", [2, 40, 41], greedy(50))
    engine.add_request("y", [2, 42, 43], greedy(3))
    runner.execute = execute
    try:
        first = {o.request_id: o for o in engine.step()}
        assert not first["x"].finished and len(first["x"].outputs[0].token_ids) == 1  # the step ran it
        second = {o.request_id: o for o in engine.step()}
        assert second["x"].finished and second["x"].outputs[0].finish_reason == "abort"
        assert len(second["x"].outputs[0].token_ids) == 1  # aborted before the second step planned
        finals = run_until_done(engine)
        assert len(finals["y"].outputs[0].token_ids) == 3
    finally:
        del runner.execute
    assert_pool_drained(engine)


def test_a_closed_engine_refuses_requests():
    e = Engine(max_model_len=64, num_gpu_blocks_override=16, max_num_seqs=2)
    e.add_request("left", [2, 5, 6], greedy(4))
    e.close()
    assert not e.has_unfinished_requests()
    with pytest.raises(EngineClosedError, match="closed"):
        e.add_request("late", [2, 5, 6], greedy(4))
    assert e.step() == []
    e.close()  # idempotent


def test_streaming_kinds_cumulative_and_delta(engine):
    ref = _first_tokens(engine, [2, 77, 78], 6)
    engine.add_request("cum", [2, 77, 78], greedy(6))
    engine.add_request("del", [2, 77, 78], greedy(6, output_kind=RequestOutputKind.DELTA))
    cum, delta = [], []
    while engine.has_unfinished_requests():
        for o in engine.step():
            (cum if o.request_id == "cum" else delta).append(o)
    assert [len(o.outputs[0].token_ids) for o in cum] == [1, 2, 3, 4, 5, 6]
    assert cum[-1].outputs[0].token_ids == ref.token_ids and cum[-1].outputs[0].text == ref.text
    assert sum((o.outputs[0].token_ids for o in delta), []) == ref.token_ids
    assert "".join(o.outputs[0].text for o in delta) == ref.text
    assert delta[-1].finished and not delta[0].finished


def test_metrics_count_tokens_and_requests(engine):
    before = engine.get_metrics()
    engine.generate([[2, 9, 9, 9], [2, 8, 8]], greedy(5), use_tqdm=False)
    after = engine.get_metrics()
    assert after.prompt_tokens - before.prompt_tokens == 7
    assert after.generation_tokens - before.generation_tokens == 10
    assert after.request_success["length"] - before.request_success["length"] == 2
    assert after.time_to_first_token.count - before.time_to_first_token.count == 2
    assert after.inter_token_latency.count - before.inter_token_latency.count == 8
    assert after.cross_rows - before.cross_rows == 10  # fast prefill: one cross row per sampled token
    assert after.scheduled_tokens - before.scheduled_tokens == 7 + 8


def test_without_fast_prefill_every_scheduled_token_counts_as_a_cross_decoder_row():
    e = Engine(max_model_len=256, num_gpu_blocks_override=64, max_num_seqs=4, max_num_batched_tokens=64,
               kv_sharing_fast_prefill=False)
    try:
        e.generate([[2, 9, 9, 9], [2, 8, 8]], greedy(5), use_tqdm=False)
        m = e.get_metrics()
        assert m.scheduled_tokens == 7 + 8 and m.cross_rows == m.scheduled_tokens
    finally:
        e.close()


@pytest.mark.timeout(60)
def test_the_content_format_probe_renders_within_the_callers_budget(engine):
    # A template that never ends: with a budget, the "auto" content-format probe gives up at the budget
    # (it would otherwise hang before the budgeted rendering even starts), and the rendering then fails.
    import time

    from yoco_rs.template_budget import TemplateBudget, TemplateBudgetExceeded

    endless = ("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
               "{% endfor %}{% endfor %}{% endfor %}"
               "{{ messages[0]['content'] }}")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    t0 = time.monotonic()
    with pytest.raises(TemplateBudgetExceeded):
        engine.tokenizer.apply_chat_template(msgs, chat_template=endless, budget=TemplateBudget(seconds=0.2))
    assert time.monotonic() - t0 < 5
