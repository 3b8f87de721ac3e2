"""What publishing KV events costs the step loop: scheduler step time (``schedule()`` + ``update()``
through the Python boundary, the strictest denominator: no model forward) at 256 running requests, with
events off vs collected by the core only ("log-only": its bounded log, never taken) vs on
(``start_kv_events``: the core's event log plus the Rust publisher's queue and thread,
a PUB socket bound on loopback, nobody subscribed, and once with a pyzmq subscriber process draining it).

Rounds alternate off/on inside one run (the machine is shared and noisy; compare the ratio). Every
request decodes (prompt lengths staggered over 64..79), so a sub-block of 16 completes every 16 steps
per request: 256 requests announce 16 wire blocks per step on average, as in a steady decode-heavy
server. Figures are mean step times, the median of the rounds.

    .venv/bin/python benches/kv_events_cost.py [--steps 2000] [--rounds 3] [--sub-block 16]
    .venv/bin/python benches/kv_events_cost.py --engine [--steps 200] [--rounds 3]   (the whole engine step)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from yoco_rs._core import Scheduler  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(mode: str, steps: int, sub: int, n: int = 256) -> tuple[float, float, dict]:
    """Mean step time (µs, wall and CPU time of the step thread) after warm-up (the mean: sub-block
    boundary steps carry the cost), and the publisher's counters. The CPU time leaves out what other
    threads and processes take from the step thread on a loaded machine; the publisher thread's own
    work shows up in the wall time only when it competes for a core."""
    s = Scheduler(["full"], num_blocks=n * ((64 + steps + 100) // 16 + 2) + 64, block_size=16, sub_block_size=sub, max_num_seqs=n,
                  max_num_batched_tokens=8192, max_model_len=4096, enable_kv_events=mode != "off")
    sub_proc = None
    if mode not in ("off", "log-only"):
        port = free_port()
        s.start_kv_events(f"tcp://*:{port}", encoding="map")
        if mode == "on+subscriber":
            # A subscriber in its own process, as a router is (in-process, its Python thread would
            # contend for the GIL with the step loop and measure that instead).
            code = ("import zmq,sys; c=zmq.Context(); so=c.socket(zmq.SUB); so.setsockopt(zmq.SUBSCRIBE,b''); "
                    f"so.connect('tcp://127.0.0.1:{port}'); n=0\n"
                    "while True:\n if so.poll(200): so.recv_multipart(); n+=1\n")
            sub_proc = subprocess.Popen([sys.executable, "-c", code])
            time.sleep(1.0)
    rng = np.random.default_rng(0)
    for i in range(n):
        s.add_request(i + 1, rng.integers(10, 30000, 64 + i % 16).tolist(), max_tokens=steps + 100, ignore_eos=True)
    times = []
    for step in range(steps + 50):
        if step == 50:
            cpu0 = time.thread_time_ns()
        t = time.perf_counter_ns()
        plan = s.schedule()
        s.update(np.full(int(plan.num_samples), 7, dtype=np.int32))
        if step >= 50:
            times.append(time.perf_counter_ns() - t)
    cpu_us = (time.thread_time_ns() - cpu0) / steps / 1e3
    stats = s.kv_events_stats()
    s.stop_kv_events()
    if sub_proc:
        sub_proc.kill()
        sub_proc.wait(5)
    return statistics.fmean(times) / 1e3, cpu_us, stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sub-block", type=int, default=16)
    ap.add_argument("--engine", action="store_true",
                    help="time Engine.step() of the bundled CPU model at 256 running requests instead")
    a = ap.parse_args()
    if a.engine:
        return engine_main(min(a.steps, 200), a.rounds)
    res: dict[str, list[float]] = {"off": [], "log-only": [], "on": [], "on+subscriber": []}
    cpu: dict[str, list[float]] = {m: [] for m in res}
    for r in range(a.rounds):
        for mode in res:
            us, cpu_us, st = run(mode, a.steps, a.sub_block)
            res[mode].append(us)
            cpu[mode].append(cpu_us)
            print(f"round {r} {mode:14s} mean step {us:8.1f} us wall {cpu_us:8.1f} us cpu  "
                  f"{st if mode not in ('off', 'log-only') else ''}", flush=True)
    off, off_cpu = statistics.median(res["off"]), statistics.median(cpu["off"])
    for mode, v in res.items():
        m, c = statistics.median(v), statistics.median(cpu[mode])
        print(f"{mode:14s} median of rounds {m:8.1f} us/step wall (ratio to off {m / off:.3f}), "
              f"{c:8.1f} us/step step-thread cpu (ratio {c / off_cpu:.3f})")


def engine_run(events: bool, steps: int, n: int = 256) -> float:
    """Mean ``Engine.step()`` time (ms) of the bundled CPU model at ``n`` running decodes."""
    from yoco_rs import Engine, SamplingParams

    kw = dict(max_num_seqs=n, max_model_len=512, kv_cache_memory=512 << 20, seed=0)
    if events:
        kw["kv_events_config"] = {"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": f"tcp://*:{free_port()}", "encoding": "map"}
    eng = Engine(None, **kw)
    sp = SamplingParams(max_tokens=steps + 40, ignore_eos=True, temperature=0.0)
    for i in range(n):
        eng.add_request(str(i), list(range(100 + i % 16, 164 + 2 * (i % 8))), sp)
    times = []
    for k in range(steps + 20):
        t = time.perf_counter_ns()
        eng.step()
        if k >= 20:
            times.append(time.perf_counter_ns() - t)
    eng.close()
    return statistics.fmean(times) / 1e6


def engine_main(steps: int, rounds: int) -> None:
    res: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for ev in (False, True):
            ms = engine_run(ev, steps)
            res[ev].append(ms)
            print(f"round {r} engine events {'on ' if ev else 'off'} mean step {ms:8.2f} ms", flush=True)
    off, on = statistics.median(res[False]), statistics.median(res[True])
    print(f"engine step, 256 running: off {off:.2f} ms, on {on:.2f} ms, ratio {on / off:.3f}")


if __name__ == "__main__":
    main()
