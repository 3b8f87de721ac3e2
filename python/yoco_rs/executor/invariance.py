"""What keeps the CPU reference attention batch-invariant: measured properties of CPU BLAS and softmax.

These are properties of one torch build (the one ``uv.lock`` pins), not guarantees of torch: what is
exact by construction and what only under that build is written down in ``docs/DESIGN.md`` ("Numerics"),
and ``tests/test_00_environment.py`` says so first when the installed build differs.

A token's numbers must not depend on what else is in the batch, so that greedy output is the same across
batch compositions, chunkings and fast prefill on/off, and equal to a whole-sequence forward (the
equivalence matrix and the transformers comparisons rely on it). Measured on MKL, AVX-512, float32
(``tests/test_executor_attention.py`` pins the parts the attention relies on):

* A GEMM with fewer than ``MIN_GEMM_ROWS`` rows (4 there; probed per CPU at import, 16 on an Intel CPU
  with MKL's AVX-512 sgemm) takes another code path (GEMV-like) and rounds differently. From that many rows up (and ``N >= 12`` columns) an output is a sequential FMA chain
  over each block of ``kc`` terms (192; a K of 256 is two blocks of 128), the block sums added in order,
  whatever the row count: the model's projections reproduce exactly that for any number of rows
  (``cpu_linear.py``, measured there at load), and the attention GEMMs below get at least
  ``MIN_GEMM_ROWS`` query rows (zero rows are appended).
* With at least that many rows, an output summed over at most ``FMA_CHAIN_MAX`` terms is one sequential
  FMA chain, whatever the GEMM's other dimensions, batch or operand strides. So zero terms anywhere in the
  sum (masked keys, another KV head's columns) change nothing, and ``embedding_bag``'s weighted sum (a
  sequential FMA chain at any length) gives the same value. Over more terms BLAS splits the sum at points
  that depend on the total length, so padding changes the last ulps there.
* Softmax gives bit-identical probabilities whatever masked entries (``finfo.min``) surround a row's
  visible ones, once the row is at least ``MIN_KEYS`` long; shorter rows round differently.
* Hence the rule both attention paths follow for ``p @ v``: a query's values are summed in *pieces* of
  keys ``[VALUE_PIECE * k, VALUE_PIECE * (k + 1))`` (absolute positions), each piece one sequential chain
  (a GEMM over at most ``FMA_CHAIN_MAX`` keys, or ``embedding_bag``), the pieces added in order. That
  makes a token's output independent of the batch, of its chunking and of prefill vs decode at any
  context length; up to ``VALUE_PIECE`` keys it is also exactly transformers' ``p @ v`` (beyond, the
  oracle's own GEMM splits the sum at points that depend on its whole sequence length).
* A GEMM over K = 4 terms (AltUp's predict) is rounded products added in order on the AMD EPYC and one
  FMA chain on the Intel CPU (``SMALL_GEMM_FMA``, probed): elementwise ops reproduce either exactly.
* Swapping a GEMM's operands (``k @ q^T`` instead of ``q @ k^T``) changes the rounding: the orientation
  is part of the contract (transformers' eager attention computes ``q @ k^T`` and ``p @ v``).
"""

from __future__ import annotations

import torch



def _min_gemm_rows() -> int:
    """The fewest GEMM rows from which this CPU's BLAS gives a row the same bits whatever the row count
    (``F.linear`` on a contiguous ``[N, K]`` weight, the strictest layout: a transposed ``[K, N]`` one, and
    the attention's ``p @ v``, hold from 4 rows on both CPUs measured). 4 on the AMD EPYC the properties
    above were measured on; 16 on an Intel CPU whose MKL takes its AVX-512 sgemm (rows under 11 round
    otherwise at K = 256, under 16 at K = 2048: measured). Probed once at import on random data at the
    model's shapes with at least 12 outputs (below, MKL takes other paths: ``cpu_linear.SMALL_N``), at
    K = 2048 and at the attention scores' head dim 256."""
    g = torch.Generator().manual_seed(4)
    probes = []
    for n, k in ((24, 2048), (48, 256)):
        w = torch.randn(n, k, generator=g)
        x = torch.randn(72, k, generator=g)
        probes.append((x, w, torch.nn.functional.linear(x, w)))
    candidates = (4, 8, 16, 32)
    with torch.inference_mode():
        for rows in candidates:
            if all(torch.equal(torch.nn.functional.linear(x[:m], w), ref[:m])
                   for x, w, ref in probes for m in (rows, rows + 1, 2 * rows - 1, 2 * rows + 3)):
                return rows
    return candidates[-1]


MIN_GEMM_ROWS = _min_gemm_rows()


def _small_gemm_fuses() -> bool:
    """Whether a batched matmul with K = 4 (transformers' AltUp predict: ``[H, A] @ [A, A]`` per token) sums
    its terms as one FMA chain ``fma(h3, c3, fma(h2, c2, fma(h1, c1, h0 * c0)))`` (an Intel CPU with
    MKL's AVX-512 kernels: measured) rather than rounding each product and adding in order (the AMD EPYC).
    ``torch.addcmul`` is that FMA chain on the CPU, ``mul`` + ``add`` the other: the model's predict picks
    the one this probe finds (``layer.AltUp.predict``), and fails loudly if neither matches."""
    g = torch.Generator().manual_seed(5)
    h, c = torch.randn(64, 4, 128, generator=g), torch.randn(64, 4, 4, generator=g)
    with torch.inference_mode():
        ref = torch.matmul(h.transpose(1, 2), c.transpose(1, 2)).transpose(1, 2)  # [T, i, H]
        rounded, fused = h[:, None, 0] * c[:, :, 0, None], h[:, None, 0] * c[:, :, 0, None]
        for k in range(1, 4):
            rounded = rounded + h[:, None, k] * c[:, :, k, None]
            fused = torch.addcmul(fused, h[:, None, k], c[:, :, k, None])
    if torch.equal(rounded, ref):
        return False
    if torch.equal(fused, ref):
        return True
    raise RuntimeError("this CPU's batched matmul at K = 4 rounds neither as rounded products added in order "
                       "nor as one FMA chain: AltUp predict cannot reproduce transformers (executor/invariance.py)")


SMALL_GEMM_FMA = _small_gemm_fuses()
MIN_KEYS = 16
FMA_CHAIN_MAX = 192
VALUE_PIECE = FMA_CHAIN_MAX


def value_pieces(num_keys: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the value pieces over keys ``0 .. num_keys`` (key 0 at a piece boundary)."""
    return [(c, min(c + VALUE_PIECE, num_keys)) for c in range(0, num_keys, VALUE_PIECE)]


def pad_rows(x: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """``x`` with zero entries appended along ``dim`` up to ``n`` (no copy when already long enough)."""
    if x.shape[dim] >= n:
        return x
    shape = list(x.shape)
    shape[dim] = n - x.shape[dim]
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def additive_mask(kpos: torch.Tensor, qpos: torch.Tensor, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """0 where key ``kpos`` is visible from query ``qpos`` (causal, and within ``window`` when sliding),
    ``finfo.min`` elsewhere (as transformers' eager attention: a fully masked row stays finite)."""
    visible = kpos <= qpos
    if window is not None:
        visible &= kpos > qpos - window
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
        ~visible, torch.finfo(dtype).min)
