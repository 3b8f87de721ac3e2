"""The Triton attention backend: the executor's ``AttentionBackend`` on the GPU kernels of this package.

Kernel choice per half is a host decision made once in :meth:`build_metadata` (or fixed by the graph
runner for a captured graph), never inside ``attend``: rows with at most one query each (decode steps,
the cross-decoder's one-row-per-request) take the split-KV decode kernel, anything else the varlen
kernel. Queries outside every row (padding up to a capture size) get zeros, as with the reference.
Nothing here reads a device tensor's values on the host, so ``write_kv``/``attend`` can be captured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from yoco_rs.attention import AttentionBackend, AttentionMetadata


@dataclass
class TritonAttentionMetadata(AttentionMetadata):
    """The common attention metadata plus host-side facts that pick a kernel (decode or varlen) and bound
    its grid."""

    max_query_len: int = 0
    """Host: the longest row's query count; 1 (or 0 with no rows) selects the decode kernel, 0 with rows
    means unknown (varlen kernel)."""
    max_seq_len: int = 0
    """Host: the longest context, 0 = unknown (a captured graph replays at any context length)."""
    num_covered: int = -1
    """Host: ``query_start_loc[R]``, the queries inside rows; -1 = all of them (graph buffers: the
    padding is a row of its own)."""


class TritonAttentionBackend(AttentionBackend):
    """Attention through the Triton kernels (paged KV write, KV copy, decode and varlen attention): what
    ``select_backend`` picks on CUDA, and what the CUDA graph runner captures."""

    name = "triton"

    def build_metadata(
        self,
        *,
        query_start_loc_cpu: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        positions: torch.Tensor,
        block_tables: Sequence[torch.Tensor],
        slot_mapping: torch.Tensor | None,
        windows: Sequence[int | None],
        block_size: int,
        dtype: torch.dtype,
    ) -> TritonAttentionMetadata:
        """Metadata for one decoder half of a step, with the host facts (longest query and context) the
        kernel choice needs."""
        qsl = query_start_loc_cpu.to(torch.int64)
        r = int(seq_lens_cpu.shape[0])
        max_q = int((qsl[1:] - qsl[:-1]).max()) if r else 0
        return TritonAttentionMetadata(
            num_queries=int(positions.shape[0]), block_size=block_size, positions=positions,
            query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=list(block_tables),
            windows=list(windows), slot_mapping=slot_mapping,
            max_query_len=max(max_q, 1) if r else 0,
            max_seq_len=int(seq_lens_cpu.max()) if r else 0,
            num_covered=int(qsl[-1]),
        )

    def write_kv(self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 meta: AttentionMetadata, group: int) -> None:
        """Write this step's K/V of one layer into the paged cache at the group's slots."""
        from yoco_rs.kernels.kv_write import write_kv

        assert meta.slot_mapping is not None, "this half has no slot_mapping: it must not write KV"
        write_kv(kv_layer, k, v, meta.slot_mapping[group])

    def attend(self, q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, group: int,
               scale: float) -> torch.Tensor:
        """Paged attention of ``q`` over one layer's cache: the decode kernel when every row has one query,
        the varlen kernel otherwise; queries past the last row (graph padding) come out as zeros."""
        from yoco_rs.kernels.decode_attention import decode_attention
        from yoco_rs.kernels.paged_attention import paged_attention

        window = meta.windows[group] or 0
        max_q = getattr(meta, "max_query_len", 0)
        covered = getattr(meta, "num_covered", -1)
        out = torch.empty_like(q)
        if 0 <= covered < q.shape[0]:
            out[covered:].zero_()
        args = (q, kv_layer, meta.block_tables[group], meta.query_start_loc, meta.seq_lens)
        if max_q == 1:
            decode_attention(*args, window=window, scale=scale, out=out,
                             max_seq_len=getattr(meta, "max_seq_len", 0))
        else:
            paged_attention(*args, window=window, scale=scale, out=out)
        return out

    def copy_kv(self, kv_groups: Sequence[torch.Tensor], copies: torch.Tensor) -> None:
        """Applies a step's sub-block copy ops (``[C, 4]`` int32 on the device) to every group."""
        from yoco_rs.kernels.kv_copy import copy_kv

        for g, kv in enumerate(kv_groups):
            copy_kv(kv, copies, g)


def select_backend(device: torch.device | str, name: str | None = None) -> AttentionBackend:
    """``name`` None / ``"auto"``: Triton on CUDA when Triton imports, else the torch reference;
    ``"torch"`` / ``"triton"`` force one (env ``YOCO_ATTENTION_BACKEND`` overrides ``auto``)."""
    import os

    device = torch.device(device)
    name = name or os.environ.get("YOCO_ATTENTION_BACKEND") or "auto"
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_ok() else "torch"
    if name == "triton":
        if device.type != "cuda" and not _interpreting():
            raise ValueError(
                f"the triton attention backend needs a CUDA device (got {device}); use 'torch' or 'auto', "
                "or set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter"
            )
        return TritonAttentionBackend()
    if name == "torch":
        from yoco_rs.attention import get_backend

        return get_backend("torch")
    raise ValueError(f"unknown attention backend {name!r}; choose 'auto', 'torch' or 'triton'")


def _interpreting() -> bool:
    from yoco_rs.kernels._common import interpreting

    return interpreting()


def _triton_ok() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - triton ships with CUDA torch
        return False
    return True
