"""``Engine``: the synchronous face of yoco-rs (vLLM's ``LLM`` + ``LLMEngine``), on the Rust step loop.

The steps are those of ``yoco-serve`` and ``AsyncEngine``: a ``_core.EngineLoop`` owns the scheduler,
detokenization, stop strings and grammar masks, and calls the PyTorch ``StepExecutor`` (the model and
the sampler) once per step with the GIL held only for that call. Here the loop is *manual*: it has no
thread, and each ``step()`` runs exactly one synchronous step on the caller's thread (GIL released
around the Rust work), then turns the step's events into ``RequestOutput``s (``LoopRequests``). So
what a caller submitted before a step is in it, and a test that steps by hand is deterministic.

Python work per step is O(1) calls plus O(requests that stream, finish or were admitted), never
O(tokens) (except for requests that asked for logprobs: vLLM's per-position dicts are Python objects).

Not thread-safe: one thread drives an ``Engine`` (``get_metrics`` is safe from any thread).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Iterable, Optional, Sequence, Union

from yoco_rs import _core
from yoco_rs.config import EngineConfig
from yoco_rs.errors import EngineClosedError
from yoco_rs.executor.sampler import derive_seed
from yoco_rs.executor.step_executor import StepExecutor
from yoco_rs.grammars import Grammars
from yoco_rs.inputs import PromptType, is_single_prompt
from yoco_rs.loop_outputs import LoopRequest
from yoco_rs.loop_requests import LoopRequests
from yoco_rs.metrics import EngineMetrics, loop_metrics
from yoco_rs.outputs import RequestOutput
from yoco_rs.request_prep import RequestPreparer
from yoco_rs.runtime import build_runtime
from yoco_rs.sampling_params import RequestOutputKind, SamplingParams
from yoco_rs.tokenizer import Tokenizer

Messages = Sequence[dict]
#: An ``Engine`` never dies of failed steps: each failure raises from its ``step()`` and aborts only the
#: requests that step ran (the loop's limit, a u32, is set out of reach).
_NEVER = 2**32 - 1


class Engine:
    """Generate text with a Gemma 3n checkpoint.

    >>> engine = Engine()                        # the bundled tiny model, offline
    >>> out = engine.generate("Hello", SamplingParams(max_tokens=8, temperature=0))
    >>> out[0].outputs[0].text

    ``Engine(model, **settings)``: ``settings`` are ``EngineConfig`` fields (``max_model_len``,
    ``max_num_seqs``, ``block_size``, ``kv_sharing_fast_prefill``, ...), named like vLLM's flags.
    """

    def __init__(self, model: Union[str, os.PathLike, None] = None, *, config: Optional[EngineConfig] = None,
                 progress: bool = False, **settings) -> None:
        if config is not None and (model is not None or settings):
            raise TypeError("pass either config=EngineConfig(...) or model/settings, not both")
        cfg = config if config is not None else EngineConfig.from_kwargs(
            os.fspath(model) if model is not None else None, **settings)
        rt = build_runtime(cfg, progress=progress)
        self._rt = rt
        self.config: EngineConfig = rt.config
        self.model_name: str = rt.model_name
        self.max_model_len: int = rt.config.max_model_len
        self.kv_capacity_tokens: int = rt.kv_capacity_tokens
        self.memory_split: str = rt.memory_split
        """How device memory was split (weights / step / KV), as the startup line prints it."""
        self.vocab_size: int = rt.vocab_size
        """Token ids in ``[0, vocab_size)`` are valid prompt tokens."""
        self.sampling_defaults: dict = dict(rt.sampling_defaults)
        """Default sampling fields from the checkpoint's generation config (``generation_config``)."""
        self._tok = rt.tokenizer
        self._exec = rt.executor
        self._sampler = rt.sampler
        self._mm = rt.executor.mm  # the executor's per-request items and encoder cache
        self._executor = StepExecutor(rt)  # what the loop calls once per step (model + sampler)
        eos = list(self._tok.eos_token_ids)
        grammars = Grammars(self._tok.tokenizer_file, rt.vocab_size, eos,
                                limits=rt.config.structured_outputs_config)
        self._preparer = RequestPreparer(rt, grammars)
        self._core = _core.EngineLoop(rt.scheduler, self._executor, tokenizer_file=self._tok.tokenizer_file,
                                      eos_token_ids=eos, vocab_size=int(rt.vocab_size),
                                      max_consecutive_failures=_NEVER, manual=True)
        self._table = LoopRequests()
        self._pending: list[RequestOutput] = []  # outputs the next step() returns first
        self._seeds = itertools.count(1)
        self._rid = itertools.count()
        self._last_ran = False
        self._closed = False
        self.last_failed_request_ids: list[str] = []
        """The requests the last failed ``step()`` aborted."""
        self.mm_processor = rt.mm_processor
        """Image / audio preprocessing of a multimodal checkpoint (None for a text-only model)."""

    @property
    def _runner(self):
        """What each step calls ``execute`` on (the executor, or its CUDA-graph runner); tests and
        benchmarks swap it for a mock."""
        return self._executor._runner

    @_runner.setter
    def _runner(self, runner) -> None:
        self._executor._runner = runner

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        """An engine from a complete ``EngineConfig`` (a server builds one from its flags)."""
        return cls(config=config)

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams()`` with the generation config's defaults (vLLM's ``LLM`` method of that
        name): what ``generate`` uses when given no sampling parameters."""
        return SamplingParams(**self.sampling_defaults)

    # ---- offline generation ----------------------------------------------------------------------
    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        use_tqdm: bool = True,
        priority: Optional[Sequence[int]] = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in prompt order.

        ``prompts``: one prompt or a list (str, token-id list, or ``{"prompt"|"prompt_token_ids",
        "cache_salt"?}``). ``sampling_params``: one for all or one per prompt (default
        ``get_default_sampling_params()``). A progress bar shows for batches when ``use_tqdm``. Invalid input raises
        ``ValueError`` before anything runs.
        """
        plist = [prompts] if is_single_prompt(prompts) else list(prompts)
        n = len(plist)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or self.get_default_sampling_params()] * n
        else:
            params = list(sampling_params)
            if len(params) != n:
                raise ValueError(f"sampling_params has {len(params)} entries for {n} prompts; give one or one per prompt")
        if priority is not None and len(priority) != n:
            raise ValueError(f"priority has {len(priority)} entries for {n} prompts")
        final = {}
        for p in params:
            if id(p) not in final:
                if not isinstance(p, SamplingParams):
                    raise ValueError(f"sampling_params entries must be SamplingParams, got {type(p).__name__}")
                final[id(p)] = p.replace(output_kind=RequestOutputKind.FINAL_ONLY)
        prepared = [self._prepare(prompt, final[id(p)]) for prompt, p in zip(plist, params)]
        ids = []
        try:
            for i, (proc, p) in enumerate(prepared):
                rid = f"gen-{next(self._rid)}"
                self._add_prepared(rid, proc, p, priority[i] if priority is not None else 0, time.monotonic())
                ids.append(rid)
        except BaseException:
            self._discard(ids)
            raise
        results: dict[str, RequestOutput] = {}
        wanted = set(ids)
        bar = None
        if use_tqdm and n > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=n, desc="Processed prompts", dynamic_ncols=True)
        idle = 0
        try:
            while len(results) < n:
                outs = self.step()
                idle = 0 if outs or self._last_ran else idle + 1
                if idle > 1000:
                    raise RuntimeError("the scheduler planned nothing for 1000 steps with requests pending")
                for out in outs:
                    if out.finished and out.request_id in wanted:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
                if len(results) < n and not self.has_unfinished_requests():
                    raise RuntimeError("engine stopped with requests unfinished (a scheduler bug)")
        except BaseException:
            self._discard([r for r in ids if r not in results])
            self._pending = [o for o in self._pending if o.request_id not in wanted]
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[r] for r in ids]

    def chat(
        self,
        messages: Union[Messages, Sequence[Messages]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        use_tqdm: bool = True,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Optional[dict] = None,
    ) -> list[RequestOutput]:
        """``generate`` over conversations rendered with the checkpoint's chat template.
        ``messages`` is one conversation (a list of ``{"role", "content"}``) or a list of them."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conv in convs:
            text = self._tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,
                                                 chat_template=chat_template, **(chat_template_kwargs or {}))
            prompts.append({"prompt": text, "prompt_token_ids": self._tok.hf.encode(text, add_special_tokens=False).ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    # ---- step-level API -----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: PromptType, params: Optional[SamplingParams] = None, *,
                    priority: int = 0, arrival_time: Optional[float] = None) -> list[int]:
        """Validate, tokenize and queue one request (``n`` loop sequences); returns the prompt ids.
        ``ValueError`` for bad input (prompt too long, logprobs over ``max_logprobs``, duplicate id)."""
        proc, params = self._prepare(prompt, params or self.get_default_sampling_params())
        self._add_prepared(request_id, proc, params, priority,
                           arrival_time if arrival_time is not None else time.monotonic())
        return proc.token_ids

    def _prepare(self, prompt: PromptType, params: SamplingParams):
        """Thread-safe validation and tokenization (``RequestPreparer.prepare``)."""
        return self._preparer.prepare(prompt, params)

    def _add_prepared(self, request_id: str, proc, params: SamplingParams, priority: int, arrival: float) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        req = LoopRequest(request_id, proc.prompt, list(proc.token_ids), params, arrival, self._rt.text.decode_each)
        base_seed = params.seed if params.seed is not None else derive_seed(self.config.seed, next(self._seeds))
        self._table.submit(self._core, req, proc, params, priority, base_seed, self.max_model_len)

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort requests in any state; their blocks are freed at once. Unknown ids are ignored.
        The next ``step()`` reports them finished with ``finish_reason="abort"``."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            req = self._table.requests.get(rid)
            if req is not None:
                for lid in req.loop_ids:
                    if lid in self._table.by_loop_id:
                        self._core.abort(lid)

    def _discard(self, request_ids: Iterable[str]) -> None:
        """Abort requests and drop them: no output of theirs comes back (``generate`` failing)."""
        for rid in request_ids:
            req = self._table.requests.get(rid)
            if req is not None:
                self._table.forget(req, self._core.abort)

    def has_unfinished_requests(self) -> bool:
        """Whether ``step()`` still has work or outputs to hand out (drive the loop until False)."""
        return bool(self._table.requests) or bool(self._pending)

    def get_num_unfinished_requests(self) -> int:
        """Requests queued or running (a request with ``n > 1`` counts once)."""
        return len(self._table.requests)

    def step(self) -> list[RequestOutput]:
        """Run one engine step; return the outputs it produced (per each request's ``output_kind``).

        If the step fails (the executor raised, say), the requests it ran are aborted and the
        exception propagates, with a note naming them: the engine stays usable, and the next
        ``step()`` returns those requests finished with ``finish_reason="abort"``."""
        outputs, self._pending = self._pending, []
        self.last_failed_request_ids = []
        self._executor.last_error = None
        ran, error = self._core.step()
        self._last_ran = ran
        failed: list[str] = []
        for req, out in self._table.dispatch(self._core.poll(0.0), time.monotonic(), self._core.abort):
            if req.error is not None:
                failed.append(req.request_id)
            if out is not None:
                outputs.append(out)
        if error is None:
            return outputs
        self._pending = outputs
        self.last_failed_request_ids = failed
        err = self._executor.last_error or RuntimeError(f"the engine step failed: {error}")
        names = ", ".join(map(repr, failed)) or "none"
        err.add_note(f"yoco_rs: this engine step failed; the requests it ran were aborted "
                     f"(finish_reason='abort'): {names}. The engine remains usable.")
        raise err

    # ---- tokenizer ----------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The checkpoint's tokenizer, for callers who build prompts themselves."""
        return self._tok

    def get_tokenizer(self) -> Tokenizer:
        """The checkpoint's tokenizer (vLLM's ``LLM.get_tokenizer``)."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Prompt token ids of ``text`` as the engine would tokenize it (``<bos>`` first by default)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids, as the engine detokenizes outputs."""
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Messages, **kwargs) -> Union[str, list[int]]:
        """Render a conversation with the checkpoint's chat template (text, or ids with ``tokenize=True``)."""
        return self._tok.apply_chat_template(messages, **kwargs)

    # ---- observability and control --------------------------------------------------------------------
    def get_metrics(self) -> EngineMetrics:
        """A snapshot of the loop's counters, gauges and histograms (atomics read in Rust: safe from any
        thread, and cheap)."""
        return loop_metrics(self._core.stats(), bool(self.config.kv_sharing_fast_prefill))

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix; False while requests hold blocks."""
        return self._core.reset_prefix_cache()

    def take_kv_events(self) -> list:
        """KV cache events since the last call (needs ``enable_kv_events``; with ``kv_events_config``
        they go to its publisher instead)."""
        return self._core.take_kv_events()

    def check_invariants(self) -> None:
        """The scheduler's structural invariants, and no grammar matcher, text or logprob state left by
        an ended request (tests; O(pool)). Raises AssertionError."""
        self._core.check_invariants()

    def close(self) -> None:
        """Abort everything and release the executor's memory."""
        if self._closed:
            return
        self._discard(list(self._table.requests))
        self._pending.clear()
        self._closed = True
        self._core.shutdown()  # ends what is left; flushes and closes a KV-event publisher
        self._executor._runner = None  # captured graphs hold the KV tensors
        self._exec.kv_caches = []

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Engine"]
