"""Replicas of yoco-serve behind the real vllm-router (PyPI ``vllm-router``, a Rust binary): requests
sharing a prefix land on the replica that caches it, judged by the replicas' own prefix-cache hit
counters (``vllm:prefix_cache_hits_total``); a killed replica is routed around; nothing leaks.

Default: 2 replicas, ``kv_aware`` (events) and ``cache_aware``; ``YOCO_HEAVY=1`` adds a third replica and
more requests per prefix family."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from conftest import heavy
from serve_helpers import CliServer

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

NUM_REPLICAS = 3 if heavy() else 2
PER_FAMILY = 8 if heavy() else 4
FAMILIES = ["alpha " * 120, "bravo " * 120, "charlie " * 120][:NUM_REPLICAS]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    """N yoco-serve replicas, each publishing KV events (map encoding, what vllm-router decodes)."""

    def __init__(self, n: int):
        self.replicas: list[CliServer] = []
        self.event_ports: list[int] = []
        try:
            for _ in range(n):
                ev = free_port()
                cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}",
                       "encoding": "map"}
                self.replicas.append(CliServer("--port", str(free_port()), "--kv-cache-memory", "64MiB",
                                               "--max-model-len", "512", "--max-num-seqs", "8",
                                               "--metrics-prefix", "vllm", "--kv-events-config", json.dumps(cfg)))
                self.event_ports.append(ev)
        except BaseException:
            self.close()
            raise

    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def metric(self, i: int, name: str) -> float:
        text = httpx.get(self.replicas[i].url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[-1])
        raise KeyError(name)

    def hits(self) -> list[float]:
        return [self.metric(i, "vllm:prefix_cache_hits_total") if self.replicas[i].proc.poll() is None else 0.0
                for i in range(len(self.replicas))]

    def close(self) -> None:
        for r in self.replicas:
            r.kill()


class Router:
    def __init__(self, fleet: Fleet, policy: str):
        self.port = free_port()
        exe = os.path.join(os.path.dirname(sys.executable), "vllm-router")
        args = [exe, "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *fleet.urls(),
                "--policy", policy, "--log-level", "warning", "--prometheus-port", str(free_port())]
        if policy == "kv_aware":
            args += ["--kv-event-block-size", "16", "--kv-event-model", "yoco-tiny"]
            for url, ev in zip(fleet.urls(), fleet.event_ports):
                args += ["--kv-event-source", f"{url}=tcp://127.0.0.1:{ev}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.monotonic() < deadline, "vllm-router did not come up"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def complete(self, prompt: str) -> httpx.Response:
        return httpx.post(self.url + "/v1/completions", json={"model": "yoco-tiny", "prompt": prompt,
                                                              "max_tokens": 2}, timeout=120)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def fleet():
    f = Fleet(NUM_REPLICAS)
    yield f
    f.close()


def direct(fleet: Fleet, i: int, prompt: str) -> None:
    r = httpx.post(fleet.replicas[i].url + "/v1/completions", json={"model": "yoco-tiny", "prompt": prompt,
                                                                   "max_tokens": 1}, timeout=120)
    assert r.status_code == 200, r.text


def served_by(fleet: Fleet, send) -> int:
    """Sends one request and returns the replica whose prefix-hit counter moved (-1: none did)."""
    before = fleet.hits()
    r = send()
    assert r.status_code == 200, r.text
    after = fleet.hits()
    moved = [i for i, (a, b) in enumerate(zip(before, after)) if b > a]
    assert len(moved) <= 1
    return moved[0] if moved else -1


def assert_idle(fleet: Fleet) -> None:
    for i, r in enumerate(fleet.replicas):
        if r.proc.poll() is not None:
            continue
        deadline = time.monotonic() + 30
        while True:
            busy = [fleet.metric(i, n) for n in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                                 "yoco:kv_blocks_used")]
            if not any(busy):
                break
            assert time.monotonic() < deadline, f"replica {i} not idle: running/waiting/blocks_used = {busy}"
            time.sleep(0.1)


def test_kv_aware_routes_each_prefix_to_the_replica_whose_events_announced_it(fleet):
    router = Router(fleet, "kv_aware")
    try:
        time.sleep(2.0)  # the router's SUB sockets connect (a PUB keeps nothing for late subscribers)
        # Warm family k on replica k directly: only the replicas' KV events tell the router where it is.
        for k, fam in enumerate(FAMILIES):
            direct(fleet, k, fam + "warm-up")
        time.sleep(1.0)
        landed = {k: [served_by(fleet, lambda fam=fam, j=j: router.complete(fam + f" question {j}"))
                      for j in range(PER_FAMILY)] for k, fam in enumerate(FAMILIES)}
        assert landed == {k: [k] * PER_FAMILY for k in range(len(FAMILIES))}, landed
    finally:
        router.close()
    assert_idle(fleet)


def test_cache_aware_keeps_each_prefix_on_one_replica(fleet):
    router = Router(fleet, "cache_aware")
    try:
        fams = [f"{w} " * 120 for w in ("delta", "echo", "foxtrot")[:NUM_REPLICAS]]
        for fam in fams:
            assert router.complete(fam + "first").status_code == 200  # the router's tree learns the prefix
        for fam in fams:
            homes = {served_by(fleet, lambda fam=fam, j=j: router.complete(fam + f" question {j}"))
                     for j in range(PER_FAMILY)}
            assert len(homes) == 1 and -1 not in homes, f"{fam[:6]}: hits on replicas {homes}"
    finally:
        router.close()
    assert_idle(fleet)


def test_a_killed_replica_is_routed_around_and_nothing_leaks(fleet):
    router = Router(fleet, "kv_aware")
    try:
        time.sleep(2.0)
        victim = len(fleet.replicas) - 1
        fleet.replicas[victim].kill()
        # The router notices through failed requests / health checks; allow a short grace, then every
        # request must succeed on a living replica.
        deadline = time.monotonic() + 60
        ok_streak = 0
        while ok_streak < 2 * PER_FAMILY:
            assert time.monotonic() < deadline, "requests kept failing after a replica died"
            r = router.complete(FAMILIES[victim] + f" after the kill {ok_streak}")
            ok_streak = ok_streak + 1 if r.status_code == 200 else 0
    finally:
        router.close()
    assert_idle(fleet)
