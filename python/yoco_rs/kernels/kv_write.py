"""Triton kernel: write this step's K/V into a layer's paged cache through ``slot_mapping``.

``slot = block_id * block_size + offset``. Padding tokens carry slots in the reserved block 0, so they
write harmlessly there; a negative slot (vLLM's convention) skips the token, which callers may use too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yoco_rs.kernels._common import check_kv_layer, check_same_device, next_pow2


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kv, stride_cb, stride_co, stride_ch,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_HD: tl.constexpr,
):
    t = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    offs = chunk * BLOCK_HD + tl.arange(0, BLOCK_HD)
    mask = offs < NUM_KV_HEADS * HEAD_DIM
    h = offs // HEAD_DIM
    d = offs % HEAD_DIM
    dst = cache_ptr + blk * stride_cb + off * stride_co + h * stride_ch + d
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_kv, v.to(cache_ptr.dtype.element_ty), mask=mask)


def write_kv(kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store ``k``/``v`` ``[T, num_kv_heads, head_dim]`` at ``slot_mapping[:T]`` of ``kv_layer``
    (``[2, num_blocks, block_size, num_kv_heads, head_dim]``). ``slot_mapping`` may be longer than T
    (a padded plan): only its first T entries are used."""
    _, bs, hkv, d = check_kv_layer(kv_layer)
    t = k.shape[0]
    if k.shape != (t, hkv, d) or v.shape != (t, hkv, d):
        raise ValueError(f"k and v must be [T, {hkv}, {d}] to match the cache, got {tuple(k.shape)} and {tuple(v.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] < t:
        raise ValueError(f"slot_mapping must be 1-D with at least T={t} entries, got {tuple(slot_mapping.shape)}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("k and v must have a contiguous head_dim")
    check_same_device(kv_layer, k, v, slot_mapping)
    if t == 0:
        return
    block_hd = min(next_pow2(hkv * d), 1024)
    grid = (t, triton.cdiv(hkv * d, block_hd))
    c = kv_layer
    _write_kv_kernel[grid](
        k, v, c, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        c.stride(0), c.stride(1), c.stride(2), c.stride(3),
        BLOCK_SIZE=bs, NUM_KV_HEADS=hkv, HEAD_DIM=d, BLOCK_HD=block_hd,
    )
