"""Triton kernel: paged attention specialised for at most one query per row (decode steps, and the
cross-decoder, whose rows hold one sampling token each).

Same semantics as ``paged_attention`` restricted to rows with 0 or 1 query (the query sits at
position ``seq_lens[r] - 1``). A decode step has too few (row, kv head) pairs to fill a GPU (batch 1
of Gemma 3n E2B: 2), so the key range of each row is split into ``num_splits`` parts computed by
separate programs (flash-decoding); a second kernel merges their partial softmax states. The split
count depends only on shapes and the device, never on tensor values, so launches stay capturable.
Each program handles all G query heads of its kv head at once (padded to the 16 rows ``tl.dot``
needs), so a K/V tile is read from memory once per kv head.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from yoco_rs.kernels._common import f32_dots, interpreting, next_pow2
from yoco_rs.kernels.paged_attention import _attend_tiles, check_attention_args, num_stages


@triton.jit(do_not_specialize=["window", "num_splits"])
def _decode_attention_kernel(
    q_ptr, o_ptr, part_acc_ptr, part_ml_ptr,
    k_cache, v_cache, bt_ptr, qsl_ptr, seq_lens_ptr,
    window, scale, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_co, stride_ch, stride_bt,
    NUM_Q_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, GQA: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    SINGLE: tl.constexpr, F32_DOTS: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    r = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_tok = tl.load(qsl_ptr + r)
    if tl.load(qsl_ptr + r + 1) == q_tok:
        return
    seq_len = tl.load(seq_lens_ptr + r)
    q_pos = seq_len - 1
    k_lo = 0
    if window > 0:
        k_lo = tl.maximum(q_pos - window + 1, 0)
    span = seq_len - k_lo
    per_split = tl.cdiv(tl.cdiv(span, num_splits), BLOCK_N) * BLOCK_N
    s_lo = k_lo + split * per_split
    s_hi = tl.minimum(s_lo + per_split, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    head = kvh * GQA + offs_h
    row_valid = offs_h < GQA
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_tok64 = q_tok.to(tl.int64)
    q = tl.load(
        q_ptr + q_tok64 * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_valid[:, None] & d_mask[None, :], other=0.0,
    )
    if F32_DOTS:
        q = q.to(tl.float32)
    q_posv = tl.full([BLOCK_H], 0, dtype=tl.int32) + q_pos

    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_cache, v_cache, bt_ptr + r.to(tl.int64) * stride_bt, kvh,
        stride_cb, stride_co, stride_ch, q_posv, row_valid, s_lo, s_hi, window, scale,
        BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D, F32_DOTS, NUM_STAGES,
    )
    if SINGLE:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            o_ptr + q_tok64 * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out.to(o_ptr.dtype.element_ty), mask=row_valid[:, None] & d_mask[None, :],
        )
    else:
        # partials: acc [R, Hq, S, D] (unnormalised, fp32), (m, l) [R, Hq, S, 2]
        part = (r.to(tl.int64) * NUM_Q_HEADS + head) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_valid[:, None] & d_mask[None, :])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_valid)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_valid)


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    o_ptr, part_acc_ptr, part_ml_ptr, qsl_ptr, stride_ot, stride_oh, num_splits,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    q_tok = tl.load(qsl_ptr + r)
    if tl.load(qsl_ptr + r + 1) == q_tok:
        return
    offs_s = tl.arange(0, SPLITS_PAD)
    s_mask = offs_s < num_splits
    part = (r.to(tl.int64) * NUM_Q_HEADS + h) * num_splits + offs_s
    m = tl.load(part_ml_ptr + part * 2, mask=s_mask, other=float("-inf"))
    l = tl.load(part_ml_ptr + part * 2 + 1, mask=s_mask, other=0.0)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_safe))
    denom = tl.sum(w * l, 0)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(o_ptr + q_tok.to(tl.int64) * stride_ot + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty),
             mask=d_mask)


MAX_SPLITS = 32  # the merge kernel is compiled once for this many partial states


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(num_rows: int, num_kv_heads: int, device: torch.device, max_seq_len: int = 0,
                      block_n: int = 32) -> int:
    """Splits so that about two programs per SM run, at most 32, and (when the caller knows the
    longest context) no more splits than key tiles. Shapes and device only: capturable."""
    if interpreting() or device.type != "cuda":
        splits = 2  # exercises the split + merge path in CPU tests
    else:
        splits = triton.cdiv(2 * _num_sms(device.index or 0), max(1, num_rows * num_kv_heads))
    splits = max(1, min(splits, MAX_SPLITS))
    if max_seq_len > 0:
        splits = max(1, min(splits, triton.cdiv(max_seq_len, block_n)))
    return splits


def decode_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    window: int = 0,
    scale: float = 1.0,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    max_seq_len: int = 0,
) -> torch.Tensor:
    """Like ``paged_attention`` for batches whose rows have at most one query each (the caller knows
    this from host metadata: ``max_query_len <= 1``). ``num_splits`` None = choose from shapes; pass
    ``max_seq_len`` (a host int, 0 = unknown) to avoid splits beyond the longest context."""
    bs, hkv, d = check_attention_args(q, kv_layer, block_table, query_start_loc, seq_lens)
    hq = q.shape[1]
    r = seq_lens.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0 or r == 0:
        return out
    g = hq // hkv
    block_h = max(16, next_pow2(g))
    block_d = max(16, next_pow2(d))
    block_n = 16 if interpreting() else (64 if d <= 128 else 32)
    if num_splits is None:
        num_splits = choose_num_splits(r, hkv, q.device, max_seq_len, block_n)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits={num_splits}: must be in [1, {MAX_SPLITS}]")
    if num_splits > 1:
        part_acc = torch.empty((r, hq, num_splits, d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((r, hq, num_splits, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused
    kc, vc = kv_layer[0], kv_layer[1]
    _decode_attention_kernel[(r, hkv, num_splits)](
        q, out, part_acc, part_ml, kc, vc, block_table, query_start_loc, seq_lens,
        int(window), float(scale), num_splits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), block_table.stride(0),
        NUM_Q_HEADS=hq, BLOCK_SIZE=bs, GQA=g, BLOCK_H=block_h, BLOCK_N=block_n,
        HEAD_DIM=d, BLOCK_D=block_d, SINGLE=num_splits == 1, F32_DOTS=f32_dots(q.dtype),
        NUM_STAGES=num_stages(q.device, decode=True),
        num_warps=4 if d <= 128 else 8,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(r, hq)](
            out, part_acc, part_ml, query_start_loc, out.stride(0), out.stride(1), num_splits,
            NUM_Q_HEADS=hq, HEAD_DIM=d, BLOCK_D=block_d, SPLITS_PAD=MAX_SPLITS,
        )
    return out
