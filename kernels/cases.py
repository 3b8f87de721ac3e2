"""Random paged-attention batches at any size (vectorized: thousands of blocks build in milliseconds),
plus what each case costs at the limit: bytes a decode step must read, FLOPs a prefill must do.

The cache is filled with finite random values everywhere (the torch reference multiplies masked keys,
as the executor's zeroed cache allows); sliding-window rows hold 0 in their block table for blocks no
query can reach, like the core after it frees them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Case:
    name: str
    q: torch.Tensor  # [T, Hq, D]
    kv: torch.Tensor  # [2, NB, BS, Hkv, D]
    block_table: torch.Tensor  # [R, max_blocks] int32
    qsl: torch.Tensor  # [R+1] int32
    seq_lens: torch.Tensor  # [R] int32
    positions: torch.Tensor  # [T] int64
    window: int  # 0 = full
    rows: list[tuple[int, int]]

    @property
    def max_query_len(self) -> int:
        return max(n for _, n in self.rows)

    def visible_keys(self) -> list[int]:
        """Per row, the keys its last query sees (what a decode step must read)."""
        return [min(c + n, self.window) if self.window else c + n for c, n in self.rows]

    def decode_bytes(self) -> int:
        """Bytes decode attention must move at the limit: each visible K and V once, q in, out."""
        _, _, _, hkv, d = self.kv.shape
        elt = self.kv.element_size()
        kv = sum(self.visible_keys()) * 2 * hkv * d * elt
        return kv + 2 * self.q.numel() * self.q.element_size()

    def attention_flops(self) -> int:
        """4 * Hq * D per visible (query, key) pair (QK^T and PV), causal and windowed."""
        hq, d = self.q.shape[1], self.q.shape[2]
        pairs = 0
        for c, n in self.rows:
            for i in range(n):
                p = c + i + 1
                pairs += min(p, self.window) if self.window else p
        return 4 * hq * d * pairs


def make(name: str, rows: list[tuple[int, int]], *, num_q_heads=8, num_kv_heads=2, head_dim=256, block_size=16,
         window=0, dtype=torch.bfloat16, device="cuda", seed=0) -> Case:
    """``rows`` = [(context already cached, new queries)]."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq = torch.tensor([c + n for c, n in rows])
    nblk = (seq + block_size - 1) // block_size
    total = int(nblk.sum())
    num_blocks = total + 1
    ids = torch.randperm(total, generator=g) + 1
    width = int(nblk.max())
    col = torch.arange(width)
    table = torch.zeros((len(rows), width), dtype=torch.int32)
    starts = torch.cumsum(nblk, 0) - nblk
    valid = col[None, :] < nblk[:, None]
    table[valid] = ids[(starts[:, None] + col[None, :])[valid]].to(torch.int32)
    if window:
        first_q = torch.tensor([c for c, _ in rows])
        reach = (first_q - window + 1).clamp(min=0) // block_size  # whole blocks below every query's window
        table[col[None, :] < reach[:, None]] = 0
    qlens = torch.tensor([n for _, n in rows])
    qsl = torch.zeros(len(rows) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(qlens, 0)
    t = int(qsl[-1])
    positions = torch.cat([torch.arange(c, c + n) for c, n in rows]) if t else torch.zeros(0, dtype=torch.int64)
    gd = torch.Generator(device=device).manual_seed(seed)  # big tensors are drawn where they live
    kv = torch.randn((2, num_blocks, block_size, num_kv_heads, head_dim), generator=gd, device=device, dtype=dtype)
    q = torch.randn((t, num_q_heads, head_dim), generator=gd, device=device, dtype=dtype)
    return Case(name, q, kv, table.to(device), qsl.to(device), seq.to(torch.int32).to(device), positions.to(device),
                window, list(rows))
