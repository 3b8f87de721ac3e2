"""KV events from a live yoco-serve (``kv_events_config``, the engine behind ``--kv-events-config``):
what a prefix-aware router's indexer receives matches the prompts the server ran, from the default
(Python) server and from ``--frontend rust`` (whose step loop owns the scheduler and feeds the same
publisher)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import msgspec
import pytest
import zmq

from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import SHARED_ENGINE, CliServer, LiveServer

pytestmark = pytest.mark.timeout(240)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RustServer(CliServer):
    """``yoco-serve --frontend rust`` with ``metrics()`` as LiveServer has it (labels minus engine/model)."""

    def metrics(self) -> dict:
        out = {}
        for fam in text_string_to_metric_families(httpx.get(self.url + "/metrics", timeout=10).text):
            for s in fam.samples:
                labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))
                out[(s.name, labels)] = out.get((s.name, labels), 0) + s.value
        return out

    def stop(self):
        self.kill()


@pytest.fixture(scope="module", params=["python", "rust"])
def served(request):
    port = free_port()
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}",
           "topic": "kv@127.0.0.1:0@yoco-tiny", "encoding": "map"}
    if request.param == "python":
        srv = LiveServer(engine_kwargs={**SHARED_ENGINE, "kv_events_config": cfg}, metrics_prefix="vllm")
    else:
        srv = RustServer("--frontend", "rust", "--kv-cache-memory", "64MiB", "--max-model-len", "512",
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
