"""``AsyncEngine``: the engine for asyncio servers (what ``yoco-serve`` wraps).

The ``Engine`` lives in its own thread (the loop thread) and runs steps while there is work; the
asyncio side validates and tokenizes requests itself (so a bad request fails at once, in the caller),
then hands commands (add, abort) to the loop thread through a queue and awaits per-request output
queues that the loop thread fills with one ``call_soon_threadsafe`` per step. The asyncio loop never
waits on a forward pass. Model loading happens in that thread too: ``is_ready`` turns True when it is
done, ``wait_ready()`` raises the loading error if it failed.

Failures are contained: a step that raises (the executor, the sampler, an allocation) aborts only the
requests it ran, whose streams raise ``RequestFailedError`` naming the cause; the loop goes on. Only
``max_consecutive_step_failures`` failing steps in a row declare the engine dead (``EngineDeadError``
for every pending caller, queued ones included, so nobody waits forever). The engine holds its streams
weakly: a stream its consumer dropped without closing it is collected, and its finalizer aborts the
request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from typing import AsyncIterator, Optional, Sequence, Union

from yoco_rs.config import EngineConfig
from yoco_rs.errors import EngineClosedError, EngineDeadError, RequestFailedError
from yoco_rs.inputs import PromptType
from yoco_rs.metrics import EngineMetrics, MetricsRecorder
from yoco_rs.outputs import RequestOutput
from yoco_rs.runtime import resolve_model_dir
from yoco_rs.sampling_params import SamplingParams
from yoco_rs.tokenizer import Tokenizer

log = logging.getLogger("yoco_rs.engine")
_DONE = object()

#: Failing steps in a row after which the engine is declared dead (the server then exits, so an
#: orchestrator restarts it). One failure only aborts the failing step's requests.
DEFAULT_MAX_CONSECUTIVE_STEP_FAILURES = 3


class RequestStream:
    """One submitted request: an async iterator over its ``RequestOutput``s.

    Closing it (``aclose()``, leaving an ``async for`` early, or cancelling the consuming task) before
    the request finished aborts the request, so a disconnected client frees its blocks."""

    def __init__(self, engine: "AsyncEngine", request_id: str, prompt_token_ids: list[int]):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self._engine = engine
        self._queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self._closed = False

    def _put(self, item) -> None:  # on the asyncio loop
        self._queue.put_nowait(item)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished or self._closed:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:  # cancelled: the consumer went away
            await self.aclose()
            raise
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    async def aclose(self) -> None:
        """Abort the request unless it finished."""
        if not self.finished and not self._closed:
            self._closed = True
            self._engine._abort_nowait(self.request_id)

    def __del__(self):  # a stream dropped without being closed still frees its request
        if not self.finished and not self._closed:
            try:
                self._engine._abort_nowait(self.request_id)
            except Exception:
                pass


class AsyncEngine:
    """Asynchronous engine.

    >>> engine = AsyncEngine(max_model_len=2048)     # loads in the background
    >>> await engine.wait_ready()
    >>> async for out in engine.stream("Hello", SamplingParams(max_tokens=16)):
    ...     print(out.outputs[0].delta_text, end="")
    >>> await engine.shutdown(drain_timeout=30)
    """

    def __init__(self, model: Union[str, os.PathLike, None] = None, *, config: Optional[EngineConfig] = None,
                 progress: bool = False,
                 max_consecutive_step_failures: int = DEFAULT_MAX_CONSECUTIVE_STEP_FAILURES,
                 **settings) -> None:
        """Validates the settings now (``ValueError``/``TypeError``), loads the tokenizer, and starts
        loading the model in the loop thread. ``max_consecutive_step_failures``: failing steps in a
        row that kill the engine (each failure alone only fails that step's requests)."""
        if not isinstance(max_consecutive_step_failures, int) or max_consecutive_step_failures < 1:
            raise ValueError(f"max_consecutive_step_failures must be an integer >= 1, got "
                             f"{max_consecutive_step_failures!r}")
        self.max_consecutive_step_failures = max_consecutive_step_failures
        if config is not None and (model is not None or settings):
            raise TypeError("pass either config=EngineConfig(...) or model/settings, not both")
        cfg = config if config is not None else EngineConfig.from_kwargs(
            os.fspath(model) if model is not None else None, **settings)
        model_dir, self._model_name = resolve_model_dir(cfg.model)
        self._config_in = cfg.replace(model=model_dir) if cfg.model is None else cfg
        self._tokenizer = Tokenizer(os.path.expanduser(cfg.tokenizer) if cfg.tokenizer else model_dir)
        self._engine = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # Weak: a stream dropped by its consumer is collected and aborts its request (``__del__``).
        self._streams: "weakref.WeakValueDictionary[str, RequestStream]" = weakref.WeakValueDictionary()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ready = threading.Event()
        self._dead: Optional[BaseException] = None
        self._accepting = True
        self._stopping = False
        self._stopped = threading.Event()
        self._ids = itertools.count()
        self._metrics_idle = MetricsRecorder()
        self._thread = threading.Thread(target=self._run, args=(progress,), name="yoco-engine", daemon=True)
        self._thread.start()

    @classmethod
    async def create(cls, model=None, *, config: Optional[EngineConfig] = None, **settings) -> "AsyncEngine":
        """Construct and wait until ready (raises the loading error)."""
        engine = cls(model, config=config, **settings)
        await engine.wait_ready()
        return engine

    # ---- the loop thread ----------------------------------------------------------------------------
    def _run(self, progress: bool) -> None:
        from yoco_rs.engine import Engine

        try:
            self._engine = Engine(config=self._config_in, progress=progress)
        except BaseException as e:
            self._dead = e
            self._ready.set()
            self._stopped.set()
            return
        self._ready.set()
        eng = self._engine
        failures = 0
        try:
            while True:
                idle = not eng.has_unfinished_requests()
                if idle and self._stopping and self._commands.empty():
                    break
                self._drain_commands(block=idle)
                if eng.has_unfinished_requests():
                    try:
                        outs = eng.step()
                    except Exception as e:
                        failures += 1
                        if failures >= self.max_consecutive_step_failures:
                            raise
                        self._contain(e, failures)
                        continue
                    if eng._last_plan_rows:
                        failures = 0
                    if outs:
                        self._deliver(outs)
        except BaseException as e:  # the engine is dead: fail every request, keep the cause
            log.exception("engine loop died")
            self._dead = e
            self._fail_all(e)
        finally:
            try:
                eng.close()
            except Exception:
                pass
            self._stopped.set()
            self._fail_queued(self._dead_or_closed())  # adds that raced the end

    def _contain(self, e: Exception, failures: int) -> None:
        """One failed step: its requests were aborted by ``Engine.step``; fail their streams with the
        cause and keep serving."""
        failed = list(self._engine.last_failed_request_ids)
        log.error("engine step failed (%d in a row; %d kill the engine); aborted its requests %s: %s: %s",
                  failures, self.max_consecutive_step_failures, failed, type(e).__name__, e)
        if _is_oom(e):
            _release_cached_memory()
        err = RequestFailedError(f"the engine step running this request failed: {type(e).__name__}: {e}")
        err.__cause__ = e

        def push():
            for rid in failed:
                s = self._streams.pop(rid, None)
                if s is not None:
                    s._put(err)

        try:
            self._loop.call_soon_threadsafe(push)
        except RuntimeError:  # the event loop is closed
            pass

    def _drain_commands(self, block: bool) -> None:
        """Apply queued commands (waiting for one when ``block``, until stopping)."""
        eng = self._engine
        while True:
            try:
                cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                if block and not self._stopping:
                    continue
                return
            block = False
            kind = cmd[0]
            if kind == "add":
                _, rid, proc, params, priority, arrival, fut = cmd
                try:
                    eng._add_prepared(rid, proc, params, priority, arrival)
                    self._resolve(fut, None)
                except BaseException as e:
                    self._resolve(fut, e)
            elif kind == "abort":
                eng.abort_request(cmd[1])
            elif kind == "abort_all":
                eng.abort_request(list(eng._requests))
            elif kind == "stop":  # wakes the loop; it ends once idle
                pass

    def _resolve(self, fut: asyncio.Future, err: Optional[BaseException]) -> None:
        def done():
            if not fut.done():
                fut.set_exception(err) if err is not None else fut.set_result(None)

        self._loop.call_soon_threadsafe(done)

    def _deliver(self, outs: list[RequestOutput]) -> None:
        def push():
            for o in outs:
                s = self._streams.get(o.request_id)
                if s is not None:
                    s._put(o)
                    if o.finished:
                        del self._streams[o.request_id]

        self._loop.call_soon_threadsafe(push)

    def _fail_all(self, e: BaseException) -> None:
        """The engine died: every stream and every queued ``add_request`` gets ``EngineDeadError``."""
        err = EngineDeadError(f"the engine loop died: {type(e).__name__}: {e}")
        err.__cause__ = e
        self._fail_queued(err)

        def push():
            for s in list(self._streams.values()):
                s._put(err)
            self._streams.clear()

        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(push)
            except RuntimeError:  # the event loop is closed
                pass

    def _fail_queued(self, err: BaseException) -> None:
        """Resolve the futures of commands the loop will never read (it died or stopped)."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                try:
                    self._resolve(cmd[-1], err)
                except RuntimeError:  # the event loop is closed
                    pass

    # ---- lifecycle ----------------------------------------------------------------------------------
    @property
    def is_ready(self) -> bool:
        """True once the model is loaded and the loop runs (and it has not died or shut down)."""
        return self._ready.is_set() and self._dead is None and not self._stopped.is_set()

    @property
    def is_dead(self) -> bool:
        """True after the loop failed (loading or a step); ``dead_error`` says why."""
        return self._dead is not None

    @property
    def dead_error(self) -> Optional[BaseException]:
        """The exception that killed the loop (loading or a step), None while alive."""
        return self._dead

    @property
    def is_accepting(self) -> bool:
        """False once ``shutdown`` started."""
        return self._accepting and not self.is_dead

    async def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Wait for the model to load; raises ``EngineDeadError`` (from the cause) if it failed."""
        ok = await asyncio.to_thread(self._ready.wait, timeout)
        if not ok:
            raise TimeoutError(f"the engine was not ready within {timeout} s")
        self._check_alive()

    def _dead_or_closed(self) -> BaseException:
        if self._dead is not None:
            err = EngineDeadError(f"the engine is dead: {type(self._dead).__name__}: {self._dead}")
            err.__cause__ = self._dead
            return err
        return EngineClosedError("the engine is shutting down and accepts no new requests")

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine is dead: {type(self._dead).__name__}: {self._dead}") from self._dead

    async def check_health(self) -> None:
        """Raise ``EngineDeadError`` when the engine is dead (a server's /health returns 503)."""
        self._check_alive()
        if self._stopped.is_set():
            raise EngineDeadError("the engine was shut down")

    async def shutdown(self, drain_timeout: Optional[float] = None) -> None:
        """Stop accepting requests (``EngineClosedError``), let in-flight requests finish for up to
        ``drain_timeout`` seconds (None: wait for all; 0: abort at once), abort the rest, stop the loop
        thread and free the executor. Idempotent."""
        self._accepting = False
        if self._stopped.is_set():
            return
        self._bind_loop()
        deadline = None if drain_timeout is None else time.monotonic() + drain_timeout
        while self._streams and self._dead is None and (deadline is None or time.monotonic() < deadline):
            await asyncio.sleep(0.01)
        if self._streams:
            self._commands.put(("abort_all",))
        self._stopping = True
        self._commands.put(("stop",))
        await asyncio.to_thread(self._stopped.wait)
        await asyncio.sleep(0)  # let the final outputs reach their streams

    async def __aenter__(self) -> "AsyncEngine":
        await self.wait_ready()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown(drain_timeout=0)

    # ---- requests -----------------------------------------------------------------------------------
    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("an AsyncEngine is bound to the event loop it was first used from")

    async def add_request(self, prompt: PromptType, params: Optional[SamplingParams] = None,
                          request_id: Optional[str] = None, priority: int = 0) -> RequestStream:
        """Validate and tokenize now (``ValueError`` for bad input, ``EngineClosedError`` while
        shutting down, ``EngineDeadError`` when dead), queue the request, return its stream."""
        self._bind_loop()
        self._check_alive()
        if not self._accepting:
            raise EngineClosedError("the engine is shutting down and accepts no new requests")
        if not self._ready.is_set():
            await self.wait_ready()
        eng = self._engine
        arrival = time.monotonic()
        params = params or eng.get_default_sampling_params()
        mm = isinstance(prompt, dict) and (prompt.get("multi_modal_data") is not None
                                           or bool(prompt.get("multi_modal_items")))
        if params.structured_outputs is not None or mm:
            # Grammar compilation (GIL released, under its time budget) and image / audio decoding and
            # encoding must not block the event loop (nor the step loop: other streams keep decoding).
            proc, params = await asyncio.to_thread(eng._prepare, prompt, params)
        else:
            proc, params = eng._prepare(prompt, params)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request_id {rid!r} is already in use by an unfinished request")
        stream = RequestStream(self, rid, proc.token_ids)
        self._streams[rid] = stream
        fut = self._loop.create_future()
        self._commands.put(("add", rid, proc, params, priority, arrival, fut))
        if self._stopped.is_set():  # the loop ended meanwhile: it will not read the command
            self._fail_queued(self._dead_or_closed())
        try:
            await fut
        except BaseException:
            self._streams.pop(rid, None)
            stream.finished = True
            # Cancelled while queued (a client gone during a slow step): the loop thread adds the
            # request anyway, so queue its abort behind the add, or it would run with no stream and
            # hold its blocks. A failed add (fut holds its error) left nothing behind.
            if not fut.done() or fut.cancelled() or fut.exception() is None:
                self._abort_nowait(rid)
            raise
        if self._dead is not None:  # died while adding: the stream would never end
            self._streams.pop(rid, None)
            stream.finished = True
            self._check_alive()
        return stream

    async def stream(self, prompt: PromptType, params: Optional[SamplingParams] = None,
                     request_id: Optional[str] = None, priority: int = 0) -> AsyncIterator[RequestOutput]:
        """``async for out in engine.stream(...)``: outputs as the request progresses (what each holds
        follows ``params.output_kind``; the last has ``finished=True``). Errors as ``add_request``;
        leaving the loop early aborts the request."""
        s = await self.add_request(prompt, params, request_id=request_id, priority=priority)
        try:
            async for out in s:
                yield out
        finally:
            await s.aclose()

    async def generate(self, prompt: PromptType, params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None, priority: int = 0) -> RequestOutput:
        """The final output of one request."""
        last = None
        async for out in self.stream(prompt, params, request_id=request_id, priority=priority):
            last = out
        return last

    async def abort(self, request_id: str) -> bool:
        """Abort a request in any state (its blocks are freed within one step); False if unknown."""
        self._bind_loop()
        if request_id not in self._streams:
            return False
        self._abort_nowait(request_id)
        return True

    def _abort_nowait(self, request_id: str) -> None:
        if not self._stopped.is_set():
            self._commands.put(("abort", request_id))

    # ---- model facts and tokenizer --------------------------------------------------------------------
    def _loaded(self):
        if self._engine is None:
            self._check_alive()
            raise RuntimeError("the engine is not ready yet (await wait_ready())")
        return self._engine

    @property
    def config(self) -> EngineConfig:
        """The resolved config (available once ready)."""
        return self._loaded().config

    @property
    def mm_processor(self):
        """Image / audio preprocessing of a multimodal checkpoint, None for a text-only one (once ready)."""
        return getattr(self._loaded(), "mm_processor", None)

    @property
    def model_name(self) -> str:
        """The name responses report: the checkpoint directory's name, or ``yoco-tiny`` for the bundled model."""
        return self._model_name

    @property
    def max_model_len(self) -> int:
        """Longest sequence (prompt + output) a request may reach (available once ready)."""
        return self._loaded().max_model_len

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV pool holds in all (available once ready): the server's startup line reports it."""
        return self._loaded().kv_capacity_tokens

    @property
    def memory_split(self) -> str:
        """How device memory was split (weights / step / KV) (available once ready)."""
        return getattr(self._loaded(), "memory_split", "")

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary: token ids in ``[0, vocab_size)`` are valid prompt tokens."""
        return self._loaded().vocab_size

    @property
    def tokenizer(self) -> Tokenizer:
        """Loaded synchronously by the constructor (usable before the model is ready)."""
        return self._tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Prompt token ids of ``text``, usable before the model is loaded."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids, usable before the model is loaded."""
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, **kwargs) -> Union[str, list[int]]:
        """Render a conversation with the chat template, usable before the model is loaded."""
        return self._tokenizer.apply_chat_template(messages, **kwargs)

    # ---- observability --------------------------------------------------------------------------------
    def get_metrics(self) -> EngineMetrics:
        """A snapshot (counters, gauges, histograms); cheap, safe from the asyncio thread."""
        if self._engine is None:
            return self._metrics_idle.snapshot()
        return self._engine.get_metrics()

    @property
    def num_unfinished_requests(self) -> int:
        """Streams not yet finished (what a draining shutdown waits for)."""
        return len(self._streams)


def _is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)) or "out of memory" in str(e).lower()


def _release_cached_memory() -> None:
    """After an allocation failure: give the allocator's cached blocks back so the next step can fit."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


__all__ = ["AsyncEngine", "RequestStream", "DEFAULT_MAX_CONSECUTIVE_STEP_FAILURES"]
