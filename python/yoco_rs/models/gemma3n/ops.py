"""Elementwise and per-token ops of Gemma 3n, written to round exactly like transformers 5.24.

Every formula here mirrors the oracle's order of operations (multiply vs divide, ``pow(ms + eps, -0.5)``
instead of ``rsqrt``, casts), because the per-layer hidden states are compared at 1e-5 and a different but
"equivalent" form drifts by ulps that AltUp's 4-stream mixing then amplifies.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


GPU_FUSIONS = {"rms_norm", "norm_rope", "altup", "residual"}
"""Which elementwise chains run as one Triton launch for bf16/fp16 tensors on a GPU (``kernels/rms_norm.py``,
``kernels/layer_elementwise.py``): a graph-replayed decode step is launch-bound. float32 and the CPU always
keep the torch forms. Emptying the set restores them on a GPU too (``benches/gpu_profile_decode.py`` A/Bs
this in one run)."""


def gpu_fused(x: torch.Tensor, name: str) -> bool:
    return name in GPU_FUSIONS and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``y = x * (mean(x^2) + eps)^-0.5 [* w]`` in float32, cast back. Gemma 3n has no ``1 + w``."""
    if x.dtype == torch.float32 and (weight is None or weight.dtype == torch.float32):  # same ops, no casts
        y = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)
        return y if weight is None else y.mul_(weight)
    if gpu_fused(x, "rms_norm"):  # 1 kernel, not 9
        from yoco_rs.kernels.rms_norm import rms_norm as fused_rms_norm

        return fused_rms_norm(x, weight, eps)
    xf = x.float()
    y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight.float()
    return y.type_as(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def gaussian_topk_multiplier(sparsity: float, dtype: torch.dtype) -> torch.Tensor:
    """``Normal(0, 1).icdf(sparsity)`` computed in float32 then cast, as transformers does."""
    t = torch.tensor(sparsity, dtype=torch.float32)
    return torch.distributions.normal.Normal(0, 1).icdf(t).to(dtype)


def gaussian_topk(gate: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor:
    """``relu(gate - (mean + std_pop * icdf(sparsity)))`` per token: shifts as well as masks."""
    mean = torch.mean(gate, dim=-1, keepdim=True)
    std = torch.std(gate, dim=-1, keepdim=True, unbiased=False)
    return F.relu_(gate - (mean + std * multiplier))


def rope_inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    """``1 / theta^(arange(0, D, 2) / D)`` in float32 (default RoPE)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, D]`` for absolute ``positions [T]``, computed in float32 and cast to ``dtype``."""
    freqs = positions[:, None].float() * inv_freq.to(device=positions.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX half-split rotation of ``x [T, heads, D]`` with ``cos/sin [T, 1, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos).add_(rotated.mul_(sin))


def norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """A head's RMSNorm then RoPE, ``x [T, heads, D]``: q, and k of a layer that writes KV."""
    d = x.shape[-1]
    if gpu_fused(x, "norm_rope") and d >= 2 and not d & (d - 1) and x.stride(-1) == 1:
        from yoco_rs.kernels.layer_elementwise import norm_rope as fused_norm_rope

        return fused_norm_rope(x, weight, eps, cos, sin)
    return apply_rope(rms_norm(x, weight, eps), cos, sin)


def residual_mean(active: torch.Tensor, attn: torch.Tensor, laurel: torch.Tensor) -> torch.Tensor:
    """``(active + attn + laurel) / sqrt(2)``: transformers divides by ``math.sqrt(2)``. ``attn`` is consumed."""
    if gpu_fused(active, "residual") and active.stride(-1) == 1:
        from yoco_rs.kernels.layer_elementwise import residual_mean as fused_residual_mean

        return fused_residual_mean(active, attn, laurel)
    return (active + attn).add_(laurel).div_(SQRT2)


def magnitude_match(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Rescale ``x`` to the RMS ``target`` (``[..., 1]``): ``x * target / sqrt(clamp(mean(x^2), 1e-5))``."""
    new = torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True).clamp(min=1e-5))
    return x * target / new


def rms(x: torch.Tensor) -> torch.Tensor:
    """``mean(x^2, -1) ** 0.5`` with keepdim (the AltUp magnitude target)."""
    return torch.mean(x**2, dim=-1, keepdim=True) ** 0.5


SQRT2 = math.sqrt(2.0)
