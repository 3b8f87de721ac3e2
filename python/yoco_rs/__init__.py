"""yoco-rs: serve Gemma 3n fast. A Rust core (``yoco_rs._core``) schedules; a PyTorch executor runs.

Public API (vLLM-shaped)::

    from yoco_rs import Engine, SamplingParams
    outs = Engine().generate(["Hello"], SamplingParams(max_tokens=16))
"""

from yoco_rs import _core
from yoco_rs.async_engine import AsyncEngine, RequestStream
from yoco_rs.config import EngineConfig
from yoco_rs.engine import Engine
from yoco_rs.errors import EngineClosedError, EngineDeadError
from yoco_rs.inputs import PromptType, TextPrompt, TokensPrompt
from yoco_rs.metrics import EngineMetrics, HistogramSnapshot
from yoco_rs.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from yoco_rs.sampling_params import RequestOutputKind, SamplingParams
from yoco_rs.tokenizer import Tokenizer

__version__ = _core.__version__

__all__ = [
    "__version__",
    "Engine",
    "AsyncEngine",
    "RequestStream",
    "EngineConfig",
    "SamplingParams",
    "RequestOutputKind",
    "RequestOutput",
    "CompletionOutput",
    "RequestMetrics",
    "Logprob",
    "EngineMetrics",
    "HistogramSnapshot",
    "Tokenizer",
    "PromptType",
    "TextPrompt",
    "TokensPrompt",
    "EngineDeadError",
    "EngineClosedError",
]
