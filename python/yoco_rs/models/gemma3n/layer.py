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

from yoco_rs.attention import AttentionBackend, AttentionMetadata
from yoco_rs.executor.invariance import SMALL_GEMM_FMA
from yoco_rs.models.gemma3n.config import Gemma3nTextArgs
from yoco_rs.models.gemma3n.fused import FusedParams
from yoco_rs.models.gemma3n.ops import (
    apply_rope, gaussian_topk, gaussian_topk_multiplier, gelu_tanh, gpu_fused, norm_rope, residual_mean, rms_norm,
)


def _empty(*shape: int, dtype: torch.dtype, device: torch.device | str | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


def _on_cpu(device: torch.device | str | None) -> bool:
    return torch.device(device if device is not None else "cpu").type == "cpu"


def projection_weight(out_features: int, in_features: int, *, dtype, device) -> nn.Parameter:
    """A projection's ``[out, in]`` weight; on the CPU stored in panels or K-major (``executor/cpu_linear.py``:
    what the row-invariant kernel streams; the values and names are the checkpoint's, the tensor shape of
    panels is not: ``cpu_linear.weight_shape`` gives the ``[out, in]``)."""
    if not _on_cpu(device):
        return _empty(out_features, in_features, dtype=dtype, device=device)
    from yoco_rs.executor.cpu_linear import cpu_weight

    return nn.Parameter(cpu_weight(out_features, in_features, dtype), requires_grad=False)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear``, also for a CPU weight in panels (which only the CPU kernel reads)."""
    if w.dim() == 3:
        from yoco_rs.executor.cpu_linear import panel_linear

        return panel_linear(x, w)
    return F.linear(x, w)


class Projecting:
    """What the model's modules call for every projection: ``lin(x, weight)``, :func:`linear` until the
    executor installs its CPU linear (:meth:`Gemma3nModel.use_linear`)."""

    lin = staticmethod(linear)


class Linear(nn.Module, Projecting):
    """A bias-free projection whose only parameter is ``weight [out, in]``."""

    def __init__(self, in_features: int, out_features: int, *, dtype, device):
        super().__init__()
        self.weight = projection_weight(out_features, in_features, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, *, dtype, device, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = _empty(dim, dtype=dtype, device=device) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


FUSE_MAX_ROWS = 512
"""On the CPU, up to this many tokens, q/k/v (and MLP gate/up) run as one GEMM each: fewer torch calls.
Above it the separate GEMMs win (their outputs are contiguous for the elementwise ops that follow). Same
values. Never on other devices: the fused weights are built lazily, which a CUDA graph capture must not
see."""


def _fuse(x: torch.Tensor) -> bool:
    return x.shape[0] <= FUSE_MAX_ROWS and x.device.type == "cpu"


PREDICT_CHUNK = 1024


@dataclass
class AttnContext:
    """Where a layer's attention reads/writes: the backend, this half's metadata, the layer's KV slice."""

    backend: AttentionBackend
    meta: AttentionMetadata
    kv_layer: torch.Tensor
    group: int


class Attention(nn.Module, Projecting):
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
            # small batches: q, k, v in one GEMM, normed together (v's scale is 1), q and k rotated together
            self._qkv = FusedParams([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            self._scale: torch.Tensor | None = None
            self._scale_key: tuple = ()
        self.o_proj = Linear(self.num_heads * d, h, **kw)
        self.eps = args.rms_norm_eps

    def _qkv_scale(self) -> torch.Tensor:
        """``[nH + 2 nKV, D]``: q_norm's scale per q head, k_norm's per k head, ones for v heads."""
        qw, kw = self.q_norm.weight, self.k_norm.weight
        key = (qw.data_ptr(), qw._version, kw.data_ptr(), kw._version)
        if self._scale is None or key != self._scale_key:
            with torch.inference_mode(False):
                nh, nkv = self.num_heads, self.num_kv_heads
                self._scale = torch.cat([qw.detach().expand(nh, -1), kw.detach().expand(nkv, -1),
                                         torch.ones_like(kw).expand(nkv, -1)])
            self._scale_key = key
        return self._scale

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttnContext,
                write: bool = True) -> torch.Tensor:
        """Attention output ``[T, H]``; a KV-producing layer first writes its tokens' K/V (unless ``write``
        is False: they were written by :meth:`write_kv` already)."""
        t, nh, nkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if self.is_shared or not write:
            q = norm_rope(self.lin(x, self.q_proj.weight).view(t, nh, d), self.q_norm.weight, self.eps, cos, sin)
        elif not _fuse(x):
            q = norm_rope(self.lin(x, self.q_proj.weight).view(t, nh, d), self.q_norm.weight, self.eps, cos, sin)
            self.write_kv(x, cos, sin, ctx)
        else:
            qkv = rms_norm(self.lin(x, self._qkv.get()).view(t, nh + 2 * nkv, d), self._qkv_scale(), self.eps)
            qk = apply_rope(qkv[:, : nh + nkv], cos, sin)
            q = qk[:, :nh]
            ctx.backend.write_kv(ctx.kv_layer, qk[:, nh:], qkv[:, nh + nkv:], ctx.meta, ctx.group)
        out = ctx.backend.attend(q, ctx.kv_layer, ctx.meta, ctx.group, 1.0)  # Gemma 3n: scaling 1.0
        return self.lin(out.reshape(t, nh * d), self.o_proj.weight)

    def write_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttnContext) -> None:
        """Only the K/V of tokens ``x`` (a producing layer), written through ``ctx``."""
        t, nkv, d = x.shape[0], self.num_kv_heads, self.head_dim
        k = norm_rope(self.lin(x, self.k_proj.weight).view(t, nkv, d), self.k_norm.weight, self.eps, cos, sin)
        v = rms_norm(self.lin(x, self.v_proj.weight).view(t, nkv, d), None, self.eps)
        ctx.backend.write_kv(ctx.kv_layer, k, v, ctx.meta, ctx.group)


class MLP(nn.Module, Projecting):
    def __init__(self, args: Gemma3nTextArgs, layer: int, *, dtype, device):
        super().__init__()
        h, i = args.hidden_size, args.intermediate_size[layer]
        kw = dict(dtype=dtype, device=device)
        self.gate_proj = Linear(h, i, **kw)
        self.up_proj = Linear(h, i, **kw)
        self.down_proj = Linear(i, h, **kw)
        self._gate_up = FusedParams([self.gate_proj.weight, self.up_proj.weight])
        self.intermediate = i
        sparsity = args.activation_sparsity_pattern[layer]
        self.sparse = sparsity > 0.0
        self.register_buffer("topk_multiplier", gaussian_topk_multiplier(sparsity, dtype).to(device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fuse(x):
            gate_up = self.lin(x, self._gate_up.get())
            gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate:]
        else:
            gate, up = self.lin(x, self.gate_proj.weight), self.lin(x, self.up_proj.weight)
        if self.sparse:
            gate = gaussian_topk(gate, self.topk_multiplier)
        return self.lin(gelu_tanh(gate).mul_(up), self.down_proj.weight)


class AltUp(nn.Module, Projecting):
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
        normed = rms_norm(x, self.router_norm.weight, self.router_norm.eps)
        routed = self.lin(normed * self.router_input_scale, self.modality_router.weight)
        return torch.tanh(routed) if routed.dtype == torch.float32 else torch.tanh(routed.float()).type_as(x)

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """``pred[:, i] = h[:, i] + sum_k c[i*A + k] h[:, k]`` with ``c`` routed from stream 0.

        transformers computes the sum as a batched GEMM ``[H, A] @ [A, A]`` per token; with K = A that GEMM
        either rounds each product and adds them in order or runs one FMA chain, depending on the CPU's BLAS
        (``invariance.SMALL_GEMM_FMA``, probed); these elementwise ops do exactly the same (``mul`` + ``add``
        or ``addcmul``: bit-identical, pinned by a test) in a fraction of the time, and per token, so batch
        invariant. Tokens go in chunks of ``PREDICT_CHUNK`` so the temporaries stay in cache."""
        t, a = h.shape[0], self.num_inputs
        coefs = self.lin(self.modalities(h[:, 0]), self.prediction_coefs.weight).view(t, a, a)
        if gpu_fused(h, "altup") and h.is_contiguous():  # one launch, the same roundings
            from yoco_rs.kernels.layer_elementwise import altup_predict

            return altup_predict(h, coefs)
        out = torch.empty_like(h)
        fma = h.device.type == "cpu" and SMALL_GEMM_FMA
        for s in range(0, t, PREDICT_CHUNK):
            hs, cs, o = h[s:s + PREDICT_CHUNK], coefs[s:s + PREDICT_CHUNK], out[s:s + PREDICT_CHUNK]
            torch.mul(hs[:, None, 0], cs[:, :, 0, None], out=o)
            for k in range(1, a):
                if fma:
                    o.addcmul_(hs[:, None, k], cs[:, :, k, None])
                else:
                    o.add_(hs[:, None, k] * cs[:, :, k, None])
            o.add_(hs)
        return out

    def correct(self, pred: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """``corr[:, j] = pred[:, j] + (coef_j + 1) * (activated - pred[:, 0])``."""
        raw = self.lin(self.modalities(activated), self.correction_coefs.weight)
        if gpu_fused(pred, "altup") and pred.is_contiguous() and activated.stride(-1) == 1:  # one launch, same roundings
            from yoco_rs.kernels.layer_elementwise import altup_correct

            return altup_correct(pred, activated, raw)
        innovation = activated - pred[:, 0]
        coefs = raw + 1.0
        corrected = innovation[:, None, :] * coefs[:, :, None]
        return corrected.add_(pred)

    def scale_corrected_output(self, x: torch.Tensor) -> torch.Tensor:
        s = self.correct_output_scale
        return x * s if x.dtype == s.dtype else (x.type_as(s) * s).type_as(x)


class Laurel(nn.Module):
    def __init__(self, args: Gemma3nTextArgs, *, dtype, device):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.linear_left = Linear(args.hidden_size, args.laurel_rank, **kw)
        self.linear_right = Linear(args.laurel_rank, args.hidden_size, **kw)
        self.post_laurel_norm = RMSNorm(args.hidden_size, args.rms_norm_eps, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))


class DecoderLayer(nn.Module, Projecting):
    def __init__(self, args: Gemma3nTextArgs, layer: int, *, dtype, device):
        super().__init__()
        h, p, eps = args.hidden_size, args.hidden_size_per_layer_input, args.rms_norm_eps
        kw = dict(dtype=dtype, device=device)
        self.layer = layer
        self.eps = eps
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
                ctx: AttnContext, rows: torch.Tensor | None = None,
                rows_ctx: AttnContext | None = None) -> torch.Tensor:
        """``h [T, A, H]``, ``per_layer_input [T, P]``, ``cos/sin [T, 1, D]`` -> new ``[T, A, H]``.

        With ``rows`` (a KV-producing layer whose output only ``rows`` need, i.e. the last self-decoder
        layer under fast prefill): K/V are written for all T tokens, everything after that runs for the
        tokens ``rows`` only, attending through ``rows_ctx``; returns ``[len(rows), A, H]``, the same
        values as the full layer's rows (every step is per token, and attention per query).

        The norms and small projections are called as functions on the submodules' weights (a decode step
        runs hundreds of them: module-call overhead shows)."""
        eps = self.eps
        pred = self.altup.predict(h)
        active = pred[:, 0]
        x = rms_norm(active, self.input_layernorm.weight, eps)
        if rows is not None:
            self.self_attn.write_kv(x, cos, sin, ctx)
            pred, x = pred.index_select(0, rows), x.index_select(0, rows)
            active = pred[:, 0]
            cos, sin, per_layer_input = cos.index_select(0, rows), sin.index_select(0, rows), \
                per_layer_input.index_select(0, rows)
            ctx = rows_ctx
        lr = self.laurel
        # in-place where a fresh result is consumed once (same operations and operand order: same values)
        laurel = rms_norm(self.lin(self.lin(x, lr.linear_left.weight), lr.linear_right.weight),
                          lr.post_laurel_norm.weight, eps).add_(x)
        attn = rms_norm(self.self_attn(x, cos, sin, ctx, write=rows is None), self.post_attention_layernorm.weight, eps)
        gated = residual_mean(active, attn, laurel)
        mlp = self.mlp(rms_norm(gated, self.pre_feedforward_layernorm.weight, eps))
        out = rms_norm(mlp, self.post_feedforward_layernorm.weight, eps).add_(gated)
        corr = self.altup.correct(pred, out)

        first = corr[:, 0]
        if self.correct_scale:
            first = self.altup.scale_corrected_output(first)
        first = gelu_tanh(self.lin(first, self.per_layer_input_gate.weight)).mul_(per_layer_input)
        first = rms_norm(self.lin(first, self.per_layer_projection.weight), self.post_per_layer_input_norm.weight, eps)
        corr[:, 1:] += first[:, None, :]
        return corr
