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
import sys
from typing import Optional

from yoco_rs import _core
from yoco_rs.config import EngineConfig
from yoco_rs.executor.step_executor import StepExecutor, async_scheduling_on
from yoco_rs.runtime import Runtime, build_runtime, resolve_model_dir

def _chat_and_metrics_settings(rt: Runtime, settings) -> dict:
    """What the Rust front end needs beyond the engine: the chat template (``--chat-template``, else the
    checkpoint's) and the special tokens it sees, the template's budget, the generation config's sampling
    defaults, and the serving flags (CORS, metric names, version)."""
    import yoco_rs

    tok = rt.tokenizer
    special = [(k, v) for k, v in (("bos_token", tok.bos_token), ("eos_token", tok.eos_token),
                                    ("pad_token", tok.pad_token),
                                    ("unk_token", _token_str(tok.config.get("unk_token")))) if v is not None]
    defaults = [(k, float(v)) for k, v in dict(rt.sampling_defaults).items()
                if k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens") and v is not None]
    info = sorted((k, str(v)) for k, v in cache_config_info(rt.config).items())
    return dict(
        chat_template=settings.chat_template or tok.chat_template, special_tokens=special,
        trust_request_chat_template=bool(settings.trust_request_chat_template),
        chat_template_timeout=float(settings.chat_template_seconds),
        chat_template_content_format=settings.chat_template_content_format, sampling_defaults=defaults,
        compat_metric_names=bool(settings.compat_metric_names), allowed_origins=list(settings.allowed_origins or []),
        return_tokens_as_token_ids=bool(settings.return_tokens_as_token_ids), version=yoco_rs.__version__,
        cache_config_info=info, kv_sharing_fast_prefill=bool(rt.config.kv_sharing_fast_prefill),
        # Tools (serve/tools.py): with tools in play a request renders with --chat-template, else the
        # shipped tool-aware template (never the checkpoint's).
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
    cfg = EngineConfig.from_kwargs(model, **engine_kwargs)
    dp = int(getattr(args, "data_parallel_size", 1) or 1)
    kv = cfg.kv_events_config
    per_rank = dp > 1 and kv is not None and kv.active
    try:
        resolve_model_dir(cfg.model)  # a bad model path is a usage error (exit 2)
        # Each step loop publishes its own KV events, on its own endpoint (vLLM's data-parallel convention).
        cfgs = [dataclasses.replace(cfg, kv_events_config=kv.for_rank(r)) if per_rank else cfg for r in range(dp)]
    except ValueError as e:
        print(f"yoco-serve: error: {e}", file=sys.stderr, flush=True)
        return 2
    # One runtime per step loop: its own weights, KV pool and sampler (on a GPU, pin each process to
    # its device; in one process they share the device and its memory budget).
    try:
        rts = [build_runtime(c, progress=not args.disable_progress) for c in cfgs]
    except Exception as e:  # noqa: BLE001 - any load failure is the engine's: exit 1
        print(f"yoco-serve: error: the engine failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    rt = rts[0]
    names = list(settings.served_model_names or [rt.model_name])

    c = rt.config
    pc = f"on (sub-block {c.sub_block_size})" if c.enable_prefix_caching else "off"
    mem = f" | memory: {rt.memory_split}" if rt.memory_split else ""

    async_on = async_scheduling_on(getattr(args, "async_scheduling", None), rt.executor.device)

    def ready(url: str) -> None:
        # Tests and scripts read the URL at the end of this line.
        print(f"yoco-serve ready: model {names[0]} | KV capacity {rt.kv_capacity_tokens:,} tokens (block "
              f"{c.block_size}) | fast prefill {'on' if c.kv_sharing_fast_prefill else 'off'} | prefix caching {pc} | "
              f"max_model_len {c.max_model_len}{mem} | front end rust, {dp} step loop{'s' if dp > 1 else ''}, "
              f"{'async' if async_on else 'synchronous'} scheduling | {url}", file=sys.stderr, flush=True)

    executors = [StepExecutor(r) for r in rts]
    try:
        _serve_http(rts, executors, rt, args, settings, names, c, async_on, ready)
    except _core.EngineDied as e:
        # Every step loop stopped after --max-consecutive-step-failures failed steps: exit 1, so a
        # supervisor restarts the server instead of it answering 503 forever.
        print(f"yoco-serve: error: {e}", file=sys.stderr, flush=True)
        return 1
    # How many requests still hold image / audio items (0 unless one leaked: the serve tests read it).
    live = sum(e.num_media_requests() for e in executors)
    print(f"yoco-serve: stopped ({live} media requests live)", file=sys.stderr, flush=True)
    return 0


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


__all__ = ["StepExecutor", "async_scheduling_on", "cache_config_info", "serve", "tool_template"]
