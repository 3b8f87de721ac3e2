"""``AsyncEngine``: the engine for asyncio servers (what ``yoco-serve`` wraps).

The ``Engine`` lives in its own thread (the loop thread) and runs steps while there is work; the
asyncio side only enqueues commands (add, abort) and awaits per-request output queues that the loop
thread fills through ``loop.call_soon_threadsafe``. The asyncio loop never waits on a forward pass.
Model loading happens in that thread too: ``is_ready`` turns True when it is done, ``wait_ready()``
raises the loading error if it failed.
"""

from __future__ import annotations

import os
from typing import AsyncIterator, Optional, Sequence, Union

from yoco_rs.config import EngineConfig
from yoco_rs.inputs import PromptType
from yoco_rs.metrics import EngineMetrics
from yoco_rs.outputs import RequestOutput
from yoco_rs.sampling_params import SamplingParams
from yoco_rs.tokenizer import Tokenizer


class RequestStream:
    """One submitted request: an async iterator over its ``RequestOutput``s.

    Closing it (``aclose()``, leaving an ``async for`` early, or cancelling the consuming task) before
    the request finished aborts the request, so a disconnected client frees its blocks."""

    request_id: str
    prompt_token_ids: list[int]

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError


class AsyncEngine:
    """Asynchronous engine.

    >>> engine = AsyncEngine(max_model_len=2048)     # loads in the background
    >>> await engine.wait_ready()
    >>> async for out in engine.stream("Hello", SamplingParams(max_tokens=16)):
    ...     print(out.outputs[0].delta_text, end="")
    >>> await engine.shutdown(drain_timeout=30)
    """

    def __init__(self, model: Union[str, os.PathLike, None] = None, *, config: Optional[EngineConfig] = None,
                 **settings) -> None:
        """Validates the settings now (``ValueError``/``TypeError``) and starts loading in the loop thread."""
        raise NotImplementedError

    @classmethod
    async def create(cls, model=None, *, config: Optional[EngineConfig] = None, **settings) -> "AsyncEngine":
        """Construct and wait until ready (raises the loading error)."""
        engine = cls(model, config=config, **settings)
        await engine.wait_ready()
        return engine

    # ---- lifecycle ------------------------------------------------------------------------------
    @property
    def is_ready(self) -> bool:
        """True once the model is loaded and the loop runs (and it has not died or shut down)."""
        raise NotImplementedError

    @property
    def is_dead(self) -> bool:
        """True after the loop failed (loading or a step); ``dead_error`` says why."""
        raise NotImplementedError

    @property
    def dead_error(self) -> Optional[BaseException]:
        raise NotImplementedError

    async def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Wait for the model to load; raises ``EngineDeadError`` (from the cause) if it failed."""
        raise NotImplementedError

    async def check_health(self) -> None:
        """Raise ``EngineDeadError`` when the engine is dead (a server's /health returns 503)."""
        raise NotImplementedError

    async def shutdown(self, drain_timeout: Optional[float] = None) -> None:
        """Stop accepting requests (``EngineClosedError``), let in-flight requests finish for up to
        ``drain_timeout`` seconds (None: wait for all; 0: abort at once), abort the rest, stop the loop
        thread and free the executor. Idempotent."""
        raise NotImplementedError

    async def __aenter__(self) -> "AsyncEngine":
        await self.wait_ready()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown(drain_timeout=0)

    # ---- requests -------------------------------------------------------------------------------
    async def add_request(self, prompt: PromptType, params: Optional[SamplingParams] = None, *,
                          request_id: Optional[str] = None, priority: int = 0) -> RequestStream:
        """Validate and tokenize now (``ValueError`` for bad input, ``EngineClosedError`` while
        shutting down, ``EngineDeadError`` when dead), queue the request, return its stream."""
        raise NotImplementedError

    async def stream(self, prompt: PromptType, params: Optional[SamplingParams] = None, *,
                     request_id: Optional[str] = None, priority: int = 0) -> AsyncIterator[RequestOutput]:
        """``async for out in engine.stream(...)``: outputs as the request progresses (what each holds
        follows ``params.output_kind``; the last has ``finished=True``). Errors as ``add_request``;
        leaving the loop early aborts the request."""
        raise NotImplementedError
        yield  # pragma: no cover

    async def generate(self, prompt: PromptType, params: Optional[SamplingParams] = None, *,
                       request_id: Optional[str] = None, priority: int = 0) -> RequestOutput:
        """The final output of one request."""
        raise NotImplementedError

    async def abort(self, request_id: str) -> bool:
        """Abort a request in any state (its blocks are freed within one step); False if unknown."""
        raise NotImplementedError

    # ---- model facts and tokenizer --------------------------------------------------------------
    @property
    def config(self) -> EngineConfig:
        """The resolved config (available once ready)."""
        raise NotImplementedError

    @property
    def model_name(self) -> str:
        raise NotImplementedError

    @property
    def max_model_len(self) -> int:
        raise NotImplementedError

    @property
    def tokenizer(self) -> Tokenizer:
        """Loaded synchronously by the constructor (usable before the model is ready)."""
        raise NotImplementedError

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, **kwargs) -> Union[str, list[int]]:
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    # ---- observability ----------------------------------------------------------------------------
    def get_metrics(self) -> EngineMetrics:
        """A snapshot (counters, gauges, histograms); cheap, safe from the asyncio thread."""
        raise NotImplementedError


__all__ = ["AsyncEngine", "RequestStream"]
