"""KV cache tensors on the executor side: group specs, allocation, copy ops, sizing from a memory budget.

One tensor per KV group, ``[num_layers_in_group, 2 (K,V), num_blocks, block_size, num_kv_heads, head_dim]``;
groups are the producing layers of one attention type in order of first appearance (as the Rust core
groups them); layer ``layers[i]`` of a group is slice ``i``. Shared layers own nothing: they read their
donor's slice. Block 0 is reserved (padding writes land there; null block-table entries point there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from yoco_rs.models.gemma3n.config import Gemma3nTextArgs, kv_groups

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVGroupSpec:
    """One KV group as the executor allocates it."""

    kind: str
    """``"full"`` or ``"sliding"``."""
    window: int | None
    layers: tuple[int, ...]
    """Producing layers, ascending; ``layers[i]`` is slice ``i`` of the group tensor."""
    readers: tuple[tuple[int, int], ...]
    """Shared layers reading this group, as ``(layer, donor)``."""
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_block(self, block_size: int) -> int:
        """Bytes one block takes across all layers of the group (K and V)."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return len(self.layers) * 2 * block_size * self.num_kv_heads * self.head_dim * itemsize

    def shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (len(self.layers), 2, num_blocks, block_size, self.num_kv_heads, self.head_dim)


def kv_group_specs(args: Gemma3nTextArgs, dtype: torch.dtype) -> list[KVGroupSpec]:
    return [KVGroupSpec(g.kind, g.window, g.layers, g.readers, args.num_key_value_heads, args.head_dim, dtype)
            for g in kv_groups(args)]


def allocate_kv(specs: Sequence[KVGroupSpec], num_blocks: int | Sequence[int], block_size: int,
                device: torch.device | str) -> list[torch.Tensor]:
    """Zeroed KV tensors (the reference attention multiplies masked keys too, so no NaN garbage)."""
    if isinstance(num_blocks, int):
        num_blocks = [num_blocks] * len(specs)
    if len(num_blocks) != len(specs):
        raise ValueError(f"num_blocks has {len(num_blocks)} entries; the model has {len(specs)} KV groups")
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be >= 1")
    for g, n in enumerate(num_blocks):
        if n < 2:
            raise ValueError(f"num_blocks[{g}]={n}: need >= 2 (block 0 is reserved)")
    return [torch.zeros(s.shape(n, block_size), dtype=s.dtype, device=device) for s, n in zip(specs, num_blocks)]


def apply_kv_copies(kv_caches: Sequence[torch.Tensor], kv_copies: torch.Tensor) -> None:
    """Applies ``[C, 4]`` rows ``(group, src_block, dst_block, num_tokens)``: token slots ``0..num_tokens``
    of ``src`` go to ``dst`` in every layer of ``group``. One gather/scatter per group, all layers at once."""
    if kv_copies is None or kv_copies.numel() == 0:
        return
    ops = kv_copies.reshape(-1, 4).to("cpu", torch.int64)
    groups = ops[:, 0]
    for g in torch.unique(groups).tolist():
        if not 0 <= g < len(kv_caches):
            raise ValueError(f"kv_copies names group {g}; the model has {len(kv_caches)} KV groups")
        cache = kv_caches[g]
        nl, _, nb, bs = cache.shape[:4]
        sel = ops[groups == g]
        src, dst, n = sel[:, 1], sel[:, 2], sel[:, 3]
        if (n < 0).any() or (n > bs).any():
            raise ValueError(f"kv_copies: num_tokens {n.tolist()} out of range [0, block_size={bs}]")
        for name, b in (("src", src), ("dst", dst)):
            if (b < 0).any() or (b >= nb).any():
                raise ValueError(f"kv_copies: {name} block ids {b.tolist()} out of range [0, {nb}) in group {g}")
        total = int(n.sum())
        if total == 0:
            continue
        within = torch.arange(total) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
        src_slots = (torch.repeat_interleave(src * bs, n) + within).to(cache.device)
        dst_slots = (torch.repeat_interleave(dst * bs, n) + within).to(cache.device)
        flat = cache.view(nl, 2, nb * bs, *cache.shape[4:])
        flat[:, :, dst_slots] = flat[:, :, src_slots]


@dataclass(frozen=True)
class KVPoolPlan:
    """How many blocks each group's pool gets, and what that holds."""

    block_size: int
    num_blocks: list[int]
    """Per group, block 0 included (what ``allocate_kv`` and the core's ``KvConfig.num_blocks`` take)."""
    bytes_per_block: list[int]
    max_tokens: int
    """Tokens of context the pools hold in total (the limiting group: a full-attention one if any)."""

    @property
    def total_bytes(self) -> int:
        return sum(n * b for n, b in zip(self.num_blocks, self.bytes_per_block))

    def summary(self, specs: Sequence[KVGroupSpec]) -> str:
        parts = [f"{s.kind}{'' if s.window is None else f'(W={s.window})'} x{len(s.layers)} layers: {n} blocks"
                 for s, n in zip(specs, self.num_blocks)]
        return (f"KV cache: {self.total_bytes / 2**30:.2f} GiB, block_size {self.block_size}; "
                + "; ".join(parts) + f"; {self.max_tokens:,} tokens fit")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan_kv_pools(specs: Sequence[KVGroupSpec], block_size: int, budget_bytes: int, *,
                  max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None) -> KVPoolPlan:
    """Splits ``budget_bytes`` into per-group pools.

    Every group gets the same number of blocks, except that, when ``max_num_seqs`` and
    ``max_num_batched_tokens`` are given and a full-attention group exists, a sliding group is capped at
    what its windows can ever reach (``max_num_seqs * (cdiv(W - 1 + max_num_batched_tokens, bs) + 1) + 1``
    blocks) and the rest goes to the full-attention groups."""
    bpb = [s.bytes_per_block(block_size) for s in specs]
    caps: list[int | None] = [None] * len(specs)
    has_full = any(s.window is None for s in specs)
    if max_num_seqs and max_num_batched_tokens and has_full:
        for g, s in enumerate(specs):
            if s.window is not None:
                caps[g] = max_num_seqs * (_cdiv(s.window - 1 + max_num_batched_tokens, block_size) + 1) + 1

    def cost(n: int) -> int:
        return sum(min(n, c) * b if c is not None else n * b for c, b in zip(caps, bpb))

    lo, hi = 0, max(1, budget_bytes // max(1, min(bpb)))
    while lo < hi:  # largest n with cost(n) <= budget
        mid = (lo + hi + 1) // 2
        if cost(mid) <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    n = lo
    if n < 2:
        need = cost(2)
        raise ValueError(f"KV budget of {budget_bytes:,} bytes holds fewer than 2 blocks per group; "
                         f"block_size={block_size} needs at least {need:,} bytes")
    num_blocks = [n if c is None else min(n, c) for c in caps]
    limiting = [nb for s, nb in zip(specs, num_blocks) if s.window is None] or num_blocks
    return KVPoolPlan(block_size, num_blocks, bpb, (min(limiting) - 1) * block_size)


def kv_memory_budget(device: torch.device | str, *, gpu_memory_utilization: float = 0.9,
                     reserve_bytes: int = 0, cpu_kv_bytes: int = 4 << 30) -> int:
    """Bytes available for KV after the weights are loaded. CUDA: ``total * utilization`` minus what is
    in use now (by anyone) minus ``reserve_bytes`` (activations); CPU: ``cpu_kv_bytes``."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        budget = int(total * gpu_memory_utilization) - (total - free) - reserve_bytes
        if budget <= 0:
            raise ValueError(
                f"no memory left for the KV cache on {dev}: {free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB, "
                f"gpu_memory_utilization={gpu_memory_utilization}; raise it or free memory")
        return budget
    return int(cpu_kv_bytes)
