"""Server-sent events and client-disconnect handling.

``EventStream`` is a plain ASGI response that sends the chunks of an async generator and, at the same
time, listens for ``http.disconnect``: when the client goes away the generator is cancelled at once,
even while it waits for a request that is still queued, and its ``finally`` closes the engine
streams, which aborts the requests and frees their blocks. (Starlette's ``StreamingResponse`` only
notices on the next send under ASGI 2.4.) ``cancel_on_disconnect`` does the same for non-streaming
handlers.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator, Awaitable, Optional, TypeVar

from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")

DONE = "data: [DONE]\n\n"


def sse(obj) -> str:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ClientDisconnected(Exception):
    """The client went away before the response was ready; the app answers 499 (nobody reads it)."""


async def _wait_disconnect(receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


class EventStream(Response):
    """``text/event-stream`` response over an async generator of already-formatted SSE strings."""

    media_type = "text/event-stream"

    def __init__(self, gen: AsyncIterator[str], headers: Optional[dict] = None):
        self.gen = gen
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})})

    async def __call__(self, scope, receive, send) -> None:
        raw = self.raw_headers

        async def pump():
            await send({"type": "http.response.start", "status": 200, "headers": raw})
            async for chunk in self.gen:
                await send({"type": "http.response.body", "body": chunk.encode("utf-8"), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        task = asyncio.ensure_future(pump())
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, watcher):
                if not t.done():
                    t.cancel()
            await asyncio.gather(task, watcher, return_exceptions=True)
            await self.gen.aclose()
        if task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None and not isinstance(exc, OSError):
                raise exc


async def cancel_on_disconnect(request: Request, aw: Awaitable[T]) -> T:
    """Await ``aw``; if the client disconnects first, cancel it (its ``finally`` aborts the engine work)
    and raise ``ClientDisconnected``."""
    task = asyncio.ensure_future(aw)
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not watcher.done():
            watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientDisconnected()


async def merge(streams: list) -> AsyncIterator[tuple[int, object]]:
    """Interleave several engine streams as ``(stream index, output)`` in arrival order. Closing the
    merged generator closes every stream (aborting what is unfinished)."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            await _close(streams[0])
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def feed(i, s):
        try:
            async for out in s:
                queue.put_nowait((i, out))
            queue.put_nowait((i, end))
        except BaseException as e:  # forwarded to the consumer
            queue.put_nowait((i, e))
            if isinstance(e, asyncio.CancelledError):
                raise

    tasks = [asyncio.ensure_future(feed(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(streams)
        while live:
            i, item = await queue.get()
            if item is end:
                live -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            await _close(s)


async def _close(stream) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            pass


__all__ = ["EventStream", "sse", "DONE", "cancel_on_disconnect", "ClientDisconnected", "merge"]
