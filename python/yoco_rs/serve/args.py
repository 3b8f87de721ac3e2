"""``yoco-serve`` flags: named like ``vllm serve``'s where the concept is the same, each also read from
an environment variable ``YOCO_SERVE_<FLAG>`` (``--max-model-len`` <- ``YOCO_SERVE_MAX_MODEL_LEN``).
A flag on the command line wins over its variable; a variable wins over the default. Engine flags map
1:1 onto ``EngineConfig`` fields (``--max-model-len`` is ``max_model_len``)."""

from __future__ import annotations

import argparse
import os
from typing import Callable, Optional

ENV_PREFIX = "YOCO_SERVE_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def env_name(dest: str) -> str:
    """The environment variable that sets a flag (``YOCO_SERVE_`` + its dest in capitals)."""
    return ENV_PREFIX + dest.upper()


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE[:-1])}, got {s!r}")


def _pos_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise ValueError(f"must be >= 1, got {v}")
    return v


def _port(s: str) -> int:
    v = int(s)
    if not 0 <= v <= 65535:
        raise ValueError(f"must be in [0, 65535], got {v}")
    return v


def _nonneg_float(s: str) -> float:
    v = float(s)
    if not v >= 0:
        raise ValueError(f"must be >= 0, got {s}")
    return v


def _kv_memory(s: str):
    """Bytes (an integer, or with a K/M/G/GiB suffix) or a fraction of device memory (a float <= 1)."""
    t = s.strip().lower().removesuffix("ib").removesuffix("b")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:] if t else "", None)
    if mult:
        return int(float(t[:-1]) * mult)
    if "." in t:
        return float(t)
    return int(t)


def _type_name(conv) -> str:
    return {int: "an integer", _pos_int: "an integer >= 1", _port: "a port number", float: "a number",
            _nonneg_float: "a number >= 0", _kv_memory: "bytes or a fraction", _bool: "a boolean"}.get(conv, "a value")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose defaults come from the environment (validated, with the variable named in
    errors) and whose help shows each flag's variable."""

    def add(self, *flags, env: bool = True, default=None, type: Optional[Callable] = None, help: str = "",
            **kw):
        dest = kw.get("dest") or flags[0].lstrip("-").replace("-", "_")
        if flags[0].startswith("-"):
            kw["dest"] = dest
        value = default
        if env:
            var = env_name(dest)
            raw = os.environ.get(var)
            if raw is not None:
                conv = _bool if kw.get("action") in ("store_true", argparse.BooleanOptionalAction) else (type or str)
                try:
                    value = conv(raw)
                    if kw.get("nargs") in ("+", "*"):
                        value = raw.split()
                except ValueError as e:
                    self.error(f"environment variable {var}={raw!r} is not {_type_name(conv)}: {e}")
                if kw.get("choices") and value not in kw["choices"]:
                    self.error(f"environment variable {var}={raw!r}: choose from {', '.join(kw['choices'])}")
            help = f"{help} [env: {var}]"
        if "default" not in help and default is not None and kw.get("action") != "store_true":
            help = f"{help} (default: {'on' if default is True else 'off' if default is False else default})"
        if type is not None:
            kw["type"] = type
        if value is None and kw.get("action") == "store_true":
            value = False
        return self.add_argument(*flags, default=value, help=help, **kw)


def build_parser() -> argparse.ArgumentParser:
    """``yoco-serve``'s command line (vLLM's flag names), each flag also settable from the environment."""
    p = _Parser(
        prog="yoco-serve",
        description="Serve a Gemma 3n checkpoint with an OpenAI-compatible API (vLLM-shaped: /v1/completions, "
                    "/v1/chat/completions, /v1/models, /health, /metrics, /tokenize, /detokenize, /version). "
                    "With no MODEL_DIR, serves the bundled tiny model yoco-tiny (trained, offline).",
        epilog="Every flag can also be set with the environment variable shown in brackets "
               f"({ENV_PREFIX}<FLAG>, dashes as underscores); the command line wins. "
               "SIGTERM drains: no new requests, in-flight ones finish within --shutdown-timeout, then exit.",
    )
    p.add("model_pos", nargs="?", metavar="MODEL_DIR", env=False,
          help="checkpoint directory in Hugging Face layout (config.json, *.safetensors, tokenizer.json); "
               f"omit for the bundled yoco-tiny (also --model or env {ENV_PREFIX}MODEL)")
    p.add("--model", help="same as MODEL_DIR")
    p.add("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for every interface)")
    p.add("--port", type=_port, default=8000, help="port to bind")
    p.add("--served-model-name", nargs="+", metavar="NAME",
          help="name(s) clients put in `model`, listed by /v1/models; the first labels the metrics "
               "(default: the model directory's name)")
    p.add("--api-key", nargs="+", metavar="KEY",
          help="require `Authorization: Bearer KEY` on /v1/* (/health and /metrics stay open)")
    p.add("--max-request-body-bytes", type=_pos_int, default=32 * 1024 * 1024,
          help="larger request bodies get a 413")
    p.add("--shutdown-timeout", type=_nonneg_float, default=20.0,
          help="on SIGTERM, seconds in-flight requests may take to finish before they are aborted (the default "
               "plus 5 s of connection close fits Kubernetes' 30 s termination grace period)")
    p.add("--chat-template", metavar="PATH_OR_TEXT",
          help="Jinja chat template (a file or the template itself) overriding the checkpoint's")
    p.add("--chat-template-content-format", choices=("auto", "string", "openai"), default="auto",
          help="how a message's list of text parts reaches the template: 'openai' as the list, 'string' "
               "joined with newlines; 'auto' asks each template (one that loops over the parts gets the list)")
    p.add("--return-tokens-as-token-ids", action="store_true",
          help="logprobs name tokens as 'token_id:N' instead of their text")
    p.add("--metrics-prefix", choices=("yoco", "vllm"), default="yoco",
          help="prefix of the vLLM-named Prometheus metrics; 'vllm' for routers/dashboards that scrape vllm:*")
    p.add("--compat-metric-names", action="store_true",
          help="also publish deprecated vLLM metric names (gpu_cache_usage_perc, gpu_prefix_cache_*, "
               "time_per_output_token_seconds) for older scrapers such as production-stack's router")
    p.add("--uvicorn-log-level", default="warning",
          choices=("critical", "error", "warning", "info", "debug", "trace"),
          help="accepted for vLLM compatibility; the Rust front end has no uvicorn")
    p.add("--disable-progress", action="store_true", help="no progress bar while weights load")
    p.add("--frontend", choices=("rust",), default="rust",
          help="the Rust front end and step loop (crates/yoco-server: every endpoint, HTTP, validation, SSE and "
               "the scheduler off the GIL), the only one since the FastAPI server was retired; kept so that "
               "scripts passing it still run")
    p.add("--data-parallel-size", type=_pos_int, default=1,
          help="step loops (each with its own copy of the model and KV pool) behind one front end, requests "
               "dispatched by prefix overlap and load")
    p.add("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
          help="plan step N+1 while step N runs, its decodes on placeholder tokens (vLLM's async scheduling; "
               "stop strings then end a request one step late, the extra token not emitted). Default: on "
               "on a GPU, off on the CPU (its forward is synchronous: planning ahead would only delay each token "
               "by a step)")
    _add_hardening_flags(p)

    p.add("--tokenizer", help="tokenizer directory (default: the model directory)")
    p.add("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
          help="weight and activation dtype; auto: the checkpoint's torch_dtype (a float32 checkpoint runs in "
               "bfloat16 on CUDA, float32 on CPU)")
    p.add("--per-layer-embeddings-on-device", action="store_true",
          help="keep Gemma 3n's per-layer embedding table (2.0B of E2B's parameters) in device memory instead "
               "of memory-mapped in host memory")
    p.add("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add("--seed", type=int, default=0, help="engine seed; requests without their own seed derive one from it")
    p.add("--max-model-len", type=_pos_int,
          help="context limit (prompt + output); requests beyond it get a 400 (default: the model's, capped "
               "by what the KV cache holds)")
    p.add("--max-num-seqs", type=_pos_int, help="most requests running at once (default: 256 on CUDA, 64 on CPU)")
    p.add("--max-num-batched-tokens", type=_pos_int,
          help="token budget per engine step; longer prompts are prefilled in chunks (default: 8192 CUDA, 2048 CPU)")
    p.add("--block-size", type=_pos_int, help="KV block size in tokens, a power of two (default: 64 CUDA, 16 CPU)")
    p.add("--sub-block-size", type=_pos_int,
          help="prefix-cache match grain in tokens; divides --block-size (default: min(16, block size))")
    p.add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
          help="reuse the KV of shared prompt prefixes (sub-block grain)")
    p.add("--kv-sharing-fast-prefill", action=argparse.BooleanOptionalAction, default=True,
          help="YOCO fast prefill: the KV-sharing (cross-decoder) layers run only on rows whose logits are "
               "needed; prompt logprobs stay exact")
    p.add("--enforce-eager", action="store_true", help="no CUDA graphs (faster startup, slower steps)")
    p.add("--kv-cache-memory", type=_kv_memory,
          help="KV pool: bytes (e.g. 2GiB) or a fraction of device memory in (0, 1] (default: 0.9 CUDA, 1 GiB CPU)")
    p.add("--gpu-memory-utilization", type=float,
          help="vLLM's name for a fraction given to --kv-cache-memory")
    p.add("--num-gpu-blocks-override", type=_pos_int, help="exact number of KV blocks per group")
    p.add("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs",
          help="fcfs, or priority (lower `priority` first; preempts the least important)")
    p.add("--max-logprobs", type=int, default=20, help="largest logprobs / top_logprobs / prompt_logprobs allowed")
    p.add("--kv-events-config", metavar="JSON",
          help="publish KV cache events over ZMQ in vLLM's wire format, vLLM's keys, e.g. "
               '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
               '"replay_endpoint": "tcp://*:5558", "topic": "kv@HOST:PORT@MODEL", "encoding": "map"}\' '
               "(encoding: array, vLLM's documented form; map, what vllm-router 0.1.17 needs; block_size: "
               "tokens per wire block, default 16)")
    p.add("--generation-config", default="auto", metavar="auto|vllm|PATH",
          help="defaults of the sampling fields a request leaves unset (temperature, top_k, top_p, min_p, "
               "repetition_penalty; its max_new_tokens caps every request's max_tokens, as in vLLM): auto, the "
               "model's generation_config.json; vllm, none; PATH, a directory holding a generation_config.json")
    # Structured outputs and tool calling (serve/structured.py, serve/tools.py).
    p.add("--structured-outputs-config", type=_json_object, metavar="JSON",
          help="structured-output settings as JSON, vLLM's names where they apply: backend (auto|guidance|"
               "llguidance), disable_any_whitespace, and the compile budget time_budget_ms (10000), "
               "max_grammar_size (500000), max_in_flight (4), cache_size (256)")
    p.add("--enable-auto-tool-choice", action="store_true",
          help="let the model decide to call tools (tool_choice 'auto'); needs --tool-call-parser")
    # Image and audio inputs (serve/chat_media.py, serve/media_fetch.py, serve/transcriptions.py).
    p.add("--limit-mm-per-prompt", metavar="JSON",
          help='most image / audio items one prompt may carry, e.g. \'{"image": 2, "audio": 1}\' (default: no '
               "limit but the context)")
    p.add("--allowed-local-media-path", metavar="DIR",
          help="let content parts read file:// URLs inside DIR (off: file:// is refused)")
    p.add("--max-media-bytes", type=_pos_int, default=20 << 20,
          help="largest image / audio payload of one content part or transcription upload")
    p.add("--media-fetch-timeout", type=_nonneg_float, default=10.0,
          help="seconds an http(s) image / audio fetch may take")
    p.add("--max-num-encoder-input-tokens", type=_pos_int,
          help="encoder budget per step in soft tokens (images / audio encoded per step; default: "
               "max-num-batched-tokens, at least one item)")
    p.add("--encoder-cache-memory", type=_kv_memory,
          help="bytes of image / audio encoder outputs kept by content hash (default 256MiB)")
    p.add("--tool-call-parser", choices=("pythonic", "json"),
          help="how tool calls appear in the model's text: pythonic ([f(a=1)], vLLM's Gemma 3 format) or json "
               "(<tool_call>{...}</tool_call>); see docs/serving.md")
    return p


def _add_hardening_flags(p: _Parser) -> None:
    """Limits on what one request may ask, browser exposure, failure containment."""
    p.add("--max-n", type=_pos_int, default=128, help="largest `n` (completions per prompt) a request may ask")
    p.add("--max-prompts-per-request", type=_pos_int, default=256,
          help="most prompts in one /v1/completions request")
    p.add("--trust-request-chat-template", action="store_true",
          help="accept `chat_template` in requests (templates are code; off: such requests get a 400)")
    p.add("--chat-template-timeout", type=_nonneg_float, default=2.0,
          help="seconds one chat-template rendering may take (a 400 past it)")
    p.add("--allowed-origins", nargs="+", metavar="ORIGIN",
          help="browser origins allowed by CORS (e.g. http://localhost:3000); none: no CORS headers")
    p.add("--disable-fastapi-docs", action="store_true",
          help="accepted for vLLM compatibility; the Rust front end serves no /docs or /openapi.json")
    p.add("--max-consecutive-step-failures", type=_pos_int, default=3,
          help="failing engine steps in a row that declare the engine dead (the server exits 1); a single "
               "failure only fails the requests of that step")


def _json_object(s: str) -> dict:
    import json

    v = json.loads(s)
    if not isinstance(v, dict):
        raise ValueError(f"must be a JSON object, got {s}")
    return v


#: CLI dest -> EngineConfig field, for the flags that are engine settings.
ENGINE_FLAGS = ("tokenizer", "dtype", "device", "seed", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                "block_size", "sub_block_size", "enable_prefix_caching", "kv_sharing_fast_prefill", "enforce_eager",
                "kv_cache_memory", "num_gpu_blocks_override", "scheduling_policy", "max_logprobs",
                "per_layer_embeddings_on_device", "kv_events_config", "generation_config",
                "structured_outputs_config", "limit_mm_per_prompt", "max_num_encoder_input_tokens",
                "encoder_cache_memory")


def engine_settings(args: argparse.Namespace) -> dict:
    """EngineConfig keyword arguments from parsed flags (None: the engine's own default)."""
    out = {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k) is not None}
    if args.gpu_memory_utilization is not None and args.kv_cache_memory is None:
        out["kv_cache_memory"] = float(args.gpu_memory_utilization)
    return out


def model_dir(args: argparse.Namespace) -> Optional[str]:
    """The model from the positional MODEL_DIR or ``--model`` (an error when both are given and differ)."""
    if args.model_pos and args.model and os.path.normpath(args.model_pos) != os.path.normpath(args.model):
        raise SystemExit(f"yoco-serve: error: MODEL_DIR {args.model_pos!r} and --model {args.model!r} disagree")
    return args.model_pos or args.model


def read_chat_template(value: Optional[str]) -> Optional[str]:
    """``--chat-template`` as Jinja text: a file's contents, or the value itself when it is a template."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:
        raise SystemExit(f"yoco-serve: error: --chat-template {value!r} is neither a file nor a Jinja template")
    return value


__all__ = ["build_parser", "engine_settings", "model_dir", "read_chat_template", "ENV_PREFIX", "env_name"]
