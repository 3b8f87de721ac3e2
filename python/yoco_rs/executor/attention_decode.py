"""Single-query rows of the torch reference attention (decode steps, the cross-decoder's one query per
request): all rows of a step in a handful of batched torch calls per layer, no per-row Python.

Once per step and KV group (:func:`build_decode_rows`, called by ``build_metadata``; shared by every layer
of the group):

* each row's keys are covered by *pages* of ``PAGE_TOKENS`` tokens (whole blocks when blocks are
  smaller), from the page holding its first visible key (0, or ``seq - W`` on a sliding layer): a sliding
  row gathers only its window;
* rows are ordered by span, longest first, and cut into at most ``MAX_BUCKETS`` buckets, each padded to
  its longest row, so that mixed context lengths do not all pay for the longest one (a bucket costs a few
  more torch calls per layer, weighed as ``BUCKET_COST_PAGES`` gathered pages);
* the page indices, the additive masks and the value-sum indices are computed once.

Per layer (:meth:`DecodeAttention.attend`):

1. keys: one ``index_select`` of all pages (whole pages: memcpy-sized pieces) into a scratch buffer, which
   the following layers reading the same KV slice (a donor and its KV-sharing layers) reuse until the
   slice is written again;
2. scores: per bucket one batched GEMM with the queries as rows. When ``nKV * D <= FMA_CHAIN_MAX`` all
   query heads go into one GEMM against all KV heads at once, each query zero outside its own KV head's
   ``D`` columns: zeros add nothing to an FMA chain, so every score is exactly what a per-head GEMM gives
   (see :mod:`.invariance`). Otherwise one GEMM per KV head. K/V are never repeated for GQA;
3. per bucket one mask add and one softmax (into one flat buffer);
4. values: a single ``embedding_bag`` for all buckets, reading V straight from the cache, one bag per
   (row, query head, value piece): a weighted sum is a sequential FMA chain, exactly what the multi-query
   path's ``p @ v`` GEMM computes per piece (:mod:`.invariance`); the pieces are then added in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from yoco_rs.executor.invariance import (
    FMA_CHAIN_MAX, MIN_GEMM_ROWS, MIN_KEYS, VALUE_PIECE, additive_mask, pad_rows,
)

PAGE_TOKENS = 16
"""Gather granularity in tokens (whole blocks when blocks are smaller)."""
MAX_BUCKETS = 4
BUCKET_COST_PAGES = 48
"""What one more bucket costs, in gathered pages (its extra GEMM, mask add and softmax per layer)."""


@dataclass
class DecodeRows:
    """The single-query rows of one step and KV group, in bucket order."""

    query_idx: torch.Tensor
    """[Rs] query index of each row, in bucket order (device)."""
    buckets: list[tuple[int, int]]
    """(rows, pages per row) of each bucket."""
    page: int
    """Tokens per page."""
    page_ids: torch.Tensor
    """[sum rows * pages] int64 ids of the pages to gather, bucket by bucket, row by row, in a layer's K
    viewed as ``[num_pages, page * nKV * D]``; padding pages are page 0 (block 0)."""
    masks: list[torch.Tensor]
    """Per bucket, ``[rows, 1, pages * page]`` additive mask."""
    key_start: torch.Tensor
    """[Rs] absolute position of each row's first gathered key (bucket order, device)."""
    num_pieces: int
    """Value pieces per row (the most any row's gathered keys touch)."""
    _bags: dict = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.query_idx.shape[0])

    def value_bags(self, nkv: int, grp: int, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``embedding_bag`` indices and offsets of the value sums, in the layout of the probabilities:
        per bucket one bag per (row, query head) (``fused``) or per (KV head, row, query head of that KV
        head), over the row's gathered keys, cut into ``num_pieces`` bags at the value-piece boundaries
        (trailing ones empty); index ``slot * nKV + kv_head`` into V viewed as ``[num_slots * nKV, D]``.
        Built on first use, shared by the group's layers."""
        got = self._bags.get((nkv, grp, fused))
        if got is not None:
            return got
        dev = self.page_ids.device
        within = torch.arange(self.page, device=dev)
        kv_head = torch.arange(nkv * grp, device=dev) // grp
        # piece boundaries of each row, relative to its first gathered key: [Rs, num_pieces]
        first_piece = torch.div(self.key_start, VALUE_PIECE, rounding_mode="floor")
        pieces = first_piece[:, None] + torch.arange(self.num_pieces, device=dev)
        cuts = pieces * VALUE_PIECE - self.key_start[:, None]
        index, offsets, p0, r0, total = [], [], 0, 0, 0
        for n, pages in self.buckets:
            s = pages * self.page
            slots = (self.page_ids[p0:p0 + n * pages].view(n, pages, 1) * self.page + within).view(n, 1, s)
            cut = cuts[r0:r0 + n].clamp(0, s)  # [n, pieces]
            p0, r0 = p0 + n * pages, r0 + n
            if fused:
                idx = slots * nkv + kv_head.view(1, -1, 1)  # [n, nH, s]
            else:
                idx = (slots * nkv + torch.arange(nkv, device=dev).view(nkv, 1, 1, 1)).expand(nkv, n, grp, s)
            bag_start = torch.arange(total, total + idx.numel(), s, device=dev).view(idx.shape[:-1])
            cut = cut.view(n, 1, -1) if fused else cut.view(1, n, 1, -1)
            offsets.append((bag_start[..., None] + cut).reshape(-1))
            index.append(idx.reshape(-1))
            total += idx.numel()
        got = torch.cat(index), torch.cat(offsets)
        self._bags[(nkv, grp, fused)] = got
        return got


def plan_buckets(need: list[int], max_buckets: int = MAX_BUCKETS,
                 cost: int = BUCKET_COST_PAGES) -> list[tuple[int, int]]:
    """Cuts rows needing ``need`` pages (descending) into at most ``max_buckets`` runs, each padded to its
    first (longest) row, minimizing gathered pages plus ``cost`` per run. Cut points come from at most 8
    evenly spaced candidates: O(1) work per step. Returns ``(rows, pages)`` per run."""
    n = len(need)
    step = max(1, -(-n // 8))
    cands = list(range(0, n, step)) + [n]
    inf = float("inf")
    best = [[(inf, -1)] * (max_buckets + 1) for _ in cands]  # best[i][b]: rows [0, cands[i]) in b runs
    best[0][0] = (0, -1)
    for i in range(1, len(cands)):
        for b in range(1, max_buckets + 1):
            for j in range(i):
                c = best[j][b - 1][0] + (cands[i] - cands[j]) * need[cands[j]] + cost
                if c < best[i][b][0]:
                    best[i][b] = (c, j)
    last = len(cands) - 1
    b = min(range(1, max_buckets + 1), key=lambda k: best[last][k][0])
    runs, i = [], last
    while i > 0:
        j = best[i][b][1]
        runs.append((cands[i] - cands[j], need[cands[j]]))
        i, b = j, b - 1
    return runs[::-1]


def build_decode_rows(table: torch.Tensor, seq: torch.Tensor, qpos: torch.Tensor, query_idx: torch.Tensor,
                      window: int | None, block_size: int, dtype: torch.dtype) -> DecodeRows:
    """``table``: the rows' block tables ``[Rs, max_blocks]`` (device); ``seq``: their context lengths
    (host int64); ``qpos``, ``query_idx``: their query's position and index (device)."""
    dev = table.device
    page = min(block_size, PAGE_TOKENS)
    per_block = block_size // page
    start = torch.zeros_like(seq) if window is None else (seq - window).clamp(min=0)
    first, last = start // page, (seq - 1) // page
    need = (last - first + 1).clamp(min=-(-MIN_KEYS // page))
    order = torch.argsort(need, descending=True, stable=True)
    buckets = plan_buckets(need[order].tolist())
    per_row = torch.repeat_interleave(torch.tensor([p for _, p in buckets]), torch.tensor([n for n, _ in buckets]))
    row_of = torch.repeat_interleave(order, per_row)  # each gathered page's row (host)
    j = torch.arange(int(per_row.sum())) - torch.repeat_interleave(torch.cumsum(per_row, 0) - per_row, per_row)
    pg = first[row_of] + j  # absolute page number within the row's sequence
    valid = (pg <= last[row_of]).to(dev)
    col = (pg // per_block).clamp(max=table.shape[1] - 1).to(dev)
    row_d, pg = row_of.to(dev), pg.to(dev)
    blocks = table[row_d, col].to(torch.int64)
    page_ids = torch.where(valid, blocks * per_block + pg % per_block, 0)
    kpos = pg[:, None] * page + torch.arange(page, device=dev)
    mask = additive_mask(kpos, qpos.index_select(0, row_d)[:, None], window, dtype).view(-1)
    masks, k0 = [], 0
    for n, pages in buckets:
        masks.append(mask[k0:k0 + n * pages * page].view(n, 1, pages * page))
        k0 += n * pages * page
    key_start = first[order] * page
    span = torch.repeat_interleave(torch.tensor([p * page for _, p in buckets]), torch.tensor([n for n, _ in buckets]))
    pieces = int(((key_start + span - 1) // VALUE_PIECE - key_start // VALUE_PIECE).max()) + 1
    return DecodeRows(query_idx.index_select(0, order.to(dev)), buckets, page, page_ids, masks, key_start.to(dev),
                      pieces)


class DecodeAttention:
    """The single-query computation, with a key scratch buffer per KV group reused across layers."""

    def __init__(self) -> None:
        self._scratch: dict[int, torch.Tensor] = {}
        self._held: dict[int, tuple[tuple, torch.Tensor]] = {}
        """Per group, ``(key, gathered)`` describing the scratch buffer's content."""

    def invalidate(self, kv_layer: torch.Tensor) -> None:
        """``kv_layer`` is being written: gathered copies of it are stale."""
        ptr = kv_layer.data_ptr()
        for g in [g for g, (key, _) in self._held.items() if key[1] == ptr]:
            del self._held[g]

    def _keys(self, kv_layer: torch.Tensor, rows: DecodeRows, serial: int, group: int) -> torch.Tensor:
        """``[sum rows * pages, page * nKV * D]``: the gathered key pages (reused when ``serial`` and the
        slice match the last gather of this group)."""
        key = (serial, kv_layer.data_ptr())
        held = self._held.get(group)
        if held is not None and held[0] == key:
            return held[1]
        pages = kv_layer[0].view(-1, rows.page * kv_layer.shape[-2] * kv_layer.shape[-1])
        n = rows.page_ids.numel()
        buf = self._scratch.get(group)
        if buf is None or buf.numel() < n * pages.shape[1] or buf.dtype != pages.dtype or buf.device != pages.device:
            buf = torch.empty(n * pages.shape[1], dtype=pages.dtype, device=pages.device)
            self._scratch[group] = buf
        k = torch.index_select(pages, 0, rows.page_ids, out=buf[: n * pages.shape[1]].view(n, pages.shape[1]))
        self._held[group] = (key, k)
        return k

    def attend(self, q: torch.Tensor, kv_layer: torch.Tensor, rows: DecodeRows, serial: int, group: int,
               scale: float, out: torch.Tensor) -> None:
        """Writes the rows' attention outputs into ``out`` (``[Tq, nH, D]``) at their query indices."""
        rs, (_, nh, d), nkv = rows.num_rows, q.shape, kv_layer.shape[-2]
        grp = nh // nkv
        k = self._keys(kv_layer, rows, serial, group)
        fused = nkv == 1 or nkv * d <= FMA_CHAIN_MAX
        qs = q.index_select(0, rows.query_idx)
        if fused:  # rows: query heads (>= MIN_GEMM_ROWS), columns: all KV heads' D
            m = max(nh, MIN_GEMM_ROWS)
            if nkv == 1:
                qg = pad_rows(qs, 1, m)
            else:
                qg = q.new_zeros(rs, m, nkv, d)
                qg[:, :nh].view(rs, nkv, grp, nkv, d).diagonal(dim1=1, dim2=3).copy_(
                    qs.view(rs, nkv, grp, d).permute(0, 2, 3, 1))
                qg = qg.view(rs, m, nkv * d)
            per_bucket = [m * rows.page * p for _, p in rows.buckets]
        else:  # per KV head: rows are its query heads (>= MIN_GEMM_ROWS)
            m = max(grp, MIN_GEMM_ROWS)
            qg = pad_rows(qs.view(rs, nkv, grp, d).transpose(0, 1), 2, m)  # [nKV, Rs, m, D]
            per_bucket = [nkv * m * rows.page * p for _, p in rows.buckets]
        total = sum(n * c for (n, _), c in zip(rows.buckets, per_bucket))
        scores = q.new_empty(total)
        probs = q.new_empty(total)
        weights, r0, p0, off = [], 0, 0, 0
        for (n, pages), mask, c in zip(rows.buckets, rows.masks, per_bucket):
            s = pages * rows.page
            kb = k[p0:p0 + n * pages].view(n, s, nkv * d)
            if fused:
                sc = scores[off:off + n * c].view(n, m, s)
                torch.bmm(qg[r0:r0 + n], kb.transpose(1, 2), out=sc)
            else:
                sc = scores[off:off + n * c].view(nkv, n, m, s)
                kh = kb.view(n, s, nkv, d)
                for h in range(nkv):
                    torch.bmm(qg[h, r0:r0 + n], kh[:, :, h].transpose(1, 2), out=sc[h])
            if scale != 1.0:
                sc.mul_(scale)
            sc.add_(mask)
            pr = probs[off:off + n * c].view(sc.shape)
            if q.dtype == torch.float32:
                torch.softmax(sc, dim=-1, out=pr)
            else:
                pr.copy_(torch.softmax(sc, dim=-1, dtype=torch.float32))
            weights.append(pr[:, :nh] if fused else pr[:, :, :grp])
            r0, p0, off = r0 + n, p0 + n * pages, off + n * c
        padded = m > (nh if fused else grp)
        w = torch.cat([x.reshape(-1) for x in weights]) if padded else probs
        index, offsets = rows.value_bags(nkv, grp, fused)
        o = F.embedding_bag(index, kv_layer[1].view(-1, d), offsets, mode="sum", per_sample_weights=w)
        pieces = rows.num_pieces
        if fused:
            o = o.view(rs, nh, pieces, d)
        else:
            parts, b0 = [], 0
            for n, _ in rows.buckets:
                part = o[b0:b0 + nh * n * pieces].view(nkv, n, grp, pieces, d)
                parts.append(part.transpose(0, 1).reshape(n, nh, pieces, d))
                b0 += nh * n * pieces
            o = torch.cat(parts)
        acc = o[:, :, 0]
        for j in range(1, pieces):  # value pieces in order (empty ones are exact zeros)
            acc = acc + o[:, :, j]
        out.index_copy_(0, rows.query_idx, acc)
