"""What completions and chat share: submitting prompts to the engine, collecting final outputs, usage."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Optional

from yoco_rs._core import GrammarBusyError
from yoco_rs.errors import EngineClosedError, EngineDeadError, RequestFailedError
from yoco_rs.sampling_params import SamplingParams
from yoco_rs.serve.errors import APIError, from_value_error
from yoco_rs.serve.sse import _close
from yoco_rs.serve.validation import Prompt


#: ``Retry-After`` (seconds) of the 503 answered when too many grammars are compiling at once.
GRAMMAR_BUSY_RETRY_AFTER_S = 1


def new_id(prefix: str) -> str:
    """A unique response id (``cmpl-...``, ``chatcmpl-...``)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """Unix seconds, the ``created`` field of responses."""
    return int(time.time())


async def submit(state, prompts: list[Prompt], params: list[SamplingParams], base_id: str, *,
                 priority: int = 0, cache_salt: Optional[str] = None) -> list:
    """Queue every prompt; all or nothing (a failure aborts those already queued)."""
    streams = []
    try:
        for i, (p, sp) in enumerate(zip(prompts, params)):
            prompt = {"prompt_token_ids": p.token_ids}
            if p.text is not None:
                prompt["prompt"] = p.text
            if cache_salt is not None:
                prompt["cache_salt"] = cache_salt
            if getattr(p, "mm_items", None):
                prompt["multi_modal_items"] = p.mm_items
            rid = base_id if len(prompts) == 1 else f"{base_id}-{i}"
            streams.append(await state.engine.add_request(prompt, sp, request_id=rid, priority=priority))
    except BaseException as e:
        for s in streams:
            await _close(s)
        if isinstance(e, (ValueError, TypeError)):
            raise from_value_error(e) from None
        if isinstance(e, GrammarBusyError):  # a transient overload: the client should retry
            raise APIError(503, str(e), headers={"Retry-After": str(GRAMMAR_BUSY_RETRY_AFTER_S)}) from None
        if isinstance(e, (EngineClosedError, EngineDeadError)):
            raise state.engine_error(e) from None
        raise
    return streams


async def final_output(stream):
    """The last output of a stream (the requests use FINAL_ONLY); aborts the request if cancelled."""
    last = None
    try:
        async for out in stream:
            last = out
    finally:
        await _close(stream)
    return last


async def final_outputs(state, streams: list) -> list:
    """The last output of each stream (non-streaming responses); engine shutdown or death becomes a 503,
    a failed step a 500 naming its cause, and leaving early closes the streams, which aborts their requests."""
    tasks = [asyncio.ensure_future(final_output(s)) for s in streams]
    try:
        return await asyncio.gather(*tasks)
    except (EngineClosedError, EngineDeadError, RequestFailedError) as e:
        raise state.engine_error(e) from None
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's ``usage`` object, with the prefix-cache hit as ``prompt_tokens_details.cached_tokens``."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def stream_error_body(state, e: BaseException) -> dict:
    """The error JSON sent as a last SSE event when a stream fails after its 200 went out."""
    err = e if isinstance(e, APIError) else state.engine_error(e)
    return err.body()


__all__ = ["new_id", "now", "submit", "final_output", "final_outputs", "usage", "stream_error_body"]
