"""The Gemma 3n text decoder, split for YOCO fast prefill into three independently callable parts.

* :meth:`Gemma3nModel.self_decoder` ``(input_ids [T], positions [T], kv_caches, meta)`` ->
  ``(hidden [T, A, H], per_layer_inputs [T, N, P])``: embeddings, per-layer inputs (PLE), AltUp expansion,
  then layers ``0 .. first_shared-1``, writing the K/V of every producing layer through
  ``meta.slot_mapping``.
* :meth:`Gemma3nModel.self_decoder_for_rows`: the same followed by picking X rows, skipping the last
  self-decoder layer's work past its K/V for the other tokens (what fast prefill executes).
* :meth:`Gemma3nModel.cross_decoder` ``(hidden [X, A, H], per_layer_inputs [X, N, P], positions [X],
  kv_caches, meta)`` -> ``hidden [X, A, H]``: the KV-sharing layers ``first_shared .. N-1``, on whatever rows
  they are given (the selected rows in fast prefill; all T rows otherwise), attending to their donors' KV.
* :meth:`Gemma3nModel.compute_logits` ``(hidden [X, A, H])`` -> ``float32 [X, V]``: AltUp unembed and
  magnitude match, stream average, final norm, tied head, final softcap.

The AltUp state is token-major (``[T, A, H]``), so picking rows for the cross-decoder is a dim-0 gather.
Each half takes fixed-shape tensors plus metadata built beforehand and performs no host sync, so it can be
captured as a CUDA graph. ``kv_caches[g]`` is the KV tensor of group ``g``
(``[num_layers_in_group, 2, num_blocks, block_size, nKV, D]``, see :func:`config.kv_groups`).

Parameter names equal transformers' ``Gemma3nTextModel`` names (``layers.3.mlp.gate_proj.weight``, ...).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from yoco_rs.attention import AttentionBackend, AttentionMetadata
from yoco_rs.models.gemma3n.config import Gemma3nTextArgs, kv_groups, kv_slices
from yoco_rs.models.gemma3n.layer import (
    AttnContext, DecoderLayer, Linear, Projecting, RMSNorm, _empty, projection_weight,
)
from yoco_rs.models.gemma3n.ops import magnitude_match, rms, rope_cos_sin, rope_inv_freq
from yoco_rs.models.gemma3n.ple_host import HostPerLayerEmbedding


class Embedding(nn.Module):
    def __init__(self, num: int, dim: int, scale: float, *, dtype, device, projection: bool = False):
        """``projection``: the table is also a projection's weight (the tied LM head): laid out as one."""
        super().__init__()
        self.weight = (projection_weight if projection else _empty)(num, dim, dtype=dtype, device=device)
        # transformers: a float32 buffer cast to the weight dtype before the multiply (sqrt(2048) -> 45.25 in bf16)
        self.register_buffer("embed_scale", torch.tensor(scale, device=device).to(dtype), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight.dim() == 3:  # a CPU table in panels (the tied head's layout, executor/cpu_linear.py)
            from yoco_rs.executor.cpu_linear import embedding

            return embedding(ids, self.weight) * self.embed_scale
        return F.embedding(ids, self.weight) * self.embed_scale


class Gemma3nModel(nn.Module, Projecting):
    def __init__(self, args: Gemma3nTextArgs, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, per_layer_embeddings_on_host: bool = False):
        """``per_layer_embeddings_on_host``: the per-layer embedding table is no parameter of the model but a
        host table attached at load (:class:`HostPerLayerEmbedding`, memory-mapped from the checkpoint)."""
        super().__init__()
        self.args = args
        self.dtype = dtype
        h, n, p = args.hidden_size, args.num_hidden_layers, args.hidden_size_per_layer_input
        kw = dict(dtype=dtype, device=device)
        self.embed_tokens = Embedding(args.vocab_size, h, h**0.5, projection=args.tie_word_embeddings, **kw)
        ple = HostPerLayerEmbedding if per_layer_embeddings_on_host else Embedding
        self.embed_tokens_per_layer = ple(args.vocab_size_per_layer_input, n * p, p**0.5, **kw)
        self.per_layer_embeddings_on_host = per_layer_embeddings_on_host
        self.per_layer_model_projection = Linear(h, n * p, **kw)
        self.per_layer_projection_norm = RMSNorm(p, args.rms_norm_eps, **kw)
        self.altup_projections = nn.ModuleList([Linear(h, h, **kw) for _ in range(1, args.altup_num_inputs)])
        self.altup_unembed_projections = nn.ModuleList([Linear(h, h, **kw) for _ in range(1, args.altup_num_inputs)])
        self.layers = nn.ModuleList([DecoderLayer(args, i, **kw) for i in range(n)])
        self.norm = RMSNorm(h, args.rms_norm_eps, **kw)
        self.lm_head = None if args.tie_word_embeddings else Linear(h, args.vocab_size, **kw)
        self.register_buffer("per_layer_projection_scale", torch.tensor(h**-0.5, device=device).to(dtype),
                             persistent=False)
        self.register_buffer("per_layer_input_scale", torch.rsqrt(torch.tensor(2.0, device=device)).to(dtype),
                             persistent=False)
        self.layer_types = list(args.layer_types)
        for t in sorted(set(args.layer_types)):
            self.register_buffer(f"inv_freq_{t}", rope_inv_freq(args.rope_theta[t], args.head_dim).to(device),
                                 persistent=False)
        self.groups = kv_groups(args)
        self.kv_slices = kv_slices(args)
        self.first_shared = args.first_shared

    def use_linear(self, lin) -> None:
        """Every projection of the model calls ``lin(x, weight)`` from now on (the executor's CPU linear)."""
        for m in self.modules():
            if isinstance(m, Projecting):
                m.lin = lin

    # ---- the host-resident per-layer embedding table ------------------------------------------------------

    def stage_per_layer_inputs(self, input_ids_host: torch.Tensor) -> None:
        """Before a forward on a non-CPU device with a host table: gather the step's per-layer embedding
        rows and copy them in asynchronously (what a replayed CUDA graph reads). A no-op otherwise."""
        if self.per_layer_embeddings_on_host:
            self.embed_tokens_per_layer.stage(input_ids_host)

    def reserve_per_layer_inputs(self, rows: int) -> None:
        """Fixes the device staging buffer at ``rows`` tokens (before capturing CUDA graphs)."""
        if self.per_layer_embeddings_on_host:
            self.embed_tokens_per_layer.reserve(rows)

    def weight_bytes(self) -> tuple[int, int]:
        """``(on the device, in host memory)``: parameter bytes, and the host-resident table's."""
        dev = sum(p.numel() * p.element_size() for p in self.parameters())
        host = self.embed_tokens_per_layer.host_bytes() if self.per_layer_embeddings_on_host else 0
        return dev, host

    # ---- pieces -----------------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor, overlay: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T]`` ids -> AltUp streams ``[T, A, H]`` and per-layer inputs ``[T, N, P]``.

        ``overlay``: ``(token_index [M], embeddings [M, H])`` written over the token embeddings first
        (image / audio embeddings, ``executor/mm_inputs.py``); the per-layer projection then sees them."""
        a = self.args
        ids = input_ids.to(torch.int64)
        e = self.embed_tokens(ids)
        if overlay is not None:
            idx, vals = overlay
            e = e.index_copy(0, idx.to(e.device), vals.to(e.device, e.dtype))
        in_table = (ids >= 0) & (ids < a.vocab_size_per_layer_input)
        ple_tok = self.embed_tokens_per_layer(torch.where(in_table, ids, 0))
        ple_tok = ple_tok.view(ids.shape[0], a.num_hidden_layers, a.hidden_size_per_layer_input)
        proj = self.per_layer_model_projection(e) * self.per_layer_projection_scale
        proj = self.per_layer_projection_norm(proj.view(ids.shape[0], a.num_hidden_layers, -1))
        ple = (proj + ple_tok) * self.per_layer_input_scale

        target = rms(e)
        streams = [e] + [magnitude_match(proj_j(e), target) for proj_j in self.altup_projections]
        return torch.stack(streams, dim=1), ple

    def rope(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per layer type, cos/sin ``[T, 1, D]`` (broadcast over heads)."""
        out = {}
        for t in set(self.layer_types):
            cos, sin = rope_cos_sin(positions, getattr(self, f"inv_freq_{t}"), self.dtype)
            out[t] = cos[:, None], sin[:, None]
        return out

    def run_layers(self, start: int, end: int, h: torch.Tensor, ple: torch.Tensor, positions: torch.Tensor,
                   kv_caches: Sequence[torch.Tensor], backend: AttentionBackend, meta: AttentionMetadata,
                   collect: list | None = None) -> torch.Tensor:
        rope = self.rope(positions)
        for i in range(start, end):
            g, s = self.kv_slices[i]
            cos, sin = rope[self.layer_types[i]]
            h = self.layers[i](h, ple[:, i], cos, sin, AttnContext(backend, meta, kv_caches[g][s], g))
            if collect is not None:
                collect.append(h)
        return h

    # ---- the three callable parts ---------------------------------------------------------------------------

    def self_decoder(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[torch.Tensor],
                     backend: AttentionBackend, meta: AttentionMetadata,
                     collect: list | None = None, *, overlay=None) -> tuple[torch.Tensor, torch.Tensor]:
        h, ple = self.embed(input_ids, overlay)
        h = self.run_layers(0, self.first_shared, h, ple, positions, kv_caches, backend, meta, collect)
        return h, ple

    def self_decoder_for_rows(self, input_ids: torch.Tensor, positions: torch.Tensor,
                              kv_caches: Sequence[torch.Tensor], backend: AttentionBackend, meta: AttentionMetadata,
                              rows: torch.Tensor, rows_meta: AttentionMetadata, *,
                              overlay=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``self_decoder`` followed by picking ``rows``, the fast-prefill way: identical K/V for every token
        and identical values for the rows, but the last self-decoder layer runs past its K/V projection only
        for the rows (the other tokens' outputs would feed nothing), attending through ``rows_meta`` (the
        cross half's metadata). Returns ``(hidden [X, A, H], per_layer_inputs [X, N, P])`` of the rows."""
        h, ple = self.embed(input_ids, overlay)
        last = self.first_shared - 1
        h = self.run_layers(0, last, h, ple, positions, kv_caches, backend, meta)
        g, s = self.kv_slices[last]
        cos, sin = self.rope(positions)[self.layer_types[last]]
        h = self.layers[last](h, ple[:, last], cos, sin, AttnContext(backend, meta, kv_caches[g][s], g),
                              rows=rows, rows_ctx=AttnContext(backend, rows_meta, kv_caches[g][s], g))
        return h, ple.index_select(0, rows)

    def cross_decoder(self, hidden: torch.Tensor, per_layer_inputs: torch.Tensor, positions: torch.Tensor,
                      kv_caches: Sequence[torch.Tensor], backend: AttentionBackend, meta: AttentionMetadata,
                      collect: list | None = None) -> torch.Tensor:
        return self.run_layers(self.first_shared, self.args.num_hidden_layers, hidden, per_layer_inputs,
                               positions, kv_caches, backend, meta, collect)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        h0 = hidden[:, 0]
        target = rms(h0)
        streams = [h0] + [magnitude_match(unemb(hidden[:, j + 1]), target)
                          for j, unemb in enumerate(self.altup_unembed_projections)]
        x = self.norm(torch.mean(torch.stack(streams), dim=0))
        logits = self.lin(x, self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight)
        cap = self.args.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
