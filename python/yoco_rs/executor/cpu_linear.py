"""The model's projections on the CPU: ``F.linear`` values whatever the number of rows, without padding.

Batch invariance (``docs/DESIGN.md`` §6-7) needs a token's GEMMs to round the same in a 600-token prefill
and in a 1-row decode step. MKL's sgemm (the locked torch build's CPU BLAS) does so from
``MIN_GEMM_ROWS`` (4) rows up, where every output with ``N >= 12`` columns is summed as sequential FMA
chains over blocks of ``kc`` terms (192 at this build's AVX2 kernel; a K of 256 is two blocks of 128),
the block sums added in order; below 4 rows it takes a GEMV path that rounds otherwise (measured,
``tests/test_cpu_linear.py``). The executor used to pad every step to 4 rows, and at E2B's sizes MKL's
4-row GEMM costs about 8 GEMVs (memory reads are the same; the small-M kernel is compute-poor).

:class:`RowInvariantLinear` instead computes few rows with ``yoco_cpu`` (``crates/yoco-cpu``, via
``_core.linear_f32``), a kernel that reproduces that blocked order exactly for any row count, reading the
weights once per step like a GEMV (and once for all rows of a batched decode step). Per K, the block
size is not assumed: on first use it is found by comparing the kernel with MKL's 4-row GEMM on random
data (:meth:`RowInvariantLinear.kc_for`); where no block size reproduces MKL (or the kernel cannot run:
no AVX2/FMA), that K's GEMMs fall back to padding their rows to 4. GEMMs with ``N <= SMALL_N`` outputs
(AltUp's routers: MKL takes another path there) are padded too, which costs nothing at their size, and so
are the tiny ones (``TINY``). For K-major weights, from ``MKL_ROWS`` rows up MKL's GEMM itself runs (same
values, and faster than the kernel on that layout at prefill sizes); weights in panels (below) are only
readable by the kernel, which runs at every row count there (as fast as MKL at 600 rows: 97 / 335 / 431
ms against MKL's 100 / 501 / 395 at 2048 x 2048, 8192 x 2048, 2048 x 8192, one thread), in float32 with
the calibrated block size (MKL's values) or, where calibration found none, ``BF16_KC`` (row-invariant
still: every GEMM of such a weight runs the kernel).

The weights (``[N, K]`` parameters, as in the checkpoints) are stored in *panels* on the CPU where the
kernel runs and ``N`` is a multiple of ``PANEL``: a ``[N / PANEL, K, PANEL]`` tensor (:func:`cpu_weight`),
``PANEL`` consecutive outputs side by side for each ``k``, one panel after the other. The kernel reads
each panel front to back, one sequential stream, with the chains of several rows' outputs in registers
over a whole ``kc`` block (``crates/yoco-cpu/src/resident.rs``; 512-bit registers where the CPU has
AVX-512F, ``zmm.rs``, the same bits); torch cannot view that layout as
``[N, K]``, so every use of such a weight goes through this module (:class:`RowInvariantLinear` runs the
kernel at every row count, :func:`embedding` gathers the tied table's rows, :func:`weight_shape` gives the
``[N, K]`` the loader checks, :func:`weight_rows` a torch copy for tests). Other weights are stored *K-major*: the ``[N, K]`` view of a
``[K, N + PAD]`` buffer (MKL rounds the same on either layout, ``N >= 12``, checked; ``PAD`` keeps the
rows' cache lines in different L1 sets). :func:`copy_weight` loads a checkpoint tensor into either.

bfloat16 goes through ``_core.linear_bf16`` at every row count: the same blocked f32 order on the
exactly widened values, rounded once to bf16. It is batch-invariant by construction (torch's own bf16
GEMM on this CPU computes one dot product per output and gets ~5 GFLOP/s, so it is also much slower at
prefill), and it is *not* bit-identical to torch's bf16 GEMM (transformers' bf16 differs in the last bf16
bit here and there; bf16 is compared by tolerance anyway).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import torch
import torch.nn.functional as F

from yoco_rs.executor.invariance import MIN_GEMM_ROWS

SMALL_N = 8
"""Up to this many output columns MKL's sgemm does not use the blocked order (and rounds otherwise for
K-major weights): such weights stay row-major and their GEMMs are padded."""
MKL_ROWS = 16
"""float32 GEMMs of at least this many rows run MKL's sgemm (same values; faster there)."""
PAD = 16
"""Extra elements per row of a K-major weight buffer (row strides a multiple of 4 KiB map every row's
lines to the same L1 sets)."""
BF16_KC = 192
"""bf16 block size (any fixed value is invariant; MKL's f32 one, so bf16 = rounded f32 order)."""
PROBE_COLUMNS = (24, 520)
"""Output widths of the calibration probe: MKL picks its GEMM path by shape, so the block size is only
taken where it reproduces MKL at a narrow and at a wide N (on another CPU MKL may sum otherwise)."""
PANEL = 16
"""Outputs per panel of a panel weight (``yoco_cpu::PANEL``)."""
TINY = 1 << 16
"""GEMMs with at most this many weights (AltUp's 4 x 4, 16 x 4, 4 x 2048) run padded to 4 rows in torch:
cheaper than a kernel call at their size, and as row-invariant (bf16: on the widened values, rounded
once, like the kernel)."""


def _core():
    from yoco_rs import _core

    return _core


def cpu_weight(out_features: int, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized ``[out, in]`` CPU weight (see the module doc): in panels (``[out / PANEL, in,
    PANEL]``) where the kernel runs, ``out`` is a multiple of ``PANEL`` and the weight is not ``TINY``;
    otherwise K-major when ``out > SMALL_N``, row-major below. In transparent huge pages where the system
    grants them on request (a GEMV-like read of 10 GB of weights then walks 2 MiB pages instead of 4 KiB
    ones: ~10% faster, measured)."""
    if out_features <= SMALL_N:
        return torch.empty(out_features, in_features, dtype=dtype)
    if (out_features % PANEL == 0 and out_features * in_features > TINY and dtype in KERNEL_DTYPES
            and _core().cpu_linear_available()):
        buf = torch.empty(out_features // PANEL, in_features, PANEL, dtype=dtype)
        _advise_huge_pages(buf)
        return buf
    return k_major_weight(out_features, in_features, dtype)


def k_major_weight(out_features: int, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized K-major ``[out, in]`` CPU weight (rows padded by ``PAD``), in huge pages."""
    buf = torch.empty(in_features, out_features + PAD, dtype=dtype)
    _advise_huge_pages(buf)
    return buf[:, :out_features].t()


HUGE_PAGE = 1 << 21
_MADV_HUGEPAGE = 14


def _advise_huge_pages(t: torch.Tensor) -> None:
    """``madvise(MADV_HUGEPAGE)`` on the whole 2 MiB pages inside ``t``'s (untouched) memory; a no-op where
    that is unavailable (not Linux, THP off) or the tensor is small."""
    size = t.numel() * t.element_size()
    if size < 2 * HUGE_PAGE or not hasattr(os, "sched_getaffinity"):
        return
    start = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    end = (t.data_ptr() + size) // HUGE_PAGE * HUGE_PAGE
    try:
        libc = _libc()
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_HUGEPAGE)
    except (OSError, AttributeError):
        pass


@functools.cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)


KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def is_k_major(w: torch.Tensor) -> bool:
    return w.dim() == 2 and w.stride(0) == 1 and w.shape[0] > 1 and w.shape[1] > 1


def is_panels(w: torch.Tensor) -> bool:
    """Whether ``w`` is a weight in panels (:func:`cpu_weight`), or a slice of panels of one."""
    return w.dim() == 3 and w.shape[2] == PANEL


def weight_shape(w: torch.Tensor) -> tuple[int, ...]:
    """The ``[out, in]`` shape a weight stands for (a panel weight's is not its tensor shape)."""
    return (w.shape[0] * PANEL, w.shape[1]) if is_panels(w) else tuple(w.shape)


def weight_rows(w: torch.Tensor) -> torch.Tensor:
    """``w`` as an ``[out, in]`` tensor torch can use (a copy for panels: for fallbacks and tests only)."""
    return w.permute(0, 2, 1).reshape(-1, w.shape[1]) if is_panels(w) else w


def embedding(ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.embedding(ids, w)``, also for a table in panels (the tied LM head): each id's row gathered from
    its panel (``in`` values ``PANEL`` apart)."""
    if not is_panels(w):
        return F.embedding(ids, w)
    flat = ids.reshape(-1)
    return w[flat // PANEL, :, flat % PANEL].view(*ids.shape, w.shape[1])


COPY_COLUMNS = 512


def copy_weight(param: torch.Tensor, t: torch.Tensor) -> None:
    """``param.copy_(t)`` for an ``[out, in]`` tensor ``t`` (any dtype/layout), into panels or fast when
    ``param`` is K-major: ``COPY_COLUMNS`` rows of ``t`` at a time converted and transposed into a
    contiguous buffer (torch's blocked transpose), then copied as a whole (panels) or row by row (a strided
    ``copy_`` into the padded K-major layout takes torch's elementwise path: 5x slower), so the transient
    memory is one slice, not a converted copy of the whole tensor."""
    if is_panels(param):
        if t.dim() != 2 or weight_shape(param) != tuple(t.shape):
            raise ValueError(f"a {list(t.shape)} tensor into a {list(weight_shape(param))} weight")
        k = t.shape[1]
        for j0 in range(0, t.shape[0], COPY_COLUMNS):  # COPY_COLUMNS is a multiple of PANEL
            part = t[j0:j0 + COPY_COLUMNS].to(param.dtype)
            p0 = j0 // PANEL
            param[p0:p0 + part.shape[0] // PANEL].copy_(part.view(-1, PANEL, k).transpose(1, 2).contiguous())
        return
    if not is_k_major(param) or t.dim() != 2:
        param.copy_(t.to(param.dtype))
        return
    dst = param.t()  # [K, N], rows contiguous
    for j0 in range(0, t.shape[0], COPY_COLUMNS):
        part = t[j0:j0 + COPY_COLUMNS].to(param.dtype)
        dst[:, j0:j0 + part.shape[0]].copy_(part.t().contiguous())


def _padded(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m = x.shape[0]
    if m >= MIN_GEMM_ROWS:
        return F.linear(x, w)
    return F.linear(torch.cat([x, x.new_zeros(MIN_GEMM_ROWS - m, x.shape[1])]), w)[:m]


def _bits(t: torch.Tensor):
    """The numpy view the kernel reads: float32 as is, bf16 as its raw bits (no copy)."""
    return t.numpy() if t.dtype == torch.float32 else t.view(torch.uint16).numpy()


def kernel_linear(x: torch.Tensor, w: torch.Tensor, kc: int, threads: int) -> torch.Tensor:
    """``x [M, K] @ w[N, K]^T`` by ``yoco_cpu`` (``x`` rows contiguous; ``w`` row-major, K-major or in
    panels; float32 or bfloat16)."""
    y = torch.empty(x.shape[0], weight_shape(w)[0], dtype=x.dtype)
    fn = _core().linear_f32 if x.dtype == torch.float32 else _core().linear_bf16
    if is_panels(w):
        fn(_bits(x), _bits(w.view(w.shape[0], -1)), _bits(y), kc, threads, panels=True)
    else:
        fn(_bits(x), _bits(w), _bits(y), kc, threads)
    return y


def panel_linear(x: torch.Tensor, w: torch.Tensor, kc: int | None = None) -> torch.Tensor:
    """``F.linear(x, w)`` for a weight in panels (any leading dimensions of ``x``): the kernel at every row
    count (the only reader of the layout), in float32 with MKL's block size where calibration found it
    (the values of MKL's GEMM) and ``BF16_KC`` otherwise (row-invariant either way)."""
    lead, k = x.shape[:-1], x.shape[-1]
    n = weight_shape(w)[0]
    if x.dtype != w.dtype or x.device.type != "cpu":
        raise ValueError(f"a {x.dtype} {x.device.type} input for a {w.dtype} CPU weight in panels")
    if kc is None:
        kc = (RowInvariantLinear.kc_for(k) if x.dtype == torch.float32 else None) or BF16_KC
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty(*lead, n)
    return kernel_linear(_rows(x2), w, kc, torch.get_num_threads()).view(*lead, n)


class RowInvariantLinear:
    """``F.linear`` for the model's projections, row-count invariant on the CPU (see the module doc).

    One instance serves a model (its calibration is per process, shared by instances); ``enabled`` off
    means plain ``F.linear`` (``batch_invariant=False``: MKL's GEMV for few rows, not invariant), except
    for weights in panels, which only the kernel reads."""

    _kc: dict[int, int | None] = {}
    _lock = threading.Lock()

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.kernel = enabled and _core().cpu_linear_available()

    @classmethod
    def kc_for(cls, k: int) -> int | None:
        """MKL's block size for K (the first candidate whose kernel output equals MKL's 4-row GEMM on
        random data, at 1 and 4 rows, for each of ``PROBE_COLUMNS``), or None: pad this K's GEMMs instead
        (no AVX2/FMA for the kernel, or this CPU's MKL sums in an order the kernel does not reproduce)."""
        got = cls._kc.get(k, -1)
        if got != -1:
            return got
        with cls._lock:
            if k in cls._kc:
                return cls._kc[k]
            g = torch.Generator().manual_seed(k)
            x = torch.randn(MIN_GEMM_ROWS, k, generator=g)
            probes = []
            for n in PROBE_COLUMNS:
                w = torch.randn(n, k, generator=g)
                wk = cpu_weight(n, k, torch.float32)
                wk.copy_(w)
                probes.append((wk, F.linear(x, w)))
            with torch.inference_mode():
                found = None
                # MKL: the same values from the K-major layout
                if all(torch.equal(F.linear(x, wk), ref) for wk, ref in probes):
                    for kc in dict.fromkeys([192, k, -(-k // 2), 128, 256, 96, 64, 384, 512]):
                        if 1 <= kc <= k and all(torch.equal(kernel_linear(x[:m], wk, kc, 1), ref[:m])
                                                for wk, ref in probes for m in (1, 4)):
                            found = kc
                            break
            cls._kc[k] = found
            return found

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if is_panels(w):  # only the kernel reads panels; it is row-invariant, and the fast path anyway
            return panel_linear(x, w)
        if not self.enabled or x.device.type != "cpu" or x.dtype != w.dtype or x.dim() < 1:
            return F.linear(x, w)
        lead, k, n = x.shape[:-1], x.shape[-1], w.shape[0]
        x2 = x.reshape(-1, k)
        m = x2.shape[0]
        if m == 0 or x.dtype not in (torch.float32, torch.bfloat16):
            return F.linear(x, w)
        if x.dtype == torch.bfloat16:
            if n * k <= TINY:
                return _padded(x2.float(), w.float()).to(torch.bfloat16).view(*lead, n)
            if not self.kernel:
                return _padded(x2, w).view(*lead, n)
            return kernel_linear(_rows(x2), _weights(w), BF16_KC, torch.get_num_threads()).view(*lead, n)
        if m >= MKL_ROWS:
            return F.linear(x, w)
        kc = self.kc_for(k) if self.kernel and n > SMALL_N and n * k > TINY else None
        if kc is None:
            return _padded(x2, w).view(*lead, n)
        return kernel_linear(_rows(x2), _weights(w), kc, torch.get_num_threads()).view(*lead, n)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with contiguous rows (a copy only when its last dimension is strided)."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _weights(w: torch.Tensor) -> torch.Tensor:
    """``w`` as the kernel reads it: row-major or K-major as it is (a copy only for other strides)."""
    return w if w.stride(-1) == 1 or w.stride(0) == 1 else w.contiguous()
