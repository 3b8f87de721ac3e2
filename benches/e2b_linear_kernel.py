"""The CPU linear kernel alone at Gemma 3n E2B's projection shapes, 1 and 8 rows, against torch's matmul.

Per shape (``SHAPES``: the decoder's projections and a slice of the LM head), per dtype and row count,
the best of ``--reps`` calls in process CPU time (1 torch thread: what ``benches/e2b_cpu.py`` runs) of

* ``yoco_cpu``: ``RowInvariantLinear`` on a weight from ``cpu_weight`` (in panels: how the executor stores
  CPU weights), i.e. the kernel of ``crates/yoco-cpu``, row-invariant;
* ``torch``: ``F.linear`` (MKL) on a row-major weight (not row-invariant below 4 rows; bf16: torch's own
  bf16 GEMM), the reference speed;

and, weighted by how often a decode step runs each shape (``COUNT``: 30 layers, 10 of them without K/V,
the LM head in ``HEAD_SLICES`` slices), the kernel's share of one decode step: the linear-only time a step
would take at 1 and 8 rows, and the 8-row / 1-row ratio (the weights are read once per step either way,
so what the ratio adds over 1.0 is compute the 8-row path does).

    .venv/bin/python benches/e2b_linear_kernel.py [--dtypes float32,bfloat16] [--reps 5]
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.nn.functional as F
from e2b_roofline import best

HEAD_ROWS = 262400
HEAD_SLICE = 65600
HEAD_SLICES = HEAD_ROWS // HEAD_SLICE
#: (name, N outputs, K inputs, calls per decode step)
SHAPES = [
    ("q_proj / o_proj (2048 x 2048)", 2048, 2048, 60),
    ("k_proj / v_proj (512 x 2048)", 512, 2048, 40),
    ("gate / up (8192 x 2048)", 8192, 2048, 60),
    ("down (2048 x 8192)", 2048, 8192, 30),
    ("per-layer gate (256 x 2048)", 256, 2048, 30),
    ("per-layer proj (2048 x 256)", 2048, 256, 30),
    (f"LM head slice ({HEAD_SLICE} x 2048)", HEAD_SLICE, 2048, HEAD_SLICES),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true", help="time the kernel only")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from yoco_rs.executor.cpu_linear import RowInvariantLinear, copy_weight, cpu_weight

    rows = [int(r) for r in a.rows.split(",")]
    lin = RowInvariantLinear()
    g = torch.Generator().manual_seed(0)
    load0 = os.getloadavg()[0]
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load average {load0:.2f}, "
          "1 torch thread, process CPU time, best of", a.reps)
    for dtype in [getattr(torch, d) for d in a.dtypes.split(",")]:
        print(f"\n{dtype}: ms per call")
        head = "| shape | " + " | ".join(
            f"yoco {m} row{'s' if m > 1 else ''}" + ("" if a.no_torch else f" | torch {m}") for m in rows) + " |"
        print(head)
        print("|---" * (head.count("|") - 1) + "|")
        step = {m: 0.0 for m in rows}
        with torch.inference_mode():
            for name, n, k, count in SHAPES:
                w = torch.randn(n, k, generator=g).to(dtype)
                wk = cpu_weight(n, k, dtype)
                copy_weight(wk, w)
                cells = []
                for m in rows:
                    x = torch.randn(m, k, generator=g).to(dtype)
                    t = best(lambda: lin(x, wk), a.reps)
                    step[m] += t * count
                    cells.append(f"{1e3 * t:.2f}")
                    if not a.no_torch:
                        cells.append(f"{1e3 * best(lambda: F.linear(x, w), a.reps):.2f}")
                print(f"| {name} | " + " | ".join(cells) + " |")
                del w, wk
        parts = ", ".join(f"{m} row{'s' if m > 1 else ''} {1e3 * step[m]:.0f} ms" for m in rows)
        ratio = f"; {rows[-1]}/{rows[0]} = {step[rows[-1]] / step[rows[0]]:.2f}" if len(rows) > 1 else ""
        print(f"\nyoco_cpu linear time of one decode step ({dtype}): {parts}{ratio}")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
