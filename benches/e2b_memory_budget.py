"""Device-memory budget of Gemma 3n E2B and E4B on 8, 16 and 24 GB GPUs, computed from the checkpoints'
shapes (no GPU, no weights): weights on the device with the per-layer embedding table there or in host
memory, and the KV capacity what is left gives.

The weights are the text decoder's parameters (what yoco-rs loads; the audio and vision towers are never
loaded) in bfloat16, what ``dtype="auto"`` gives for the released bf16 checkpoints. The KV pool is what the
engine would plan (``plan_kv_pools``: sliding-window groups capped at what ``max_num_seqs`` windows can
reach, the rest to the full-attention group) from ``0.9 x GPU memory - weights - reserve`` (the engine's
default ``kv_cache_memory=0.9``; ``reserve`` stands for the CUDA context, activations and CUDA graphs,
an assumption stated in the output, not a measurement).

    .venv/bin/python benches/e2b_memory_budget.py [--reserve-gib 1.5] [--max-num-seqs 16]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from e2b_checkpoint import E2B_TEXT, E4B_TEXT  # noqa: E402

from yoco_rs.executor.kv_cache import kv_group_specs, plan_kv_pools  # noqa: E402
from yoco_rs.models.gemma3n.config import Gemma3nTextArgs  # noqa: E402
from yoco_rs.models.gemma3n.model import Gemma3nModel  # noqa: E402

GB = 10**9
GIB = 2**30


def weights(text: dict) -> tuple[int, int]:
    """(bf16 bytes of every text weight but the per-layer table, bf16 bytes of the table)."""
    args = Gemma3nTextArgs.from_dict(dict(text))
    m = Gemma3nModel(args, dtype=torch.bfloat16, device="meta", per_layer_embeddings_on_host=True)
    rest = sum(p.numel() for p in m.parameters()) * 2
    table = args.vocab_size_per_layer_input * args.num_hidden_layers * args.hidden_size_per_layer_input * 2
    return rest, table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reserve-gib", type=float, default=1.5)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--block-size", type=int, default=64)
    a = ap.parse_args()
    print(f"bf16; KV budget = 0.9 x GPU - weights - {a.reserve_gib} GiB reserve; block {a.block_size}, "
          f"max_num_seqs {a.max_num_seqs}, max_num_batched_tokens {a.max_num_batched_tokens}\n")
    print("| model | per-layer table | weights on GPU | weights in host RAM | KV tokens, 8 GB | 16 GB | 24 GB |")
    print("|---|---|---|---|---|---|---|")
    for name, text in (("E2B", E2B_TEXT), ("E4B", E4B_TEXT)):
        rest, table = weights(text)
        specs = kv_group_specs(Gemma3nTextArgs.from_dict(dict(text)), torch.bfloat16)
        for on_host in (False, True):
            dev = rest + (0 if on_host else table)
            cells = []
            for gpu in (8, 16, 24):
                budget = int(0.9 * gpu * GB) - dev - int(a.reserve_gib * GIB)
                if budget <= 0:
                    cells.append("does not fit")
                    continue
                plan = plan_kv_pools(specs, a.block_size, budget, max_num_seqs=a.max_num_seqs,
                                     max_num_batched_tokens=a.max_num_batched_tokens)
                cells.append("does not fit" if plan.max_tokens <= 0 else
                             f"{plan.max_tokens:,} ({budget / GIB:.1f} GiB)")
            print(f"| {name} | {'host (mmap)' if on_host else 'GPU'} | {dev / GIB:.2f} GiB | "
                  f"{(table if on_host else 0) / GIB:.2f} GiB | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
