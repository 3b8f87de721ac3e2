"""Gemma 3n's per-layer embedding table kept in host memory, memory-mapped from the checkpoint.

The table is ``[vocab_size_per_layer_input, N * P]`` (262,144 x 7,680 for E2B: 2.0B of the text model's
4.4B parameters), yet a step reads one row per token. Held on the device it costs ~3.9 GB in bf16 that the
KV cache could use; held in RAM as a copy it makes loading slow and RSS large. So the table stays where the
checkpoint is: :func:`mmap_safetensors` maps the tensor's bytes read-only (the page cache holds the rows a
workload touches, nothing is copied at load), and each step gathers its tokens' rows on the host
(``torch.embedding`` releases the GIL), converts them to the model dtype, and hands them to the forward.

On a CUDA device the forward cannot gather on the host (it may be a replayed CUDA graph): the executor
calls :meth:`HostPerLayerEmbedding.stage` with the step's token ids before the forward; the rows are
gathered into a pinned buffer and copied asynchronously into a fixed device buffer, which the forward
reads (its address never changes after :meth:`reserve`, so captured graphs read each step's rows).

Values are exactly those of an on-device table: the rows are the checkpoint's values, cast to the model
dtype (as a whole-table cast on load would), then scaled by ``sqrt(P)`` in the model dtype.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import warnings

import torch
from torch import nn

_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def mmap_safetensors(path: str, key: str) -> torch.Tensor:
    """Tensor ``key`` of the safetensors file ``path`` as a read-only view of a memory map (no copy).

    The map lives as long as the tensor (the tensor keeps the buffer alive). Never write to it."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        info = header.get(key)
        if info is None:
            raise KeyError(f"{path}: no tensor {key!r}")
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {key!r} has dtype {info['dtype']}; expected a floating type")
        start, end = info["data_offsets"]
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    shape = tuple(info["shape"])
    count = 1
    for s in shape:
        count *= s
    if (end - start) != count * dtype.itemsize or 8 + n + end > len(mm):
        raise ValueError(f"{path}: tensor {key!r} has {end - start} bytes for shape {list(shape)} "
                         f"(file truncated or corrupted?)")
    with warnings.catch_warnings():  # a read-only buffer: torch warns that writes would be undefined
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(mm, dtype=dtype, count=count, offset=8 + n + start)
    return t.view(shape)


class HostPerLayerEmbedding(nn.Module):
    """The per-layer embedding, its table in host memory (see the module doc).

    ``forward(ids)`` returns ``table[ids] * scale`` as ``[T, N * P]`` in the model dtype on the model's
    device: on the CPU gathered right there; on another device the rows :meth:`stage` copied in."""

    def __init__(self, num: int, dim: int, scale: float, *, dtype: torch.dtype, device):
        super().__init__()
        self.num, self.dim, self.dtype = num, dim, dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.table: torch.Tensor | None = None
        self.register_buffer("embed_scale", torch.tensor(scale, device=self.device).to(dtype), persistent=False)
        self._pinned: torch.Tensor | None = None
        self._staged: torch.Tensor | None = None  # [capacity, dim] on the device, fixed address
        self._copied: torch.cuda.Event | None = None
        self._overflow: torch.Tensor | None = None  # rows of a step larger than the fixed buffer
        self._staged_rows = -1  # rows staged and not yet consumed (-1: nothing staged)

    @property
    def on_cpu(self) -> bool:
        return self.device.type == "cpu"

    def attach(self, table: torch.Tensor) -> None:
        """Use ``table`` (``[num, dim]`` on the host, any floating dtype; typically a memory map)."""
        if tuple(table.shape) != (self.num, self.dim):
            raise ValueError(f"per-layer embedding table has shape {list(table.shape)}; expected "
                             f"[{self.num}, {self.dim}]")
        self.table = table.detach()

    def host_bytes(self) -> int:
        return 0 if self.table is None else self.table.numel() * self.table.element_size()

    def device_bytes(self) -> int:
        return 0 if self._staged is None else self._staged.numel() * self._staged.element_size()

    def _gather(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.table is None:
            raise RuntimeError("the per-layer embedding table was never loaded (attach a table first)")
        ids = ids.to(torch.int64)
        ids = torch.where((ids >= 0) & (ids < self.num), ids, 0)  # as the model's embed: out-of-table ids read row 0
        rows = torch.embedding(self.table, ids)  # reads only these rows of the map; GIL released
        if out is None:
            return rows.to(self.dtype)
        out[: ids.shape[0]].copy_(rows)
        return out[: ids.shape[0]]

    def reserve(self, rows: int) -> None:
        """Device staging for up to ``rows`` tokens per step, allocated once (before any CUDA graph capture:
        captured graphs read this buffer, so it is never reallocated; larger eager steps use a temporary)."""
        if self.on_cpu or self._staged is not None:
            return
        self._staged = torch.zeros(rows, self.dim, dtype=self.dtype, device=self.device)
        self._pinned = torch.zeros(rows, self.dim, dtype=self.dtype, pin_memory=True)
        self._copied = torch.cuda.Event()

    def stage(self, ids: torch.Tensor) -> None:
        """Gathers the rows of ``ids`` (host tensor, the step's tokens in order) and copies them, without
        a host sync, into the device buffer the next forward reads. A no-op on the CPU."""
        if self.on_cpu:
            return
        t = int(ids.shape[0])
        self.reserve(max(t, 256))
        if t > self._staged.shape[0]:  # an eager step above the graphs' sizes: a one-off device tensor
            self._overflow = self._gather(ids.cpu()).to(self.device, non_blocking=False)
        else:
            self._overflow = None
            self._copied.synchronize()  # the previous step's copy out of the pinned buffer is done
            self._gather(ids.cpu(), self._pinned)
            self._staged[:t].copy_(self._pinned[:t], non_blocking=True)
            self._copied.record()
        self._staged_rows = t

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[0]
        if self.on_cpu:
            rows = self._gather(ids)
        else:
            if not torch.cuda.is_current_stream_capturing() and self._staged_rows < 0:
                self.stage(ids)  # nobody staged this step (a direct model call): gather now, with a host sync
            self._staged_rows = -1
            if self._overflow is not None and self._overflow.shape[0] >= t:
                rows, self._overflow = self._overflow[:t], None
            elif self._staged is not None and self._staged.shape[0] >= t:
                rows = self._staged[:t]
            else:
                raise RuntimeError(f"per-layer embedding rows for {t} tokens were not staged: reserve() before "
                                   "capturing CUDA graphs, stage(ids) before a forward")
        return rows * self.embed_scale
