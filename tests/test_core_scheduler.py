"""The Scheduler's Python face: configuration, requests, errors, lifecycle, stats, events, GIL, costs."""

import sys
import threading
import time

import numpy as np
import pytest

from yoco_rs import _core
from yoco_rs._core import CapacityError, MockExecutor, Scheduler


def small(**kw):
    kw.setdefault("num_blocks", 64)
    kw.setdefault("block_size", 16)
    kw.setdefault("max_model_len", 256)
    return Scheduler(["full"], **kw)


def test_kv_groups_describe_producing_and_shared_layers():
    s = Scheduler(["sliding:512", "full", "sliding:512", "shared:2", "shared:1"], num_blocks=[10, 20])
    assert s.kv_groups() == [
        {"kind": "sliding", "window": 512, "layers": [0, 2], "readers": [(3, 2)]},
        {"kind": "full", "window": None, "layers": [1], "readers": [(4, 1)]},
    ]
    assert s.stats()["blocks_total"] == (10 - 1) + (20 - 1)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"layer_kinds": ["ful"]}, "layer_kinds\\[0\\]"),
        ({"layer_kinds": ["sliding:0"]}, "sliding:W"),
        ({"layer_kinds": ["full", "shared:5"]}, "donor 5"),
        ({"num_blocks": [8, 8]}, "one per group"),
        ({"num_blocks": "x"}, "num_blocks"),
        ({"policy": "lifo"}, "fcfs"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"token_capture_sizes": [8, 4]}, "token_capture_sizes"),
    ],
)
def test_bad_configuration_raises_value_error_naming_the_field(kw, match):
    args = {"layer_kinds": ["full"], "num_blocks": 8} | kw
    with pytest.raises(ValueError, match=match):
        Scheduler(args.pop("layer_kinds"), **args)


def test_bad_requests_raise_value_error_and_change_nothing():
    s = small()
    with pytest.raises(ValueError, match="empty"):
        s.add_request(1, [], max_tokens=4)
    with pytest.raises(ValueError, match="prompt\\[1\\] = -3"):
        s.add_request(1, np.array([4, -3], dtype=np.int32), max_tokens=4)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request(1, [1] * 257, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        s.add_request(1, [1, 2], max_tokens=0)
    with pytest.raises(ValueError, match="prompt"):
        s.add_request(1, "hello", max_tokens=2)
    s.add_request(1, np.array([1, 2], dtype=np.uint32), max_tokens=2)
    with pytest.raises(ValueError, match="already live"):
        s.add_request(1, [1, 2], max_tokens=2)
    assert s.num_unfinished == 1
    s.check_invariants()


def test_a_request_the_pool_can_never_hold_raises_capacity_error():
    s = small(num_blocks=5)  # 4 usable blocks = 64 tokens
    with pytest.raises(CapacityError, match="num_blocks"):
        s.add_request(1, [1] * 60, max_tokens=10)
    assert issubclass(CapacityError, ValueError)
    assert s.num_unfinished == 0


def test_protocol_misuse_raises_specific_errors():
    s = small()
    s.add_request(1, [1, 2, 3], max_tokens=4)
    s.schedule()
    with pytest.raises(RuntimeError, match="before update"):
        s.schedule()
    with pytest.raises(ValueError, match="expected 1 sampled"):
        s.update(np.array([1, 2], dtype=np.int32))
    with pytest.raises(ValueError, match="int32"):
        s.update(np.array([1.5]))
    with pytest.raises(ValueError, match="reason_code"):
        s.finish(1, 9)
    assert s.update(np.array([5], dtype=np.int32)).new_tokens.tolist() == [5]


def test_abort_and_finish_free_requests_in_any_state():
    s = small(num_blocks=10, max_num_batched_tokens=16)
    s.add_request(1, list(range(40)), max_tokens=4)  # chunked over 3 steps
    s.add_request(2, [3, 4], max_tokens=4)  # waiting behind it
    p = s.schedule()
    assert p.req_ids.tolist() == [1] and 1 in s and s.contains(2)
    assert s.abort(2) and not s.abort(2)
    s.update(np.zeros(p.num_samples, dtype=np.int32))
    assert s.finish(1, _core.FINISH_STOP_STRING)
    assert s.num_unfinished == 0
    st = s.stats()
    assert st["blocks_used"] == 0 and st["blocks_free"] == st["blocks_total"]


def test_abort_between_schedule_and_update_is_skipped():
    s = small()
    s.add_request(1, [1, 2, 3], max_tokens=4)
    s.add_request(2, [1, 2, 4], max_tokens=4)
    p = s.schedule()
    assert s.abort(1)
    out = s.update(np.array([50, 51], dtype=np.int32))
    assert out.req_ids.tolist() == [2] and out.new_tokens.tolist() == [51]
    s.check_invariants()
    assert p.req_ids.tolist() == [1, 2], "the old plan is unaffected"


def test_stats_report_queues_preemptions_and_every_kv_metric():
    s = small()
    keys = {"running", "waiting", "preemptions", "blocks_total", "blocks_free", "blocks_used", "blocks_cached",
            "prefix_query_tokens", "prefix_hit_tokens", "copies", "copied_tokens", "adoptions",
            "kv_events_published", "kv_events_dropped"}
    assert set(s.stats()) == keys
    prompt = list(range(100, 140))
    s.add_request(1, prompt, max_tokens=1)
    s.add_request(2, [9], max_tokens=3)
    assert s.stats()["waiting"] == 2
    s.update(np.array([7, 8], dtype=np.int32)) if s.schedule() else None
    s.add_request(3, prompt, max_tokens=1)
    p = s.schedule()
    assert p.admitted_num_cached.tolist() == [32]
    st = s.stats()
    assert st["running"] == 2 and st["prefix_hit_tokens"] == 32


def test_kv_events_and_prefix_cache_reset():
    s = small(enable_kv_events=True)
    s.add_request(1, list(range(100, 140)), max_tokens=1)
    s.schedule()
    assert s.reset_prefix_cache() is False, "blocks are referenced while the request runs"
    s.update(np.array([7], dtype=np.int32))
    events = s.take_kv_events()
    stored = [e for e in events if e["type"] == "stored"]
    assert stored and stored[0]["group"] == 0 and stored[0]["block_size"] == 16
    assert sum(len(e["hashes"]) for e in stored) == 2, "two full 16-token blocks of the 40-token prompt"
    assert s.take_kv_events() == []
    assert s.reset_prefix_cache() is True
    assert {"type": "all_cleared"} in s.take_kv_events()
    assert small().take_kv_events() == [], "events are off by default"


def test_siblings_wait_for_the_parent_prompt_and_reuse_it():
    s = small()
    prompt = list(range(200, 240))
    s.add_request(1, prompt, max_tokens=2)
    s.add_request(2, prompt, max_tokens=2, after=1)
    p = s.schedule()
    assert p.admitted_ids.tolist() == [1]
    s.update(np.array([5], dtype=np.int32))
    p = s.schedule()
    assert p.admitted_ids.tolist() == [2] and p.admitted_num_cached.tolist() == [32]


def test_prompt_logprobs_select_every_prompt_row_for_the_cross_decoder():
    s = small()
    s.add_request(1, [5, 6, 7, 8], max_tokens=2, prompt_logprobs=True)
    s.add_request(2, [5, 6, 7], max_tokens=2)
    p = s.schedule()
    assert p.cross_indices.tolist() == [0, 1, 2, 3, 6]
    assert p.cross_query_start_loc.tolist() == [0, 4, 5]
    assert p.logits_cross_pos.tolist() == [3, 4]


def test_schedule_releases_the_gil():
    # One long schedule() (admitting 150k requests, ~0.1 s) while another thread timestamps its
    # progress. Holding the GIL, Rust would let that thread run only at the call's edges (within a
    # switch interval); released, it runs throughout.
    n = 150_000
    s = small(max_num_seqs=n, max_num_batched_tokens=n, num_blocks=n + 1, max_model_len=16)
    for i in range(n):
        s.add_request(i, [i % 1000 + 16], max_tokens=2)
    stamps = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.02)
        start = time.perf_counter()
        p = s.schedule()
        end = time.perf_counter()
    finally:
        stop.set()
        t.join()
    assert p.num_rows == n
    edge = 2 * sys.getswitchinterval()
    assert end - start > 2 * edge, "the call is long enough to tell"
    inside = [x for x in stamps if start + edge < x < end - edge]
    assert inside, "another Python thread ran during schedule()"


def _allocated_blocks_per_step(num_requests):
    s = small(max_num_seqs=512, num_blocks=2048)
    for i in range(num_requests):
        s.add_request(i, [i % 500 + 16, 17, 18], max_tokens=100)
    m = MockExecutor(1000, first_token=16)
    for _ in range(3):  # warm up: prefill, then decodes
        s.update(m.sample(s.schedule()))
    deltas = []
    for _ in range(5):
        sampled = None
        before = sys.getallocatedblocks()
        p = s.schedule()
        arrays = [getattr(p, name) for name in ("input_ids", "positions", "slot_mapping", "query_start_loc",
                                                 "seq_lens", "logits_indices", "cross_indices", "dirty_rows")]
        sampled = m.sample(p)
        out = s.update(sampled)
        arrays += [out.req_ids, out.new_tokens, out.finish_reasons]
        deltas.append(sys.getallocatedblocks() - before)
        del p, out, arrays, sampled
    return min(deltas)


def test_python_objects_per_step_do_not_grow_with_the_batch():
    few, many = _allocated_blocks_per_step(4), _allocated_blocks_per_step(400)
    assert few < 200
    assert many <= few + 8, (few, many)
