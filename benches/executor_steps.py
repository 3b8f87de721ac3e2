"""Executor time of one prefill step and one decode step of benchmark 1's workload (``engine_throughput.py``).

Runs the engine on the same 64 prompts (64-512 tokens) until every request decodes, capturing the
``ForwardBatch`` of the first step (8192 prefill tokens) and of a decode step at batch 64 (contexts up to
~550 tokens), then re-executes each (the executor alone: no scheduling, sampling or detokenization) and
reports the median thread CPU time, which other processes on a shared machine disturb less than wall time.
Re-running a step rewrites the same K/V, so repetitions are equivalent.

    OMP_NUM_THREADS=1 .venv/bin/python benches/executor_steps.py [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from yoco_rs import Engine, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30, help="decode-step repetitions (prefill: a sixth)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    prompts = [[2] + rng.integers(10, 2048, size=int(rng.integers(63, 512))).tolist() for _ in range(64)]
    eng = Engine(max_model_len=1024, max_num_seqs=64, max_num_batched_tokens=8192,
                 kv_cache_memory=256 << 20, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=64)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, params)
    ex = eng._exec
    captured = []
    run = ex.execute

    def capture(batch, **kw):
        captured.append(batch)
        return run(batch, **kw)

    ex.execute = capture
    for _ in range(40):
        eng.step()
    ex.execute = run
    prefill, decode = captured[0], captured[-1]

    def median_ms(batch, n: int) -> float:
        ts = []
        for _ in range(n):
            t = time.thread_time()
            ex.execute(batch)
            ts.append(time.thread_time() - t)
        return statistics.median(ts) * 1e3

    median_ms(prefill, 1)
    median_ms(decode, 3)
    p = median_ms(prefill, max(3, args.reps // 6))
    d = median_ms(decode, args.reps)
    print(f"prefill step ({prefill.num_tokens} tokens, {prefill.num_rows} rows): {p:7.1f} ms")
    print(f"decode step (batch {decode.num_rows}, contexts up to {int(decode.seq_lens.max())}): {d:7.2f} ms")


if __name__ == "__main__":
    main()
