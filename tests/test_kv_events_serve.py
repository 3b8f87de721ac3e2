"""KV events from a live yoco-serve (``kv_events_config``, the engine behind ``--kv-events-config``):
what a prefix-aware router's indexer receives matches the prompts the server ran (the Rust step loop
owns the scheduler and feeds the publisher)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import msgspec
import pytest
import zmq

from serve_helpers import RustServer

pytestmark = pytest.mark.timeout(240)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    port = free_port()
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}",
           "topic": "kv@127.0.0.1:0@yoco-tiny", "encoding": "map"}
    srv = RustServer("--kv-cache-memory", "64MiB", "--max-model-len", "512",
                     "--metrics-prefix", "vllm", "--kv-events-config", json.dumps(cfg))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(f"tcp://127.0.0.1:{port}")
    yield srv, sub
    sub.close(linger=0)
    ctx.term()
    srv.stop()


def complete(srv, prompt):
    r = httpx.post(srv.url + "/v1/completions", json={"model": "yoco-tiny", "prompt": prompt, "max_tokens": 1},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_served_prompts_are_announced_block_by_block_with_their_tokens(served):
    srv, sub = served
    # The slow joiner: send distinct prompts until the subscription is live.
    deadline = time.monotonic() + 60
    i = 0
    while not sub.poll(200):
        assert time.monotonic() < deadline, "no KV events reached the subscriber"
        complete(srv, [100 + i] * 40)
        i += 1
    while sub.poll(500):
        sub.recv_multipart()
    prompt = list(range(1000, 1050))  # 50 tokens: 3 full wire blocks of 16
    complete(srv, prompt)
    stored_tokens, seen = [], []
    while sub.poll(2000):
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv@127.0.0.1:0@yoco-tiny"
        seen.append(int.from_bytes(seq, "big"))
        for e in msgspec.msgpack.decode(payload)[1]:
            if e["type"] == "BlockStored":
                assert e["block_size"] == 16 and len(e["token_ids"]) == 16 * len(e["block_hashes"])
                stored_tokens += e["token_ids"]
    assert stored_tokens[:48] == prompt[:48], "the prompt's full blocks, in order, with their tokens"
    assert seen == list(range(seen[0], seen[0] + len(seen))), "no gap in seq"
    m = srv.metrics()
    assert m[("vllm:prefix_cache_queries_total", frozenset())] > 0
    assert m[("yoco:kv_events_published_total", frozenset())] >= len(seen)
    assert m[("yoco:kv_events_dropped_total", frozenset())] == 0
    assert ("vllm:num_requests_waiting", frozenset()) in m and ("vllm:kv_cache_usage_perc", frozenset()) in m


def test_each_data_parallel_loop_publishes_on_its_own_endpoint_with_its_rank():
    """``--data-parallel-size 2``: rank r binds the endpoint's port + r (vLLM's convention) and tags its
    batches ``data_parallel_rank`` r, so an indexer learns which loop holds which blocks. Distinct
    prompts in turn reach both loops (ties in load go round-robin)."""
    for _ in range(20):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                break
            except OSError:
                continue
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}",
           "topic": "kv", "encoding": "map"}
    srv = RustServer("--data-parallel-size", "2", "--kv-cache-memory", "32MiB",
                     "--max-model-len", "512", "--kv-events-config", json.dumps(cfg))
    ctx = zmq.Context()
    subs = []
    try:
        for p in (port, port + 1):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"kv")
            sub.connect(f"tcp://127.0.0.1:{p}")
            subs.append(sub)
        ranks: list[set] = [set(), set()]
        stored: list[list[int]] = [[], []]

        def drain(wait_ms: int) -> None:
            for r, sub in enumerate(subs):
                while sub.poll(wait_ms):
                    _, _, payload = sub.recv_multipart()
                    batch = msgspec.msgpack.decode(payload)
                    ranks[r].add(batch[2])
                    stored[r] += [t for e in batch[1] if e["type"] == "BlockStored" for t in e["token_ids"]]

        deadline = time.monotonic() + 90
        i = 0
        while not (ranks[0] and ranks[1]):
            assert time.monotonic() < deadline, f"events reached rank 0: {bool(ranks[0])}, rank 1: {bool(ranks[1])}"
            complete(srv, [100 + i] * 40)
            i += 1
            drain(200)
        assert ranks == [{0}, {1}], "each endpoint carries its own loop's rank"
        drain(500)
        for k in range(2):  # two fresh prompts in a row: one per loop
            complete(srv, list(range(2000 + 100 * k, 2048 + 100 * k)))
        stored = [[], []]
        drain(2000)
        fresh = [sorted({t // 100 for t in s if t >= 2000}) for s in stored]
        assert sorted(fresh) == [[20], [21]], f"each fresh prompt's blocks on exactly one endpoint: {fresh}"
    finally:
        for sub in subs:
            sub.close(linger=0)
        ctx.term()
        srv.stop()


def test_data_parallel_endpoints_follow_vllm_s_offset_convention():
    from yoco_rs.kv_events import KVEventsConfig, offset_endpoint

    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("tcp://10.0.0.1:7000", 1) == "tcp://10.0.0.1:7001"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    assert offset_endpoint(None, 3) is None
    with pytest.raises(ValueError, match="no port"):
        offset_endpoint("tcp://host", 1)
    with pytest.raises(ValueError, match="exceeds 65535"):
        offset_endpoint("tcp://*:65535", 1)
    c = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", replay_endpoint="tcp://*:6000",
                       data_parallel_rank=4).for_rank(1)
    assert (c.endpoint, c.replay_endpoint, c.data_parallel_rank) == ("tcp://*:5558", "tcp://*:6001", 5)
