"""Random paged-attention cases for the kernel tests: rows with earlier context and new queries, spread
over shuffled (non-contiguous) block ids, every slot that no row may read filled with NaN (block 0,
unused blocks, stale slots past ``seq_lens``, and, for sliding windows, blocks out of every query's
reach, whose block-table entries are 0 as after the core frees them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():
    # Triton reads this when a kernel is decorated: it must be set before yoco_rs.kernels is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
"""Where kernel tests run: the GPU when there is one, else the CPU under Triton's interpreter."""


@dataclass
class PagedCase:
    q: torch.Tensor  # [T_pad, Hq, D]
    kv_layer: torch.Tensor  # [2, NB, BS, Hkv, D]
    block_table: torch.Tensor  # [R, max_blocks] int32
    query_start_loc: torch.Tensor  # [R+1] int32
    seq_lens: torch.Tensor  # [R] int32
    window: int
    num_tokens: int  # T (q[T:] is padding)


def make_case(
    rows: list[tuple[int, int]],
    *,
    block_size: int = 4,
    num_kv_heads: int = 2,
    gqa: int = 2,
    head_dim: int = 16,
    window: int = 0,
    pad_tokens: int = 0,
    extra_table_cols: int = 1,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: str = DEV,
) -> PagedCase:
    """``rows`` = [(context_len, query_len)]: each row already holds ``context_len`` tokens of KV and
    schedules ``query_len`` new ones (whose KV is in the cache too, as after this step's write)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in rows]
    nblk = [-(-s // block_size) for s in seq_lens]
    num_blocks = 1 + sum(nblk) + 3  # block 0 reserved, a few never used
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    max_blocks = max(nblk, default=0) + extra_table_cols
    table = torch.zeros((len(rows), max_blocks), dtype=torch.int32)
    kv = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=torch.float32)
    for r, ((ctx, n), s) in enumerate(zip(rows, seq_lens)):
        first_reachable = max(0, ctx - window + 1) if window > 0 else 0
        for b in range(nblk[r]):
            blk = perm.pop()
            if (b + 1) * block_size <= first_reachable:
                continue  # freed: the table holds 0 (block 0 is NaN: reading it would show)
            table[r, b] = blk
            ntok = min(block_size, s - b * block_size)
            kv[:, blk, :ntok] = torch.randn((2, ntok, num_kv_heads, head_dim), generator=g)
    qsl = torch.tensor([0] + [n for _, n in rows], dtype=torch.int32).cumsum(0).to(torch.int32)
    t = int(qsl[-1])
    q = torch.randn((t + pad_tokens, num_kv_heads * gqa, head_dim), generator=g)
    return PagedCase(
        q=q.to(dtype).to(device), kv_layer=kv.to(dtype).to(device), block_table=table.to(device),
        query_start_loc=qsl.to(device), seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device),
        window=window, num_tokens=t,
    )
