"""``yoco-serve``: parse flags, start the engine (it loads in its own thread while the HTTP server
already answers ``/health`` with 503), print one ready line, serve until SIGTERM/SIGINT.

SIGTERM drains: the listening socket closes, new requests on open connections get 503, in-flight
requests get up to ``--shutdown-timeout`` seconds to finish, the rest are aborted (their streams end
with ``finish_reason: "abort"``), then the process exits 0. SIGINT (Ctrl+C) aborts at once; a second
one exits immediately. If the model fails to load or the engine dies, the process exits 1 (so an
orchestrator restarts it); ``/health`` answers 503 meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from typing import Optional

import yoco_rs
from yoco_rs.serve.args import build_parser, engine_settings, model_dir, read_chat_template
from yoco_rs.serve.state import ServerSettings, ServerState

log = logging.getLogger("yoco_rs.serve")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ready_line(state: ServerState, url: str) -> str:
    """The one line printed once the server serves: model, KV capacity, features, URL."""
    cfg = state.engine.config
    cap = state.kv_capacity_tokens()
    cap_s = f"{cap:,} tokens" if cap is not None else "unknown"
    pc = f"on (sub-block {cfg.sub_block_size})" if cfg.enable_prefix_caching else "off"
    return (f"yoco-serve ready: model {state.model_name} | KV capacity {cap_s} (block {cfg.block_size}) | "
            f"fast prefill {'on' if cfg.kv_sharing_fast_prefill else 'off'} | prefix caching {pc} | "
            f"max_model_len {state.limits().max_model_len}{_memory(state)} | {url}")


def _memory(state: ServerState) -> str:
    """The memory budget split (`` | memory: weights .. | step .. | KV ..``), when the engine reports it."""
    split = getattr(state.engine, "memory_split", "")
    return f" | memory: {split}" if isinstance(split, str) and split else ""


def main(argv: Optional[list[str]] = None) -> int:
    """``yoco-serve``: parse flags, start the engine and uvicorn, drain on SIGTERM; the exit status is 1 when
    the model fails to load."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import uvicorn

    from yoco_rs.async_engine import AsyncEngine
    from yoco_rs.serve.app import begin_drain, create_app

    settings = ServerSettings(
        served_model_names=args.served_model_name, api_keys=list(args.api_key or []),
        max_request_body_bytes=args.max_request_body_bytes, metrics_prefix=args.metrics_prefix,
        compat_metric_names=args.compat_metric_names, chat_template=read_chat_template(args.chat_template),
        shutdown_timeout=args.shutdown_timeout, return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        host=args.host, port=args.port, max_n=args.max_n, max_prompts_per_request=args.max_prompts_per_request,
        trust_request_chat_template=args.trust_request_chat_template,
        chat_template_seconds=args.chat_template_timeout, allowed_origins=list(args.allowed_origins or []),
        enable_docs=not args.disable_fastapi_docs,
        enable_auto_tool_choice=args.enable_auto_tool_choice, tool_call_parser=args.tool_call_parser,
        allowed_local_media_path=args.allowed_local_media_path, max_media_bytes=args.max_media_bytes,
        media_fetch_timeout=args.media_fetch_timeout)
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        _say("yoco-serve: error: --enable-auto-tool-choice needs --tool-call-parser (pythonic or json)")
        return 2
    model = model_dir(args)
    _say(f"yoco-serve {yoco_rs.__version__}: loading {model or 'the bundled model yoco-tiny'}")
    if args.data_parallel_size > 1 and args.frontend != "rust":
        _say("yoco-serve: error: --data-parallel-size needs --frontend rust")
        return 2
    if args.frontend == "rust":
        from yoco_rs.serve.rust_frontend import serve as serve_rust

        try:
            return serve_rust(args, settings, model, engine_settings(args))
        except (ValueError, TypeError, OSError) as e:
            _say(f"yoco-serve: error: {e}")
            return 2
    try:
        engine = AsyncEngine(model, progress=not args.disable_progress,
                             max_consecutive_step_failures=args.max_consecutive_step_failures,
                             **engine_settings(args))
    except (ValueError, TypeError, OSError) as e:
        _say(f"yoco-serve: error: {e}")
        return 2

    outcome = {"code": 0}
    server: Optional[_Server] = None

    def on_ready(state: ServerState) -> None:
        if server is not None and not server.started and not server.should_exit:
            # The model loaded before uvicorn bound its socket: the line must carry the real port.
            asyncio.get_running_loop().call_later(0.02, on_ready, state)
            return
        _say(ready_line(state, server.url() if server else f"http://{args.host}:{args.port}"))

    def on_fatal(err: BaseException) -> None:
        cause = err.__cause__ or err
        _say(f"yoco-serve: error: the engine failed: {type(cause).__name__}: {cause}")
        outcome["code"] = 1
        if server is not None:
            server.should_exit = True

    app = create_app(engine, settings, on_ready=on_ready, on_fatal=on_fatal)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                            timeout_graceful_shutdown=int(args.shutdown_timeout) + 5, lifespan="on",
                            access_log=args.uvicorn_log_level in ("info", "debug", "trace"))
    server = _Server(config, app, args.shutdown_timeout)
    try:
        server.run()
    except SystemExit as e:  # uvicorn: bind failure
        return int(e.code or 1)
    if server.drained_by_signal:
        _say("yoco-serve: stopped")
    return outcome["code"]


class _Server:
    """uvicorn.Server whose first SIGTERM starts the engine drain and which exits normally afterwards
    (uvicorn would re-raise the signal)."""

    def __new__(cls, config, app, shutdown_timeout: float):
        import uvicorn

        class Server(uvicorn.Server):
            drained_by_signal = False

            def url(self) -> str:
                port = config.port
                for s in getattr(self, "servers", []) or []:
                    for sock in s.sockets or []:
                        port = sock.getsockname()[1]
                        break
                host = config.host if config.host not in ("0.0.0.0", "::") else "127.0.0.1"
                return f"http://{host}:{port}"

            def handle_exit(self, sig, frame):
                if not self.drained_by_signal:
                    self.drained_by_signal = True
                    timeout = shutdown_timeout if sig == signal.SIGTERM else 0.0
                    loop = self._loop
                    if loop is not None:
                        loop.call_soon_threadsafe(self._drain, timeout)
                super().handle_exit(sig, frame)

            def _drain(self, timeout: float) -> None:
                from yoco_rs.serve.app import begin_drain

                _say(f"yoco-serve: draining (up to {timeout:g} s for in-flight requests)")
                self._drain_task = begin_drain(app, timeout)

            async def serve(self, sockets=None):
                self._loop = asyncio.get_running_loop()
                with self._signals():
                    await self._serve(sockets)

            @contextlib.contextmanager
            def _signals(self):
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                handled = (signal.SIGINT, signal.SIGTERM)
                original = {s: signal.signal(s, self.handle_exit) for s in handled}
                try:
                    yield
                finally:
                    for s, h in original.items():
                        signal.signal(s, h)

        s = Server(config)
        s._loop = None
        return s


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
