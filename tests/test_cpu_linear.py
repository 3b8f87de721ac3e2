"""The CPU linear layer (``executor/cpu_linear.py``, kernel ``crates/yoco-cpu``): a row's outputs are MKL's
4-row GEMM values at every row count (what lets the executor run decode steps unpadded), the MKL properties
that rests on, the K-major weight layout and its loading, and the kernel's refusals of bad operands.

The shapes are E2B's (K = 2048, 8192, 256, 64; N from 12 to 16384) at small N where N does not matter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from yoco_rs import _core
from yoco_rs.executor.cpu_linear import (
    MKL_ROWS, SMALL_N, RowInvariantLinear, copy_weight, cpu_weight, is_k_major, kernel_linear,
)
from yoco_rs.models.gemma3n.fused import FusedParams

needs_kernel = pytest.mark.skipif(not _core.cpu_linear_available(), reason="the kernel needs AVX2 and FMA")
SHAPES = [(24, 2048), (3072, 2048), (2048, 8192), (2048, 256), (2048, 64), (256, 2048), (12, 2048), (16, 4)]


def _weight(n: int, k: int, seed: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(row-major, K-major) copies of one random ``[n, k]`` weight."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
    wk = cpu_weight(n, k, dtype)
    copy_weight(wk, w)
    return w, wk


@pytest.mark.locked_rounding
@needs_kernel
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_every_row_count_gets_mkls_4_row_gemm_values(n, k):
    """The property decode relies on: 1, 2, 3 ... rows (kernel below MKL_ROWS, MKL above) give each row
    exactly what a 4-row (or 40-row) MKL GEMM gives it; plain F.linear does not below 4 rows."""
    w, wk = _weight(n, k, seed=n + k)
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(1))
    ref = F.linear(x, w)  # 40 rows: MKL's blocked GEMM
    lin = RowInvariantLinear()
    with torch.inference_mode():
        for m in [1, 2, 3, 4, 5, 8, MKL_ROWS - 1, MKL_ROWS, 40]:
            assert torch.equal(lin(x[:m], wk), ref[:m]), m
        assert torch.equal(lin(x[:1], w), ref[:1])  # row-major weights too (the tile kernel)
    if n > SMALL_N and k > 64:
        assert not torch.equal(F.linear(x[:1], w), ref[:1])  # MKL's GEMV rounds otherwise


@pytest.mark.locked_rounding
@needs_kernel
def test_mkl_sums_192_term_blocks_from_4_rows_up():
    """The measured order the kernel reproduces: K = 2048 and 8192 in blocks of 192, 256 as two of 128,
    up to 192 terms one chain; and MKL gives the same bits from K-major weights (N >= 12) but not for
    N <= SMALL_N, whose weights therefore stay row-major."""
    assert RowInvariantLinear.kc_for(2048) == 192
    assert RowInvariantLinear.kc_for(8192) == 192
    assert RowInvariantLinear.kc_for(256) == 128
    assert RowInvariantLinear.kc_for(64) == 64
    x = torch.randn(8, 2048, generator=torch.Generator().manual_seed(2))
    w = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(kernel_linear(x, w, 128, 1), F.linear(x, w))  # another block size: other bits
    small = torch.randn(4, 2048, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(F.linear(x, small.t().contiguous().t()), F.linear(x, small))
    assert not is_k_major(cpu_weight(SMALL_N, 2048, torch.float32))
    assert is_k_major(cpu_weight(SMALL_N + 1, 2048, torch.float32))


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_rows_do_not_depend_on_the_batch_and_stay_close_to_torch(threads):
    w, wk = _weight(3072, 2048, seed=5, dtype=torch.bfloat16)
    x = torch.randn(40, 2048, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            lin = RowInvariantLinear()
            together = lin(x, wk)
            assert all(torch.equal(lin(x[i:i + 1], wk), together[i:i + 1]) for i in range(0, 40, 7))
            assert torch.equal(lin(x[:3], w), together[:3])  # either layout: the same order
            ref = F.linear(x.float(), w.float())
            # rounded once from f32 sums: within one bf16 ulp of the f32 GEMM
            assert ((together.float() - ref).abs() <= ref.abs() * 2**-7 + 1e-6).all()
    finally:
        torch.set_num_threads(1)


def test_k_major_weights_load_exactly_and_fuse_k_major():
    g = torch.Generator().manual_seed(7)
    src = torch.randn(700, 96, generator=g).to(torch.bfloat16)
    p = cpu_weight(700, 96, torch.float32)
    assert is_k_major(p) and p.shape == (700, 96) and p.stride(1) > 700  # padded rows
    copy_weight(p, src)  # a dtype conversion and COPY_COLUMNS-sized slices
    assert torch.equal(p, src.float())
    q = cpu_weight(100, 96, torch.float32)
    copy_weight(q, torch.randn(100, 96, generator=g))
    fused = FusedParams([torch.nn.Parameter(p, requires_grad=False), torch.nn.Parameter(q, requires_grad=False)])
    both = fused.get()
    assert is_k_major(both) and torch.equal(both, torch.cat([src.float(), q]))


@needs_kernel
def test_strided_rows_of_x_and_a_fused_weights_columns():
    """``x`` may be a strided view (an AltUp stream), ``w`` a slice of a fused K-major weight."""
    w, wk = _weight(300, 256, seed=8)
    h = torch.randn(5, 4, 256, generator=torch.Generator().manual_seed(9))
    x = h[:, 0]
    assert not x.is_contiguous()
    with torch.inference_mode():
        got = RowInvariantLinear()(x, wk[100:200])
    assert torch.equal(got, F.linear(torch.cat([x, x[:3]]), w[100:200])[:5])


@needs_kernel
def test_the_kernel_refuses_operands_that_do_not_line_up():
    x = np.zeros((2, 8), np.float32)
    w = np.zeros((3, 8), np.float32)
    with pytest.raises(ValueError, match="K must agree"):
        _core.linear_f32(x, np.zeros((3, 7), np.float32), np.zeros((2, 3), np.float32), 192, 1)
    with pytest.raises(ValueError, match="expected 2 x 3"):
        _core.linear_f32(x, w, np.zeros((2, 4), np.float32), 192, 1)
    with pytest.raises(ValueError, match="kc"):
        _core.linear_f32(x, w, np.zeros((2, 3), np.float32), 0, 1)
    with pytest.raises(ValueError, match="contiguous"):
        _core.linear_f32(np.zeros((2, 16), np.float32)[:, ::2], w, np.zeros((2, 3), np.float32), 192, 1)
    with pytest.raises(TypeError):
        _core.linear_f32(x.astype(np.float64), w, np.zeros((2, 3), np.float32), 192, 1)
    y = np.full((2, 3), np.nan, np.float32)
    _core.linear_f32(x, w, y, 192, 1)
    assert (y == 0).all()
