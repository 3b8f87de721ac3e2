"""KV events on the wire: the Rust publisher (crates/yoco-events) against pyzmq and msgspec, the
independent reference implementations vLLM's own subscribers use."""

from __future__ import annotations

import socket
import time
from typing import Any, Optional

import msgspec
import numpy as np
import pytest
import zmq

from yoco_rs import _core
from yoco_rs.kv_events import KVEventsConfig

pytestmark = pytest.mark.timeout(60)


# vLLM's structs (vllm/distributed/kv_events.py), array form.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


ARRAY_DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scheduler(block_size=8, sub_block_size=8, **kw):
    return _core.Scheduler(["full"], num_blocks=64, block_size=block_size, sub_block_size=sub_block_size,
                           max_model_len=256, enable_kv_events=True, **kw)


def run_prompt(s, req_id: int, prompt: list[int]) -> None:
    s.add_request(req_id, prompt, max_tokens=1)
    plan = s.schedule()
    s.update(np.full(int(plan.num_samples), 7, dtype=np.int32))


class Subscriber:
    """A pyzmq SUB socket that waits until the publisher sees it (the slow-joiner problem): it pokes
    the scheduler with prefix-cache resets (each one an AllBlocksCleared batch) until one arrives."""

    def __init__(self, ctx, port: int, topic: bytes, s) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "no batch reached the subscriber"
            s.reset_prefix_cache()
            if self.sock.poll(100):
                self.last_seq = int.from_bytes(self.recv()[1], "big")
                break
        while self.sock.poll(200):  # drain the other pokes
            self.last_seq = int.from_bytes(self.recv()[1], "big")

    def recv(self) -> list[bytes]:
        frames = self.sock.recv_multipart()
        assert len(frames) == 3, "[topic, seq, payload]"
        return frames

    def next_batch(self, timeout_ms: int = 5000) -> tuple[bytes, int, bytes]:
        assert self.sock.poll(timeout_ms), "no batch arrived"
        topic, seq, payload = self.recv()
        assert len(seq) == 8
        return topic, int.from_bytes(seq, "big"), payload


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_stored_events_reach_a_pyzmq_subscriber_in_vllms_array_format(ctx):
    port = free_port()
    s = scheduler(block_size=8, sub_block_size=8)
    s.start_kv_events(f"tcp://*:{port}", topic="kv@host:1@m", block_size=4)
    sub = Subscriber(ctx, port, b"kv@host:1@m", s)
    prompt = list(range(100, 125))  # 25 tokens: 3 full sub-blocks of 8 = 6 wire blocks of 4
    run_prompt(s, 1, prompt)
    topic, seq, payload = sub.next_batch()
    assert topic == b"kv@host:1@m"
    assert seq == sub.last_seq + 1, "seq counts batches one by one"
    batch = ARRAY_DECODER.decode(payload)
    assert abs(batch.ts - time.time()) < 30 and batch.data_parallel_rank is None
    stored = [e for e in batch.events if isinstance(e, BlockStored)]
    assert [e.block_size for e in stored] == [4] * len(stored)
    assert stored[0].parent_block_hash is None, "the chain starts at the prompt's first block"
    hashes = [h for e in stored for h in e.block_hashes]
    tokens = [t for e in stored for t in e.token_ids]
    assert len(hashes) == 6 and len(set(hashes)) == 6
    assert tokens == prompt[:24], "token_ids are the full wire blocks' tokens, in order"
    assert all(e.medium == "GPU" and e.lora_id is None for e in stored)
    st = s.kv_events_stats()
    assert st["dropped"] == 0 and st["published"] >= 2
    s.stop_kv_events()


def test_map_encoding_tags_each_event_by_type(ctx):
    port = free_port()
    s = scheduler(block_size=16, sub_block_size=16)
    s.start_kv_events(f"tcp://*:{port}", encoding="map", data_parallel_rank=2)
    sub = Subscriber(ctx, port, b"", s)
    run_prompt(s, 1, list(range(40)))
    _, _, payload = sub.next_batch()
    ts, events, rank = msgspec.msgpack.decode(payload)
    assert rank == 2 and isinstance(ts, float)
    assert events[0]["type"] == "BlockStored"
    assert events[0]["block_size"] == 16 and events[0]["token_ids"] == list(range(32))
    assert set(events[0]) == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                              "medium", "lora_name"}
    s.stop_kv_events()


def test_replay_socket_returns_buffered_batches_then_end_marker(ctx):
    port, replay_port = free_port(), free_port()
    s = scheduler()
    s.start_kv_events(f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay_port}", buffer_steps=3,
                      block_size=8)
    for i in range(5):  # 5 batches with nobody listening; the buffer keeps the last 3 (seq 2, 3, 4)
        run_prompt(s, i + 1, [i * 1000 + t for t in range(16)])
    deadline = time.monotonic() + 10
    while s.kv_events_stats()["published"] < 5:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    got = []
    while True:
        assert dealer.poll(5000), "replay answered"
        empty, seq, payload = dealer.recv_multipart()
        assert empty == b""
        if seq == (-1).to_bytes(8, "big", signed=True):
            assert payload == b""
            break
        got.append((int.from_bytes(seq, "big"), ARRAY_DECODER.decode(payload)))
    assert [g[0] for g in got] == [2, 3, 4]
    assert all(isinstance(g[1].events[0], BlockStored) for g in got)
    s.stop_kv_events()


def test_evictions_are_published_as_removals_of_the_announced_wire_hashes(ctx):
    port = free_port()
    s = _core.Scheduler(["full"], num_blocks=5, block_size=8, sub_block_size=8, max_model_len=32,
                        enable_kv_events=True)
    s.start_kv_events(f"tcp://*:{port}", block_size=4)
    sub = Subscriber(ctx, port, b"", s)
    stored: set[int] = set()
    removed: set[int] = set()
    for i in range(6):  # 4 usable blocks: later prompts evict earlier cache
        run_prompt(s, i + 1, [i * 100 + t for t in range(17)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sub.sock.poll(300):
        for e in ARRAY_DECODER.decode(sub.recv()[2]).events:
            if isinstance(e, BlockStored):
                stored.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                removed.update(e.block_hashes)
    assert removed, "eviction was published"
    assert removed <= stored, "every removed hash had been announced"
    s.stop_kv_events()


def test_bad_settings_fail_at_start_with_a_clear_message():
    s = scheduler(block_size=8, sub_block_size=8)
    with pytest.raises(ValueError, match="block_size 16 must divide .* 8"):
        s.start_kv_events(f"tcp://*:{free_port()}", block_size=16)
    with pytest.raises(ValueError, match="encoding"):
        s.start_kv_events(f"tcp://*:{free_port()}", encoding="json")
    with pytest.raises(ValueError, match="enable_kv_events"):
        _core.Scheduler(["full"], num_blocks=8).start_kv_events("tcp://*:5557")
    port = free_port()
    s.start_kv_events(f"tcp://*:{port}", block_size=8)
    with pytest.raises(ValueError, match="bind"):
        scheduler().start_kv_events(f"tcp://*:{port}", block_size=8)
    s.stop_kv_events()


def test_kv_events_config_takes_vllms_keys_and_names_a_bad_one():
    cfg = KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",'
                               ' "replay_endpoint": "tcp://*:5558", "buffer_steps": 10, "hwm": 5, "topic": "kv"}')
    assert cfg.active and cfg.replay_endpoint == "tcp://*:5558" and cfg.block_size == 16
    assert not KVEventsConfig.parse({"enable_kv_cache_events": True}).active, "vLLM: publisher 'null' by default"
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['endpont'\]"):
        KVEventsConfig.parse({"endpont": "tcp://*:1"})
    with pytest.raises(ValueError, match="kv_events_config.buffer_steps"):
        KVEventsConfig.parse({"buffer_steps": -1})
    with pytest.raises(ValueError, match="not valid JSON"):
        KVEventsConfig.parse("{")


def test_yoco_serve_rejects_a_bad_kv_events_config_at_startup_naming_the_key():
    import os
    import subprocess
    import sys

    exe = os.path.join(os.path.dirname(sys.executable), "yoco-serve")
    r = subprocess.run([exe, "--port", "0", "--disable-progress", "--kv-events-config", '{"endpont": "tcp://*:1"}'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "kv_events_config: unknown key(s) ['endpont']" in r.stderr
