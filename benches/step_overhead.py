"""Scheduler cost per engine step *through the Python boundary* (``yoco_rs._core``), over the shared
``peer-bench-workload/1`` workloads: the same keys as the peers' benches and the Rust harness
(``benches/rust/sched_workloads.rs``), timed with ``time.thread_time_ns()`` like the peers.

Per step we time ``plan = s.schedule()`` + ``out = s.update(sampled)`` ("step"), and additionally the
attribute accesses an executor and engine make on them ("step+arrays": 11 plan arrays, 3 outcome
arrays). The mock executor's sampling is not timed (the peers' fake runners were not either).

    .venv/bin/python benches/step_overhead.py [WORKLOAD ...] [--dir DIR] [--repeat N] [--json FILE]
        [--layout full|gemma3n] [--no-prefix-caching]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import numpy as np  # noqa: E402
from workload import EOS_TOKEN, FIRST_TOKEN, load_workload  # noqa: E402

from yoco_rs._core import MockExecutor, Scheduler  # noqa: E402

PLAN_ARRAYS = ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "logits_indices",
               "cross_indices", "cross_query_start_loc", "req_rows", "dirty_rows", "kv_copies")
OUT_ARRAYS = ("req_ids", "new_tokens", "finish_reasons")


def gemma3n_layers() -> list[str]:
    kinds = []
    for i in range(30):
        full = i % 5 == 4
        if i < 20:
            kinds.append("full" if full else "sliding:512")
        else:
            kinds.append(f"shared:{19 if full else 18}")
    return kinds


def summarize(ns: list[int]) -> dict:
    if not ns:
        return {"n": 0}
    s = sorted(ns)
    n = len(s)

    def pct(p):
        return s[max(1, math.ceil(p / 100 * n)) - 1] / 1e3

    total = sum(s)
    return {"n": n, "mean_us": round(total / n / 1e3, 2), "p50_us": round(pct(50), 2), "p99_us": round(pct(99), 2),
            "total_s": round(total / 1e9, 4)}


def run(wl, layers, prefix_caching: bool) -> dict:
    eng = wl.engine
    bs = int(eng.get("block_size", 16))
    max_num_seqs = int(eng.get("max_num_seqs", 256))
    num_blocks = int(eng.get("num_blocks", sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // bs) for r in wl.requests) + 64))
    max_model_len = -(-wl.max_seq_len // bs) * bs
    s = Scheduler(layers, num_blocks=num_blocks, block_size=bs, max_num_seqs=max_num_seqs,
                  max_num_batched_tokens=int(eng.get("max_num_batched_tokens", 8192)), max_model_len=max_model_len,
                  enable_prefix_caching=prefix_caching)
    mock = MockExecutor(wl.vocab_size, first_token=FIRST_TOKEN)
    prompts = [np.asarray(r.prompt_token_ids, dtype=np.int32) for r in wl.requests]
    clock = time.thread_time_ns
    step_ns, arrays_ns, sched_ns, upd_ns, decode_full_ns = [], [], [], [], []
    admit_ns = 0
    produced = np.zeros(len(wl.requests), dtype=np.int64)
    tokens = cached = 0
    nxt, step, idle = 0, 0, 0
    reqs = wl.requests
    while nxt < len(reqs) or s.num_unfinished:
        if not s.num_unfinished and reqs[nxt].arrival_step > step:
            idle += reqs[nxt].arrival_step - step
            step = reqs[nxt].arrival_step
        while nxt < len(reqs) and reqs[nxt].arrival_step <= step:
            r = reqs[nxt]
            t0 = clock()
            s.add_request(r.index, prompts[nxt], max_tokens=r.max_tokens, eos_token_ids=(EOS_TOKEN,))
            admit_ns += clock() - t0
            nxt += 1
        t0 = clock()
        plan = s.schedule()
        t1 = clock()
        for name in PLAN_ARRAYS:
            getattr(plan, name)
        t2 = clock()
        sampled = mock.sample(plan)
        full = plan.max_query_len == 1 and plan.num_rows == max_num_seqs
        tokens += plan.num_tokens
        cached += int(plan.admitted_num_cached.sum())
        t3 = clock()
        out = s.update(sampled)
        t4 = clock()
        for name in OUT_ARRAYS:
            getattr(out, name)
        t5 = clock()
        produced[out.req_ids.astype(np.int64)] += 1
        sched_ns.append(t1 - t0)
        upd_ns.append(t4 - t3)
        step_ns.append((t1 - t0) + (t4 - t3))
        arrays_ns.append((t2 - t0) + (t5 - t3))
        if full:
            decode_full_ns.append((t1 - t0) + (t4 - t3))
        step += 1
    want = np.array([r.max_tokens for r in reqs])
    assert (produced == want).all(), "every request finished with exactly max_tokens tokens"
    return {
        "workload": wl.name, "requests": len(reqs), "steps": len(step_ns), "idle_steps_skipped": idle,
        "tokens_scheduled": tokens, "prefix_cached_tokens": cached,
        "step": summarize(step_ns), "step_with_arrays": summarize(arrays_ns),
        "schedule": summarize(sched_ns), "update": summarize(upd_ns),
        "decode_full_steps": summarize(decode_full_ns), "max_num_seqs": max_num_seqs,
        "admit_us_per_req": round(admit_ns / len(reqs) / 1e3, 2),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*")
    ap.add_argument("--dir", default=str(pathlib.Path(__file__).parent / "workloads"))
    ap.add_argument("--repeat", type=int, default=3, help="runs per workload (median by step mean)")
    ap.add_argument("--layout", choices=["full", "gemma3n"], default="full")
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    names = a.workloads or sorted(p.stem for p in pathlib.Path(a.dir).glob("*.json"))
    layers = ["full"] if a.layout == "full" else gemma3n_layers()
    print(f"layout={a.layout} prefix_caching={not a.no_prefix_caching} repeat={a.repeat} (median by step mean); "
          "µs of thread CPU per step through yoco_rs._core")
    print("| workload | steps | tokens scheduled | prefix-cached tokens | step mean | step p50 | step p99 | step+arrays mean "
          "| schedule mean | update mean | admit µs/req | decode-full steps mean / p50 / p99 (µs per running req) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    rows = []
    for name in names:
        wl = load_workload(os.path.join(a.dir, f"{name}.json"))
        run(wl, layers, not a.no_prefix_caching)  # warm-up
        runs = sorted((run(wl, layers, not a.no_prefix_caching) for _ in range(a.repeat)), key=lambda r: r["step"]["mean_us"])
        r = runs[len(runs) // 2]
        rows.append(r)
        d = r["decode_full_steps"]
        dec = (f"{d['mean_us']:.1f} / {d['p50_us']:.1f} / {d['p99_us']:.1f} ({d['mean_us'] / r['max_num_seqs']:.3f})"
               if d["n"] else "–")
        print(f"| {r['workload']} | {r['steps']} | {r['tokens_scheduled']} | {r['prefix_cached_tokens']} "
              f"| {r['step']['mean_us']:.1f} | {r['step']['p50_us']:.1f} | {r['step']['p99_us']:.1f} "
              f"| {r['step_with_arrays']['mean_us']:.1f} | {r['schedule']['mean_us']:.1f} | {r['update']['mean_us']:.1f} "
              f"| {r['admit_us_per_req']:.1f} | {dec} |", flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
