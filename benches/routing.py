"""Prefix-aware routing across replicas: a multi-tenant, prefix-heavy workload (P system prompts x U
users, each user one question after its tenant's system prompt, Poisson arrivals) through 3 replicas
of the bundled CPU model, routed by round robin, vllm-router ``cache_aware``, vllm-router ``kv_aware``
(fed by the replicas' KV events) and Ray Serve's prefix-cache-affinity router
(``yoco_rs.serve.ray``), against one replica with the fleet's whole KV pool holding all traffic (the
hit rate a perfect router could reach).

Per configuration: the prefix-cache hit rate (cached prompt tokens / prompt tokens, from every
response's ``usage.prompt_tokens_details.cached_tokens``) and TTFT p50/p95 (request sent to first SSE
chunk, measured by the client). Every configuration gets fresh replicas (cold caches), 2 untimed
warm-up requests per replica that share no block with the workload, then the same request schedule. Each replica's KV pool holds about 3 system prompts plus the working set
(``--blocks``), so a router that scatters a tenant over the fleet makes replicas evict each other's
tenants; the single replica gets 3x the blocks.

    .venv/bin/python benches/routing.py [--prompts 8 --users 32 --system-words 225 --question-words 23
                                         --rate 3 --blocks 260 --max-model-len 2048]

(A "wN" word is about 4.4 tokens of the bundled tokenizer: 225 words ~ 1,000 tokens, 23 ~ 100.)

Kills every process it starts (replicas, routers, the local Ray cluster), also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from serve_helpers import CliServer  # noqa: E402

MODEL = "yoco-tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workload(a) -> list[tuple[float, str]]:
    """(arrival time in s, prompt) for every request, the same for every configuration."""
    rng = np.random.default_rng(a.seed)
    words = [f"w{i}" for i in range(2000)]
    systems = [" ".join(rng.choice(words, a.system_words)) for _ in range(a.prompts)]
    reqs = [(p, " ".join(rng.choice(words, a.question_words))) for p in range(a.prompts) for _ in range(a.users)]
    order = rng.permutation(len(reqs))
    t = np.cumsum(rng.exponential(1.0 / a.rate, len(reqs)))
    return [(float(t[i]), f"System {p}: {systems[p]}\nUser: {q}\nAssistant:")
            for i, (p, q) in enumerate(reqs[j] for j in order)]


async def one(client: httpx.AsyncClient, url: str, at: float, t0: float, prompt: str, max_tokens: int) -> dict:
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, usage = None, None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"{r.status_code} {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - start
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
    cached = int(((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {"ttft": ttft, "prompt": int((usage or {}).get("prompt_tokens", 0)), "cached": cached}


async def drive(url: str, reqs: list[tuple[float, str]], max_tokens: int, warmup: int) -> dict:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=1000)) as client:
        # Untimed warm-up with prompts that share no block with the workload: the first calls through
        # a fresh path pay one-off costs (Ray's handle and router start-up took seconds).
        for i in range(warmup):
            r = await one(client, url, 0.0, time.perf_counter(), f"Warm-up {i} " + "x " * 20, 1)
            assert "error" not in r, r
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one(client, url, at, t0, p, max_tokens) for at, p in reqs))
        wall = time.perf_counter() - t0
    errors = [r["error"] for r in res if "error" in r]
    ok = [r for r in res if "error" not in r]
    ttft = sorted(r["ttft"] for r in ok)
    prompt, cached = sum(r["prompt"] for r in ok), sum(r["cached"] for r in ok)
    return {"requests": len(ok), "errors": len(errors), "first_error": errors[0] if errors else None,
            "hit_rate": cached / max(prompt, 1), "prompt_tokens": prompt, "cached_tokens": cached,
            "ttft_p50_ms": 1e3 * statistics.median(ttft) if ttft else float("nan"),
            "ttft_p95_ms": 1e3 * ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))] if ttft else float("nan"),
            "wall_s": wall}


def replica_flags(a, blocks: int, events_port: int | None = None) -> list[str]:
    flags = ["--num-gpu-blocks-override", str(blocks), "--max-model-len", str(a.max_model_len),
             "--max-num-seqs", "16", "--metrics-prefix", "vllm"]
    if events_port is not None:
        flags += ["--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                    "endpoint": f"tcp://*:{events_port}", "encoding": "map"})]
    return flags


class Fleet:
    """Fresh replicas (started one after another: engines building at once starve a 2-core box)."""

    def __init__(self, a, n: int, blocks: int):
        self.replicas: list[CliServer] = []
        self.event_ports: list[int] = []
        try:
            for _ in range(n):
                ev = free_port()
                self.replicas.append(CliServer(*replica_flags(a, blocks, ev), timeout=300))
                self.event_ports.append(ev)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for r in self.replicas:
            r.kill()


class Router:
    """The real vllm-router (PyPI ``vllm-router``) in front of a fleet."""

    def __init__(self, fleet: Fleet, policy: str):
        exe = os.path.join(os.path.dirname(sys.executable), "vllm-router")
        self.port = free_port()
        args = [exe, "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls",
                *[r.url for r in fleet.replicas], "--policy", policy, "--log-level", "warning",
                "--prometheus-port", str(free_port())]
        if policy == "kv_aware":
            args += ["--kv-event-block-size", "16", "--kv-event-model", MODEL]
            for r, ev in zip(fleet.replicas, fleet.event_ports):
                args += ["--kv-event-source", f"{r.url}=tcp://127.0.0.1:{ev}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"vllm-router --policy {policy} did not come up")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        time.sleep(2.0)  # kv_aware: the router's SUB sockets connect before the first event

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def run_single(a, reqs) -> dict:
    r = CliServer(*replica_flags(a, 3 * a.blocks), timeout=300)
    try:
        return asyncio.run(drive(r.url, reqs, a.max_tokens, 2 * a.replicas))
    finally:
        r.kill()


def run_router(a, reqs, policy: str) -> dict:
    fleet = Fleet(a, a.replicas, a.blocks)
    try:
        router = Router(fleet, policy)
        try:
            return asyncio.run(drive(router.url, reqs, a.max_tokens, 2 * a.replicas))
        finally:
            router.close()
    finally:
        fleet.close()


def run_ray(a, reqs) -> dict:
    os.environ.setdefault("RAY_agent_register_timeout_ms", "180000")
    os.environ.setdefault("RAY_enable_metrics_collection", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from yoco_rs.serve.ray import build_app

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        flags = ["--num-gpu-blocks-override", str(a.blocks), "--max-model-len", str(a.max_model_len),
                 "--max-num-seqs", "16"]
        serve.run(build_app(None, num_replicas=a.replicas, serve_args=flags, num_cpus=0.5), name="yoco",
                  route_prefix="/")
        return asyncio.run(drive(f"http://127.0.0.1:{port}", reqs, a.max_tokens, 2 * a.replicas))
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--system-words", type=int, default=225)
    ap.add_argument("--question-words", type=int, default=23)
    ap.add_argument("--rate", type=float, default=3.0, help="Poisson arrivals per second")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=260, help="KV blocks (16 tokens) per replica")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="single,round_robin,cache_aware,kv_aware,ray")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    reqs = workload(a)
    print(f"{len(reqs)} requests over {reqs[-1][0]:.0f} s; {a.replicas} replicas x {a.blocks} blocks", flush=True)
    results = {}
    for cfg in a.configs.split(","):
        t = time.perf_counter()
        if cfg == "single":
            res = run_single(a, reqs)
        elif cfg == "ray":
            res = run_ray(a, reqs)
        else:
            res = run_router(a, reqs, cfg)
        res["config_s"] = time.perf_counter() - t
        results[cfg] = res
        print(cfg, json.dumps(res), flush=True)
    base, rr = results.get("single"), results.get("round_robin")
    print(f"\n| routing | hit rate | vs one replica | TTFT p50 ms | vs round robin | TTFT p95 ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for cfg, r in results.items():
        vs_base = f"{r['hit_rate'] / base['hit_rate']:.2f}x" if base and base["hit_rate"] else ""
        vs_rr = f"{r['ttft_p50_ms'] / rr['ttft_p50_ms']:.2f}x" if rr else ""
        print(f"| {cfg} | {r['hit_rate']:.3f} | {vs_base} | {r['ttft_p50_ms']:.0f} | {vs_rr} | "
              f"{r['ttft_p95_ms']:.0f} | {r['errors']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
