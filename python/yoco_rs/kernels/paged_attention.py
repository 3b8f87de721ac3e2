"""Triton kernel: paged attention for mixed prefill/decode batches (varlen queries).

Semantics (the torch reference backend's, which is the oracle):

* Row r owns queries ``q[query_start_loc[r]:query_start_loc[r+1]]`` and ``seq_lens[r]`` keys, read
  through its block-table row (``slot = block_table[r, k // block_size] * block_size + k % block_size``).
* Bottom-right causal: the row's last query sits at position ``seq_lens[r] - 1``; query i of a row with
  n queries is at ``seq_lens[r] - n + i`` and sees key k iff ``k <= pos`` and, with a sliding window
  W > 0, ``pos - W < k``. This also serves chunked prefill with earlier context and the cross-decoder's
  trailing-row queries.
* GQA (``num_q_heads = G * num_kv_heads``), logits scaled by ``scale`` (1.0 for Gemma 3n), no softcap,
  softmax in fp32.

Work split: one program per (q tile, kv head). A q tile is ``BLOCK_Q`` consecutive tokens of one row
times the G query heads sharing the kv head, so each K/V tile is loaded once for G heads. Row r's tiles
are numbered from ``query_start_loc[r] // BLOCK_Q + r`` on (strictly increasing in r), so a program
finds its row by binary search over ``query_start_loc`` on the device: the grid
``cdiv(T, BLOCK_Q) + R`` depends on shapes only, which keeps launches capturable in CUDA graphs.

Keys are visited from the window's first key (tiles wholly outside the window are never read: a
sliding group's block table holds 0 there once the blocks are freed) to the tile's last query
position. Loads are masked, so neither freed blocks nor stale slots beyond ``seq_lens`` can leak NaN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yoco_rs.kernels._common import check_kv_layer, check_same_device, f32_dots, interpreting, next_pow2


@triton.jit
def _find_row(qsl_ptr, num_rows, target, BLOCK_Q: tl.constexpr):
    """Largest r in [0, num_rows) with qsl[r] // BLOCK_Q + r <= target."""
    lo = 0
    hi = num_rows
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if start <= target:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tiles(
    acc, m_i, l_i, q,
    k_cache, v_cache, bt_row_ptr, kvh,
    stride_cb, stride_co, stride_ch,
    q_pos, row_valid, k_lo, k_hi, window, scale,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOTS: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """Online-softmax accumulation over keys ``[k_lo, k_hi)`` (shared by both attention kernels). The
    loop is software-pipelined explicitly (``tl.range(num_stages=...)``): the block-table entries, K
    and V of the next tiles are copied asynchronously while this tile computes; a launch-level
    ``num_stages`` does not reach this loop."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    # keys visible from a query: (q_pos - window, q_pos]; the lower bound is hoisted out of the loop
    # (no branch inside it, so Triton can software-pipeline the K/V loads)
    min_key = tl.where(window > 0, q_pos - window, -1)
    start = (k_lo // BLOCK_N) * BLOCK_N
    for kb in tl.range(start, k_hi, BLOCK_N, num_stages=NUM_STAGES):
        kpos = kb + offs_n
        k_valid = (kpos >= k_lo) & (kpos < k_hi)
        blk = tl.load(bt_row_ptr + kpos // BLOCK_SIZE, mask=k_valid, other=0).to(tl.int64)
        slot_off = blk * stride_cb + (kpos % BLOCK_SIZE) * stride_co + kvh * stride_ch
        kv_mask = k_valid[:, None] & d_mask[None, :]
        k = tl.load(k_cache + slot_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache + slot_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if F32_DOTS:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale
        visible = row_valid[:, None] & k_valid[None, :] & (kpos[None, :] <= q_pos[:, None]) \
            & (kpos[None, :] > min_key[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if F32_DOTS:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["num_rows", "window"])
def _paged_attention_kernel(
    q_ptr, o_ptr, k_cache, v_cache, bt_ptr, qsl_ptr, seq_lens_ptr,
    num_rows, window, scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_co, stride_ch, stride_bt,
    BLOCK_SIZE: tl.constexpr, GQA: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, F32_DOTS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    r = _find_row(qsl_ptr, num_rows, pid, BLOCK_Q)
    q_start = tl.load(qsl_ptr + r)
    q_len = tl.load(qsl_ptr + r + 1) - q_start
    tile = pid - (q_start // BLOCK_Q + r)
    if tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + r)
    ctx = seq_len - q_len

    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    offs_m = tl.arange(0, BLOCK_M)
    tok = tile * BLOCK_Q + offs_m // G_PAD
    head = kvh * GQA + offs_m % G_PAD
    row_valid = (tok < q_len) & (offs_m % G_PAD < GQA)
    q_pos = ctx + tok
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_valid[:, None] & d_mask[None, :], other=0.0,
    )
    if F32_DOTS:
        q = q.to(tl.float32)

    first_pos = ctx + tile * BLOCK_Q
    k_hi = tl.minimum(first_pos + BLOCK_Q, seq_len)
    k_lo = 0
    if window > 0:
        k_lo = tl.maximum(first_pos - window + 1, 0)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_cache, v_cache, bt_ptr + r.to(tl.int64) * stride_bt, kvh,
        stride_cb, stride_co, stride_ch, q_pos, row_valid, k_lo, k_hi, window, scale,
        BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D, F32_DOTS, NUM_STAGES,
    )
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        o_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty), mask=row_valid[:, None] & d_mask[None, :],
    )


def _tiles(g_pad: int, d: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_N, num_warps): about 64 query rows per tile (16 under the interpreter, where
    small tiles keep the CPU tests quick), fewer keys per tile for wide heads."""
    rows = 16 if interpreting() else (64 if d <= 128 or dtype != torch.float32 else 32)
    block_q = max(1, rows // g_pad)
    block_n = 16 if interpreting() else (64 if d <= 64 else 32)
    warps = 4 if d <= 128 else 8
    return block_q, block_n, warps


def num_stages(device: torch.device, decode: bool = False) -> int:
    """Depth of the K/V prefetch pipeline. Triton prefetches K/V tiles into registers (block-table
    entries by async copy), so deeper pipelines cost registers: compiled for sm_90 at head_dim 256,
    3 stages make the 8-warp varlen kernel spill (2 do not), the decode kernel takes 3 without spilling
    (``kernels/compile_check.py`` prints the resources)."""
    if decode and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9:
        return 3
    return 2


def check_attention_args(q, kv_layer, block_table, query_start_loc, seq_lens):
    """Shape, dtype and layout checks shared by the attention kernels, with errors naming the expected
    shape; returns the cache's ``(block_size, num_kv_heads, head_dim)``."""
    nb, bs, hkv, d = check_kv_layer(kv_layer)
    if q.dim() != 3 or q.shape[2] != d or q.shape[1] % hkv != 0:
        raise ValueError(
            f"q must be [T, num_q_heads, {d}] with num_q_heads a multiple of num_kv_heads={hkv}, got {tuple(q.shape)}"
        )
    if q.stride(-1) != 1:
        raise ValueError("q must have a contiguous head_dim")
    r = seq_lens.shape[0]
    if query_start_loc.shape != (r + 1,):
        raise ValueError(f"query_start_loc must be [R+1] = [{r + 1}] for R={r} rows, got {tuple(query_start_loc.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] < r:
        raise ValueError(f"block_table must be [>=R, max_blocks] with R={r}, got {tuple(block_table.shape)}")
    if block_table.stride(-1) != 1:
        raise ValueError("block_table rows must be contiguous")
    for name, t in (("block_table", block_table), ("query_start_loc", query_start_loc), ("seq_lens", seq_lens)):
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    check_same_device(q, kv_layer, block_table, query_start_loc, seq_lens)
    return bs, hkv, d


def paged_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    window: int = 0,
    scale: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of ``q`` ``[T, Hq, D]`` against ``kv_layer`` ``[2, NB, block_size, Hkv, D]`` for R rows
    (``query_start_loc`` ``[R+1]``, ``seq_lens`` ``[R]``, ``block_table`` ``[R, max_blocks]``);
    ``window`` 0 = full attention. Returns ``out`` ``[T, Hq, D]`` (dtype of q); rows of q outside every
    row's span (padding) are left untouched."""
    bs, hkv, d = check_attention_args(q, kv_layer, block_table, query_start_loc, seq_lens)
    t, hq = q.shape[0], q.shape[1]
    if out is None:
        out = torch.empty_like(q)
    r = seq_lens.shape[0]
    if t == 0 or r == 0:
        return out
    g = hq // hkv
    g_pad = next_pow2(g)
    block_q, block_n, warps = _tiles(g_pad, d, q.dtype)
    stages = num_stages(q.device)
    block_d = max(16, next_pow2(d))
    grid = (triton.cdiv(t, block_q) + r, hkv)
    kc, vc = kv_layer[0], kv_layer[1]
    _paged_attention_kernel[grid](
        q, out, kc, vc, block_table, query_start_loc, seq_lens,
        r, int(window), float(scale),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), block_table.stride(0),
        BLOCK_SIZE=bs, GQA=g, G_PAD=g_pad, BLOCK_Q=block_q, BLOCK_N=block_n,
        HEAD_DIM=d, BLOCK_D=block_d, F32_DOTS=f32_dots(q.dtype), NUM_STAGES=stages, num_warps=warps,
    )
    return out
