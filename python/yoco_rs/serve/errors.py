"""An error the Python side of the serving path raises for the Rust front end to answer (the media seam:
a bad image or audio part is a 400 naming the field). The Rust server turns it into the OpenAI error
envelope, ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Optional

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


def error_body(status: int, message: str, *, param: Optional[str] = None, type: Optional[str] = None) -> dict:
    """OpenAI's error JSON: ``{"error": {message, type, param, code}}`` (clients' SDKs parse it)."""
    return {"error": {"message": message, "type": type or ERROR_TYPES.get(status, "BadRequestError"),
                      "param": param, "code": status}}


def bad_request(message: str, param: Optional[str] = None) -> APIError:
    """A 400 for invalid input; ``param`` names the field at fault."""
    return APIError(400, message, param=param)


__all__ = ["APIError", "ERROR_TYPES", "error_body", "bad_request"]
