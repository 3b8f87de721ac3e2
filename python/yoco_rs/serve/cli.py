"""``yoco-serve``: parse flags, load the model, then serve from the Rust front end (``rust_frontend``) and
print one ready line once the port is bound; serve until SIGTERM/SIGINT.

The port is bound only once the model has loaded, so a connection that succeeds is one the server can
answer (``/health`` is 200 from the first one). SIGTERM drains: no new connection is accepted, in-flight
requests get up to ``--shutdown-timeout`` seconds to finish, the rest are aborted (their streams end
with ``finish_reason: "abort"``), then the process exits 0. SIGINT (Ctrl+C) aborts at once. A usage
error (a bad flag value, a missing model directory) exits 2; a model that fails to load, or an engine
whose steps keep failing (``--max-consecutive-step-failures``), exits 1 so that an orchestrator restarts
it.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional

import yoco_rs
from yoco_rs.serve.args import build_parser, engine_settings, model_dir, read_chat_template
from yoco_rs.serve.settings import ServerSettings


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def settings_of(args) -> ServerSettings:
    """The HTTP side's settings from the parsed flags."""
    return ServerSettings(
        served_model_names=args.served_model_name, api_keys=list(args.api_key or []),
        max_request_body_bytes=args.max_request_body_bytes, metrics_prefix=args.metrics_prefix,
        compat_metric_names=args.compat_metric_names, chat_template=read_chat_template(args.chat_template),
        shutdown_timeout=args.shutdown_timeout, return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        host=args.host, port=args.port, max_n=args.max_n, max_prompts_per_request=args.max_prompts_per_request,
        trust_request_chat_template=args.trust_request_chat_template,
        chat_template_seconds=args.chat_template_timeout,
        chat_template_content_format=args.chat_template_content_format, allowed_origins=list(args.allowed_origins or []),
        enable_auto_tool_choice=args.enable_auto_tool_choice, tool_call_parser=args.tool_call_parser,
        allowed_local_media_path=args.allowed_local_media_path, max_media_bytes=args.max_media_bytes,
        media_fetch_timeout=args.media_fetch_timeout)


def main(argv: Optional[list[str]] = None) -> int:
    """``yoco-serve``; the exit status (0 after a drain, 1 when the engine fails, 2 on a usage error)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        _say("yoco-serve: error: --enable-auto-tool-choice needs --tool-call-parser (pythonic or json)")
        return 2
    try:
        settings = settings_of(args)
        model = model_dir(args)
    except (ValueError, TypeError, OSError) as e:
        _say(f"yoco-serve: error: {e}")
        return 2
    _say(f"yoco-serve {yoco_rs.__version__}: loading {model or 'the bundled model yoco-tiny'}")
    from yoco_rs.serve.rust_frontend import serve

    try:
        return serve(args, settings, model, engine_settings(args))
    except (ValueError, TypeError, OSError) as e:
        _say(f"yoco-serve: error: {e}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
