"""Triton kernel: apply a packed token bitmask to rows of logits in place (structured outputs).

Row ``i`` of ``bitmask`` (``[C, W]`` int32, bit ``t % 32`` of word ``t // 32`` allows token ``t``)
masks logits row ``rows[i]``: every token whose bit is clear becomes ``-inf``. One program per (row,
block of the vocabulary); tokens past ``W * 32`` are masked too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yoco_rs.kernels._common import check_same_device


@triton.jit
def _apply_bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, stride_logits, vocab, words, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    blk = tl.program_id(1)
    row = tl.load(rows_ptr + i).to(tl.int64)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inside = offs < vocab
    word = offs // 32
    bits = tl.load(bitmask_ptr + i.to(tl.int64) * words + word, mask=inside & (word < words), other=0)
    allowed = ((bits >> (offs % 32)) & 1) != 0
    tl.store(logits_ptr + row * stride_logits + offs, float("-inf"), mask=inside & ~allowed)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """``logits`` ``[X, V]`` (row-contiguous), ``bitmask`` ``[C, W]`` int32, ``rows`` ``[C]`` int64
    indices into ``logits``; all on one device. In place."""
    check_same_device(logits, bitmask, rows)
    c = bitmask.shape[0]
    if c == 0:
        return
    if logits.stride(1) != 1:
        raise ValueError("logits rows must be contiguous")
    v = logits.shape[1]
    block = 1024
    grid = (c, triton.cdiv(v, block))
    _apply_bitmask_kernel[grid](logits, bitmask.contiguous(), rows.contiguous(), logits.stride(0), v,
                                bitmask.shape[1], BLOCK=block)
