"""The torch reference attention backend: runs everywhere (CPU tests, the GPU fallback).

Rows are split by query count when the metadata is built:

* *single-query rows* (decode steps, the cross-decoder's usual one row per request) are computed in one
  batched gather + matmul for all of them, no per-request Python;
* *multi-query rows* (prefill chunks, prompt-logprob cross rows) run in pieces of ``QUERY_CHUNK``
  queries, each over only the keys its queries can see (causal: up to its last query; sliding: from its
  first query's window start). That bounds the score tensor and skips the masked parts of the
  ``L x S`` score matrix: a long prompt costs ``O(L * W)`` on sliding layers, about half of ``L^2`` on
  full ones.

Index tensors (key slots) and additive masks are precomputed per KV group in :meth:`build_metadata`, so
``attend`` is gathers, two matmuls and a softmax.

Batch invariance (CPU float32): a token's result must not depend on what else is in the batch, so that
greedy output is the same across batch compositions, chunkings and fast prefill on/off, and equal to a
whole-sequence forward. CPU BLAS takes a different code path (different rounding) for GEMMs with fewer
than 4 rows, and softmax rounds differently on rows shorter than 16. So every GEMM here has at least
``MIN_GEMM_ROWS`` query rows (zero rows are added when a row has fewer) and every key span at least
``MIN_KEYS`` keys (extra keys are masked); the executor pads both halves to >= 4 tokens for the same
reason. Measured: bit-identical to transformers' whole-sequence forward while key spans stay within 256
keys; beyond that BLAS blocks the key dimension by span length and results differ in the last ulps
(1e-7 relative). Masked scores get ``finfo.min`` added (as transformers'
eager attention does) rather than ``-inf``, so a fully masked padding query stays finite; the cache must
hold finite values (the executor allocates it zeroed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from yoco_rs.executor.attention import AttentionBackend, AttentionMetadata


@dataclass
class _QueryChunk:
    """Queries ``start:end`` of one multi-query row in one group: key slots ``[S]``, additive mask ``[L, S]``."""

    start: int
    end: int
    slots: torch.Tensor
    mask: torch.Tensor


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    single_query_idx: torch.Tensor | None = None
    """[Rs] query index of each single-query row (device), None when there are none."""
    single_slots: list[torch.Tensor] = field(default_factory=list)
    """Per group, [Rs, S] key slots of the single-query rows."""
    single_mask: list[torch.Tensor] = field(default_factory=list)
    """Per group, [Rs, S] additive mask."""
    multi_chunks: list[list[_QueryChunk]] = field(default_factory=list)
    """Per group, the query chunks of all multi-query rows."""


MIN_GEMM_ROWS = 4
MIN_KEYS = 16
QUERY_CHUNK = 256


def _pad_rows(x: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """``x`` with zero entries appended along ``dim`` up to ``n`` (no copy when already long enough)."""
    if x.shape[dim] >= n:
        return x
    shape = list(x.shape)
    shape[dim] = n - x.shape[dim]
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

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
        neg = torch.finfo(dtype).min
        meta = TorchAttentionMetadata(
            num_queries=int(positions.shape[0]), block_size=bs, positions=positions,
            query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=block_tables,
            windows=list(windows), slot_mapping=slot_mapping,
        )
        qsl = query_start_loc_cpu.to(torch.int64)
        sl = seq_lens_cpu.to(torch.int64)
        qlens = qsl[1:] - qsl[:-1]
        offs = torch.arange(bs, device=device)

        # ---- single-query rows: one batched computation --------------------------------------------------
        single = torch.nonzero(qlens == 1).flatten()
        if single.numel():
            rows_d = single.to(device)
            meta.single_query_idx = qsl[single].to(device)
            qpos = positions.index_select(0, meta.single_query_idx)
            seq_cpu = sl[single]
            seq_d = seq_cpu.to(device)
            for table, w in zip(block_tables, windows):
                # keys [start, seq) of each row; a sliding row needs only its last W keys
                start_cpu = torch.zeros_like(seq_cpu) if w is None else (seq_cpu - w).clamp(min=0)
                start_d = torch.zeros_like(seq_d) if w is None else (seq_d - w).clamp(min=0)
                span = max(MIN_KEYS, int((seq_cpu - start_cpu).max()))
                kpos = start_d[:, None] + torch.arange(span, device=device)
                col = (kpos // bs).clamp(max=table.shape[1] - 1)
                blocks = table.index_select(0, rows_d).gather(1, col).to(torch.int64)
                meta.single_slots.append(blocks * bs + kpos % bs)
                meta.single_mask.append(self._mask(kpos, qpos[:, None], w, dtype))

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
                    mask = self._mask(kpos[None, :], qpos[:, None], w, dtype)
                    meta.multi_chunks[g].append(_QueryChunk(cs, ce, slots, mask))
        return meta

    @staticmethod
    def _mask(kpos: torch.Tensor, qpos: torch.Tensor, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask: 0 where key ``kpos`` is visible from query ``qpos``, ``finfo.min`` elsewhere."""
        visible = kpos <= qpos
        if window is not None:
            visible &= kpos > qpos - window
        return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
            ~visible, torch.finfo(dtype).min)

    def write_kv(self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 meta: AttentionMetadata, group: int) -> None:
        assert meta.slot_mapping is not None, "this half has no slot_mapping: it must not write KV"
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
        if meta.single_query_idx is not None:
            idx = meta.single_query_idx
            rs = idx.shape[0]
            slots = meta.single_slots[group]
            qs = _pad_rows(q.index_select(0, idx).view(rs, nkv, grp, d), 2, MIN_GEMM_ROWS)
            k = flat[0][slots].permute(0, 2, 3, 1)  # [Rs, nKV, D, S]
            v = flat[1][slots].permute(0, 2, 1, 3)  # [Rs, nKV, S, D]
            scores = torch.matmul(qs, k) * scale + meta.single_mask[group][:, None, None, :]
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(probs, v)[:, :, :grp]
            out.index_copy_(0, idx, o.reshape(rs, nh, d))
        for keys in meta.multi_chunks[group]:
            s, e = keys.start, keys.end
            n = e - s
            # all heads of a KV head in one GEMM: rows (g, l) of [nKV, G*L, D]
            qr = q[s:e].view(n, nkv, grp, d).permute(1, 2, 0, 3).reshape(nkv, grp * n, d)
            qr = _pad_rows(qr, 1, MIN_GEMM_ROWS)
            k = flat[0][keys.slots].permute(1, 2, 0)  # [nKV, D, S]
            v = flat[1][keys.slots].permute(1, 0, 2)  # [nKV, S, D]
            scores = torch.matmul(qr, k) * scale
            scores = (scores[:, : grp * n].view(nkv, grp, n, -1) + keys.mask).view(nkv, grp * n, -1)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(_pad_rows(probs, 1, MIN_GEMM_ROWS), v)[:, : grp * n]
            out[s:e] = o.view(nkv, grp, n, d).permute(2, 0, 1, 3).reshape(n, nh, d)
        return out
