"""The attention backend interface: how the model writes K/V into the paged cache and attends over it.
Neutral ground between ``models/`` (which calls it) and ``executor/`` and ``kernels/`` (which implement
it), so neither package imports the other's internals in a cycle.

A backend is used in three steps per forward half (self-decoder, cross-decoder):

1. ``meta = backend.build_metadata(...)`` once per step and half, *outside* the half: everything that
   needs host values (per-row query counts, the longest context, index tensors, masks) is computed here,
   from the CPU copies of ``query_start_loc`` / ``seq_lens`` that the engine has anyway.
2. Inside the half, for each producing layer: ``backend.write_kv(kv_layer, k, v, meta, group)`` writes the
   new tokens' K/V through ``meta.slot_mapping[group]``.
3. For every layer: ``out = backend.attend(q, kv_layer, meta, group, scale)`` over the paged cache.

With the metadata built, the halves do no host syncs and no ``.item()``: given static-shaped inputs and
metadata tensors living in static buffers, a half can be captured in a CUDA graph (helper ``gpu``).

Tensor conventions (``nH`` query heads, ``nKV`` KV heads, ``D`` head dim, ``Tq`` queries of this half):

* ``kv_layer``: one layer's slice of its group's cache, ``[2 (K,V), num_blocks, block_size, nKV, D]``
  (the group tensor is ``[num_layers_in_group, 2, num_blocks, block_size, nKV, D]``; shared layers get
  their donor's slice). Block 0 is the padding target and the "null" entry of block tables.
* ``q``: ``[Tq, nH, D]`` after q_norm and RoPE; ``k``, ``v``: ``[Tq, nKV, D]`` after norms/RoPE.
* Queries of row ``r`` are ``q[query_start_loc[r]:query_start_loc[r+1]]``; they are the *trailing*
  tokens of the row's context of ``seq_lens[r]`` keys (bottom-right causal alignment). Query ``t`` sits at
  absolute position ``positions[t]``; key ``p`` of its row is visible iff ``p <= positions[t]`` and, for a
  sliding group with window ``W``, ``p > positions[t] - W`` (HF's convention: the window includes the
  token itself). Key ``p`` of row ``r`` lives in slot ``block_tables[g][r, p // bs] * bs + p % bs``.
* Queries outside every row (padding to a capture size) produce finite garbage (the reference: zeros)
  that the caller drops. GQA: query head ``h`` uses KV head ``h // (nH // nKV)``. No logit softcap.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class AttentionMetadata:
    """What every backend's metadata carries; backends subclass it with their precomputed tensors."""

    num_queries: int
    """Tq (padded): rows of ``q`` in this half."""
    block_size: int
    positions: torch.Tensor
    """[Tq] int64 absolute position of each query (device)."""
    query_start_loc: torch.Tensor
    """[R+1] int32 (device)."""
    seq_lens: torch.Tensor
    """[R] int32 (device)."""
    block_tables: Sequence[torch.Tensor]
    """Per KV group, [R, max_blocks] int32 (device)."""
    windows: Sequence[int | None]
    """Per KV group, the sliding window W or None for full attention."""
    slot_mapping: torch.Tensor | None
    """[G, Tq] int64 write slots (device), None for a half that writes nothing (the cross-decoder)."""


class AttentionBackend(ABC):
    """Paged attention for mixed prefill/decode batches in one call. See the module docstring."""

    name: str = "abstract"

    @abstractmethod
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
    ) -> AttentionMetadata:
        """Precomputes a half's metadata. ``*_cpu`` are host copies (int32/int64) of the device tensors;
        ``positions`` has one entry per query of this half (its length is Tq)."""

    @abstractmethod
    def write_kv(self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 meta: AttentionMetadata, group: int) -> None:
        """Writes ``k``/``v`` ``[Tq, nKV, D]`` into ``kv_layer`` at ``meta.slot_mapping[group]``."""

    @abstractmethod
    def attend(self, q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, group: int,
               scale: float) -> torch.Tensor:
        """``softmax(q k^T * scale + mask) v`` over the paged keys of each query's row: ``[Tq, nH, D]``."""


def get_backend(name: str | AttentionBackend | None = None) -> AttentionBackend:
    """``"torch"`` (the reference, default) or a backend instance (returned as is)."""
    if isinstance(name, AttentionBackend):
        return name
    if name in (None, "torch"):
        from yoco_rs.executor.attention_torch import TorchAttentionBackend

        return TorchAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; available: 'torch'")
