"""Multi-query rows of the torch reference attention (prefill chunks, prompt-logprob cross rows): every
row's queries in chunks of at most ``query_chunk`` queries, similar chunks of all rows batched together.

Once per step and KV group (:func:`build_prefill_rows`, from ``build_metadata``; shared by the group's
layers): a row's queries are cut at absolute positions ``k * query_chunk`` (small chunks: less of the
masked upper triangle of each chunk's score block is computed). Each chunk sees keys from its first
query's window start (0 on full-attention layers) to its last query; that span is widened down to a
value-piece boundary (:mod:`.invariance`: values are summed in pieces of ``VALUE_PIECE`` keys at absolute
positions, so every chunk's pieces line up) and covered by pages of ``PAGE_TOKENS`` tokens. Chunks with
the same absolute index, from all rows, have (nearly) the same shape and are batched ("buckets"), padded
to the largest, in slices under ``SCORES_BUDGET``; a step of many prompts does not loop per chunk in
Python. Padding queries repeat the chunk's last query and are dropped; padding keys are masked. (The work
is compute-bound: batching dissimilar chunks costs more in padding than it saves in calls.)

Per layer and bucket (:meth:`PrefillAttention.attend`): gather the queries and the K and V pages, then per
KV head one batched GEMM ``q @ k^T`` with that head's query heads and the chunk's queries as rows, the
mask add and a softmax for all heads, and per KV head and value piece one batched ``p @ v`` GEMM, the
pieces added in order. Every number is what the decode path (:mod:`.attention_decode`) and, up to
``VALUE_PIECE`` keys, transformers compute for the same token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from yoco_rs.executor.invariance import (
    MIN_GEMM_ROWS, MIN_KEYS, VALUE_PIECE, additive_mask, value_pieces,
)

PAGE_TOKENS = 16
"""Gather granularity in tokens (whole blocks when blocks are smaller)."""
SCORES_BUDGET = 1 << 19
"""Queries x keys per batched computation: a bucket is processed in slices of chunks under it, so score
tensors stay a few MB (cache-sized, and reused by the allocator instead of fresh pages every layer)."""


@dataclass
class PrefillBucket:
    """Chunks computed together, padded to the same number of queries and key pages."""

    chunks: int
    queries: int
    """Queries per chunk, padded (at least ``MIN_GEMM_ROWS`` GEMM rows with the query heads of a KV head)."""
    pages: int
    """Key pages per chunk, padded."""
    q_index: torch.Tensor
    """[chunks * queries] index in ``q`` of each (padded) query."""
    page_ids: torch.Tensor
    """[chunks * pages] int64 page ids in a layer's K (or V) viewed as ``[num_pages, page * nKV * D]``."""
    mask: torch.Tensor
    """[chunks, queries, pages * page] additive mask."""
    real: torch.Tensor
    """Positions in ``[chunks * queries]`` of the real queries..."""
    out_index: torch.Tensor
    """...and their index in ``q`` / the output."""


@dataclass
class PrefillRows:
    """The multi-query rows of one step and KV group."""

    page: int
    """Tokens per page."""
    buckets: list[PrefillBucket]


def build_prefill_rows(rows: Sequence[tuple[int, int, int, int]], table: torch.Tensor, window: int | None,
                       block_size: int, dtype: torch.dtype, query_chunk: int) -> PrefillRows:
    """``rows``: ``(row, index of its first query, queries n, context after this step seq)`` of each
    multi-query row (its queries are positions ``seq - n .. seq - 1``); ``table``: all rows' block tables
    ``[R, max_blocks]`` (device)."""
    dev = table.device
    page = min(block_size, PAGE_TOKENS)
    per_block = block_size // page
    min_pages = -(-MIN_KEYS // page)
    by_index: dict[int, list] = {}  # absolute chunk index -> (row, first query index, queries, position, page0, pages)
    for r, s, n, seq in rows:
        first = seq - n
        pos = first
        while pos < seq:
            c = pos // query_chunk
            end = min(seq, (c + 1) * query_chunk)
            start = 0 if window is None else max(0, pos - window + 1)
            p0 = (start // VALUE_PIECE * VALUE_PIECE) // page
            by_index.setdefault(c, []).append(
                (r, s + pos - first, end - pos, pos, p0, max((end - 1) // page - p0 + 1, min_pages)))
            pos = end
    # Chunks with the same absolute index have (nearly) the same shape: batch them, padded to the largest,
    # in slices whose score tensor stays under SCORES_BUDGET queries x keys (cache-sized temporaries).
    buckets = []
    for c in sorted(by_index, reverse=True):
        group = sorted(by_index[c], key=lambda x: -x[5])
        pages, width = group[0][5], max(x[2] for x in group)
        per = max(1, SCORES_BUDGET // (width * pages * page))
        for i in range(0, len(group), per):
            part = group[i:i + per]
            buckets.append(_bucket(part, part[0][5], max(x[2] for x in part), table, window, page, per_block,
                                   dtype, dev))
    return PrefillRows(page, buckets)


def _bucket(part, pages: int, width: int, table: torch.Tensor, window: int | None, page: int, per_block: int,
            dtype: torch.dtype, dev: torch.device) -> PrefillBucket:
    t = torch.tensor(part, dtype=torch.int64)  # [B, 6]
    row, q0, nq, qpos0, p0 = t[:, 0], t[:, 1], t[:, 2], t[:, 3], t[:, 4]
    b = len(part)
    queries = width
    j = torch.arange(queries)
    real = j[None, :] < nq[:, None]  # [B, queries]
    q_index = q0[:, None] + torch.minimum(j[None, :], nq[:, None] - 1)
    qpos = qpos0[:, None] + j[None, :]
    pg = p0[:, None] + torch.arange(pages)  # absolute page numbers [B, pages]
    last = (qpos0 + nq - 1) // page
    valid = (pg <= last[:, None]).to(dev)
    col = (pg // per_block).clamp(max=table.shape[1] - 1).to(dev)
    pg = pg.to(dev)
    blocks = table.index_select(0, row.to(dev)).gather(1, col).to(torch.int64)
    page_ids = torch.where(valid, blocks * per_block + pg % per_block, 0)
    kpos = (pg[:, :, None] * page + torch.arange(page, device=dev)).view(b, 1, pages * page)
    mask = additive_mask(kpos, qpos.to(dev)[:, :, None], window, dtype)
    flat_real = torch.nonzero(real.flatten()).flatten()
    return PrefillBucket(b, queries, pages, q_index.flatten().to(dev), page_ids.flatten(), mask,
                         flat_real.to(dev), q_index.flatten()[flat_real].to(dev))


class PrefillAttention:
    def attend(self, q: torch.Tensor, kv_layer: torch.Tensor, rows: PrefillRows, scale: float,
               out: torch.Tensor) -> None:
        """Writes the multi-query rows' outputs into ``out`` (``[Tq, nH, D]``) at their query indices."""
        nh, d = q.shape[1:]
        nkv = kv_layer.shape[-2]
        grp = nh // nkv
        width = rows.page * nkv * d
        k_pages, v_pages = kv_layer[0].view(-1, width), kv_layer[1].view(-1, width)
        for bk in rows.buckets:
            b, n, s = bk.chunks, bk.queries, bk.pages * rows.page
            m = n * grp
            pad = max(0, MIN_GEMM_ROWS - m)
            # rows of a KV head's GEMM: (query, query head of that KV head)
            qh = q.index_select(0, bk.q_index).view(b, n, nkv, grp, d).permute(2, 0, 1, 3, 4).reshape(nkv, b, m, d)
            if pad:
                qh = torch.cat([qh, qh.new_zeros(nkv, b, pad, d)], 2)
            # [nKV, B, S, D] contiguous: BLAS is faster on it than on the cache layout's strided heads
            k = k_pages.index_select(0, bk.page_ids).view(b, s, nkv, d).permute(2, 0, 1, 3).contiguous()
            v = v_pages.index_select(0, bk.page_ids).view(b, s, nkv, d).permute(2, 0, 1, 3).contiguous()
            scores = q.new_empty(nkv, b, m + pad, s)
            for h in range(nkv):
                torch.bmm(qh[h], k[h].transpose(1, 2), out=scores[h])
            if scale != 1.0:
                scores.mul_(scale)
            scores[:, :, :m].view(nkv, b, n, grp, s).add_(bk.mask.view(1, b, n, 1, s))
            if q.dtype == torch.float32:
                probs = torch.softmax(scores, dim=-1, out=torch.empty_like(scores))
            else:
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            o = q.new_empty(nkv, b, m + pad, d)
            for h in range(nkv):
                vh, ph = v[h], probs[h]
                for i, (c0, c1) in enumerate(value_pieces(s)):
                    if i == 0:
                        torch.bmm(ph[..., c0:c1], vh[:, c0:c1], out=o[h])
                    else:
                        o[h] += torch.bmm(ph[..., c0:c1], vh[:, c0:c1])
            o = o[:, :, :m].view(nkv, b, n, grp, d).permute(1, 2, 0, 3, 4).reshape(b * n, nh, d)
            out.index_copy_(0, bk.out_index, o.index_select(0, bk.real))
