"""One Gemma 3n decoder layer on the token-major AltUp state ``h [T, A, H]``.

Parameter names mirror transformers' ``Gemma3nTextDecoderLayer`` (``self_attn.q_proj.weight``, ...) so a
checkpoint loads by name. Weights are created empty (no init): they are always loaded.

Order of operations (gemma3n.md §3.4): AltUp predict -> input norm -> LAuReL and attention -> residual
``(act + attn + laurel) / sqrt(2)`` -> MLP (gaussian top-k gate on sparse layers) -> AltUp correct ->
per-layer-input injection into streams 1..A-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from yoco_rs.executor.attention import AttentionBackend, AttentionMetadata
from yoco_rs.models.gemma3n.config import Gemma3nTextArgs
from yoco_rs.models.gemma3n.ops import (
    SQRT2, apply_rope, gaussian_topk, gaussian_topk_multiplier, gelu_tanh, rms_norm,
)


def _empty(*shape: int, dtype: torch.dtype, device: torch.device | str | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """A bias-free projection whose only parameter is ``weight [out, in]``."""

    def __init__(self, in_features: int, out_features: int, *, dtype, device):
        super().__init__()
        self.weight = _empty(out_features, in_features, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, *, dtype, device, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = _empty(dim, dtype=dtype, device=device) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


@dataclass
class AttnContext:
    """Where a layer's attention reads/writes: the backend, this half's metadata, the layer's KV slice."""

    backend: AttentionBackend
    meta: AttentionMetadata
    kv_layer: torch.Tensor
    group: int


class Attention(nn.Module):
    def __init__(self, args: Gemma3nTextArgs, layer: int, *, dtype, device):
        super().__init__()
        h, d = args.hidden_size, args.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_attention_heads, args.num_key_value_heads, d
        self.is_shared = args.donors()[layer] is not None
        kw = dict(dtype=dtype, device=device)
        self.q_proj = Linear(h, self.num_heads * d, **kw)
        self.q_norm = RMSNorm(d, args.rms_norm_eps, **kw)
        if not self.is_shared:
            self.k_proj = Linear(h, self.num_kv_heads * d, **kw)
            self.v_proj = Linear(h, self.num_kv_heads * d, **kw)
            self.k_norm = RMSNorm(d, args.rms_norm_eps, **kw)
        self.o_proj = Linear(self.num_heads * d, h, **kw)
        self.eps = args.rms_norm_eps

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_norm(self.q_proj(x).view(t, self.num_heads, self.head_dim)), cos, sin)
        if not self.is_shared:
            k = apply_rope(self.k_norm(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)), cos, sin)
            v = rms_norm(self.v_proj(x).view(t, self.num_kv_heads, self.head_dim), None, self.eps)
            ctx.backend.write_kv(ctx.kv_layer, k, v, ctx.meta, ctx.group)
        out = ctx.backend.attend(q, ctx.kv_layer, ctx.meta, ctx.group, 1.0)  # Gemma 3n: scaling 1.0
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, args: Gemma3nTextArgs, layer: int, *, dtype, device):
        super().__init__()
        h, i = args.hidden_size, args.intermediate_size[layer]
        kw = dict(dtype=dtype, device=device)
        self.gate_proj = Linear(h, i, **kw)
        self.up_proj = Linear(h, i, **kw)
        self.down_proj = Linear(i, h, **kw)
        sparsity = args.activation_sparsity_pattern[layer]
        self.sparse = sparsity > 0.0
        self.register_buffer("topk_multiplier", gaussian_topk_multiplier(sparsity, dtype).to(device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        if self.sparse:
            gate = gaussian_topk(gate, self.topk_multiplier)
        return self.down_proj(gelu_tanh(gate) * self.up_proj(x))


class AltUp(nn.Module):
    """Predict/correct of the A parallel streams; ``h`` is token-major ``[T, A, H]``."""

    def __init__(self, args: Gemma3nTextArgs, *, dtype, device):
        super().__init__()
        a, h = args.altup_num_inputs, args.hidden_size
        kw = dict(dtype=dtype, device=device)
        self.num_inputs = a
        self.correct_output_scale = _empty(h, **kw)
        self.correction_coefs = Linear(a, a, **kw)
        self.prediction_coefs = Linear(a, a * a, **kw)
        self.modality_router = Linear(h, a, **kw)
        self.router_norm = RMSNorm(h, args.rms_norm_eps, **kw)
        # transformers keeps this scale as a float32 buffer and multiplies without casting it.
        self.register_buffer("router_input_scale", torch.tensor(h**-1.0, device=device), persistent=False)

    def modalities(self, x: torch.Tensor) -> torch.Tensor:
        routed = self.modality_router(self.router_norm(x) * self.router_input_scale)
        return torch.tanh(routed.float()).type_as(x)

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """``pred[:, i] = h[:, i] + sum_k c[i*A + k] h[:, k]`` with ``c`` routed from stream 0."""
        t, a = h.shape[0], self.num_inputs
        coefs = self.prediction_coefs(self.modalities(h[:, 0])).view(t, a, a)
        # Same batched GEMM shape as transformers ([H, A] @ [A, A] per token) so the sums round the same.
        mixed = torch.matmul(h.transpose(1, 2), coefs.transpose(1, 2)).transpose(1, 2)
        return (mixed + h).contiguous()

    def correct(self, pred: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """``corr[:, j] = pred[:, j] + (coef_j + 1) * (activated - pred[:, 0])``."""
        innovation = activated - pred[:, 0]
        coefs = self.correction_coefs(self.modalities(activated)) + 1.0
        return innovation[:, None, :] * coefs[:, :, None] + pred

    def scale_corrected_output(self, x: torch.Tensor) -> torch.Tensor:
        return (x.type_as(self.correct_output_scale) * self.correct_output_scale).type_as(x)


class Laurel(nn.Module):
    def __init__(self, args: Gemma3nTextArgs, *, dtype, device):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.linear_left = Linear(args.hidden_size, args.laurel_rank, **kw)
        self.linear_right = Linear(args.laurel_rank, args.hidden_size, **kw)
        self.post_laurel_norm = RMSNorm(args.hidden_size, args.rms_norm_eps, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))


class DecoderLayer(nn.Module):
    def __init__(self, args: Gemma3nTextArgs, layer: int, *, dtype, device):
        super().__init__()
        h, p, eps = args.hidden_size, args.hidden_size_per_layer_input, args.rms_norm_eps
        kw = dict(dtype=dtype, device=device)
        self.layer = layer
        self.correct_scale = args.altup_correct_scale
        self.self_attn = Attention(args, layer, **kw)
        self.mlp = MLP(args, layer, **kw)
        self.input_layernorm = RMSNorm(h, eps, **kw)
        self.post_attention_layernorm = RMSNorm(h, eps, **kw)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, **kw)
        self.post_feedforward_layernorm = RMSNorm(h, eps, **kw)
        self.altup = AltUp(args, **kw)
        self.laurel = Laurel(args, **kw)
        self.per_layer_input_gate = Linear(h, p, **kw)
        self.per_layer_projection = Linear(p, h, **kw)
        self.post_per_layer_input_norm = RMSNorm(h, eps, **kw)

    def forward(self, h: torch.Tensor, per_layer_input: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ctx: AttnContext) -> torch.Tensor:
        """``h [T, A, H]``, ``per_layer_input [T, P]``, ``cos/sin [T, D]`` -> new ``[T, A, H]``."""
        pred = self.altup.predict(h)
        active = pred[:, 0]
        x = self.input_layernorm(active)
        laurel = self.laurel(x)
        attn = self.post_attention_layernorm(self.self_attn(x, cos, sin, ctx))
        gated = ((active + attn) + laurel) / SQRT2  # transformers divides by math.sqrt(2)
        out = gated + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(gated)))
        corr = self.altup.correct(pred, out)

        first = corr[:, 0]
        if self.correct_scale:
            first = self.altup.scale_corrected_output(first)
        first = gelu_tanh(self.per_layer_input_gate(first)) * per_layer_input
        first = self.post_per_layer_input_norm(self.per_layer_projection(first))
        corr[:, 1:] += first[:, None, :]
        return corr
