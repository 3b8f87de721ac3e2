"""Triton kernels: the elementwise chains of a Gemma 3n layer, one launch each, for bf16/fp16 on a GPU.

Why: a graph-replayed E2B decode step is launch-bound (RESULTS.md § GPU: ~2,300 kernels of 1-3 us at
batch 1 after the RMSNorm kernel, against a 1.15 ms weight-read floor). Per layer these chains were ~25
of the ~77 launches:

* ``norm_rope``: a head's RMSNorm then NeoX RoPE (q, and k of the layers that write KV): 6 launches -> 1;
* ``altup_predict``: ``pred[:, i] = h[:, i] + sum_k c[:, i, k] h[:, k]``: 2A launches -> 1;
* ``altup_correct``: ``pred[:, j] + (c[:, j] + 1) (act - pred[:, 0])``: 4 -> 1;
* ``residual_mean``: ``(active + attn + laurel) / sqrt(2)``: 3 -> 1.

Each torch elementwise op computes in float32 and rounds its result, and these kernels round (``_rnd``)
where those ops do. On an H200 (2026-12-04), ``residual_mean`` gave the torch ops' bits in bf16 and float32.
``altup_predict`` and ``altup_correct`` did not: the compiler fused each product into the add that follows
it, without the product's rounding. 67-78% of their values were bit-identical, and the rest differed by one
ulp of the output. transformers computes predict as a bf16 matmul with one rounding, so this is no further
from the oracle. ``norm_rope`` rounds the normed head once, like ``rms_norm``, then rotates with one
rounding where torch rounds each product and the sum. The tests pin bits where they were seen (the
interpreter in float32; the residual on a GPU too) and a few ulps elsewhere.
The callers (``models/gemma3n/ops.py``) use these only for bf16/fp16 tensors on a GPU: the float32 paths keep
the torch forms that the transformers comparisons pin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yoco_rs.kernels._common import next_pow2


@triton.jit
def _rnd(v, like_ptr):
    """Round a float32 value to the storage dtype of ``like_ptr`` and back (what a torch op's result is)."""
    return v.to(like_ptr.dtype.element_ty).to(tl.float32)


# ---- norm + RoPE --------------------------------------------------------------------------------------------

@triton.jit
def _norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, H, stride_xt, stride_xh, stride_ct, stride_st, eps,
                      D: tl.constexpr, HALF: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    t = r // H
    h = r % H
    offs = tl.arange(0, HALF)
    src = x_ptr + t * stride_xt + h * stride_xh
    x1 = tl.load(src + offs).to(tl.float32)
    x2 = tl.load(src + HALF + offs).to(tl.float32)
    inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
    n1 = _rnd(x1 * inv * tl.load(w_ptr + offs).to(tl.float32), y_ptr)
    n2 = _rnd(x2 * inv * tl.load(w_ptr + HALF + offs).to(tl.float32), y_ptr)
    c1 = tl.load(cos_ptr + t * stride_ct + offs).to(tl.float32)
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + offs).to(tl.float32)
    s1 = tl.load(sin_ptr + t * stride_st + offs).to(tl.float32)
    s2 = tl.load(sin_ptr + t * stride_st + HALF + offs).to(tl.float32)
    dst = y_ptr + r * D
    tl.store(dst + offs, (n1 * c1 - n2 * s1).to(y_ptr.dtype.element_ty))
    tl.store(dst + HALF + offs, (n2 * c2 + n1 * s2).to(y_ptr.dtype.element_ty))


def norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rope(rms_norm(x, weight, eps), cos, sin)`` for ``x [T, heads, D]`` (head dim contiguous, D a
    power of two), ``cos/sin [T, D]`` or ``[T, 1, D]``; returns a new contiguous ``[T, heads, D]``."""
    t, nh, d = x.shape
    if d & (d - 1) or d < 2 or x.stride(-1) != 1:
        raise ValueError(f"norm_rope needs a contiguous power-of-two head dim, got shape {tuple(x.shape)} "
                         f"strides {x.stride()}")
    cos2, sin2 = cos.reshape(cos.shape[0], -1), sin.reshape(sin.shape[0], -1)
    if cos2.shape != (t, d) or sin2.shape != (t, d) or weight.shape != (d,):
        raise ValueError(f"norm_rope: cos/sin must be [{t}, {d}] and weight [{d}], got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}, {tuple(weight.shape)}")
    y = torch.empty((t, nh, d), dtype=x.dtype, device=x.device)
    if t:
        _norm_rope_kernel[(t * nh,)](x, weight, cos2, sin2, y, nh, x.stride(0), x.stride(1), cos2.stride(0),
                                     sin2.stride(0), eps, D=d, HALF=d // 2, num_warps=2 if d <= 256 else 4)
    return y


# ---- AltUp ---------------------------------------------------------------------------------------------------

@triton.jit
def _altup_predict_kernel(h_ptr, c_ptr, out_ptr, HID, stride_ht, stride_ct, stride_ot,
                          A: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    t = r // A
    i = r % A
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < HID
    h_t = h_ptr + t * stride_ht
    crow = c_ptr + t * stride_ct + i * A
    acc = _rnd(tl.load(h_t + offs, mask=mask).to(tl.float32) * tl.load(crow).to(tl.float32), out_ptr)
    for k in tl.static_range(1, A):
        hk = tl.load(h_t + k * HID + offs, mask=mask).to(tl.float32)
        acc = _rnd(acc + _rnd(hk * tl.load(crow + k).to(tl.float32), out_ptr), out_ptr)
    acc = acc + tl.load(h_t + i * HID + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + i * HID + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def altup_predict(h: torch.Tensor, coefs: torch.Tensor) -> torch.Tensor:
    """AltUp's prediction for ``h [T, A, H]`` (contiguous streams) with ``coefs [T, A, A]`` (row i: the
    weights of stream i's sum over k), in the order of ``AltUp.predict``'s torch ops."""
    t, a, hid = h.shape
    if coefs.shape != (t, a, a) or h.stride(2) != 1 or h.stride(1) != hid or coefs.stride()[1:] != (a, 1):
        raise ValueError(f"altup_predict: h [T, A, H] with contiguous streams and coefs [T, A, A], got "
                         f"{tuple(h.shape)} strides {h.stride()} and {tuple(coefs.shape)}")
    out = torch.empty_like(h, memory_format=torch.contiguous_format)
    if t:
        block = min(1024, next_pow2(hid))
        _altup_predict_kernel[(t * a, triton.cdiv(hid, block))](h, coefs, out, hid, h.stride(0), coefs.stride(0),
                                                                out.stride(0), A=a, BLOCK=block, num_warps=4)
    return out


@triton.jit
def _altup_correct_kernel(p_ptr, act_ptr, c_ptr, out_ptr, HID, stride_pt, stride_at, stride_ct, stride_ot,
                          A: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    t = r // A
    j = r % A
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < HID
    p_t = p_ptr + t * stride_pt
    innovation = _rnd(tl.load(act_ptr + t * stride_at + offs, mask=mask).to(tl.float32)
                      - tl.load(p_t + offs, mask=mask).to(tl.float32), out_ptr)
    coef = _rnd(tl.load(c_ptr + t * stride_ct + j).to(tl.float32) + 1.0, out_ptr)
    v = _rnd(innovation * coef, out_ptr) + tl.load(p_t + j * HID + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + j * HID + offs, v.to(out_ptr.dtype.element_ty), mask=mask)


def altup_correct(pred: torch.Tensor, activated: torch.Tensor, coefs: torch.Tensor) -> torch.Tensor:
    """AltUp's correction: ``pred [T, A, H]`` (contiguous streams), ``activated [T, H]``, ``coefs [T, A]``
    before the ``+ 1`` (the correction_coefs projection's output)."""
    t, a, hid = pred.shape
    if (activated.shape != (t, hid) or coefs.shape != (t, a) or pred.stride(2) != 1 or pred.stride(1) != hid
            or activated.stride(-1) != 1 or coefs.stride(-1) != 1):
        raise ValueError(f"altup_correct: pred [T, A, H], activated [T, H], coefs [T, A] (last dims contiguous), "
                         f"got {tuple(pred.shape)}, {tuple(activated.shape)}, {tuple(coefs.shape)}")
    out = torch.empty_like(pred, memory_format=torch.contiguous_format)
    if t:
        block = min(1024, next_pow2(hid))
        _altup_correct_kernel[(t * a, triton.cdiv(hid, block))](
            pred, activated, coefs, out, hid, pred.stride(0), activated.stride(0), coefs.stride(0), out.stride(0),
            A=a, BLOCK=block, num_warps=4)
    return out


# ---- the attention/LAuReL residual ----------------------------------------------------------------------------

@triton.jit
def _residual_mean_kernel(a_ptr, b_ptr, c_ptr, out_ptr, HID, stride_a, stride_b, stride_c, inv_sqrt2,
                          BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < HID
    v = _rnd(tl.load(a_ptr + t * stride_a + offs, mask=mask).to(tl.float32)
             + tl.load(b_ptr + t * stride_b + offs, mask=mask).to(tl.float32), out_ptr)
    v = _rnd(v + tl.load(c_ptr + t * stride_c + offs, mask=mask).to(tl.float32), out_ptr)
    tl.store(out_ptr + t * HID + offs, (v * inv_sqrt2).to(out_ptr.dtype.element_ty), mask=mask)


INV_SQRT2_F32 = float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(2.0 ** 0.5, dtype=torch.float32))
"""torch's CUDA division by a Python scalar multiplies by the float32 reciprocal of the float32 divisor."""


def residual_mean(active: torch.Tensor, attn: torch.Tensor, laurel: torch.Tensor) -> torch.Tensor:
    """``(active + attn + laurel) / sqrt(2)`` over ``[T, H]`` rows (each with a contiguous last dim; ``active``
    may be a strided view such as ``pred[:, 0]``); returns a new contiguous ``[T, H]``."""
    t, hid = active.shape
    if attn.shape != (t, hid) or laurel.shape != (t, hid) or min(x.stride(-1) for x in (active, attn, laurel)) != 1 \
            or max(x.stride(-1) for x in (active, attn, laurel)) != 1:
        raise ValueError(f"residual_mean: three [T, H] tensors with contiguous rows, got {tuple(active.shape)}, "
                         f"{tuple(attn.shape)}, {tuple(laurel.shape)}")
    out = torch.empty((t, hid), dtype=active.dtype, device=active.device)
    if t:
        block = min(1024, next_pow2(hid))
        _residual_mean_kernel[(t, triton.cdiv(hid, block))](active, attn, laurel, out, hid, active.stride(0),
                                                            attn.stride(0), laurel.stride(0), INV_SQRT2_F32,
                                                            BLOCK=block, num_warps=4)
    return out
