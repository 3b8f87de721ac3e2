"""The torch reference attention backend against a naive per-query computation on contiguous K/V."""

from __future__ import annotations

import random

import pytest
import torch

from yoco_rs.executor import attention_torch
from yoco_rs.executor.attention_torch import TorchAttentionBackend


def _naive(q, k_seq, v_seq, pos, window, scale):
    """One query ``[nH, D]`` at ``pos`` over a request's contiguous keys ``[S, nKV, D]``."""
    nh, nkv = q.shape[0], k_seq.shape[1]
    keys = torch.arange(k_seq.shape[0])
    vis = keys <= pos
    if window is not None:
        vis &= keys > pos - window
    k = k_seq[vis].repeat_interleave(nh // nkv, dim=1)  # [S', nH, D]
    v = v_seq[vis].repeat_interleave(nh // nkv, dim=1)
    w = torch.softmax(torch.einsum("hd,shd->hs", q, k) * scale, dim=-1)
    return torch.einsum("hs,shd->hd", w, v)


@pytest.mark.parametrize("query_chunk", [256, 3], ids=["whole-rows", "rows-in-chunks-of-3"])
@pytest.mark.parametrize("seed", range(4))
def test_mixed_batch_paged_attention_equals_naive_attention(seed, query_chunk, monkeypatch):
    monkeypatch.setattr(attention_torch, "QUERY_CHUNK", query_chunk)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    nh, nkv, d, bs, nb = 4, 2, 8, 4, 64
    windows = [None, 5]  # one full group, one sliding group
    backend = TorchAttentionBackend()
    # rows: (context before this step, queries this step)
    rows = [(rng.randrange(0, 30), rng.choice([1, 1, 2, 7])) for _ in range(5)] + [(0, 9), (13, 1)]
    free = [list(range(1, nb)) for _ in windows]
    for f in free:
        rng.shuffle(f)
    caches = [torch.zeros(2, nb, bs, nkv, d) for _ in windows]
    seqs_k = [[torch.randn(c + n, nkv, d, generator=g) for c, n in rows] for _ in windows]
    seqs_v = [[torch.randn(c + n, nkv, d, generator=g) for c, n in rows] for _ in windows]
    tables, slot_rows = [], []
    for gi in range(len(windows)):
        max_blocks = max(-(-(c + n) // bs) for c, n in rows) + 1
        tab = torch.zeros(len(rows), max_blocks, dtype=torch.int32)
        slots_g = []
        for r, (c, n) in enumerate(rows):
            blocks = [free[gi].pop() for _ in range(-(-(c + n) // bs))]
            tab[r, : len(blocks)] = torch.tensor(blocks)
            slot = torch.tensor([blocks[p // bs] * bs + p % bs for p in range(c + n)])
            flat = caches[gi].view(2, -1, nkv, d)
            flat[0, slot[:c]] = seqs_k[gi][r][:c]  # the context is already in the cache
            flat[1, slot[:c]] = seqs_v[gi][r][:c]
            slots_g.append(slot[c:])
        tables.append(tab)
        slot_rows.append(torch.cat(slots_g))
    pad = 3
    qsl = torch.tensor([0] + [n for _, n in rows]).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([c + n for c, n in rows], dtype=torch.int32)
    positions = torch.cat([torch.arange(c, c + n) for c, n in rows] + [torch.zeros(pad, dtype=torch.int64)])
    slot_mapping = torch.stack([torch.cat([s, torch.arange(pad) % bs]) for s in slot_rows])
    meta = backend.build_metadata(
        query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens, query_start_loc=qsl, seq_lens=seq_lens,
        positions=positions, block_tables=tables, slot_mapping=slot_mapping, windows=windows, block_size=bs,
        dtype=torch.float32)
    t = int(qsl[-1]) + pad
    q = torch.randn(t, nh, d, generator=g)
    for gi, w in enumerate(windows):
        new_k = torch.cat([seqs_k[gi][r][c:] for r, (c, _) in enumerate(rows)] + [torch.randn(pad, nkv, d)])
        new_v = torch.cat([seqs_v[gi][r][c:] for r, (c, _) in enumerate(rows)] + [torch.randn(pad, nkv, d)])
        backend.write_kv(caches[gi], new_k, new_v, meta, gi)
        out = backend.attend(q, caches[gi], meta, gi, scale=0.5)
        assert out.shape == (t, nh, d) and torch.isfinite(out).all()
        for r, (c, n) in enumerate(rows):
            for i in range(n):
                tok = int(qsl[r]) + i
                ref = _naive(q[tok], seqs_k[gi][r], seqs_v[gi][r], c + i, w, 0.5)
                torch.testing.assert_close(out[tok], ref, atol=1e-5, rtol=1e-5)
        assert torch.equal(out[t - pad:], torch.zeros(pad, nh, d))  # padding queries: outside every row


def test_null_block_table_entries_outside_the_window_are_never_read():
    """The core frees sliding blocks the window left; their table entries become block 0 (garbage)."""
    backend = TorchAttentionBackend()
    bs, w = 4, 6
    cache = torch.zeros(2, 8, bs, 1, 2)
    k = torch.randn(20, 1, 2)
    v = torch.randn(20, 1, 2)
    blocks = [3, 7, 1, 5, 2]
    flat = cache.view(2, -1, 1, 2)
    for p in range(20):
        flat[0, blocks[p // bs] * bs + p % bs] = k[p]
        flat[1, blocks[p // bs] * bs + p % bs] = v[p]
    table = torch.tensor([[0, 0, 1, 5, 2]], dtype=torch.int32)  # blocks 0..1 (positions 0..7) released
    cache[:, 0] = 1e4  # block 0 holds garbage
    meta = backend.build_metadata(
        query_start_loc_cpu=torch.tensor([0, 2]), seq_lens_cpu=torch.tensor([20]),
        query_start_loc=torch.tensor([0, 2]), seq_lens=torch.tensor([20]), positions=torch.tensor([18, 19]),
        block_tables=[table], slot_mapping=None, windows=[w], block_size=bs, dtype=torch.float32)
    q = torch.randn(2, 1, 2)
    out = backend.attend(q, cache, meta, 0, 1.0)
    for i, p in enumerate((18, 19)):
        torch.testing.assert_close(out[i], _naive(q[i], k, v, p, w, 1.0))
