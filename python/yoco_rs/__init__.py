"""yoco-rs: serve Gemma 3n fast. A Rust core (``yoco_rs._core``) schedules; a PyTorch executor runs.

Public API (vLLM-shaped)::

    from yoco_rs import Engine, SamplingParams
    outs = Engine().generate(["Hello"], SamplingParams(max_tokens=16))

Names are imported on first use, so the executor, kernels and graph runner also import from a plain
checkout where the compiled core is not built (``PYTHONPATH=python``, e.g. ``benches/gpu_check.sh``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Engine": "yoco_rs.engine",
    "AsyncEngine": "yoco_rs.async_engine",
    "RequestStream": "yoco_rs.async_engine",
    "EngineConfig": "yoco_rs.config",
    "SamplingParams": "yoco_rs.sampling_params",
    "RequestOutputKind": "yoco_rs.sampling_params",
    "StructuredOutputsParams": "yoco_rs.structured_outputs",
    "RequestOutput": "yoco_rs.outputs",
    "CompletionOutput": "yoco_rs.outputs",
    "RequestMetrics": "yoco_rs.outputs",
    "Logprob": "yoco_rs.outputs",
    "EngineMetrics": "yoco_rs.metrics",
    "HistogramSnapshot": "yoco_rs.metrics",
    "Tokenizer": "yoco_rs.tokenizer",
    "PromptType": "yoco_rs.inputs",
    "TextPrompt": "yoco_rs.inputs",
    "TokensPrompt": "yoco_rs.inputs",
    "EngineDeadError": "yoco_rs.errors",
    "EngineClosedError": "yoco_rs.errors",
    "RequestFailedError": "yoco_rs.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # static tools see the real names
    from yoco_rs.async_engine import AsyncEngine, RequestStream
    from yoco_rs.config import EngineConfig
    from yoco_rs.engine import Engine
    from yoco_rs.errors import EngineClosedError, EngineDeadError, RequestFailedError
    from yoco_rs.inputs import PromptType, TextPrompt, TokensPrompt
    from yoco_rs.metrics import EngineMetrics, HistogramSnapshot
    from yoco_rs.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
    from yoco_rs.sampling_params import RequestOutputKind, SamplingParams
    from yoco_rs.structured_outputs import StructuredOutputsParams
    from yoco_rs.tokenizer import Tokenizer


def __getattr__(name: str) -> Any:
    if name in ("__version__", "_core"):
        # import_module, not `from yoco_rs import _core`: that form looks the name up on this
        # module first and would re-enter this function.
        core = importlib.import_module("yoco_rs._core")
        return core if name == "_core" else core.__version__
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'yoco_rs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
