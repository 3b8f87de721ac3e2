"""The KV cache itself: per-token decode time at context 128 vs 2048 with yoco-rs's paged KV cache,
vs recomputing the whole sequence for every token without a cache (one full forward of the bundled
model per new token, which is what decoding costs with no cache at all).

With the cache, a decode step computes one token's K/V and attends over the context: nearly flat in the
context length. Without it, every token re-runs the whole context: linear in it.

    OMP_NUM_THREADS=1 .venv/bin/python benches/engine_kv_decode.py [--tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from yoco_rs import Engine, SamplingParams
from yoco_rs.executor.batch import ForwardBatch


def cached_decode_ms(eng: Engine, ctx: int, n: int, rng) -> float:
    prompt = [2] + rng.integers(10, 2048, size=ctx - 1).tolist()
    eng.add_request(f"c{ctx}", prompt, SamplingParams(temperature=0.0, max_tokens=n + 1, ignore_eos=True))
    eng.step()  # prefill (one step: the budget holds the prompt)
    times = []
    while eng.has_unfinished_requests():
        t = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def recompute_ms(eng: Engine, ctx: int, n: int, rng) -> float:
    """A full forward over the whole context per token, through the same executor (a fresh KV write of
    every position each time: no reuse), keeping the sequence growing."""
    ex = eng._exec
    bs = eng.config.block_size
    nblocks = -(-(ctx + n) // bs)
    ids = [2] + rng.integers(10, 2048, size=ctx - 1).tolist()
    times = []
    for _ in range(n):
        T = len(ids)
        table = torch.arange(1, nblocks + 1, dtype=torch.int32)[None, :]
        slots = (torch.arange(T) // bs + 1) * bs + torch.arange(T) % bs
        b = ForwardBatch(
            num_tokens=T, input_ids=torch.tensor(ids), positions=torch.arange(T),
            query_start_loc=torch.tensor([0, T], dtype=torch.int32), seq_lens=torch.tensor([T], dtype=torch.int32),
            block_tables=[table] * len(ex.kv_caches), slot_mapping=slots.expand(len(ex.kv_caches), T).contiguous(),
            kv_copies=torch.zeros(0, 4, dtype=torch.int32), num_cross=1,
            cross_indices=torch.tensor([T - 1]), cross_query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
            max_query_len=T, max_seq_len=T)
        t = time.perf_counter()
        logits = ex.execute(b)
        ids.append(int(logits[0].argmax()))
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    eng = Engine(max_model_len=4096, max_num_batched_tokens=4096, num_gpu_blocks_override=600)
    cached_decode_ms(eng, 64, 4, rng)  # warm-up
    res = {}
    for ctx in (128, 2048):
        res[ctx] = (cached_decode_ms(eng, ctx, args.tokens, rng), recompute_ms(eng, ctx, max(4, args.tokens // 4), rng))
    print("| context | with KV cache (ms/token) | recompute, no cache (ms/token) | cache speedup |")
    print("|---|---|---|---|")
    for ctx, (c, r) in res.items():
        print(f"| {ctx} | {c:.2f} | {r:.2f} | {r / c:.1f}x |")
    print(f"growth 128 -> 2048: with cache {res[2048][0] / res[128][0]:.2f}x, "
          f"without {res[2048][1] / res[128][1]:.2f}x (context grew 16x)")


if __name__ == "__main__":
    main()
