"""Triton kernel: Gemma 3n's RMSNorm in one launch, ``y = x * (mean(x^2) + eps)^-0.5 [* w]`` in float32,
stored in the input's dtype.

Why: in bfloat16 the torch form is nine kernels (upcast, square, mean, add, pow, multiply, upcast of the
weight, multiply, downcast), and a Gemma 3n layer has ten norms. On an H200 a graph-replayed E2B decode
step at batch 1 ran ~3,500 kernels of 1-3 us each, 11.3 ms against a 1.15 ms weight-read floor
(``benches/gpu_profile_decode.py``, RESULTS.md); the norms' casts and reductions were the largest share.

Only bfloat16/float16 inputs on a GPU come here (``models/gemma3n/ops.py``): float32 keeps the torch form,
whose rounding the transformers comparisons pin. The sum order differs from torch's reduction, so values
may differ from it by an ulp of the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yoco_rs.kernels._common import next_pow2


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, eps, D: tl.constexpr, BLOCK_D: tl.constexpr,
                     HAS_WEIGHT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=0) / D
    y = x / tl.sqrt(ms + eps)
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x [..., D]`` (any leading shape; rows may be strided, the last dim
    must be contiguous). ``weight [D]`` or None (Gemma 3n's scale-free v-norm)."""
    d = x.shape[-1]
    if weight is not None and (weight.shape != (d,) or weight.device != x.device):
        raise ValueError(f"rms_norm weight must be [{d}] on {x.device}, got {tuple(weight.shape)} on {weight.device}")
    x2 = x.reshape(-1, d)
    if x2.shape[0] and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, d)
    if x2.shape[0]:
        w = weight if weight is not None else x2  # unread when HAS_WEIGHT is False
        _rms_norm_kernel[(x2.shape[0],)](x2, w, y2, x2.stride(0), y2.stride(0), eps, D=d, BLOCK_D=next_pow2(d),
                                         HAS_WEIGHT=weight is not None, num_warps=4 if d <= 4096 else 8)
    return y
