"""The torch reference attention backend: runs everywhere (CPU tests, the GPU fallback).

Rows are split by query count when the metadata is built, and each kind is computed for all rows of the
step together, in a few batched torch calls per layer (no per-request Python):

* *single-query rows* (decode steps, the cross-decoder's usual one row per request):
  :mod:`.attention_decode` (key pages gathered once per step and KV slice, buckets of similar context
  length, GQA without repeating K/V, values summed straight from the cache);
* *multi-query rows* (prefill chunks, prompt-logprob cross rows): :mod:`.attention_prefill`, in chunks of
  ``QUERY_CHUNK`` queries, each over only the keys its queries can see (causal: up to its last query;
  sliding: from its first query's window start), chunks of similar span batched together. That bounds
  the score tensor and skips the masked parts of the ``L x S`` score matrix: a long prompt costs
  ``O(L * W)`` on sliding layers, about half of ``L^2`` on full ones.

Gather indices and additive masks are precomputed per KV group in :meth:`build_metadata` and shared by
every layer of the group.

Batch invariance (CPU float32; :mod:`.invariance` lists the measured BLAS/softmax properties): every GEMM
has at least ``MIN_GEMM_ROWS`` query rows, every key span at least ``MIN_KEYS`` keys (the executor pads
both halves to >= 4 tokens for the same reason), and values are summed in fixed pieces of absolute key
positions. A token's result is then independent of the batch, of the chunking and of prefill vs decode,
at any context length; while its keys stay within the first ``VALUE_PIECE`` (192) positions it is also
bit-identical to transformers' whole-sequence forward (beyond, the last ulps differ, 1e-7 relative: the
oracle's own GEMM splits its sums at points that depend on its sequence length). Masked scores get
``finfo.min`` added (as transformers' eager attention does) rather than ``-inf``, so a fully masked
padding query stays finite; the cache must hold finite values (the executor allocates it zeroed).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch

from yoco_rs.attention import AttentionBackend, AttentionMetadata
from yoco_rs.executor.attention_decode import DecodeAttention, DecodeRows, build_decode_rows
from yoco_rs.executor.attention_prefill import PrefillAttention, PrefillRows, build_prefill_rows
from yoco_rs.executor.invariance import FMA_CHAIN_MAX, MIN_GEMM_ROWS, MIN_KEYS

__all__ = ["TorchAttentionBackend", "TorchAttentionMetadata", "QUERY_CHUNK", "MIN_GEMM_ROWS", "MIN_KEYS",
           "FMA_CHAIN_MAX"]

QUERY_CHUNK = 64

_serials = itertools.count(1)


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    single: list[DecodeRows] = field(default_factory=list)
    """Per group, the single-query rows (empty when there are none)."""
    multi: list[PrefillRows] = field(default_factory=list)
    """Per group, the multi-query rows (empty when there are none)."""
    serial: int = 0
    """Identifies this metadata for the reuse of gathered keys across layers."""


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        self._decode = DecodeAttention()
        self._prefill = PrefillAttention()

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

        # ---- multi-query rows: chunks of QUERY_CHUNK queries, batched -----------------------------------
        multi = torch.nonzero(qlens > 1).flatten().tolist()
        if multi:
            qsl_l, sl_l = qsl.tolist(), sl.tolist()
            rows = [(r, qsl_l[r], qsl_l[r + 1] - qsl_l[r], sl_l[r]) for r in multi]
            meta.multi = [build_prefill_rows(rows, table, w, bs, dtype, QUERY_CHUNK)
                          for table, w in zip(block_tables, windows)]
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
        out = q.new_zeros(q.shape)
        if meta.single:
            self._decode.attend(q, kv_layer, meta.single[group], meta.serial, group, scale, out)
        if meta.multi:
            self._prefill.attend(q, kv_layer, meta.multi[group], scale, out)
        return out
