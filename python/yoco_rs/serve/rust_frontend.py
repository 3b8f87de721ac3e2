"""``yoco-serve --frontend rust``: the serving path in Rust (``crates/yoco-server``) driving this
process's PyTorch executor.

HTTP, validation, tokenization, the scheduler, detokenization, stop strings and SSE run in Rust with
the GIL released; the Rust step loop calls ``StepExecutor`` with the GIL held only for that call:
``add_request``/``remove_request`` once per request, ``launch``/``collect`` once per step (O(1) calls,
flat arrays). What the Rust front end serves today is ``/v1/completions`` (text and token prompts,
``n``, stop strings and ids, streaming with usage, echo, seeds, logprobs and prompt logprobs,
penalties, structured outputs), ``/v1/models``, ``/health``, ``/metrics``, ``/v1/chat/completions``
(chat templates rendered in Rust), the render endpoints, ``/tokenize``, ``/detokenize`` and
``/version``, tool calling (``tools`` / ``tool_choice``, ``--enable-auto-tool-choice`` with
``--tool-call-parser``), and on a multimodal checkpoint images and audio in chat content parts and
``/v1/audio/transcriptions``. Requests that need what it does not serve get a 400 naming the field. It is
``yoco-serve``'s only front end (the FastAPI server it replaced is retired).

Images and audio: Rust parses the content parts, checks ``--limit-mm-per-prompt`` and renders the template
with ``{"type": "image"}`` / ``{"type": "audio"}`` parts, then calls ``rust_media.MediaSeam`` off the step
loop (fetch under the media flags, decode, process, expand and locate the placeholders, encode ahead). The
request enters the Rust loop with its placeholder runs (they key the prefix cache and the encoder budget);
``add_request`` receives the processed items as ``mm_items`` and registers them under the request id,
``launch`` builds the batch's ``mm_overlay`` as ``Engine`` does, ``remove_request`` drops them.

Structured outputs: the Rust loop owns the matchers and computes each step's token bitmasks on the
grammar pool while the forward runs; ``launch`` receives them as a ``_core.StepMasks`` and applies
them to the logits after the forward, before sampling (so logprobs are the masked distribution's, as
the Python engine reports them).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from typing import Optional

import numpy as np
import torch

from yoco_rs import _core
from yoco_rs.config import EngineConfig
from yoco_rs.engine import derive_seed
from yoco_rs.executor.batch import plan_batch
from yoco_rs.executor.grammar_mask import apply_token_bitmask_
from yoco_rs.executor.sampler import RowParams, logprobs_topk
from yoco_rs.runtime import Runtime, build_runtime, resolve_model_dir

_NO_OUTPUT = np.zeros(0, dtype=np.int64)

# Server flags the Rust front end does not implement yet: refused at start-up rather than ignored.
UNSUPPORTED_FLAGS: dict[str, str] = {}


class StepExecutor:
    """The model, the sampler and the per-request sampling state, stepped by the Rust loop.

    ``launch(plan, tables, resumed, masks, scoring)`` runs the forward and samples (on a GPU both are
    enqueued and the call returns at once); ``collect()`` returns what the step produced, copying it to
    the host: the sampled ids as an int32 array, or, when logprobs were asked, ``(sampled,
    sample_logprobs, prompt_logprobs)`` (``yoco_server::executor::StepOutput``'s flat arrays; see
    ``collect``). ``tables[g]`` is KV group g's block-table rows of the plan (``[R, cols]`` int32);
    ``resumed`` maps the requests the plan resumes after a preemption to their outputs so far (the
    sampler restores their penalty counts and random streams from them); ``masks`` is the step's
    ``_core.StepMasks`` (None when no sampling row is constrained); ``scoring`` is ``(rows int64,
    targets int64, k)``, the logits rows whose prompt token's logprob (and top ``k``) to report, or
    None.

    With async scheduling the plan of step N+1 is built before step N's update: its decodes whose
    step-N token was unknown carry placeholders (``plan.placeholder_indices`` into ``input_ids``, read
    from ``plan.placeholder_sources`` of step N's sampled ids). The loop launches N+1 only after
    collecting N, so the ids are on the host: they are written into a copy of the plan's ``input_ids``
    (the plan's own buffers are shared with Rust and read-only) before the batch reaches the device,
    which is also what the host-resident per-layer embeddings are gathered by. A plan with grammar
    masks never has placeholders (the loop does not plan ahead while a constrained request is live),
    so the ids ``collect`` returned after the masks are the ones placeholders read."""

    def __init__(self, rt: Runtime):
        self._runner = rt.runner
        self._sampler = rt.sampler
        self._eos = list(rt.tokenizer.eos_token_ids)
        self._engine_seed = int(rt.config.seed)
        self._counter = itertools.count(1)
        self._params: dict[int, RowParams] = {}
        self._prompts: dict[int, np.ndarray] = {}
        self._out = None
        self._prompt_lp = None
        self._prev: np.ndarray = np.zeros(0, dtype=np.int32)  # the ids the last collect() returned
        self._mm = rt.executor.mm  # per-request image / audio items (None: a text-only checkpoint)

    def add_request(self, req_id: int, prompt: np.ndarray, *, temperature: float, top_p: float, top_k: int,
                    min_p: float, seed: Optional[int], min_tokens: int, ignore_eos: bool,
                    stop_token_ids: list, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                    repetition_penalty: float = 1.0, logprobs: int = -1, mm_items=None) -> None:
        mask_ids = list(stop_token_ids) + ([] if ignore_eos else self._eos)
        self._params[req_id] = RowParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            repetition_penalty=repetition_penalty,
            seed=seed if seed is not None else derive_seed(self._engine_seed, next(self._counter)),
            min_tokens=min_tokens, min_tokens_ids=mask_ids, logprobs=logprobs)
        self._prompts[req_id] = prompt
        if mm_items and self._mm is not None:
            self._mm.add(req_id, mm_items)

    def remove_request(self, req_id: int) -> None:
        self._params.pop(req_id, None)
        self._prompts.pop(req_id, None)
        if self._mm is not None:
            self._mm.remove(req_id)

    def num_media_requests(self) -> int:
        """Requests whose image / audio items are registered (0 once every media request ended)."""
        return 0 if self._mm is None else self._mm.num_requests()

    def launch(self, plan, tables: list, resumed: dict, masks=None, scoring=None) -> None:
        ids = plan.admitted_ids
        if len(ids):
            ids = ids.tolist()
            self._sampler.set_rows(plan.admitted_rows.tolist(), [self._params[i] for i in ids],
                                   [self._prompts[i] for i in ids], [resumed.get(i, _NO_OUTPUT) for i in ids])
        batch = plan_batch(plan, [torch.from_numpy(t) for t in tables])
        input_ids = plan.input_ids
        if plan.num_placeholders:
            ids = batch.input_ids.clone()
            ids[torch.from_numpy(plan.placeholder_indices).long()] = torch.from_numpy(
                self._prev[plan.placeholder_sources]).to(ids.dtype)
            batch.input_ids = ids
            if self._mm is not None:
                input_ids = np.array(input_ids)
                input_ids[plan.placeholder_indices] = self._prev[plan.placeholder_sources]
        if self._mm is not None:  # image / audio embeddings of this step's chunks, as Engine builds them
            batch.mm_overlay = self._mm.overlay(plan.req_ids, plan.query_start_loc, plan.seq_lens, input_ids,
                                                int(plan.num_tokens))
        logits = self._runner.execute(batch)
        cross_pos = plan.logits_cross_pos
        if masks is not None:
            rows, bitmask = masks.take()  # computed while the forward ran; waits with the GIL released
            if len(rows):
                apply_token_bitmask_(logits, bitmask, np.asarray(cross_pos, dtype=np.int64)[rows])
        self._prompt_lp = None
        if scoring is not None:
            xs, targets, k = scoring
            lp = torch.log_softmax(logits.index_select(0, torch.from_numpy(xs).to(logits.device)).float(), dim=-1)
            self._prompt_lp = logprobs_topk(lp, torch.from_numpy(targets).to(logits.device), int(k))
        self._out = self._sampler.sample(logits, cross_pos, plan.req_rows[plan.sample_rows])

    def collect(self):
        """The sampled ids (int32 ``[S]``), or ``(sampled, sample_logprobs, prompt_logprobs)``:
        ``sample_logprobs = (rows int32[L], logprob float32[L], rank int32[L], top_ids int32[L, K],
        top_logprobs float32[L, K])`` for the L sampling rows whose request asked (``rows`` index
        ``sample_rows``), ``prompt_logprobs`` the same without ``rows`` for the scored prompt positions;
        either is None when not asked."""
        so, plp = self._out, self._prompt_lp
        self._out = self._prompt_lp = None
        sampled = np.ascontiguousarray(so.sampled.numpy(), dtype=np.int32)
        self._prev = sampled  # what the next plan's placeholders read
        if so.lp_idx is None and plp is None:
            return sampled
        slp = None
        if so.lp_idx is not None:
            slp = (_i32(so.lp_idx), _f32(so.sampled_logprobs), _i32(so.sampled_ranks), _i32(so.topk_ids),
                   _f32(so.topk_logprobs))
        if plp is not None:
            ids, vals, tgt, rank = plp
            plp = (_f32(tgt), _i32(rank), _i32(ids), _f32(vals))
        return sampled, slp, plp


def _i32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int32)


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _chat_and_metrics_settings(rt: Runtime, settings) -> dict:
    """What the Rust front end needs beyond the engine: the chat template (``--chat-template``, else the
    checkpoint's) and the special tokens it sees, the template's budget, the generation config's sampling
    defaults, and the flags the Python server also takes (CORS, metric names, version)."""
    import yoco_rs

    tok = rt.tokenizer
    special = [(k, v) for k, v in (("bos_token", tok.bos_token), ("eos_token", tok.eos_token),
                                    ("pad_token", tok.pad_token),
                                    ("unk_token", _token_str(tok.config.get("unk_token")))) if v is not None]
    defaults = [(k, float(v)) for k, v in dict(rt.sampling_defaults).items()
                if k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty") and v is not None]
    info = sorted((k, str(v)) for k, v in cache_config_info(rt.config).items())
    return dict(
        chat_template=settings.chat_template or tok.chat_template, special_tokens=special,
        trust_request_chat_template=bool(settings.trust_request_chat_template),
        chat_template_timeout=float(settings.chat_template_seconds), sampling_defaults=defaults,
        compat_metric_names=bool(settings.compat_metric_names), allowed_origins=list(settings.allowed_origins or []),
        return_tokens_as_token_ids=bool(settings.return_tokens_as_token_ids), version=yoco_rs.__version__,
        cache_config_info=info, kv_sharing_fast_prefill=bool(rt.config.kv_sharing_fast_prefill),
        # Tools (serve/tools.py): with tools in play a request renders with --chat-template, else the
        # shipped tool-aware template (never the checkpoint's, as the Python server does).
        enable_auto_tool_choice=bool(settings.enable_auto_tool_choice), tool_call_parser=settings.tool_call_parser,
        tool_chat_template=settings.chat_template or tool_template())


def cache_config_info(cfg: EngineConfig) -> dict:
    """The labels of ``cache_config_info`` (vLLM's CacheConfig info series) for an ``EngineConfig``."""
    return {
        "block_size": cfg.block_size,
        "sub_block_size": cfg.sub_block_size,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "kv_sharing_fast_prefill": cfg.kv_sharing_fast_prefill,
        "num_gpu_blocks": getattr(cfg, "num_gpu_blocks_override", None),
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "dtype": cfg.dtype,
    }


def tool_template() -> str:
    """The tool-aware Gemma 3n chat template shipped with yoco-serve (``serve/templates/``)."""
    from importlib import resources

    return resources.files("yoco_rs.serve").joinpath("templates/gemma3n_tools.jinja").read_text(encoding="utf-8")


def _media_settings(rt: Runtime, settings) -> dict:
    """The media seam of a multimodal checkpoint (none for a text-only one: media parts stay refused), the
    fetch policy (``--allowed-local-media-path``, ``--max-media-bytes``, ``--media-fetch-timeout``) and
    ``--limit-mm-per-prompt``."""
    if rt.mm_processor is None:
        return {}
    from yoco_rs.serve.media_fetch import MediaPolicy
    from yoco_rs.serve.rust_media import MediaSeam

    policy = MediaPolicy(settings.allowed_local_media_path, int(settings.max_media_bytes),
                         float(settings.media_fetch_timeout))
    limits = [(str(k), int(v)) for k, v in dict(rt.config.limit_mm_per_prompt or {}).items()]
    return dict(media_seam=MediaSeam(rt, policy), limit_mm_per_prompt=limits,
                max_media_bytes=int(settings.max_media_bytes))


def _token_str(v) -> Optional[str]:
    return v.get("content") if isinstance(v, dict) else (None if v is None else str(v))


def serve(args, settings, model: Optional[str], engine_kwargs: dict) -> int:
    """Load the model, then serve from Rust until SIGINT/SIGTERM. The exit status of ``yoco-serve``."""
    for attr, flag in UNSUPPORTED_FLAGS.items():
        if getattr(args, attr, None):
            print(f"yoco-serve: error: {flag} is not supported with --frontend rust yet", file=sys.stderr, flush=True)
            return 2
    cfg = EngineConfig.from_kwargs(model, **engine_kwargs)
    dp = int(getattr(args, "data_parallel_size", 1) or 1)
    kv = cfg.kv_events_config
    per_rank = dp > 1 and kv is not None and kv.active
    try:
        resolve_model_dir(cfg.model)  # a bad model path is a usage error (exit 2), as on the Python server
        # Each step loop publishes its own KV events, on its own endpoint (vLLM's data-parallel convention).
        cfgs = [dataclasses.replace(cfg, kv_events_config=kv.for_rank(r)) if per_rank else cfg for r in range(dp)]
    except ValueError as e:
        print(f"yoco-serve: error: {e}", file=sys.stderr, flush=True)
        return 2
    # One runtime per step loop: its own weights, KV pool and sampler (on a GPU, pin each process to
    # its device; in one process they share the device and its memory budget).
    try:
        rts = [build_runtime(c, progress=not args.disable_progress) for c in cfgs]
    except Exception as e:  # noqa: BLE001 - any load failure is the engine's; exit 1 as the Python server does
        print(f"yoco-serve: error: the engine failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    rt = rts[0]
    names = list(settings.served_model_names or [rt.model_name])

    c = rt.config
    pc = f"on (sub-block {c.sub_block_size})" if c.enable_prefix_caching else "off"
    mem = f" | memory: {rt.memory_split}" if rt.memory_split else ""

    async_on = async_scheduling_on(getattr(args, "async_scheduling", None), rt.executor.device)

    def ready(url: str) -> None:
        # The same line as the Python front end's (tests and scripts read the URL at its end).
        print(f"yoco-serve ready: model {names[0]} | KV capacity {rt.kv_capacity_tokens:,} tokens (block "
              f"{c.block_size}) | fast prefill {'on' if c.kv_sharing_fast_prefill else 'off'} | prefix caching {pc} | "
              f"max_model_len {c.max_model_len}{mem} | front end rust, {dp} step loop{'s' if dp > 1 else ''}, "
              f"{'async' if async_on else 'synchronous'} scheduling | {url}", file=sys.stderr, flush=True)

    executors = [StepExecutor(r) for r in rts]
    try:
        _serve_http(rts, executors, rt, args, settings, names, c, async_on, ready)
    except _core.EngineDied as e:
        # Every step loop stopped after --max-consecutive-step-failures failed steps: exit 1 (as the
        # Python server does) so a supervisor restarts the server instead of it answering 503 forever.
        print(f"yoco-serve: error: {e}", file=sys.stderr, flush=True)
        return 1
    # How many requests still hold image / audio items (0 unless one leaked: the serve tests read it).
    live = sum(e.num_media_requests() for e in executors)
    print(f"yoco-serve: stopped ({live} media requests live)", file=sys.stderr, flush=True)
    return 0


def async_scheduling_on(flag: Optional[bool], device: torch.device) -> bool:
    """``--async-scheduling`` as given, else on where the forward runs asynchronously to the host (CUDA).

    On the CPU the forward runs inside ``launch``: there is nothing to overlap, and a step planned ahead
    would hold each token back until the next forward ends (one extra step of latency per token, TTFT
    included). vLLM does not schedule asynchronously on the CPU either. ``--async-scheduling`` still forces
    it (the tests use it to run the real executor on placeholders)."""
    return flag if flag is not None else device.type == "cuda"


def _serve_http(rts, executors, rt, args, settings, names, c, async_on, ready) -> None:
    _core.serve_http(
        [(r.scheduler, e) for r, e in zip(rts, executors)], tokenizer_file=rt.tokenizer.tokenizer_file,
        eos_token_ids=list(rt.tokenizer.eos_token_ids),
        bos_token_id=rt.tokenizer.bos_token_id if rt.tokenizer.add_bos_token else None, host=args.host, port=args.port, served_model_names=names,
        max_model_len=int(rt.config.max_model_len), vocab_size=int(rt.vocab_size),
        api_keys=list(settings.api_keys or []), max_n=int(settings.max_n),
        max_prompts_per_request=int(settings.max_prompts_per_request),
        max_request_body_bytes=int(settings.max_request_body_bytes), metrics_prefix=settings.metrics_prefix,
        max_consecutive_failures=int(args.max_consecutive_step_failures), on_ready=ready,
        shutdown_timeout=float(args.shutdown_timeout),
        async_scheduling=async_on, max_logprobs=int(c.max_logprobs),
        structured_outputs_config=dict(c.structured_outputs_config or {}),
        **_chat_and_metrics_settings(rt, settings), **_media_settings(rt, settings))


__all__ = ["StepExecutor", "async_scheduling_on", "cache_config_info", "serve", "tool_template", "UNSUPPORTED_FLAGS"]
