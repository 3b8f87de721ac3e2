"""The OpenAI error envelope and the mapping from what went wrong to an HTTP status.

Every error the server answers has the body ``{"error": {"message", "type", "param", "code"}}`` with
``code`` the HTTP status as a number (vLLM's shape; the ``openai`` client reads ``message``). Client
mistakes are 400 (never FastAPI's 422, never a 500), a bad key 401, an unknown model or route 404, an
oversized body 413, a server that is loading, draining or dead 503.
"""

from __future__ import annotations

import re
from typing import Optional

from starlette.responses import JSONResponse

#: ``type`` strings per status, as vLLM and the OpenAI client name them.
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestEntityTooLargeError",
    415: "UnsupportedMediaTypeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error the server answers as-is (status, message, offending parameter)."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, type: Optional[str] = None,
                 headers: Optional[dict] = None):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.param = param
        self.type = type or ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")

    def body(self) -> dict:
        """The OpenAI error JSON for this error."""
        return error_body(self.status, self.message, param=self.param, type=self.type)

    def response(self, headers: Optional[dict] = None) -> JSONResponse:
        """This error as an HTTP response."""
        return JSONResponse(self.body(), status_code=self.status, headers=headers or self.headers)


def error_body(status: int, message: str, *, param: Optional[str] = None, type: Optional[str] = None) -> dict:
    """OpenAI's error JSON: ``{"error": {message, type, param, code}}`` (clients' SDKs parse it)."""
    return {"error": {"message": message, "type": type or ERROR_TYPES.get(status, "BadRequestError"),
                      "param": param, "code": status}}


def bad_request(message: str, param: Optional[str] = None) -> APIError:
    """A 400 for invalid input; ``param`` names the field at fault."""
    return APIError(400, message, param=param)


_FIELD_PREFIX = re.compile(r"^([a-z_][a-z0-9_]*) (?:must|is|has)\b")


def from_value_error(e: BaseException, *, param: Optional[str] = None) -> APIError:
    """A 400 from an engine/``SamplingParams`` ``ValueError`` (their messages start with the field name,
    "top_p must be in (0, 1], got 0", which becomes ``param``)."""
    msg = str(e) or type(e).__name__
    if param is None:
        m = _FIELD_PREFIX.match(msg)
        if m:
            param = m.group(1)
            if param.startswith("prompt_token_ids"):
                param = "prompt"
    return APIError(400, msg, param=param)


__all__ = ["APIError", "ERROR_TYPES", "error_body", "bad_request", "from_value_error"]
