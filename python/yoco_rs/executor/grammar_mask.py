"""Structured outputs in the sampler: the grammar's token bitmask applied to the logits before sampling.

The Rust core (``yoco-grammar``) computes one packed ``int32`` bitmask row per constrained sampling
row (bit ``t % 32`` of word ``t // 32`` allows token ``t``); this module sets every disallowed logit to
``-inf`` in place, before the sampler sees the logits. As in vLLM (which applies the grammar bitmask to
the logits before its sampler), everything downstream (temperature, top-k/p, the sampled token and the
reported ``logprobs``) therefore sees the *masked* distribution: a constrained row's logprobs are those
of the tokens the grammar allowed, renormalized over them.

On CUDA a Triton kernel does it (one launch for all rows). On the CPU, float32 contiguous logits are
masked in place by the Rust core (``_core.mask_logits``: one pass over the packed words, no
temporaries, GIL released); other dtypes or layouts take the torch op (unpack the bits,
``masked_fill_``), which is also the reference. Kept apart from ``sampler.py`` so the sampler's own
order can change independently.
"""

from __future__ import annotations

import numpy as np
import torch

from yoco_rs import _core

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[C, W]`` int32 -> ``[C, vocab]`` bool (True: allowed); tokens past ``W * 32`` are disallowed."""
    dev = bitmask.device
    sh = _SHIFTS.get(dev)
    if sh is None:
        sh = _SHIFTS[dev] = torch.arange(32, dtype=torch.int32, device=dev)
    bits = ((bitmask.unsqueeze(-1) >> sh) & 1).to(torch.bool).reshape(bitmask.shape[0], -1)
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    return torch.nn.functional.pad(bits, (0, vocab - bits.shape[1]), value=False)


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """The reference (and CPU) form: ``logits[rows[i], t] = -inf`` where row ``i`` disallows ``t``."""
    if bitmask.shape[0] == 0:
        return
    allowed = unpack_bitmask(bitmask, logits.shape[1])
    sub = logits.index_select(0, rows)
    sub.masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, rows, sub)


@torch.inference_mode()
def apply_token_bitmask_(logits: torch.Tensor, bitmask: np.ndarray | torch.Tensor,
                         rows: np.ndarray | torch.Tensor) -> None:
    """Mask ``logits`` (``[X, V]``, in place) rows ``rows`` (``[C]``) with ``bitmask`` (``[C, W]``
    int32, host numpy as the core hands it, or a tensor). Triton on CUDA, torch elsewhere."""
    if len(rows) == 0:
        return
    dev = logits.device
    if (dev.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2 and logits.is_contiguous()
            and isinstance(bitmask, np.ndarray)):
        _core.mask_logits(logits.numpy(), np.ascontiguousarray(rows, dtype=np.int64),
                          np.ascontiguousarray(bitmask, dtype=np.int32))
        return
    bm = torch.as_tensor(bitmask)
    rw = torch.as_tensor(np.asarray(rows, dtype=np.int64) if isinstance(rows, np.ndarray) else rows)
    if bm.device != dev:
        bm = bm.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else bm.to(dev)
    rw = rw.to(dev, non_blocking=True)
    if dev.type == "cuda" and logits.stride(1) == 1:
        from yoco_rs.kernels.token_bitmask import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bm, rw)
    else:
        apply_token_bitmask_torch(logits, bm, rw)


__all__ = ["apply_token_bitmask_", "apply_token_bitmask_torch", "unpack_bitmask"]
