"""What one server holds: the engine, its settings, and the admission gate (loading / ready / draining /
dead). It also adapts the ``AsyncEngine`` API to what the HTTP layer needs (limits, KV capacity), with
fallbacks so the server works with an engine that exposes less."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

from yoco_rs.errors import EngineClosedError, EngineDeadError, RequestFailedError
from yoco_rs.serve.errors import APIError
from yoco_rs.serve.validation import Limits
from yoco_rs.template_budget import TemplateBudget

T = TypeVar("T")


@dataclass
class ServerSettings:
    """HTTP-side settings (engine settings live in ``EngineConfig``)."""

    served_model_names: Optional[list[str]] = None
    """Names accepted in ``model`` and listed by ``/v1/models``; the first is the metrics label and the
    ``model`` of responses. None: the engine's model name."""
    api_keys: list[str] = field(default_factory=list)
    """Bearer tokens accepted on ``/v1/*``; empty: no auth."""
    max_request_body_bytes: int = 32 * 1024 * 1024
    metrics_prefix: str = "yoco"
    """``yoco`` or ``vllm``: the prefix of the vLLM-named metrics (routers scrape ``vllm:``)."""
    compat_metric_names: bool = False
    """Also publish the deprecated vLLM names (``gpu_cache_usage_perc``, ``gpu_prefix_cache_*``...)."""
    chat_template: Optional[str] = None
    """A chat template (Jinja text) overriding the checkpoint's."""
    shutdown_timeout: float = 20.0
    """SIGTERM drain; with uvicorn's 5 s on top it fits Kubernetes' default 30 s grace period."""
    return_tokens_as_token_ids: bool = False
    # ---- hostile-input limits (issue 13) ----
    max_n: int = 128
    """Largest ``n`` (OpenAI's cap)."""
    max_prompts_per_request: int = 256
    """Most prompts in one ``/v1/completions`` request (a list of prompts)."""
    trust_request_chat_template: bool = False
    """Accept ``chat_template`` in requests (vLLM's ``--trust-request-chat-template``); off: 400."""
    chat_template_seconds: float = 2.0
    """Time budget of one chat-template rendering (the server's template or a trusted request's)."""
    allowed_origins: list[str] = field(default_factory=list)
    """CORS origins; empty: no CORS headers at all (browsers block cross-origin reads)."""
    enable_docs: bool = True
    """Serve ``/docs`` and ``/openapi.json``."""
    enable_auto_tool_choice: bool = False
    """``tool_choice: "auto"`` allowed (vLLM's ``--enable-auto-tool-choice``); needs ``tool_call_parser``."""
    tool_call_parser: Optional[str] = None
    """``pythonic`` or ``json`` (serve/tools.py)."""
    host: str = "127.0.0.1"
    port: int = 8000
    # ---- image / audio inputs (issue 17) ----
    allowed_local_media_path: Optional[str] = None
    """Directory ``file://`` media URLs may read (vLLM's ``--allowed-local-media-path``); None: refused."""
    max_media_bytes: int = 20 << 20
    """Largest image / audio payload of one content part (or transcription upload)."""
    media_fetch_timeout: float = 10.0
    """Seconds an http(s) media fetch may take."""


class ServerState:
    """What every handler shares: the engine, the HTTP settings, draining state and metrics, and the
    mapping of engine facts and failures to HTTP (model names, limits, health, error codes)."""

    def __init__(self, engine, settings: Optional[ServerSettings] = None):
        self.engine = engine
        self.settings = settings or ServerSettings()
        self.draining = False
        self.started_at = time.time()
        self._limits: Optional[Limits] = None
        self.metrics = None  # ServerMetrics, set by create_app
        # Tokenization and template rendering run here, off the event loop (few workers: a flood of
        # huge prompts queues behind them instead of taking every core).
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="yoco-serve-cpu")

    async def offload(self, fn: Callable[..., T], *args) -> T:
        """Run CPU work (tokenization, chat templates) in the server's worker threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args))

    def template_budget(self) -> TemplateBudget:
        """The budget of one chat-template rendering: the time setting, and output no longer than the
        longest prompt that could fit the context."""
        return TemplateBudget(seconds=self.settings.chat_template_seconds,
                              max_chars=max(self.limits().max_prompt_chars, 1 << 16))

    def close(self) -> None:
        """Stop the worker threads (the app's lifespan end)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def observe_params(self, n: int, max_tokens) -> None:
        """Record a request's parameters in the server metrics (when metrics are on)."""
        if self.metrics is not None:
            self.metrics.observe_params(n, max_tokens)

    # ---- names ----------------------------------------------------------------------------------
    @property
    def served_names(self) -> list[str]:
        """The model names requests may ask for; the first is the default and the metrics label."""
        if self.settings.served_model_names:
            return list(self.settings.served_model_names)
        try:
            return [self.engine.model_name]
        except Exception:
            return ["yoco-tiny"]

    @property
    def model_name(self) -> str:
        """The name responses report in ``model`` and metrics carry as ``model_name``."""
        return self.served_names[0]

    def check_model(self, name: Optional[str]) -> str:
        """The served name to answer with; 404 for a model we do not serve (None: the default)."""
        names = self.served_names
        if name is None or name == "" or name in names:
            return name or names[0]
        raise APIError(404, f"The model `{name}` does not exist. This server serves: {', '.join(names)}.",
                       param="model")

    # ---- admission ------------------------------------------------------------------------------
    def ensure_serving(self) -> None:
        """503 while loading, draining or after the engine died (the client may retry elsewhere)."""
        e = self.engine
        if self.draining:
            raise APIError(503, "the server is shutting down and accepts no new requests")
        if getattr(e, "is_dead", False):
            raise APIError(503, f"the engine is dead: {_cause(e)}", type="EngineDeadError")
        if not getattr(e, "is_ready", False):
            raise APIError(503, "the model is still loading; retry when GET /health answers 200")

    def health(self) -> tuple[int, dict]:
        """``/health``'s status code and body: 200 serving; 503 while loading, draining or dead (with the cause)."""
        e = self.engine
        if getattr(e, "is_dead", False):
            return 503, {"status": "dead", "error": _cause(e)}
        if self.draining:
            return 503, {"status": "draining"}
        if not getattr(e, "is_ready", False):
            return 503, {"status": "loading"}
        return 200, {"status": "ok"}

    def engine_error(self, e: BaseException) -> APIError:
        """An engine-side failure as the HTTP error a client should see (503 closed or dead, else 500)."""
        if isinstance(e, EngineClosedError):
            return APIError(503, "the server is shutting down and accepts no new requests")
        if isinstance(e, EngineDeadError):
            return APIError(503, f"the engine is dead: {e.__cause__ or e}", type="EngineDeadError")
        if isinstance(e, RequestFailedError):
            return APIError(500, str(e), type="InternalServerError")
        return APIError(500, f"internal error: {type(e).__name__}: {e}")

    # ---- engine facts ---------------------------------------------------------------------------
    def media(self):
        """The ``chat_media.MediaContext`` of a multimodal checkpoint (None: the model takes text only)."""
        proc = getattr(self.engine, "mm_processor", None)
        if proc is None:
            return None
        from yoco_rs.serve.chat_media import MediaContext
        from yoco_rs.serve.media_fetch import MediaPolicy

        s = self.settings
        policy = MediaPolicy(s.allowed_local_media_path, s.max_media_bytes, s.media_fetch_timeout)
        return MediaContext(proc, policy, getattr(self.engine.config, "limit_mm_per_prompt", None))

    def limits(self) -> Limits:
        """The engine's request limits (context length, logprobs, vocabulary) the validators check against;
        fetched once the engine is ready."""
        if self._limits is None:
            e = self.engine
            cfg = e.config
            max_model_len = int(e.max_model_len)
            self._limits = Limits(max_model_len=max_model_len, max_logprobs=int(cfg.max_logprobs),
                                  vocab_size=self.vocab_size(),
                                  max_prompt_chars=max_model_len * _max_chars_per_token(e.tokenizer),
                                  max_n=self.settings.max_n, max_prompts=self.settings.max_prompts_per_request,
                                  priority_scheduling=getattr(cfg, "scheduling_policy", "fcfs") == "priority",
                                  sampling_defaults=dict(getattr(e, "sampling_defaults", None) or {}))
        return self._limits

    def vocab_size(self) -> int:
        """The model's vocabulary (token ids the engine accepts); the tokenizer's when not exposed."""
        v = getattr(self.engine, "vocab_size", None)
        if isinstance(v, int) and v > 0:
            return v
        return int(self.engine.tokenizer.vocab_size)

    def kv_capacity_tokens(self) -> Optional[int]:
        """Tokens the KV pool holds, for the startup line (None when not known yet)."""
        v = getattr(self.engine, "kv_capacity_tokens", None)
        if isinstance(v, int) and v > 0:
            return v
        try:
            m = self.engine.get_metrics()
            return int(m.kv_blocks_total) * int(self.engine.config.block_size)
        except Exception:
            return None


def _max_chars_per_token(tokenizer) -> int:
    """An upper bound of the characters one token stands for (the longest vocabulary string): a text
    of C characters has at least C / this many tokens, so longer texts are refused without tokenizing."""
    try:
        vocab = tokenizer.hf.get_vocab(with_added_tokens=True)
        return max(8, max(len(t) for t in vocab))
    except Exception:
        return 1 << 10


def _cause(engine) -> str:
    err = getattr(engine, "dead_error", None)
    if err is None:
        return "unknown error"
    cause = err.__cause__ or err
    return f"{type(cause).__name__}: {cause}"


__all__ = ["ServerSettings", "ServerState"]
