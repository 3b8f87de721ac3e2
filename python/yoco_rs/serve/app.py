"""The FastAPI app: routes, error handlers, middlewares, lifespan.

``create_app(engine, settings)`` serves any object with the ``AsyncEngine`` API. The app owns the
engine's shutdown (lifespan end: ``engine.shutdown``); ``begin_drain`` is what SIGTERM calls.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Awaitable, Callable, Optional

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import yoco_rs
from yoco_rs.serve.chat import create_chat_completion
from yoco_rs.serve.completions import create_completion
from yoco_rs.serve.errors import APIError, error_body
from yoco_rs.serve.metrics import ServerMetrics
from yoco_rs.serve.middleware import AuthMiddleware, BodyLimitMiddleware, HttpMetricsMiddleware, \
    JsonOnlyMiddleware, RequestIdMiddleware
from yoco_rs.serve.sse import ClientDisconnected
from yoco_rs.serve.state import ServerSettings, ServerState
from yoco_rs.serve.tokenize import detokenize, tokenize
from yoco_rs.serve.render import render_chat_completion, render_completion

log = logging.getLogger("yoco_rs.serve")


def create_app(engine, settings: Optional[ServerSettings] = None, *,
               on_ready: Optional[Callable[[ServerState], None]] = None,
               on_fatal: Optional[Callable[[BaseException], None]] = None,
               shutdown_engine: bool = True) -> FastAPI:
    """The server for ``engine``. ``on_ready`` runs once the model is loaded; ``on_fatal`` when loading
    fails or the engine dies later (the CLI exits then, so an orchestrator restarts it)."""
    state = ServerState(engine, settings)

    @asynccontextmanager
    async def lifespan(app):
        watch = asyncio.ensure_future(_watch(state, on_ready, on_fatal))
        try:
            yield
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            if shutdown_engine:
                try:
                    await engine.shutdown(drain_timeout=0)
                except Exception:  # pragma: no cover - shutting down anyway
                    log.exception("engine shutdown failed")
            state.close()

    docs = state.settings.enable_docs
    app = FastAPI(title="yoco-serve", version=yoco_rs.__version__, lifespan=lifespan,
                  docs_url="/docs" if docs else None, redoc_url=None, openapi_url="/openapi.json" if docs else None)
    app.state.yoco = state
    metrics = ServerMetrics(state)
    state.metrics = metrics

    # ---- errors -----------------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        msg = {404: f"no route {request.method} {request.url.path}",
               405: f"method {request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
        return JSONResponse(error_body(exc.status_code, str(msg)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        return JSONResponse(error_body(400, str(exc)), status_code=400)

    @app.exception_handler(ClientDisconnected)
    async def _gone(request, exc):
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _internal(request, exc):
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}"), status_code=500)

    # ---- OpenAI API ---------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _respond(create_completion(state, request))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _respond(create_chat_completion(state, request))

    @app.post("/v1/audio/transcriptions")
    async def audio_transcriptions(request: Request):
        from yoco_rs.serve.transcriptions import create_transcription

        return await _respond(create_transcription(state, request))

    # vLLM's render endpoints (prefix-aware routers tokenize through them): serve/render.py
    @app.post("/v1/completions/render")
    async def completions_render(request: Request):
        return await render_completion(state, request)

    @app.post("/v1/chat/completions/render")
    async def chat_completions_render(request: Request):
        return await render_chat_completion(state, request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(state, n) for n in state.served_names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id not in state.served_names:
            raise APIError(404, f"The model `{model_id}` does not exist.", param="model")
        return _model_card(state, model_id)

    # ---- operations ---------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        status, body = state.health()
        return JSONResponse(body, status_code=status)

    @app.get("/ping")
    async def ping():
        return await health()

    @app.get("/version")
    async def version():
        return {"version": yoco_rs.__version__}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        return await tokenize(state, request)

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        return await detokenize(state, request)

    # innermost first: JSON-only -> auth -> body limit -> http metrics -> CORS -> request id (outermost)
    app.add_middleware(JsonOnlyMiddleware)
    app.add_middleware(AuthMiddleware, keys=list(state.settings.api_keys))
    app.add_middleware(BodyLimitMiddleware, limit=state.settings.max_request_body_bytes)
    app.add_middleware(HttpMetricsMiddleware, counter=metrics.http_requests)
    if state.settings.allowed_origins:  # CORS is off (no headers at all) unless origins are named
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(state.settings.allowed_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"])
    app.add_middleware(RequestIdMiddleware)
    return app


async def _respond(aw: Awaitable):
    out = await aw
    if isinstance(out, dict):
        return JSONResponse(out)
    return out


def _model_card(state: ServerState, name: str) -> dict:
    """One ``/v1/models`` entry. ``root`` is the served name, never the checkpoint's path: a client has no
    business learning the server's file system layout (vLLM puts the path there)."""
    card = {"id": name, "object": "model", "created": int(state.started_at), "owned_by": "yoco-rs",
            "root": name, "parent": None, "permission": []}
    try:
        card["max_model_len"] = int(state.engine.max_model_len)
    except Exception:
        pass
    return card


def begin_drain(app: FastAPI, timeout: float) -> asyncio.Future:
    """SIGTERM: refuse new requests (503), let in-flight ones finish for up to ``timeout`` seconds, then
    abort the rest (their streams end with finish_reason "abort")."""
    state: ServerState = app.state.yoco
    state.draining = True
    return asyncio.ensure_future(state.engine.shutdown(drain_timeout=timeout))


async def _watch(state: ServerState, on_ready, on_fatal) -> None:
    engine = state.engine
    try:
        await engine.wait_ready()
    except asyncio.CancelledError:
        raise
    except BaseException as e:
        if on_fatal is not None:
            on_fatal(e)
        return
    if on_ready is not None:
        on_ready(state)
    while True:
        await asyncio.sleep(0.5)
        if getattr(engine, "is_dead", False):
            if on_fatal is not None:
                on_fatal(engine.dead_error or RuntimeError("engine died"))
            return


__all__ = ["create_app", "begin_drain"]
