"""The CPU linear layer (``executor/cpu_linear.py``, kernel ``crates/yoco-cpu``): a row's outputs are MKL's
4-row GEMM values at every row count (what lets the executor run decode steps unpadded), the MKL properties
that rests on, the K-major weight layout and its loading, and the kernel's refusals of bad operands.

The shapes are E2B's (K = 2048, 8192, 256, 64; N from 12 to 16384) at small N where N does not matter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from model_harness import CoreWithoutKernel

from yoco_rs import _core
from yoco_rs.executor.cpu_linear import (
    MKL_ROWS, PANEL, SMALL_N, TINY, RowInvariantLinear, copy_weight, cpu_weight, embedding, is_k_major, is_panels,
    kernel_linear, weight_rows, weight_shape,
)
from yoco_rs.models.gemma3n.fused import FusedParams

needs_kernel = pytest.mark.skipif(not _core.cpu_linear_available(), reason="the kernel needs AVX2 and FMA")
SHAPES = [(24, 2048), (3072, 2048), (2048, 8192), (2048, 256), (2048, 64), (256, 2048), (12, 2048), (16, 4)]
MEASURED_KC = {2048: 192, 8192: 192, 256: 128, 64: 64}
"""MKL's block sizes on the machine the order was measured on (AMD EPYC, AVX2 + FMA: MKL's AVX2 sgemm)."""


def _mkl_sums_as_measured() -> bool:
    """Whether this CPU's MKL sums K = 2048 in the measured 192-term blocks (the kernel at kc 192 gives a
    4-row MKL GEMM's bits). Another CPU (AVX-512: another MKL kernel) may sum otherwise; the executor then
    uses what calibration finds, or pads, and only the tests of *the measured order* are skipped."""
    if not _core.cpu_linear_available():
        return False
    x = torch.randn(4, 2048, generator=torch.Generator().manual_seed(20))
    w, wk = _weight(24, 2048, seed=21)
    return torch.equal(kernel_linear(x, wk, 192, 1), F.linear(x, w))


def _skip_unless_the_kernel_reproduces_mkl(n: int, k: int) -> None:
    """Skips (with the reason) where the executor does not run the kernel for this shape in float32
    because calibration found no block size reproducing this CPU's MKL: there is then no kernel-vs-MKL
    identity to test (the executor pads those GEMMs; ``test_without_the_kernel_*`` cover that path)."""
    if n > SMALL_N and n * k > TINY and RowInvariantLinear.kc_for(k) is None:
        pytest.skip(f"MKL on this CPU sums K={k} in no order the kernel reproduces (calibration found no block "
                    f"size): float32 GEMMs of that K are padded to 4 rows here, not run by the kernel")


def _weight(n: int, k: int, seed: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(row-major, CPU layout) copies of one random ``[n, k]`` weight: the CPU layout is panels where the
    kernel runs and ``n`` is a multiple of ``PANEL`` (most of ``SHAPES``), K-major otherwise."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
    wk = cpu_weight(n, k, dtype)
    copy_weight(wk, w)
    return w, wk


@pytest.mark.locked_rounding
@needs_kernel
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_every_row_count_gets_mkls_4_row_gemm_values(n, k):
    """The property decode relies on: 1, 2, 3 ... rows (kernel below MKL_ROWS, MKL above) give each row
    exactly what a 4-row (or 40-row) MKL GEMM gives it (whatever block size calibration found on this CPU)."""
    _skip_unless_the_kernel_reproduces_mkl(n, k)
    w, wk = _weight(n, k, seed=n + k)
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(1))
    ref = F.linear(x, w)  # 40 rows: MKL's blocked GEMM
    lin = RowInvariantLinear()
    with torch.inference_mode():
        for m in [1, 2, 3, 4, 5, 8, MKL_ROWS - 1, MKL_ROWS, 40]:
            assert torch.equal(lin(x[:m], wk), ref[:m]), m
        if n * k > TINY and RowInvariantLinear.kc_for(k) is not None:
            # row-major weights too, where the kernel (the tile kernel) runs for them; otherwise this row
            # would be padded to MKL's 4-row GEMM on row-major weights, which on some CPUs (Intel, MKL's
            # AVX-512 sgemm: measured) rounds otherwise below 16 rows; the executor stores such weights
            # K-major, where MKL's 4-row GEMM is row-invariant there too (the loop above)
            assert torch.equal(lin(x[:1], w), ref[:1])


@pytest.mark.locked_rounding
@pytest.mark.skipif(not _mkl_sums_as_measured(), reason="this CPU's MKL does not sum in the 192-term blocks "
                    "measured on the reference machine (another sgemm kernel, or no AVX2/FMA for ours): the "
                    "executor uses whatever order calibration finds, or pads (tested above and below)")
def test_mkl_sums_192_term_blocks_from_4_rows_up():
    """The measured order the kernel reproduces: K = 2048 and 8192 in blocks of 192, 256 as two of 128,
    up to 192 terms one chain; below 4 rows MKL's GEMV rounds otherwise (why the kernel exists); and MKL
    gives the same bits from K-major weights (N >= 12) but not for N <= SMALL_N, whose weights therefore
    stay row-major."""
    assert {k: RowInvariantLinear.kc_for(k) for k in MEASURED_KC} == MEASURED_KC
    for n, k in [(24, 2048), (2048, 8192), (2048, 256)]:
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
        x4 = torch.randn(4, k, generator=torch.Generator().manual_seed(1))
        assert not torch.equal(F.linear(x4[:1], w), F.linear(x4, w)[:1]), (n, k)  # the GEMV's other rounding
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
            exact = F.linear(x.double(), w.double())
            # rounded once from f32 sums: within half a bf16 ulp of the exact product, plus the f32 sums'
            # own error (~1e-5 here; against MKL's f32 GEMM instead, MKL's error would count too: 5e-5
            # on 2 threads on an Intel CPU, which a near-zero output cannot absorb)
            assert ((together.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-4).all()
    finally:
        torch.set_num_threads(1)


@needs_kernel
@pytest.mark.parametrize("kc", [192, 100])
def test_the_kernels_row_bits_do_not_depend_on_the_row_count_layout_or_threads(kc):
    """The kernel's own property, on any CPU it runs on (no MKL involved, so not tied to one BLAS): a row's
    float32 outputs are the same bits computed alone, among 2..40 rows, from either weight layout, on 1 or
    2 threads, for any block size."""
    w, wk = _weight(520, 2048, seed=30)
    x = torch.randn(40, 2048, generator=torch.Generator().manual_seed(31))
    alone = torch.cat([kernel_linear(x[i:i + 1], wk, kc, 1) for i in range(40)])
    for m in [2, 3, 5, 16, 40]:
        assert torch.equal(kernel_linear(x[:m], wk, kc, 1), alone[:m]), m
    assert torch.equal(kernel_linear(x[:7], w, kc, 2), alone[:7])
    assert torch.equal(kernel_linear(x, wk, kc, 2), alone)
    # and it is a float32 x @ w^T (the order only moves the last bits)
    assert torch.allclose(alone, F.linear(x.double(), w.double()).float(), rtol=1e-4, atol=1e-4)


@pytest.mark.locked_rounding
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_without_the_kernel_gemms_are_padded_to_4_rows_and_stay_row_invariant(monkeypatch, dtype):
    """Where the CPU lacks the kernel's ISA, RowInvariantLinear never calls it: fewer than 4 rows are padded
    to a 4-row torch GEMM (the executor's earlier behaviour), so a row's bits still do not depend on how
    many rows there are (MKL's GEMM from 4 rows up, ``executor/invariance.py``)."""
    from yoco_rs.executor import cpu_linear

    monkeypatch.setattr(cpu_linear, "_core", lambda: CoreWithoutKernel)
    lin = RowInvariantLinear()
    assert lin.enabled and not lin.kernel
    w, wk = _weight(2048, 2048, seed=40, dtype=dtype)
    x = torch.randn(40, 2048, generator=torch.Generator().manual_seed(41)).to(dtype)
    with torch.inference_mode():
        ref = F.linear(x, wk)  # 40 rows: torch's GEMM
        if dtype == torch.bfloat16 and not torch.equal(F.linear(x[:MKL_ROWS], wk), ref[:MKL_ROWS]):
            pytest.skip("torch's bf16 GEMM on this CPU rounds a row differently among 16 and 40 rows (oneDNN's "
                        "AMX kernel, measured on an Intel CPU): the padded fallback is not row-invariant here; "
                        "a CPU with AMX has AVX2, so the executor runs the kernel there and never this path")
        for m in [1, 2, 3, 4, 5, MKL_ROWS, 40]:
            assert torch.equal(lin(x[:m], wk), ref[:m]), m


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
def test_panel_weights_load_exactly_fuse_in_panels_and_serve_as_the_tied_embedding():
    """The executor's CPU layout for E2B's projections: ``[N / 16, K, 16]``, loaded from a checkpoint's
    ``[N, K]`` (dtype converted, in ``COPY_COLUMNS`` slices), fused q/k/v-style into one tensor in panels
    whose slices are the parts, and read as an embedding table by rows."""
    g = torch.Generator().manual_seed(12)
    src = torch.randn(1056, 96, generator=g).to(torch.bfloat16)  # 66 panels: more than one copy slice
    p = cpu_weight(1056, 96, torch.float32)
    assert is_panels(p) and p.shape == (66, 96, PANEL) and weight_shape(p) == (1056, 96)
    copy_weight(p, src)
    assert torch.equal(weight_rows(p), src.float())
    assert torch.equal(p[3, 5], src[48:64, 5].float())  # panel 3, k = 5: outputs 48..63 side by side
    with pytest.raises(ValueError, match="into a"):
        copy_weight(p, src[:1040])
    q = cpu_weight(2048, 96, torch.float32)
    copy_weight(q, torch.randn(2048, 96, generator=g))
    fused = FusedParams([torch.nn.Parameter(p, requires_grad=False), torch.nn.Parameter(q, requires_grad=False)])
    both = fused.get()
    assert is_panels(both) and torch.equal(weight_rows(both), torch.cat([src.float(), weight_rows(q)]))
    x = torch.randn(3, 96, generator=g)
    with torch.inference_mode():
        lin = RowInvariantLinear()
        assert torch.equal(lin(x, both), torch.cat([lin(x, p), lin(x, q)], dim=1))  # slices are the parts
    small = cpu_weight(64, 96, torch.float32)  # tiny: K-major, so q/k/v-style parts of mixed layouts
    copy_weight(small, torch.randn(64, 96, generator=g))
    mixed = FusedParams([torch.nn.Parameter(p, requires_grad=False), torch.nn.Parameter(small, requires_grad=False)])
    one = mixed.get()  # one layout: K-major, the parts re-pointed to its slices
    assert is_k_major(one) and torch.equal(one, torch.cat([src.float(), small]))
    with torch.inference_mode():
        assert torch.equal(lin(x, one)[:, :1056], lin(x, both)[:, :1056])  # the same bits from either layout
    ids = torch.tensor([[0, 15, 16], [1055, 17, 0]])
    assert torch.equal(embedding(ids, both), F.embedding(ids, torch.cat([src.float(), weight_rows(q)])))
    assert not is_panels(cpu_weight(1000, 96, torch.float32))  # not a multiple of PANEL: K-major
    assert not is_panels(cpu_weight(TINY // 64, 64, torch.float32))  # tiny: K-major


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_panel_weights_give_the_bits_of_k_major_and_row_major_at_every_row_count(dtype):
    """The same kernel order from all three layouts, alone or among 2..40 rows, from a strided ``x`` (an
    AltUp stream), on 1 or 2 threads, with a block size that is no one's default."""
    w = torch.randn(1040, 512, generator=torch.Generator().manual_seed(13)).to(dtype)
    wp = cpu_weight(1040, 512, dtype)
    copy_weight(wp, w)
    wk = torch.empty(512, 1040 + 16, dtype=dtype)[:, :1040].t()
    wk.copy_(w)
    assert is_panels(wp) and is_k_major(wk)
    h = torch.randn(40, 2, 512, generator=torch.Generator().manual_seed(14)).to(dtype)
    x = h[:, 1]
    alone = torch.cat([kernel_linear(x[i:i + 1], w, 100, 1) for i in range(40)])
    for m in [1, 2, 3, 4, 7, 8, 13, 40]:
        for threads in [1, 2]:
            assert torch.equal(kernel_linear(x[:m], wp, 100, threads), alone[:m]), (m, threads)
            assert torch.equal(kernel_linear(x[:m], wk, 100, threads), alone[:m]), (m, threads)


@needs_kernel
def test_strided_rows_of_x_and_a_fused_weights_columns():
    """``x`` may be a strided view (an AltUp stream), ``w`` a slice of a fused K-major weight."""
    w, wk = _weight(300, 256, seed=8)
    h = torch.randn(5, 4, 256, generator=torch.Generator().manual_seed(9))
    x = h[:, 0]
    assert not x.is_contiguous()
    with torch.inference_mode():
        got = RowInvariantLinear()(x, wk[100:200])
    # MKL's GEMM on the same K-major columns, 8 rows (row-invariant from 4 rows up on that layout; on
    # row-major weights some CPUs' MKL rounds otherwise below 16 rows)
    assert torch.equal(got, F.linear(torch.cat([x, x[:3]]), wk[100:200])[:5])
    assert torch.allclose(got, F.linear(x.double(), w[100:200].double()).float(), rtol=1e-5, atol=1e-5)


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
    with pytest.raises(ValueError, match="w \\(panels\\)"):  # 3 outputs are one panel of 16 x 8, not two
        _core.linear_f32(x, np.zeros((2, 128), np.float32), np.zeros((2, 3), np.float32), 192, 1, panels=True)
    y = np.full((2, 3), np.nan, np.float32)
    _core.linear_f32(x, w, y, 192, 1)
    assert (y == 0).all()
    _core.linear_f32(x, np.zeros((1, 128), np.float32), y, 192, 1, panels=True)
