"""Triton kernel: sub-block copy ops, applied before a step's forward.

A copy-on-match prefix hit gives a request a fresh block and copies the matched sub-blocks' KV into
it: op ``(group, src, dst, n)`` copies token slots ``0..n`` of block ``src`` to block ``dst`` in every
layer (K and V) of ``group``. One launch per group covers all ops; an op of another group exits at
once, so the launch never reads op values on the host. Sources are cached (complete) blocks and
destinations fresh private blocks, so ops of one step never overlap and may run in parallel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yoco_rs.kernels._common import check_same_device


@triton.jit(do_not_specialize=["group"])
def _copy_kv_kernel(
    cache_ptr, ops_ptr, group,
    stride_layer, stride_kv, stride_block,
    SLOT_NUMEL: tl.constexpr, BLOCK: tl.constexpr,
):
    op = tl.program_id(0)
    lkv = tl.program_id(1)
    chunk = tl.program_id(2)
    if tl.load(ops_ptr + op * 4) != group:
        return
    src = tl.load(ops_ptr + op * 4 + 1).to(tl.int64)
    dst = tl.load(ops_ptr + op * 4 + 2).to(tl.int64)
    n = tl.load(ops_ptr + op * 4 + 3).to(tl.int64)
    base = cache_ptr + (lkv // 2).to(tl.int64) * stride_layer + (lkv % 2) * stride_kv
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n * SLOT_NUMEL
    vals = tl.load(base + src * stride_block + offs, mask=mask)
    tl.store(base + dst * stride_block + offs, vals, mask=mask)


def copy_kv(kv_group: torch.Tensor, copies: torch.Tensor, group: int) -> None:
    """Apply the ops of ``copies`` (``[C, 4]`` int32 rows ``(group, src, dst, n)``) whose group is
    ``group`` to ``kv_group`` (``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``)."""
    if kv_group.dim() != 6 or kv_group.shape[1] != 2:
        raise ValueError(
            "kv_group must be [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(kv_group.shape)}"
        )
    nl, _, _, bs, hkv, d = kv_group.shape
    if kv_group[0, 0, 0].stride() != (hkv * d, d, 1):
        raise ValueError("kv_group must be contiguous within a block ([block_size, num_kv_heads, head_dim])")
    if copies.dim() != 2 or copies.shape[1] != 4:
        raise ValueError(f"copies must be [C, 4] rows (group, src, dst, n), got {tuple(copies.shape)}")
    if copies.dtype != torch.int32:
        raise ValueError(f"copies must be int32, got {copies.dtype}")
    check_same_device(kv_group, copies)
    c = copies.shape[0]
    if c == 0 or nl == 0:
        return
    copies = copies.contiguous()
    slot_numel = hkv * d
    block = min(triton.next_power_of_2(bs * slot_numel), 4096)
    grid = (c, nl * 2, triton.cdiv(bs * slot_numel, block))
    _copy_kv_kernel[grid](
        kv_group, copies, group,
        kv_group.stride(0), kv_group.stride(1), kv_group.stride(2),
        SLOT_NUMEL=slot_numel, BLOCK=block,
    )
