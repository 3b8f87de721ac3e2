"""What one decode step of real-size Gemma 3n E2B can cost on this CPU at best: bytes of weights read per
step (from the checkpoint's shapes) over the memory bandwidth measured here, and for 8 streams the FLOPs
over the FMA throughput measured here.

A decode step reads every projection once (whatever the number of streams: the rows of a batched step
share each weight read), the tied LM head (262,400 x 2,048), and per token one row of the per-layer table
(negligible); the KV cache at a 32-token context is a few MB. 1 and 8 streams need the same bytes, 8x the
FLOPs. Bandwidth: the best of MKL's GEMV and ``yoco_cpu``'s one-row kernel over a 1 GiB float32 weight
(both stream it once; best of 5, process CPU time, so other processes' time slices do not count, their
memory traffic does). FMA throughput: MKL's sgemm at 256 rows.

    .venv/bin/python benches/e2b_roofline.py [--threads 1]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def decode_weight_params() -> tuple[int, int]:
    """(parameters a decode step reads, of which the LM head): every weight of the text model but the
    per-layer table and the shared layers' K/V (which no layer computes), the embedding once as the head."""
    from e2b_checkpoint import E2B_TEXT

    from yoco_rs.models.gemma3n.config import Gemma3nTextArgs
    from yoco_rs.models.gemma3n.model import Gemma3nModel

    m = Gemma3nModel(Gemma3nTextArgs.from_dict(dict(E2B_TEXT)), device="meta", per_layer_embeddings_on_host=True)
    total = sum(p.numel() for p in m.parameters())
    return total, m.embed_tokens.weight.numel()


def best(f, n=5) -> float:
    f()
    out = float("inf")
    for _ in range(n):
        t = time.process_time()
        f()
        out = min(out, time.process_time() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from yoco_rs.executor.cpu_linear import RowInvariantLinear, copy_weight, cpu_weight

    params, head = decode_weight_params()
    g = torch.Generator().manual_seed(0)
    n, k = 131072, 2048  # 1 GiB of float32
    w = torch.randn(n, k, generator=g)
    x = torch.randn(1, k, generator=g)
    gib = w.numel() * 4
    mkl = gib / best(lambda: F.linear(x, w)) / 1e9
    wk = cpu_weight(n, k, torch.float32)
    copy_weight(wk, w)
    del w
    lin = RowInvariantLinear()
    with torch.inference_mode():
        ours = gib / best(lambda: lin(x, wk)) / 1e9
    del wk
    bw = max(mkl, ours)
    wsq = torch.randn(4096, 4096, generator=g)
    xs = torch.randn(256, 4096, generator=g)
    flops = 2 * 256 * 4096 * 4096 / best(lambda: F.linear(xs, wsq), 3) / 1e9
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M}, load average {open('/proc/loadavg').read().split()[0]}, "
          f"{a.threads} thread(s)")
    print(f"read bandwidth: MKL GEMV {mkl:.1f} GB/s, yoco_cpu 1 row {ours:.1f} GB/s; FMA: MKL sgemm {flops:.0f} GFLOP/s")
    print(f"weights read per decode step: {params / 1e9:.3f} B parameters ({head / 1e9:.3f} B of them the LM head)\n")
    print("| dtype | bytes / step | 1 stream: bytes / bandwidth | 8 streams: max(bytes / bandwidth, FLOPs / FMA) |")
    print("|---|---|---|---|")
    for name, size in (("float32", 4), ("bfloat16", 2)):
        b = params * size
        t1 = b / (bw * 1e9)
        t8 = max(t1, 2 * 8 * params / (flops * 1e9))
        print(f"| {name} | {b / 1e9:.2f} GB | {1e3 * t1:.0f} ms | {1e3 * t8:.0f} ms |")


if __name__ == "__main__":
    main()
