"""Pure ASGI middlewares (Starlette's ``BaseHTTPMiddleware`` would break streaming and disconnect
detection): request ids, the body-size limit (413), Bearer auth on ``/v1`` (401), HTTP request
counting, the JSON-only Content-Type gate (415). Each answers errors in the OpenAI envelope."""

from __future__ import annotations

import json
import secrets
import uuid
from typing import Optional, Sequence

from yoco_rs.serve.errors import APIError, error_body


async def _send_json(send, status: int, body: dict, headers: Sequence = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


def _header(scope, name: bytes) -> Optional[bytes]:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v
    return None


class RequestIdMiddleware:
    """Echo ``X-Request-Id`` (or send a fresh one) on every response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = _header(scope, b"x-request-id") or uuid.uuid4().hex.encode()
        scope.setdefault("state", {})["request_id"] = rid.decode("latin-1")

        async def send_with_id(msg):
            if msg["type"] == "http.response.start":
                headers = [h for h in msg.get("headers", []) if h[0].lower() != b"x-request-id"]
                msg = {**msg, "headers": headers + [(b"x-request-id", rid)]}
            await send(msg)

        await self.app(scope, receive, send_with_id)


class BodyLimitMiddleware:
    """413 for bodies over ``limit`` bytes: at once from Content-Length, or while reading a chunked body."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    def _error(self, size) -> APIError:
        return APIError(413, f"request body is too large ({size} bytes); the limit is {self.limit} bytes "
                             f"(the server's --max-request-body-bytes)")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cl = _header(scope, b"content-length")
        if cl is not None:
            try:
                size = int(cl)
            except ValueError:
                return await _send_json(send, 400, error_body(400, "Content-Length is not a number"))
            if size > self.limit:
                return await _send_json(send, 413, self._error(size).body())
        seen = 0

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise self._error(f"more than {seen}")
            return msg

        await self.app(scope, limited_receive, send)


class JsonOnlyMiddleware:
    """415 for a request body sent with a Content-Type other than JSON. A web page may send a "simple"
    cross-origin POST (``text/plain``, form encodings: no CORS preflight) to a local server; refusing
    those bodies means no page can drive the API. A body without a Content-Type is read as JSON (curl
    without ``-H``)."""

    METHODS = ("POST", "PUT", "PATCH")
    #: Endpoints whose body is an upload (OpenAI's multipart/form-data), not JSON.
    MULTIPART_PATHS = ("/v1/audio/transcriptions",)

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") not in self.METHODS:
            return await self.app(scope, receive, send)
        ct = _header(scope, b"content-type")
        if ct is None or is_json_type(ct):
            return await self.app(scope, receive, send)
        if scope.get("path") in self.MULTIPART_PATHS and ct.lower().startswith(b"multipart/form-data"):
            return await self.app(scope, receive, send)
        shown = ct.decode("latin-1")[:100]
        await _send_json(send, 415, error_body(
            415, f"Content-Type {shown!r} is not supported: send the body as JSON with "
                 "'Content-Type: application/json'", type="UnsupportedMediaTypeError"))


def is_json_type(ct: bytes) -> bool:
    """``application/json`` or ``application/<x>+json``, with any parameters (charset)."""
    media = ct.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class AuthMiddleware:
    """``Authorization: Bearer <key>`` on ``/v1/*`` (``/health``, ``/metrics`` stay open for probes)."""

    def __init__(self, app, keys: Sequence[str]):
        self.app = app
        self.keys = [k.encode() for k in keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.keys or scope.get("method") == "OPTIONS" or \
                not scope.get("path", "").startswith("/v1"):
            return await self.app(scope, receive, send)
        auth = _header(scope, b"authorization") or b""
        token = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
        if token and any(secrets.compare_digest(token, k) for k in self.keys):
            return await self.app(scope, receive, send)
        msg = "Invalid API key" if token else "Missing API key: send 'Authorization: Bearer <key>'"
        await _send_json(send, 401, error_body(401, msg, type="AuthenticationError"),
                         [(b"www-authenticate", b"Bearer")])


class HttpMetricsMiddleware:
    """``http_requests_total{method,status,handler}`` (handler: the route's path template)."""

    KNOWN = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ping", "/metrics", "/tokenize",
             "/detokenize", "/version")

    def __init__(self, app, counter):
        self.app = app
        self.counter = counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def spy(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, spy)
        finally:
            path = scope.get("path", "")
            route = scope.get("route")
            handler = getattr(route, "path", None) or (path if path in self.KNOWN else "other")
            self.counter.labels(scope.get("method", ""), f"{status // 100}xx", handler).inc()


__all__ = ["RequestIdMiddleware", "BodyLimitMiddleware", "AuthMiddleware", "HttpMetricsMiddleware",
           "JsonOnlyMiddleware", "is_json_type"]
