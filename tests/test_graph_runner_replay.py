"""The CUDA graph runner's logic without a GPU: ``mode="replay"`` runs the same bucket choice, padding,
static-buffer reuse and scatter-back as captured graphs, eagerly. Padded execution must equal the
executor's unpadded eager path (logits and KV cache outside the padding block 0), and each half must
run at its own bucket (vLLM replayed the cross-decoder at the full batch size)."""

from __future__ import annotations

import random

import pytest
import torch
from graph_fakes import BS, WINDOWS, FakeSplitModel, Pair, check_self_layout, make_kv
from step_plans import Req, schedule

from yoco_rs.attention import get_backend
from yoco_rs.executor.cuda_graphs import CudaGraphRunner, GraphConfig, capture_sizes, pick_bucket

def _config(fast_prefill=True, **over):
    kw = dict(token_sizes=(1, 2, 4, 8, 16, 24), decode_sizes=(1, 2, 4, 6), cross_sizes=(1, 2, 4),
              max_num_seqs=6, max_blocks_per_seq=12, fast_prefill=fast_prefill)
    kw.update(over)
    return GraphConfig(**kw)


def _req(rng, n, max_new=4, **kw):
    return Req(tokens=[rng.randrange(1, 61) for _ in range(n)], prompt_len=n, max_new=max_new, **kw)


def test_ladder_helpers_pick_the_smallest_size_that_fits():
    assert capture_sizes(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert pick_bucket(5, (1, 2, 4, 8)) == 8
    assert pick_bucket(8, (1, 2, 4, 8)) == 8
    assert pick_bucket(9, (1, 2, 4, 8)) is None


def test_padded_execution_equals_unpadded_for_random_plans():
    rng = random.Random(0)
    p = Pair(_config())
    waiting = [_req(rng, rng.randrange(1, 40), max_new=rng.randrange(1, 6)) for _ in range(9)]
    running: list[Req] = []
    kinds = set()
    for _ in range(40):
        while waiting and len(running) < 6 and rng.random() < 0.5:
            running.append(waiting.pop())
        if not running:
            if not waiting:
                break
            continue
        rows, counts = schedule(running, budget=rng.choice([7, 16, 30]), max_seqs=6, rng=rng)
        p.step(rows, counts, pad_to=sum(counts) + rng.choice([0, 0, 3]))
        st = p.runner.stats
        kinds.add((st.self_kind, st.cross_graphed))
        for r in [r for r in running if r.done]:
            p.planner.release(r)
            running.remove(r)
    # the run must have exercised mixed, decode and eager (above the ladder) self halves
    assert {k for k, _ in kinds} >= {"mixed", "decode", "eager"}


@pytest.mark.parametrize("size", [2, 4, 8, 16, 24])
def test_every_token_bucket_boundary(size):
    rng = random.Random(size)
    for t in (size - 1, size, size + 1):
        if t < 2:
            continue
        p = Pair(_config(), seed=size)
        a = _req(rng, 3)
        p.step([a], [3])
        # a decode row plus a prefill row of t - 1 tokens (mixed), or a 2-token prefill for t == 2
        rows, counts = ([_req(rng, 2)], [2]) if t == 2 else ([a, _req(rng, t - 1)], [1, t - 1])
        p.step(rows, counts)
        expect = pick_bucket(t, p.cfg.token_sizes)
        st = p.runner.stats
        assert (st.self_kind, st.self_size) == (("mixed", expect) if expect else ("eager", t))


@pytest.mark.parametrize("size", [1, 2, 4, 6])
def test_every_decode_bucket_boundary(size):
    rng = random.Random(10 + size)
    for r in (size - 1, size, size + 1):
        if not 1 <= r <= 6:
            continue
        p = Pair(_config(), seed=size)
        reqs = [_req(rng, rng.randrange(1, 12)) for _ in range(r)]
        p.step(reqs, [len(q.tokens) for q in reqs])
        p.step(reqs, [1] * r)
        st = p.runner.stats
        assert (st.self_kind, st.self_size) == ("decode", pick_bucket(r, p.cfg.decode_sizes))


@pytest.mark.parametrize("num_samplers", [1, 2, 3, 4, 5])
def test_cross_half_replays_at_its_own_bucket_not_the_batch_size(num_samplers):
    rng = random.Random(num_samplers)
    p = Pair(_config(), seed=num_samplers)
    done = [_req(rng, 2) for _ in range(num_samplers)]
    for r in done:
        p.step([r], [2])  # prompts complete: these rows decode next
    mid = _req(rng, 30)
    rows, counts = done + [mid], [1] * num_samplers + [10]  # a middle prefill chunk samples nothing
    p.step(rows, counts)
    st = p.runner.stats
    assert st.self_size == pick_bucket(num_samplers + 10, p.cfg.token_sizes)
    want_x = pick_bucket(num_samplers, p.cfg.cross_sizes)
    assert (st.cross_size, st.cross_graphed) == ((want_x, True) if want_x else (num_samplers, False))
    assert st.cross_size < st.self_size


def test_pure_decode_steps_use_the_decode_graphs_with_padding_rows():
    rng = random.Random(3)
    p = Pair(_config())
    reqs = [_req(rng, rng.randrange(2, 20), max_new=6) for _ in range(5)]
    p.step(reqs, [len(r.tokens) for r in reqs])
    for _ in range(3):
        p.step(reqs, [1] * 5)
        assert (p.runner.stats.self_kind, p.runner.stats.self_size, p.runner.stats.cross_size) == ("decode", 6, 5)


def test_a_small_step_after_a_large_one_sees_no_stale_static_rows():
    rng = random.Random(4)
    p = Pair(_config())
    big = [_req(rng, 4) for _ in range(5)] + [_req(rng, 3)]
    p.step(big, [4] * 5 + [3])  # 23 tokens, 6 rows
    p.step(big[:1], [1])  # 1 token, 1 row: every other row of the buffers must read as padding
    p.step(big[2:4], [1, 1])


def test_prompt_logprob_steps_select_several_trailing_rows_per_request():
    rng = random.Random(5)
    p = Pair(_config())
    a, b = _req(rng, 9, prompt_logprobs=3), _req(rng, 5, prompt_logprobs=1)
    p.step([a, b], [9, 5])
    assert p.runner.stats.cross_size == 4 + 2 or p.runner.stats.cross_graphed is False


def test_steps_without_sampling_rows_skip_the_cross_half():
    rng = random.Random(6)
    p = Pair(_config())
    r = _req(rng, 30)
    b = p.step([r], [10])
    assert b.num_cross == 0 and p.runner.stats.cross_size == 0


def test_fast_prefill_off_runs_the_cross_half_on_all_rows():
    rng = random.Random(7)
    p = Pair(_config(fast_prefill=False))
    a, b = _req(rng, 11), _req(rng, 4)
    p.step([a, b], [11, 4])
    assert (p.runner.stats.self_size, p.runner.stats.cross_size) == (16, 16)
    p.step([a, b], [1, 1])
    assert (p.runner.stats.self_kind, p.runner.stats.cross_size) == ("decode", 2)
    c = _req(rng, 30)
    p.step([a, c], [1, 29])  # above the ladder: both halves eager
    assert (p.runner.stats.self_kind, p.runner.stats.cross_graphed) == ("eager", False)


def test_more_cross_rows_than_the_cross_ladder_run_eagerly():
    rng = random.Random(8)
    p = Pair(_config(cross_sizes=(1, 2)))
    reqs = [_req(rng, 2) for _ in range(3)]
    p.step(reqs, [2, 2, 2])
    assert (p.runner.stats.cross_size, p.runner.stats.cross_graphed) == (3, False)


def test_graph_mode_needs_cuda_and_a_capturable_backend():
    model = FakeSplitModel()
    kv = make_kv(WINDOWS, num_blocks=8, block_size=BS)
    with pytest.raises(ValueError, match="CUDA"):
        CudaGraphRunner(model, kv, get_backend("torch"), windows=WINDOWS, block_size=BS, config=_config(), mode="graphs")


def test_bad_config_is_rejected_with_the_reason():
    with pytest.raises(ValueError, match="ascending"):
        _config(token_sizes=(4, 2))
    with pytest.raises(ValueError, match="max_num_seqs"):
        _config(decode_sizes=(1, 8))


def test_static_tables_are_wide_enough_for_the_padding_row():
    # a padding row of T_b - T tokens reads cdiv(T_b - T, block_size) columns, even with a short max_model_len
    p = Pair(_config(max_blocks_per_seq=1))
    assert p.runner.s_tables[0].shape[1] >= -(-24 // BS)


def test_enforce_eager_and_cpu_executors_are_not_wrapped():
    from gemma_random import TINY_10L, random_executor

    from yoco_rs.executor.cuda_graphs import maybe_graphed

    ex = random_executor(TINY_10L)
    ex.allocate_kv(8, 4)
    kw = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32)
    assert maybe_graphed(ex, enforce_eager=True, **kw) is ex
    assert maybe_graphed(ex, enforce_eager=False, **kw) is ex  # no CUDA here: eager


@pytest.mark.parametrize("fast_prefill", [True, False])
def test_capture_layouts_are_valid_batches_and_the_rehearsal_runs_every_half(fast_prefill):
    """What a graph is captured with must itself be a valid batch (a GPU kernel would otherwise read and
    write out of bounds during capture); replay mode rehearses capture on the CPU."""
    p = Pair(_config(fast_prefill=fast_prefill))
    r = p.runner
    for kind, sizes in (("mixed", r.cfg.token_sizes), ("decode", r.cfg.decode_sizes)):
        for tb in sizes:
            r._pad_self(kind, tb, 0, 0)
            check_self_layout(r, kind, tb)
    r.capture(progress=False)
    n_cross = len(r.cfg.cross_sizes) if fast_prefill else len(r.cfg.token_sizes) + len(r.cfg.decode_sizes)
    assert (len(r._self_graphs), len(r._cross_graphs)) == (len(r.cfg.token_sizes) + len(r.cfg.decode_sizes), n_cross)
    rng = random.Random(9)
    a, b = _req(rng, 6), _req(rng, 3)
    p.step([a, b], [6, 3])  # after the rehearsal, real steps still match the eager path
    p.step([a, b], [1, 1])


def test_capture_runs_where_tqdm_is_not_installed(monkeypatch):
    """The GPU script runs from a plain checkout that may lack tqdm; only the progress bar needs it."""
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)  # ``import tqdm`` now raises ImportError
    p = Pair(_config())
    p.runner.capture(progress=True)
    assert len(p.runner._cross_graphs) == len(p.runner.cfg.cross_sizes)


def test_the_cores_flat_slot_mapping_is_accepted():
    import dataclasses

    rng = random.Random(11)
    p = Pair(_config())
    a, b = _req(rng, 5), _req(rng, 2)
    batch = p.planner.batch([a, b], [5, 2])
    want = p.runner.forward(batch).clone()
    p.kv_graph[0].zero_(), p.kv_graph[1].zero_()
    flat = dataclasses.replace(batch, slot_mapping=batch.slot_mapping.reshape(-1))
    assert torch.equal(p.runner.forward(flat), want)
