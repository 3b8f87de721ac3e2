"""The torch reference attention backend: runs everywhere (CPU tests, the GPU fallback).

Rows are split by query count when the metadata is built:

* *single-query rows* (decode steps, the cross-decoder's usual one row per request) are computed together,
  in a few batched calls per layer: see :mod:`.attention_decode` (key pages gathered once per step and KV
  slice, buckets of similar context length, GQA without repeating K/V, values summed straight from the
  cache);
* *multi-query rows* (prefill chunks, prompt-logprob cross rows) run in pieces of ``QUERY_CHUNK``
  queries, each over only the keys its queries can see (causal: up to its last query; sliding: from its
  first query's window start). That bounds the score tensor and skips the masked parts of the
  ``L x S`` score matrix: a long prompt costs ``O(L * W)`` on sliding layers, about half of ``L^2`` on
  full ones.

Index tensors and additive masks are precomputed per KV group in :meth:`build_metadata`, so ``attend`` is
gathers, GEMMs and a softmax.

Batch invariance (CPU float32, :mod:`.invariance` lists the measured BLAS/softmax properties): every GEMM
has at least ``MIN_GEMM_ROWS`` query rows and every key span at least ``MIN_KEYS`` keys; the executor pads
both halves to >= 4 tokens for the same reason. A token's result is then independent of the batch, and
bit-identical to transformers' whole-sequence forward and across prefill/decode while its key span stays
within ``FMA_CHAIN_MAX`` keys; beyond that the multi-query path's value GEMM rounds differently from the
decode path's sequential sum in the last ulps (1e-7 relative). Masked scores get ``finfo.min`` added (as
transformers' eager attention does) rather than ``-inf``, so a fully masked padding query stays finite;
the cache must hold finite values (the executor allocates it zeroed).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch

from yoco_rs.executor.attention import AttentionBackend, AttentionMetadata
from yoco_rs.executor.attention_decode import DecodeAttention, DecodeRows, build_decode_rows
from yoco_rs.executor.invariance import FMA_CHAIN_MAX, MIN_GEMM_ROWS, MIN_KEYS, additive_mask, pad_rows

__all__ = ["TorchAttentionBackend", "TorchAttentionMetadata", "QUERY_CHUNK", "MIN_GEMM_ROWS", "MIN_KEYS",
           "FMA_CHAIN_MAX"]

QUERY_CHUNK = 256

_serials = itertools.count(1)


@dataclass
class _QueryChunk:
    """Queries ``start:end`` of one multi-query row in one group: key slots ``[S]``, additive mask ``[L, S]``."""

    start: int
    end: int
    slots: torch.Tensor
    mask: torch.Tensor


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    single: list[DecodeRows] = field(default_factory=list)
    """Per group, the single-query rows (empty when there are none)."""
    multi_chunks: list[list[_QueryChunk]] = field(default_factory=list)
    """Per group, the query chunks of all multi-query rows."""
    serial: int = 0
    """Identifies this metadata for the reuse of gathered keys across layers."""


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        self._decode = DecodeAttention()

    def build_metadata(
        self,
        *,
        query_start_loc_cpu: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        positions: torch.Tensor,
        block_tables: Sequence[torch.Tensor],
        slot_mapping: torch.Tensor | None,
        windows: Sequence[int | None],
        block_size: int,
        dtype: torch.dtype,
    ) -> TorchAttentionMetadata:
        device = positions.device
        bs = block_size
        meta = TorchAttentionMetadata(
            num_queries=int(positions.shape[0]), block_size=bs, positions=positions,
            query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=block_tables,
            windows=list(windows), slot_mapping=slot_mapping, serial=next(_serials),
        )
        qsl = query_start_loc_cpu.to(torch.int64)
        sl = seq_lens_cpu.to(torch.int64)
        qlens = qsl[1:] - qsl[:-1]

        # ---- single-query rows: one batched computation per group --------------------------------------
        single = torch.nonzero(qlens == 1).flatten()
        if single.numel():
            query_idx = qsl[single].to(device)
            qpos = positions.index_select(0, query_idx)
            rows_d = single.to(device)
            for table, w in zip(block_tables, windows):
                meta.single.append(build_decode_rows(table.index_select(0, rows_d), sl[single], qpos, query_idx,
                                                     w, bs, dtype))

        # ---- multi-query rows: chunks of QUERY_CHUNK queries -------------------------------------------------
        multi = torch.nonzero(qlens > 1).flatten().tolist()
        meta.multi_chunks = [[] for _ in block_tables]
        qsl_l, sl_l = qsl.tolist(), sl.tolist()
        for r in multi:
            s, e, seq = qsl_l[r], qsl_l[r + 1], sl_l[r]
            first = seq - (e - s)  # position of the row's first query (bottom-right alignment)
            for cs in range(s, e, QUERY_CHUNK):
                ce = min(e, cs + QUERY_CHUNK)
                q_first, q_end = first + (cs - s), first + (ce - s)
                qpos = positions[cs:ce]
                for g, (table, w) in enumerate(zip(block_tables, windows)):
                    start = 0 if w is None else max(0, q_first - w + 1)
                    kpos = torch.arange(start, start + max(MIN_KEYS, q_end - start), device=device)
                    col = (kpos // bs).clamp(max=table.shape[1] - 1)
                    slots = table[r].index_select(0, col).to(torch.int64) * bs + kpos % bs
                    mask = additive_mask(kpos[None, :], qpos[:, None], w, dtype)
                    meta.multi_chunks[g].append(_QueryChunk(cs, ce, slots, mask))
        return meta

    def write_kv(self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 meta: AttentionMetadata, group: int) -> None:
        assert meta.slot_mapping is not None, "this half has no slot_mapping: it must not write KV"
        self._decode.invalidate(kv_layer)
        flat = kv_layer.view(2, -1, *kv_layer.shape[-2:])
        slots = meta.slot_mapping[group]
        flat[0].index_copy_(0, slots, k.to(flat.dtype))
        flat[1].index_copy_(0, slots, v.to(flat.dtype))

    def attend(self, q: torch.Tensor, kv_layer: torch.Tensor, meta: TorchAttentionMetadata, group: int,
               scale: float) -> torch.Tensor:
        tq, nh, d = q.shape
        nkv = kv_layer.shape[-2]
        grp = nh // nkv
        flat = kv_layer.view(2, -1, nkv, d)
        out = q.new_zeros(tq, nh, d)
        if meta.single:
            self._decode.attend(q, kv_layer, meta.single[group], meta.serial, group, scale, out)
        for keys in meta.multi_chunks[group]:
            s, e = keys.start, keys.end
            n = e - s
            # all heads of a KV head in one GEMM: rows (g, l) of [nKV, G*L, D]
            qr = q[s:e].view(n, nkv, grp, d).permute(1, 2, 0, 3).reshape(nkv, grp * n, d)
            qr = pad_rows(qr, 1, MIN_GEMM_ROWS)
            k = flat[0][keys.slots].permute(1, 2, 0)  # [nKV, D, S]
            v = flat[1][keys.slots].permute(1, 0, 2)  # [nKV, S, D]
            scores = torch.matmul(qr, k) * scale
            scores = (scores[:, : grp * n].view(nkv, grp, n, -1) + keys.mask).view(nkv, grp * n, -1)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(pad_rows(probs, 1, MIN_GEMM_ROWS), v)[:, : grp * n]
            out[s:e] = o.view(nkv, grp, n, d).permute(2, 0, 1, 3).reshape(n, nh, d)
        return out
