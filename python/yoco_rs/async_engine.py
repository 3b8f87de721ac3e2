"""``AsyncEngine``: the engine for asyncio programs, on the Rust step loop that ``yoco-serve`` runs.

The model loads in a background thread (``is_ready`` turns True when it is done; ``wait_ready()``
raises the loading error if it failed); then a ``_core.EngineLoop`` runs the steps in Rust on its own
thread (scheduling, detokenization, stop strings, grammar masks), calling the PyTorch executor once per
step with the GIL held only for that call. The asyncio side validates and tokenizes a request itself (so
a bad request fails at once, in the caller), submits it to the loop, and awaits the request's output
queue. One reader thread waits on the loop's events with the GIL released and hands each batch to the
event loop with one ``call_soon_threadsafe``. The asyncio loop never waits on a forward pass.

Failures are contained: a step that raises (the executor, the sampler, an allocation) aborts only the
requests it ran, whose streams raise ``RequestFailedError`` naming the cause; the loop goes on. Only
``max_consecutive_step_failures`` failing steps in a row declare the engine dead (``EngineDeadError``
for every pending caller, so nobody waits forever). The engine holds its streams weakly: a stream its
consumer dropped without closing it is collected, and its finalizer aborts the request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import weakref
from typing import AsyncIterator, Optional, Sequence, Union

from yoco_rs import _core
from yoco_rs.config import EngineConfig
from yoco_rs.errors import EngineClosedError, EngineDeadError, RequestFailedError
from yoco_rs.executor.sampler import derive_seed
from yoco_rs.inputs import PromptType
from yoco_rs.loop_outputs import LoopRequest
from yoco_rs.loop_requests import LoopRequests
from yoco_rs.metrics import EngineMetrics, MetricsRecorder, loop_metrics
from yoco_rs.outputs import RequestOutput
from yoco_rs.runtime import resolve_model_dir
from yoco_rs.sampling_params import SamplingParams
from yoco_rs.tokenizer import Tokenizer

log = logging.getLogger("yoco_rs.engine")

#: Failing steps in a row after which the engine is declared dead (the server then exits, so an
#: orchestrator restarts it). One failure only aborts the failing step's requests.
DEFAULT_MAX_CONSECUTIVE_STEP_FAILURES = 3
#: How long the reader waits for the loop's events per call (it rechecks for shutdown in between).
_POLL_S = 0.05


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
                 async_scheduling: Optional[bool] = None, **settings) -> None:
        """Validates the settings now (``ValueError``/``TypeError``), loads the tokenizer, and starts
        loading the model in a background thread. ``max_consecutive_step_failures``: failing steps in a
        row that kill the engine (each failure alone only fails that step's requests).
        ``async_scheduling``: plan step N+1 while step N runs (None: on where the forward runs
        asynchronously to the host, i.e. CUDA; ``yoco-serve --async-scheduling``'s rule)."""
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
        self._async_scheduling = async_scheduling
        self._rt = None
        self._executor = None  # the StepExecutor the loop drives (tests inject faults through it)
        self._core: Optional[_core.EngineLoop] = None
        self._preparer = None
        # Weak: a stream dropped by its consumer is collected and aborts its request (``__del__``).
        self._streams: "weakref.WeakValueDictionary[str, RequestStream]" = weakref.WeakValueDictionary()
        self._table = LoopRequests()  # unfinished requests and their loop ids
        self._lock = threading.Lock()  # submit + register vs the reader's dispatch
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ready = threading.Event()
        self._dead: Optional[BaseException] = None
        self._accepting = True
        self._stopping = False
        self._stopped = threading.Event()
        self._ids = itertools.count()
        self._seeds = itertools.count(1)
        self._metrics_idle = MetricsRecorder()
        self._thread = threading.Thread(target=self._run, args=(progress,), name="yoco-engine", daemon=True)
        self._thread.start()

    @classmethod
    async def create(cls, model=None, *, config: Optional[EngineConfig] = None, **settings) -> "AsyncEngine":
        """Construct and wait until ready (raises the loading error)."""
        engine = cls(model, config=config, **settings)
        await engine.wait_ready()
        return engine

    # ---- the reader thread ---------------------------------------------------------------------------
    def _run(self, progress: bool) -> None:
        from yoco_rs.executor.step_executor import StepExecutor, async_scheduling_on
        from yoco_rs.grammars import Grammars
        from yoco_rs.request_prep import RequestPreparer
        from yoco_rs.runtime import build_runtime

        try:
            rt = build_runtime(self._config_in, progress=progress)
            self._executor = StepExecutor(rt)
            tok = rt.tokenizer
            grammars = Grammars(tok.tokenizer_file, rt.vocab_size, list(tok.eos_token_ids),
                                    limits=rt.config.structured_outputs_config)
            self._preparer = RequestPreparer(rt, grammars)
            self._core = _core.EngineLoop(
                rt.scheduler, self._executor, tokenizer_file=tok.tokenizer_file,
                eos_token_ids=list(tok.eos_token_ids), vocab_size=int(rt.vocab_size),
                max_consecutive_failures=self.max_consecutive_step_failures,
                async_scheduling=async_scheduling_on(self._async_scheduling, rt.executor.device))
            self._rt = rt
        except BaseException as e:
            self._dead = e
            self._ready.set()
            self._stopped.set()
            return
        self._ready.set()
        core = self._core
        try:
            while True:
                events = core.poll(_POLL_S)
                if events:
                    self._dispatch(events)
                if core.dead_error() is not None and self._dead is None and not self._table.requests:
                    self._dead = EngineDeadError(self._death_message(core.dead_error()))
                    self._dead.__cause__ = self._executor.last_error
                    break
                if self._stopping and not self._table.requests:
                    break
        except BaseException as e:  # a bug in the dispatch: the engine is dead, fail every request
            log.exception("engine reader died")
            self._dead = e
            core.shutdown()
        finally:
            self._fail_all(self._dead_or_closed())
            self._stopped.set()

    def _dispatch(self, events: list) -> None:
        """Turn a batch of loop events into outputs (a failed request's into its error) and hand them
        to the event loop in one call."""
        with self._lock:
            pairs = self._table.dispatch(events, time.monotonic(), self._core.abort)
        outs = [(req.request_id, out if req.error is None else self._request_error(*req.error)) for req, out in pairs]
        if outs:
            self._push(outs)

    def _request_error(self, message: str, engine_dead: bool) -> BaseException:
        cause = self._executor.last_error if self._executor is not None else None
        if engine_dead:
            err = EngineDeadError(self._death_message(message))
        else:
            why = f"{type(cause).__name__}: {cause}" if cause is not None else message
            err = RequestFailedError(f"the engine step running this request failed: {why}")
            log.error("engine step failed; aborted its requests: %s", why)
        err.__cause__ = cause
        return err

    def _death_message(self, message: str) -> str:
        cause = self._executor.last_error if self._executor is not None else None
        why = f"{type(cause).__name__}: {cause}" if cause is not None else message
        return f"the engine loop died after {self.max_consecutive_step_failures} failed steps in a row: {why}"

    def _push(self, outs: list) -> None:
        def push():
            for rid, item in outs:
                s = self._streams.get(rid)
                if s is not None:
                    s._put(item)
                    if isinstance(item, BaseException) or item.finished:
                        del self._streams[rid]

        try:
            self._loop.call_soon_threadsafe(push)
        except (RuntimeError, AttributeError):  # the event loop is closed (or was never bound)
            pass

    def _fail_all(self, err: BaseException) -> None:
        """The loop is gone: every stream still open gets ``err`` (nobody waits forever)."""
        with self._lock:
            rids = list(self._table.requests)
            self._table = LoopRequests()
        if rids:
            self._push([(rid, err) for rid in rids])

    # ---- lifecycle ----------------------------------------------------------------------------------
    @property
    def is_ready(self) -> bool:
        """True once the model is loaded and the loop runs (and it has not died or shut down)."""
        return self._ready.is_set() and not self.is_dead and not self._stopped.is_set()

    @property
    def is_dead(self) -> bool:
        """True after the engine failed (loading, or too many failed steps); ``dead_error`` says why."""
        return self._dead is not None or (self._core is not None and self._core.dead_error() is not None)

    @property
    def dead_error(self) -> Optional[BaseException]:
        """The exception that killed the engine (loading or a step), None while alive."""
        if self._dead is None and self._core is not None and self._core.dead_error() is not None:
            err = EngineDeadError(self._death_message(self._core.dead_error()))
            err.__cause__ = self._executor.last_error
            return err
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
        dead = self.dead_error
        if dead is not None:
            if isinstance(dead, EngineDeadError):
                return dead
            err = EngineDeadError(f"the engine is dead: {type(dead).__name__}: {dead}")
            err.__cause__ = dead
            return err
        return EngineClosedError("the engine is shutting down and accepts no new requests")

    def _check_alive(self) -> None:
        dead = self.dead_error
        if dead is not None:
            if isinstance(dead, EngineDeadError):
                raise dead
            raise EngineDeadError(f"the engine is dead: {type(dead).__name__}: {dead}") from dead

    async def check_health(self) -> None:
        """Raise ``EngineDeadError`` when the engine is dead (a server's /health returns 503)."""
        self._check_alive()
        if self._stopped.is_set():
            raise EngineDeadError("the engine was shut down")

    async def shutdown(self, drain_timeout: Optional[float] = None) -> None:
        """Stop accepting requests (``EngineClosedError``), let in-flight requests finish for up to
        ``drain_timeout`` seconds (None: wait for all; 0: abort at once), abort the rest (they finish
        with ``finish_reason="abort"``), stop the loop and free the executor. Idempotent."""
        self._accepting = False
        if self._stopped.is_set() and self._core is None:
            return
        self._bind_loop()
        await asyncio.to_thread(self._ready.wait)
        deadline = None if drain_timeout is None else time.monotonic() + drain_timeout
        while self._table.requests and not self.is_dead and (deadline is None or time.monotonic() < deadline):
            await asyncio.sleep(0.01)
        core = self._core
        if core is not None:
            await asyncio.to_thread(core.shutdown)  # aborts what is left; their final outputs follow
        self._stopping = True
        await asyncio.to_thread(self._stopped.wait)
        await asyncio.sleep(0)  # let the final outputs reach their streams
        self._release()

    def _release(self) -> None:
        """Free the executor's memory (captured graphs hold the KV tensors)."""
        rt, self._rt = self._rt, None
        if rt is not None:
            rt.scheduler.stop_kv_events()
            rt.executor.kv_caches = []
        self._core = None

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
        shutting down, ``EngineDeadError`` when dead), submit the request, return its stream."""
        self._bind_loop()
        self._check_alive()
        if not self._accepting:
            raise EngineClosedError("the engine is shutting down and accepts no new requests")
        if not self._ready.is_set():
            await self.wait_ready()
        arrival = time.monotonic()
        params = params or self.get_default_sampling_params()
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        mm = isinstance(prompt, dict) and (prompt.get("multi_modal_data") is not None
                                           or bool(prompt.get("multi_modal_items")))
        if (isinstance(params, SamplingParams) and params.structured_outputs is not None) or mm:
            # Grammar compilation (GIL released, under its time budget) and image / audio decoding and
            # encoding must not block the event loop (nor the step loop: other streams keep decoding).
            proc, params = await asyncio.to_thread(self._preparer.prepare, prompt, params)
        else:
            proc, params = self._preparer.prepare(prompt, params)
        self._check_alive()
        if not self._accepting:
            raise EngineClosedError("the engine is shutting down and accepts no new requests")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        req = LoopRequest(rid, proc.prompt, list(proc.token_ids), params, arrival, self._rt.text.decode_each)
        base_seed = params.seed if params.seed is not None else derive_seed(self._rt.config.seed, next(self._seeds))
        with self._lock:
            try:
                self._table.submit(self._core, req, proc, params, priority, base_seed, self._rt.config.max_model_len)
            except _core.EngineDied as e:
                raise EngineDeadError(str(e)) from self._executor.last_error
            # Made only now: a stream that is collected unfinished aborts its request id.
            stream = RequestStream(self, rid, req.prompt_ids)
            self._streams[rid] = stream
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
        if request_id not in self._table.requests:
            return False
        self._abort_nowait(request_id)
        return True

    def _abort_nowait(self, request_id: str) -> None:
        req = self._table.requests.get(request_id)
        core = self._core
        if req is not None and core is not None:
            for lid in list(req.loop_ids):
                core.abort(lid)

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams()`` with the generation config's defaults (once ready)."""
        return SamplingParams(**self.sampling_defaults)

    # ---- model facts and tokenizer --------------------------------------------------------------------
    def _loaded(self):
        """The loaded runtime (``RuntimeError`` before ready, ``EngineDeadError`` once dead)."""
        if self._rt is None:
            self._check_alive()
            raise RuntimeError("the engine is not ready yet (await wait_ready())")
        return self._rt

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
        return self._loaded().config.max_model_len

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV pool holds in all (available once ready): the server's startup line reports it."""
        return self._loaded().kv_capacity_tokens

    @property
    def memory_split(self) -> str:
        """How device memory was split (weights / step / KV) (available once ready)."""
        return getattr(self._loaded(), "memory_split", "")

    @property
    def sampling_defaults(self) -> dict:
        """Default sampling fields from the generation config (``--generation-config``): what the server
        applies to the fields a request leaves unset (available once ready)."""
        return dict(self._loaded().sampling_defaults)

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
        """A snapshot of the loop's counters, gauges and histograms (TTFT, inter-token latency, queue,
        prefill and decode times... as the loop observes them); cheap (atomics read in Rust), safe from
        any thread."""
        core = self._core
        if core is None:
            return self._metrics_idle.snapshot()
        return loop_metrics(core.stats(), bool(self._config_in.kv_sharing_fast_prefill))

    @property
    def num_unfinished_requests(self) -> int:
        """Requests not yet finished (what a draining shutdown waits for)."""
        return len(self._table.requests)


__all__ = ["AsyncEngine", "RequestStream", "DEFAULT_MAX_CONSECUTIVE_STEP_FAILURES"]
