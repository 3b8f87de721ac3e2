"""The HTTP side's settings of ``yoco-serve`` (engine settings live in ``EngineConfig``): what the flags
give the Rust front end beyond the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


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
    """SIGTERM drain; with the connections' close on top it fits Kubernetes' default 30 s grace period."""
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
    chat_template_content_format: str = "auto"
    """auto | string | openai: how a list of text parts reaches a template (vLLM's flag of that name)."""
    allowed_origins: list[str] = field(default_factory=list)
    """CORS origins; empty: no CORS headers at all (browsers block cross-origin reads)."""
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


__all__ = ["ServerSettings"]
