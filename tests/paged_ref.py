"""A deliberately naive paged-KV reference for the kernel tests: per row, gather the keys through the
block table into a contiguous tensor and run dense masked attention in float64. Independent of both
the Triton kernels and the executor's torch backend, so it can referee either."""

from __future__ import annotations

import torch


def ref_write_kv(kv_layer, k, v, slot_mapping):
    out = kv_layer.clone()
    bs = kv_layer.shape[2]
    for t in range(k.shape[0]):
        s = int(slot_mapping[t])
        if s < 0:
            continue
        out[0, s // bs, s % bs] = k[t]
        out[1, s // bs, s % bs] = v[t]
    return out


def ref_copy_kv(kv_group, copies, group):
    out = kv_group.clone()
    for g, src, dst, n in copies.tolist():
        if g == group:
            out[:, :, dst, :n] = kv_group[:, :, src, :n]
    return out


def ref_attention(q, kv_layer, block_table, query_start_loc, seq_lens, window=0, scale=1.0):
    """[T, Hq, D] output; rows of q outside every row's span are zero."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    bs, hkv = kv_layer.shape[2], kv_layer.shape[3]
    g = q.shape[1] // hkv
    qsl = query_start_loc.tolist()
    for r, seq_len in enumerate(seq_lens.tolist()):
        qs, qe = qsl[r], qsl[r + 1]
        if qe == qs:
            continue
        kpos = torch.arange(seq_len)
        blocks = block_table[r].long()[kpos // bs]
        keys = kv_layer[0][blocks, kpos % bs].double().repeat_interleave(g, dim=1)  # [L, Hq, D]
        vals = kv_layer[1][blocks, kpos % bs].double().repeat_interleave(g, dim=1)
        qpos = seq_len - (qe - qs) + torch.arange(qe - qs)
        visible = kpos[None, :] <= qpos[:, None]
        if window > 0:
            visible &= kpos[None, :] > qpos[:, None] - window
        s = torch.einsum("thd,khd->htk", q[qs:qe].double(), keys) * scale
        # where() rather than an additive mask, so keys outside the window never touch the result
        p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
        p = p.masked_fill(~visible, 0.0)
        out[qs:qe] = torch.einsum("htk,khd->thd", p, torch.where(visible.any(0)[:, None, None], vals, 0.0))
    return out
