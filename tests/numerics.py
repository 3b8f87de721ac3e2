"""Which numerical expectations hold by construction and which only under the locked torch build.

The project's numerics contract is written down in ``docs/DESIGN.md`` (section "Numerics: what is exact,
and why"); this module is how the suite applies it:

* ``locked_versions()`` reads the exact versions ``uv.lock`` pins; ``drift()`` compares the installed
  torch and transformers with them and returns one clear message when they differ
  (``tests/test_00_environment.py`` fails with it, first).
* Tests marked ``locked_rounding`` assert bit-identity (or a tolerance chosen from what was observed)
  that depends on *how* one torch build's CPU kernels round: which BLAS path a GEMM of a given shape
  takes, where it splits a long sum, how softmax reduces. They hold under the locked build and are
  skipped, pointing at the environment test, when torch drifts: an upgrade then shows as one clear
  failure instead of dozens of puzzling ones.
* Comparisons with transformers (an oracle whose kernels we do not control) go through ``hf_tol``:
  1e-5 under the locked build (observed 0.0: both sides run the same kernels on the same shapes), and a
  float32 re-association bound when torch drifts; greedy tokens are compared exactly either way
  (``assert_same_greedy``).
"""

from __future__ import annotations

import functools
import os
import tomllib
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The packages whose kernels decide rounding in the strict tests: torch (every op) and transformers (the
# oracle's op order).
ROUNDING_PACKAGES = ("torch", "transformers")
UNIT_ROUNDOFF = 2.0**-24  # float32
STRICT_TOL = 1e-5


@functools.cache
def locked_versions(lock_path: str = os.path.join(ROOT, "uv.lock")) -> dict[str, str]:
    """``{package: version}`` as ``uv.lock`` pins them."""
    with open(lock_path, "rb") as f:
        lock = tomllib.load(f)
    return {p["name"]: p["version"] for p in lock.get("package", []) if "version" in p}


def public_version(version: str) -> str:
    """``2.13.0+cu130`` -> ``2.13.0``: the local build tag (CUDA flavour) does not change CPU rounding."""
    return version.split("+", 1)[0]


def drift_message(package: str, installed: str | None, locked: str) -> str | None:
    """The clear failure message when ``installed`` is not the locked ``locked`` version, else None."""
    if installed is not None and public_version(installed) == public_version(locked):
        return None
    what = "is not installed" if installed is None else f"{installed} differs from"
    return (
        f"installed {package} {what} the locked {locked}: the exact-rounding tests below assume {locked} "
        f"(they are skipped; comparisons with transformers fall back to a float32 re-association bound). "
        f"Run `make setup` (uv sync --locked) to install the locked versions, or `make lock` and re-verify "
        f"to move the lock."
    )


def _installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def drift() -> str | None:
    """One message naming every rounding-relevant package that differs from the lock, or None."""
    locked = locked_versions()
    msgs = [drift_message(p, _installed(p), locked[p]) for p in ROUNDING_PACKAGES if p in locked]
    msgs = [m for m in msgs if m]
    return "\n".join(msgs) or None


def reassociation_tol(num_layers: int, width: int, scale: float) -> float:
    """A bound on how far two float32 evaluations of the same network can drift apart when the kernels
    sum in another order: a sum of ``width`` terms re-associated changes by at most about
    ``width * u * sum|terms|`` (u = 2^-24), the error of each layer carries into the next, and the values
    are of size ``scale``. Measured on torch 2.15 against a suite verified on 2.13: 3.6e-5 (10 layers,
    hidden 128) and 1.6e-4 (30 layers), under the bound's 7.6e-5 and 2.3e-4 at scale 1."""
    return num_layers * width * UNIT_ROUNDOFF * max(1.0, scale)


@functools.cache
def cpu_drift() -> str | None:
    """A message when this CPU's BLAS rounds otherwise than the machine the strict tolerances were observed
    on (an AMD EPYC: MKL's AVX2 sgemm, GEMMs row-invariant from 4 rows), else None. On an Intel CPU with
    MKL's AVX-512 sgemm, row-major GEMMs round otherwise below 16 rows (``executor/invariance.py`` probes
    it): the executor pads to what it probed, and where calibration finds no block size for a K (E2B's 2048)
    it pads MKL's GEMM rather than reproduce transformers' order, and the vision tower's GEMMs round
    otherwise too, so those comparisons take the re-association bound (as under a torch drift); the tiny
    text models stay exact there (``hf_tol(any_cpu=True)``).
    The executor's own invariances (prefill == decode, batch independence) stay exact on either CPU."""
    from yoco_rs.executor.invariance import MIN_GEMM_ROWS

    if MIN_GEMM_ROWS == 4:
        return None
    return (f"this CPU's BLAS gives a row the same bits only from {MIN_GEMM_ROWS} GEMM rows (4 on the reference "
            f"machine): comparisons with transformers use the float32 re-association bound")


def hf_tol(num_layers: int, width: int, scale: float = 1.0, *, any_cpu: bool = False) -> float:
    """Tolerance of a comparison with transformers: strict under the locked build on the reference CPU,
    else the bound (``drift``, ``cpu_drift``). ``any_cpu``: the comparison is strict under the locked build
    on either CPU measured (the tiny text models: every GEMM they run reproduces on both, 0.0 observed on
    the Intel CPU too once AltUp's predict follows ``invariance.SMALL_GEMM_FMA``); only E2B's K = 2048
    projections and the vision tower round otherwise on the Intel CPU."""
    if drift() is None and (any_cpu or cpu_drift() is None):
        return STRICT_TOL
    return max(STRICT_TOL, reassociation_tol(num_layers, width, scale))


def assert_same_greedy(got, want, tol: float) -> None:
    """Greedy tokens equal wherever the reference's top-2 margin exceeds twice ``tol`` (below that a
    tie is within the comparison's own tolerance and either token is right)."""
    import torch

    top2 = want.float().topk(2, dim=-1).values
    decided = (top2[..., 0] - top2[..., 1]) > 2 * tol
    same = got.argmax(-1) == want.argmax(-1)
    assert bool(torch.all(same | ~decided)), "greedy tokens differ where the reference's margin is clear"
