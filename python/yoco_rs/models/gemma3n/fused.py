"""Several parameters of a layer used as one tensor (one GEMM for q/k/v, one for MLP gate/up, one norm scale
for q/k/v heads), without duplicating them and without changing how checkpoints load.

The parameters keep their transformers names and shapes (loading copies into them by name); on first use
they are re-pointed to consecutive slices of one concatenated tensor, so later in-place loads write
through to it. If a parameter is replaced (``module.to()``, assigning ``.data``), its address changes and
the next use re-concatenates. Splitting a GEMM's output columns does not change any value: each output
is the same sum over the input whatever the GEMM's width (checked bit for bit, up to K = 2048).
K-major parameters (a CPU layout, ``executor/cpu_linear.py``) give a K-major fused tensor, parameters in
panels (the other) one in panels.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class FusedParams:
    """``params`` (same dtype/device, equal trailing shape) as views of one tensor concatenated on dim 0."""

    def __init__(self, params: Sequence[nn.Parameter]):
        self._params = list(params)
        self._fused: torch.Tensor | None = None
        self._ptrs: tuple[int, ...] = ()

    def get(self) -> torch.Tensor:
        ptrs = tuple(p.data_ptr() for p in self._params)
        if self._fused is None or ptrs != self._ptrs:
            with torch.inference_mode(False):  # a normal tensor: loading into the params later must work
                fused = _concat([p.detach() for p in self._params])
            from yoco_rs.executor.cpu_linear import PANEL, is_panels, weight_shape

            start, unit = 0, PANEL if is_panels(fused) else 1  # (dim 0 of panels counts panels)
            for p in self._params:
                n = weight_shape(p)[0]
                p.data = fused[start // unit:(start + n) // unit]
                start += n
            self._fused = fused
            self._ptrs = tuple(p.data_ptr() for p in self._params)
        return self._fused


def _concat(ts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(ts)`` on dim 0, in the CPU layout of the parts: panels if they all are, else K-major if
    one is (padded alike; parts in panels among them are converted: a fused tensor has one layout)."""
    from yoco_rs.executor.cpu_linear import cpu_weight, is_k_major, is_panels, k_major_weight, weight_rows, weight_shape

    cpu = ts[0].device.type == "cpu"
    if cpu and all(is_panels(t) for t in ts):
        n, k = sum(weight_shape(t)[0] for t in ts), ts[0].shape[1]
        return torch.cat(ts, out=cpu_weight(n, k, ts[0].dtype))  # (a multiple of PANEL: panels again)
    if not (cpu and (is_k_major(ts[0]) or any(is_panels(t) for t in ts))):
        return torch.cat(ts)
    rows = [weight_rows(t) for t in ts]
    out = k_major_weight(sum(r.shape[0] for r in rows), ts[0].shape[1], ts[0].dtype)
    start = 0
    for r in rows:
        out.t()[:, start:start + r.shape[0]].copy_(r.t())  # K-major parts: rows of both contiguous, a plain copy
        start += r.shape[0]
    return out
