"""The torch reference attention backend: runs everywhere (CPU tests, the GPU fallback).

Rows are split by query count when the metadata is built:

* *single-query rows* (decode steps, the cross-decoder's usual one row per request) are computed together
  for all of them: their keys are gathered a *page* (``PAGE_TOKENS`` tokens, or a whole block when blocks
  are smaller) at a time into one padded ``[R, S, nKV, D]`` buffer (sliding rows: only the pages their
  window touches), then, per KV head, one batched GEMM for the scores of all rows and that head's query
  heads (GQA by grouping the queries, K/V are never repeated), one softmax for everything, and one GEMM
  per ``PV_KEY_CHUNK`` keys for the values. The gather indices and masks are built once per step and
  group in :meth:`build_metadata` and shared by every layer of the group; the gathered buffer itself is
  reused by the following layers that read the same KV slice (a donor and its KV-sharing layers) until
  that slice is written again.
* *multi-query rows* (prefill chunks, prompt-logprob cross rows) run in pieces of ``QUERY_CHUNK``
  queries, each over only the keys its queries can see (causal: up to its last query; sliding: from its
  first query's window start). That bounds the score tensor and skips the masked parts of the
  ``L x S`` score matrix: a long prompt costs ``O(L * W)`` on sliding layers, about half of ``L^2`` on
  full ones.

Batch invariance (CPU float32): a token's result must not depend on what else is in the batch, so that
greedy output is the same across batch compositions, chunkings and fast prefill on/off, and equal to a
whole-sequence forward. CPU BLAS takes a different code path (different rounding) for GEMMs with fewer
than 4 rows, and softmax rounds differently on rows shorter than 16. So every GEMM here has at least
``MIN_GEMM_ROWS`` query rows (zero rows are added when a row has fewer) and every key span at least
``MIN_KEYS`` keys (extra keys are masked); the executor pads both halves to >= 4 tokens for the same
reason. What stays exact, measured on MKL/AVX-512 (``tests/test_executor_attention.py`` pins it): a
score is the same dot product whatever the GEMM's width, batch or K layout (a strided view of the
cache); softmax gives the same probabilities whatever masked keys surround a row; a value GEMM over at
most 256 keys is one sequential sum, so masked keys before or after a row's keys add exact zeros. Over
more keys BLAS splits the sum at points that depend on the GEMM's total key count; the single-query path
therefore sums values in fixed chunks of ``PV_KEY_CHUNK`` keys counted from the row's own first page,
which keeps a decode token independent of the batch at any context length. Spans up to 256 keys are
bit-identical to transformers' whole-sequence forward and across prefill/decode; beyond that results
differ from those in the last ulps (1e-7 relative). Masked scores get ``finfo.min`` added (as
transformers' eager attention does) rather than ``-inf``, so a fully masked padding query stays finite;
the cache must hold finite values (the executor allocates it zeroed).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from yoco_rs.executor.attention import AttentionBackend, AttentionMetadata


@dataclass
class _QueryChunk:
    """Queries ``start:end`` of one multi-query row in one group: key slots ``[S]``, additive mask ``[L, S]``."""

    start: int
    end: int
    slots: torch.Tensor
    mask: torch.Tensor


@dataclass
class _SingleRows:
    """The single-query rows of one group: key pages to gather, value indices, the mask over their keys."""

    page_ids: torch.Tensor
    """[Rs * pages] int64 page ids in a layer's K viewed as ``[num_pages, page * nKV * D]`` (0: padding)."""
    pages: int
    """Pages per row (the longest row's, at least ``MIN_KEYS`` keys)."""
    page: int
    """Tokens per page."""
    mask: torch.Tensor
    """[Rs, 1, pages * page] additive mask (0 visible, ``finfo.min`` masked)."""
    value_index: dict[tuple[int, int, bool], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """Per ``(nKV, G, fused)``: ``embedding_bag`` indices and offsets of the value sums (built on first use)."""

    def value_bags(self, nkv: int, grp: int, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One bag per (row, query head) (``fused``) or per (KV head, row, query head of that KV head),
        over the row's gathered keys: index ``slot * nKV + kv_head`` into V viewed as ``[slots * nKV, D]``."""
        got = self.value_index.get((nkv, grp, fused))
        if got is None:
            ids = self.page_ids.view(-1, self.pages)
            rs, s, dev = ids.shape[0], self.pages * self.page, ids.device
            slots = (ids[:, :, None] * self.page + torch.arange(self.page, device=dev)).view(rs, 1, s) * nkv
            if fused:
                index = slots + torch.arange(nkv * grp, device=dev).view(1, -1, 1) // grp
            else:
                index = (slots[None] + torch.arange(nkv, device=dev).view(nkv, 1, 1, 1)).expand(nkv, rs, grp, s)
            index = index.reshape(-1)
            got = index, torch.arange(0, index.numel(), s, device=dev)
            self.value_index[(nkv, grp, fused)] = got
        return got


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    single_query_idx: torch.Tensor | None = None
    """[Rs] query index of each single-query row (device), None when there are none."""
    single: list[_SingleRows] = field(default_factory=list)
    """Per group, the single-query rows' gather pages and mask."""
    multi_chunks: list[list[_QueryChunk]] = field(default_factory=list)
    """Per group, the query chunks of all multi-query rows."""
    serial: int = 0
    """Distinguishes metadata objects for the backend's gathered-KV reuse."""


MIN_GEMM_ROWS = 4
MIN_KEYS = 16
QUERY_CHUNK = 256
FMA_CHAIN_MAX = 192
"""Up to this many summands a BLAS GEMM sums each output as one sequential FMA chain (MKL, AVX-512)."""
PAGE_TOKENS = 16
"""Gather granularity of the single-query path (tokens); smaller blocks are gathered whole."""

_serials = itertools.count(1)


def _pad_rows(x: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """``x`` with zero entries appended along ``dim`` up to ``n`` (no copy when already long enough)."""
    if x.shape[dim] >= n:
        return x
    shape = list(x.shape)
    shape[dim] = n - x.shape[dim]
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        self._scratch: dict[int, torch.Tensor] = {}
        """Per group, the buffer the single-query path gathers K/V into (grown as needed)."""
        self._held: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}
        """Per group, ``((meta.serial, kv_layer.data_ptr()), gathered)`` of the buffer's current content."""

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

        # ---- single-query rows: one batched computation --------------------------------------------------
        single = torch.nonzero(qlens == 1).flatten()
        if single.numel():
            meta.single_query_idx = qsl[single].to(device)
            qpos = positions.index_select(0, meta.single_query_idx)
            rows_d = single.to(device)
            seq = sl[single]
            for table, w in zip(block_tables, windows):
                meta.single.append(self._single_rows(table.index_select(0, rows_d), seq, qpos, w, bs, dtype))
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

    def _single_rows(self, table: torch.Tensor, seq: torch.Tensor, qpos: torch.Tensor, window: int | None,
                     bs: int, dtype: torch.dtype) -> _SingleRows:
        """Pages covering keys ``[start, seq)`` of each row (``start``: 0, or ``seq - W`` when sliding).
        ``table`` holds the rows' block tables (device), ``seq`` their lengths (host), ``qpos`` the query
        positions (device)."""
        device = table.device
        page = min(bs, PAGE_TOKENS)
        per_block = bs // page
        start = seq.new_zeros(seq.shape) if window is None else (seq - window).clamp(min=0)
        first, last = start // page, (seq - 1) // page
        pages = max(int((last - first).max()) + 1, -(-MIN_KEYS // page))
        pg = first[:, None] + torch.arange(pages)  # absolute page number of each gathered page
        valid = (pg <= last[:, None]).to(device)
        col = (pg // per_block).clamp(max=table.shape[1] - 1).to(device)
        pg = pg.to(device)
        blocks = table.gather(1, col).to(torch.int64)
        ids = torch.where(valid, blocks * per_block + pg % per_block, 0)
        kpos = (pg[:, :, None] * page + torch.arange(page, device=device)).view(len(seq), pages * page)
        mask = self._mask(kpos, qpos[:, None], window, dtype)
        return _SingleRows(ids.flatten(), pages, page, mask[:, None, :])

    def _gathered_keys(self, kv_layer: torch.Tensor, meta: TorchAttentionMetadata, group: int) -> torch.Tensor:
        """``[Rs, S, nKV, D]``: the single-query rows' key pages of ``kv_layer``, gathered into a scratch
        buffer kept per group, reused while the same metadata reads the same, unwritten slice."""
        sr = meta.single[group]
        key = (meta.serial, kv_layer.data_ptr())
        held = self._held.get(group)
        if held is not None and held[0] == key:
            return held[1]
        nkv, d = kv_layer.shape[-2:]
        pages = kv_layer[0].view(-1, sr.page * nkv * d)
        need = sr.page_ids.numel() * pages.shape[1]
        buf = self._scratch.get(group)
        if buf is None or buf.numel() < need or buf.dtype != kv_layer.dtype or buf.device != kv_layer.device:
            buf = torch.empty(need, dtype=kv_layer.dtype, device=kv_layer.device)
            self._scratch[group] = buf
        out = buf[:need].view(sr.page_ids.numel(), pages.shape[1])
        torch.index_select(pages, 0, sr.page_ids, out=out)
        k = out.view(-1, sr.pages * sr.page, nkv, d)
        self._held[group] = (key, k)
        return k

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
        ptr = kv_layer.data_ptr()
        for g in [g for g, (key, _) in self._held.items() if key[1] == ptr]:
            del self._held[g]
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
            self._attend_single(q, kv_layer, meta, group, scale, out)
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

    def _attend_single(self, q: torch.Tensor, kv_layer: torch.Tensor, meta: TorchAttentionMetadata, group: int,
                       scale: float, out: torch.Tensor) -> None:
        """Scores: GEMMs over the gathered keys with the query heads as rows (at least ``MIN_GEMM_ROWS``).
        When ``nKV * D <= FMA_CHAIN_MAX`` all heads go in one GEMM per row against all KV heads at once,
        each query zero outside its own KV head's ``D`` columns (the zeros add nothing to the FMA chain, so
        every score is the chain a per-head GEMM computes); otherwise one GEMM per KV head. Values: one
        ``embedding_bag`` straight from the cache, a sequential FMA sum per output, which is what a GEMM
        computes for up to ``FMA_CHAIN_MAX`` keys, and independent of the batch at any length."""
        idx = meta.single_query_idx
        sr = meta.single[group]
        rs, (_, nh, d), nkv = idx.shape[0], q.shape, kv_layer.shape[-2]
        grp = nh // nkv
        k = self._gathered_keys(kv_layer, meta, group)  # [Rs, S, nKV, D]
        s = k.shape[1]
        fused = nkv == 1 or nkv * d <= FMA_CHAIN_MAX
        qs = q.index_select(0, idx)
        if fused:
            rows = max(nh, MIN_GEMM_ROWS)
            if nkv == 1:
                qf = _pad_rows(qs, 1, rows)
            else:
                qf = q.new_zeros(rs, rows, nkv, d)
                qf[:, :nh].view(rs, nkv, grp, nkv, d).diagonal(dim1=1, dim2=3).copy_(
                    qs.view(rs, nkv, grp, d).permute(0, 2, 3, 1))
            scores = torch.bmm(qf.view(rs, rows, nkv * d), k.view(rs, s, nkv * d).transpose(1, 2))
            mask = sr.mask
        else:
            rows = max(grp, MIN_GEMM_ROWS)
            qh = _pad_rows(qs.view(rs, nkv, grp, d).transpose(0, 1), 2, rows)
            scores = q.new_empty(nkv, rs, rows, s)
            for h in range(nkv):
                torch.bmm(qh[h], k[:, :, h].transpose(1, 2), out=scores[h])
            mask = sr.mask
        if scale != 1.0:
            scores.mul_(scale)
        scores.add_(mask)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        probs = probs[:, :nh] if fused else probs[:, :, :grp]
        index, offsets = sr.value_bags(nkv, grp, fused)
        o = F.embedding_bag(index, kv_layer[1].view(-1, d), offsets, mode="sum",
                            per_sample_weights=probs.reshape(-1))
        o = o.view(rs, nh, d) if fused else o.view(nkv, rs, grp, d).transpose(0, 1).reshape(rs, nh, d)
        out.index_copy_(0, idx, o)
