"""Small helpers shared by the Triton kernels: launch-time checks and block-size choices.

Everything here runs on the host at launch time and reads only tensor *shapes*, strides and dtypes,
never tensor values, so a launch never synchronizes with the device and can be captured in a CUDA
graph.
"""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True under Triton's CPU interpreter (``TRITON_INTERPRET=1``), used by the CPU tests."""
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (Triton block sizes must be powers of two)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def f32_dots(dtype: torch.dtype) -> bool:
    """Whether kernels upcast dot operands to fp32 and use exact IEEE dots (no TF32). Always for fp32
    inputs (the paths tests compare tightly); also under the interpreter, whose ``tl.dot`` mishandles
    bf16 operands. On a GPU, bf16/fp16 operands go to the tensor cores with fp32 accumulation."""
    return dtype == torch.float32 or interpreting()


def check_kv_layer(kv_layer: torch.Tensor, what: str = "kv_layer") -> tuple[int, int, int, int]:
    """A layer's KV slice is ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` with the head dim
    contiguous; returns ``(num_blocks, block_size, num_kv_heads, head_dim)``."""
    if kv_layer.dim() != 5 or kv_layer.shape[0] != 2:
        raise ValueError(
            f"{what} must be [2, num_blocks, block_size, num_kv_heads, head_dim], got {tuple(kv_layer.shape)}"
        )
    if kv_layer.stride(-1) != 1:
        raise ValueError(f"{what} must have a contiguous head_dim (stride 1), got strides {kv_layer.stride()}")
    _, nb, bs, hkv, d = kv_layer.shape
    return nb, bs, hkv, d


def check_same_device(*tensors: torch.Tensor) -> None:
    """A clear error before launch when kernel inputs sit on different devices."""
    dev = tensors[0].device
    for t in tensors[1:]:
        if t.device != dev:
            raise ValueError(f"all kernel inputs must be on one device: found {dev} and {t.device}")
