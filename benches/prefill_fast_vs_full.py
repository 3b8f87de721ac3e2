"""Prefill time with YOCO fast prefill on vs off, on CPU, in one run.

A 2048-token prompt through the 30-layer E2B-depth structure (20 producing layers, 10 KV-sharing layers,
producers 18/19) with random weights and a wider hidden size than the test models, one thread. With fast
prefill on, the 10 shared layers run on the last token only; off, they run on all 2048. The bound is
about 20/30 of the layer compute (plus embeddings and per-layer-input projection, which both pay), so the
target is a ratio <= 0.70.

    OMP_NUM_THREADS=1 .venv/bin/python benches/prefill_fast_vs_full.py [--reps 5]

Repetitions alternate fast/full so drift on a shared machine hits both; the ratio is of medians. The
logits of the two paths are checked to agree on the last token.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from yoco_rs.executor.batch import ForwardBatch
from yoco_rs.executor.executor import Executor
from yoco_rs.models.gemma3n.config import Gemma3nTextArgs
from yoco_rs.models.gemma3n.model import Gemma3nModel


def config(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> Gemma3nTextArgs:
    n = 30
    return Gemma3nTextArgs.from_dict(dict(
        vocab_size=1024, vocab_size_per_layer_input=768, hidden_size=hidden, hidden_size_per_layer_input=64,
        intermediate_size=intermediate, num_hidden_layers=n, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 6, num_kv_shared_layers=10,
        sliding_window=512, activation_sparsity_pattern=[0.95] * 10 + [0.0] * 20, laurel_rank=32,
        max_position_embeddings=4096,
    ))


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Like tests/tiny.py: weights N(0, fan_in^-1/2), norms 1 +- 0.1, correct_output_scale N(0, 0.5^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "correct_output_scale" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)


def prefill_batch(tokens: int, block_size: int, num_groups: int, vocab: int) -> ForwardBatch:
    """One request, its whole prompt in one chunk, blocks 1..n in every group, the last token sampled."""
    ids = torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(1))
    nblk = -(-tokens // block_size)
    slots = torch.arange(tokens) + block_size  # block 1 onward
    return ForwardBatch(
        num_tokens=tokens, input_ids=ids, positions=torch.arange(tokens),
        query_start_loc=torch.tensor([0, tokens], dtype=torch.int32),
        seq_lens=torch.tensor([tokens], dtype=torch.int32),
        block_tables=[torch.arange(1, nblk + 1, dtype=torch.int32)[None]] * num_groups,
        slot_mapping=slots.expand(num_groups, tokens).contiguous(),
        kv_copies=torch.zeros(0, 4, dtype=torch.int32), num_cross=1,
        cross_indices=torch.tensor([tokens - 1]), cross_query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        max_query_len=tokens, max_seq_len=tokens,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    args = config(a.hidden, a.intermediate, a.heads, a.kv_heads, a.head_dim)
    model = Gemma3nModel(args, dtype=torch.float32, device="cpu")
    randomize(model)
    ex = Executor(model)
    block_size = 16
    ex.allocate_kv(-(-a.tokens // block_size) + 2, block_size)
    batch = prefill_batch(a.tokens, block_size, len(ex.kv_group_specs()), args.vocab_size)
    params = sum(p.numel() for p in model.parameters())
    print(f"config: 30 layers (10 shared), hidden {a.hidden}, intermediate {a.intermediate}, heads {a.heads}/"
          f"{a.kv_heads}x{a.head_dim}, {params / 1e6:.1f}M params; prompt {a.tokens} tokens; "
          f"{torch.get_num_threads()} thread(s)")

    times: dict[bool, list[float]] = {True: [], False: []}
    logits: dict[bool, torch.Tensor] = {}
    for rep in range(a.reps + 1):  # rep 0 is warm-up
        for fast in (True, False) if rep % 2 == 0 else (False, True):
            ex.kv_sharing_fast_prefill = fast
            t0 = time.perf_counter()
            logits[fast] = ex.execute(batch)
            dt = time.perf_counter() - t0
            if rep:
                times[fast].append(dt)
    diff = (logits[True] - logits[False]).abs().max().item()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"fast prefill on : median {med[True]:.3f} s  ({', '.join(f'{t:.3f}' for t in times[True])})")
    print(f"fast prefill off: median {med[False]:.3f} s  ({', '.join(f'{t:.3f}' for t in times[False])})")
    print(f"ratio on/off: {med[True] / med[False]:.3f}  (bound ~ 20/30 = 0.667; target <= 0.70); "
          f"last-token logits max diff {diff:.1e}")


if __name__ == "__main__":
    main()
