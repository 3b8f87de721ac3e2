"""The step plan and outcome across the Python boundary: shapes, dtypes, values, zero-copy views."""

import gc
import sys

import numpy as np
import pytest

from yoco_rs import _core
from yoco_rs._core import MockExecutor, Scheduler

PLAN_DTYPES = {
    "req_ids": np.uint64,
    "req_rows": np.int32,
    "query_start_loc": np.int32,
    "seq_lens": np.int32,
    "input_ids": np.int32,
    "positions": np.int64,
    "slot_mapping": np.int64,
    "kv_copies": np.int32,
    "logits_indices": np.int32,
    "sample_rows": np.int32,
    "cross_indices": np.int32,
    "cross_query_start_loc": np.int32,
    "logits_cross_pos": np.int32,
    "admitted_ids": np.uint64,
    "admitted_rows": np.int32,
    "admitted_num_cached": np.int32,
    "preempted_ids": np.uint64,
    "dirty_rows": np.int32,
}

GEMMA_LIKE = ["sliding:8", "full", "shared:0", "shared:1"]


def mixed_batch(**kw):
    """Budget 9, threshold 7, block size 4: step 2 has rows of 5 (end of prompt), 1 (decode) and 3
    (middle chunk) tokens, the batch of plan.rs's module doc."""
    s = Scheduler(["full"], num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=9,
                  max_model_len=64, long_prefill_token_threshold=7, **kw)
    m = MockExecutor(1000, first_token=16, scheduler=s)
    s.add_request(10, np.arange(100, 112, dtype=np.int32), max_tokens=5)
    s.add_request(11, [200], max_tokens=5)
    p = s.schedule()
    assert list(p.logits_indices) == [7]
    s.update(m.sample(p))
    return s, m


def test_mixed_batch_arrays_match_the_documented_example():
    s, m = mixed_batch()
    s.add_request(12, list(range(300, 320)), max_tokens=5)
    p = s.schedule()
    assert p.num_rows == len(p) == 3
    assert p.req_ids.tolist() == [10, 11, 12]
    assert p.query_start_loc.tolist() == [0, 5, 6, 9]
    assert p.seq_lens.tolist() == [12, 2, 3]
    assert p.positions.tolist() == [7, 8, 9, 10, 11, 1, 0, 1, 2]
    assert p.input_ids[:5].tolist() == [107, 108, 109, 110, 111]
    assert p.input_ids[6:].tolist() == [300, 301, 302]
    assert p.logits_indices.tolist() == [4, 5]
    assert p.sample_rows.tolist() == [0, 1]
    assert p.cross_indices.tolist() == [4, 5]
    assert p.cross_query_start_loc.tolist() == [0, 1, 2, 2]
    assert p.logits_cross_pos.tolist() == [0, 1]
    assert p.admitted_ids.tolist() == [12]
    assert p.dirty_rows.tolist() == [0, 2]
    assert (p.num_tokens, p.num_tokens_padded, p.num_cross, p.num_cross_padded) == (9, 9, 2, 2)
    assert (p.max_query_len, p.max_seq_len, p.num_samples) == (5, 12, 2)
    out = s.update(m.sample(p))
    assert out.req_ids.tolist() == [10, 11]


def test_every_array_has_the_executor_dtype_and_shape():
    s = Scheduler(GEMMA_LIKE, num_blocks=[64, 32], block_size=4, max_model_len=64,
                  token_capture_sizes=[8, 16, 32], cross_capture_sizes=[4])
    s.add_request(1, list(range(20, 33)), max_tokens=3)
    s.add_request(2, [7, 8], max_tokens=3)
    p = s.schedule()
    for name, dtype in PLAN_DTYPES.items():
        a = getattr(p, name)
        assert isinstance(a, np.ndarray) and a.dtype == dtype, name
    r, tp, g = p.num_rows, p.num_tokens_padded, p.num_groups
    assert (r, p.num_tokens, tp, g) == (2, 15, 16, 2)
    assert p.query_start_loc.shape == p.cross_query_start_loc.shape == (r + 1,)
    assert p.input_ids.shape == p.positions.shape == (tp,)
    assert p.slot_mapping.shape == (g, tp)
    assert p.kv_copies.shape == (0, 4)
    # Padding: id 0, position 0, slot 0; the cross selection repeats its last index.
    assert p.input_ids[15] == 0 and p.positions[15] == 0 and (p.slot_mapping[:, 15] == 0).all()
    assert p.cross_indices.tolist() == [12, 14, 14, 14]
    assert p.num_cross_padded == 4


def test_plan_arrays_are_zero_copy_views_that_keep_the_plan_alive():
    s = Scheduler(["full"], num_blocks=64, block_size=16)
    s.add_request(1, list(range(1, 40)), max_tokens=2)
    p = s.schedule()
    a = p.input_ids
    assert not a.flags.owndata and a.base is p, "a view of the Rust buffer, owned by the plan"
    assert np.shares_memory(a, p.input_ids), "every access views the same buffer"
    ids = p.input_ids.copy()
    del p
    gc.collect()
    assert (a == ids).all(), "the view keeps the plan's buffer alive"


def test_stepping_with_array_access_leaks_nothing():
    s = Scheduler(["full"], num_blocks=512, block_size=16, max_model_len=2048)
    for i in range(32):
        s.add_request(i, [i + 16, 17, 18], max_tokens=1000)
    m = MockExecutor(1000, first_token=16)
    names = [n for n in dir(_core.StepPlan) if not n.startswith("_")]

    def steps(k):
        for _ in range(k):
            p = s.schedule()
            views = [getattr(p, n) for n in names]
            out = s.update(m.sample(p))
            views += [out.req_ids, out.new_tokens, out.finish_reasons]
            del p, out, views

    steps(20)
    gc.collect()
    before = sys.getallocatedblocks()
    steps(300)
    gc.collect()
    assert sys.getallocatedblocks() - before < 200, "plans, outcomes and their views are freed"


def test_block_tables_are_persistent_views_updated_in_place():
    s = Scheduler(GEMMA_LIKE, num_blocks=64, block_size=4, max_num_seqs=8, max_model_len=64)
    tables = s.block_tables()
    assert len(tables) == 2
    for t in tables:
        assert t.dtype == np.int32 and t.shape == (8, s.max_blocks_per_seq) and not t.flags.owndata
    again = s.block_tables()
    assert all(np.shares_memory(a, b) for a, b in zip(tables, again))
    s.add_request(1, list(range(30, 40)), max_tokens=8)
    p = s.schedule()
    row = p.req_rows[0]
    assert p.dirty_rows.tolist() == [row]
    full = tables[1][row]
    # The slot of every token follows the (in place updated) table.
    pos = p.positions[: p.num_tokens]
    assert (p.slot_mapping[1, : p.num_tokens] == full[pos // 4] * 4 + pos % 4).all()
    assert (full[:3] > 0).all() and (full[3:] == 0).all()


def test_outcome_arrays_report_tokens_and_finish_reasons():
    s = Scheduler(["full"], num_blocks=64, block_size=16)
    s.add_request(1, [5, 6, 7], max_tokens=1)
    s.add_request(2, [5, 6, 8], max_tokens=4, eos_token_ids=[2])
    s.schedule()
    out = s.update(np.array([40, 2], dtype=np.int32))
    assert out.req_ids.dtype == np.uint64 and out.new_tokens.dtype == np.int32 and out.finish_reasons.dtype == np.uint8
    assert out.req_ids.tolist() == [1, 2]
    assert out.new_tokens.tolist() == [40, 2]
    assert out.finish_reasons.tolist() == [_core.FINISH_LENGTH, _core.FINISH_STOP]
    assert out.num_finished == 2 and len(out) == 2
    assert out.req_ids.base is out and np.shares_memory(out.req_ids, out.req_ids)
    assert s.num_unfinished == 0


def test_update_accepts_a_list_and_a_non_contiguous_array():
    s = Scheduler(["full"], num_blocks=64, block_size=16)
    s.add_request(1, [5, 6, 7], max_tokens=3)
    s.add_request(2, [5, 6, 8], max_tokens=3)
    s.schedule()
    assert s.update([20, 21]).new_tokens.tolist() == [20, 21]
    s.schedule()
    strided = np.array([30, 0, 31, 0], dtype=np.int32)[::2]
    assert s.update(strided).new_tokens.tolist() == [30, 31]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_mock_kv_run_reproduces_the_reference_stream_through_preemptions(policy):
    # A tight pool forces preemptions; the KV-simulating mock makes any wrong plan change tokens.
    s = Scheduler(GEMMA_LIKE, num_blocks=16, block_size=4, max_num_seqs=6, max_num_batched_tokens=24,
                  max_model_len=48, policy=policy)
    m = MockExecutor(50, scheduler=s)
    rng = np.random.default_rng(3)
    base = rng.integers(0, 50, 12).tolist()
    prompts = {i: base[: rng.integers(1, 12)] + rng.integers(0, 50, rng.integers(1, 10)).tolist() for i in range(24)}
    for i, pr in prompts.items():
        s.add_request(i, np.array(pr, dtype=np.int32), max_tokens=int(rng.integers(1, 16)), priority=i % 3)
    got = {i: [] for i in prompts}
    preempted = 0
    while s.num_unfinished:
        p = s.schedule()
        preempted += len(p.preempted_ids)
        out = s.update(m.sample(p))
        for rid, tok in zip(out.req_ids.tolist(), out.new_tokens.tolist()):
            got[rid].append(tok)
        s.check_invariants()
    assert preempted > 0
    for i, pr in prompts.items():
        ctx = list(pr)
        for tok in got[i]:
            assert tok == m.reference_next(ctx)
            ctx.append(tok)
    st = s.stats()
    assert st["running"] == st["waiting"] == st["blocks_used"] == 0
