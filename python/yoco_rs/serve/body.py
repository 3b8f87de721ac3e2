"""Read a request body into a protocol model, turning every way it can be wrong into a 400 that says
what is wrong and where (invalid UTF-8 with the byte offset, malformed JSON with line and column, a
missing or mistyped field by name). FastAPI's own body parsing is not used: it answers 422."""

from __future__ import annotations

import json
import re
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from yoco_rs.serve.errors import APIError, bad_request

M = TypeVar("M", bound=BaseModel)

# A JSON escape of a surrogate code point: the only way a lone surrogate (which no UTF-8 text can hold,
# and which would fail later, at tokenization or in the response) gets into a parsed body.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


async def read_json(request: Request) -> dict:
    """The request body as a JSON object, or a 400 that says what is wrong with it (empty, not UTF-8, not
    JSON, not an object)."""
    raw = await request.body()
    if not raw.strip():
        raise bad_request("request body is empty: send a JSON object (Content-Type: application/json)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} "
                          f"({e.reason}); JSON bodies must be UTF-8") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno} "
                          f"(char {e.pos})") from None
    except RecursionError:
        raise bad_request("request body is not valid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise bad_request(f"request body must be a JSON object, got {describe_kind(obj)}")
    if _SURROGATE_ESCAPE.search(text):
        _reject_lone_surrogates(obj)
    return obj


def _reject_lone_surrogates(obj, path: str = "") -> None:
    """400 naming the first string (or key) holding a lone UTF-16 surrogate (``"\\ud800"`` with no pair)."""
    stack = [(obj, path)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                field = (where or "body").encode("utf-8", "backslashreplace").decode("utf-8")
                raise bad_request(f"{field} holds a lone UTF-16 surrogate (\\u{ord(v[e.start]):04x} at character "
                                  f"{e.start}), which is not valid Unicode", field.split(".")[0].split("[")[0])
        elif isinstance(v, dict):
            for k, x in v.items():
                stack.append((k, where or "body"))
                stack.append((x, f"{where}.{k}" if where else str(k)))
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]") for i, x in enumerate(v))


async def parse_body(request: Request, model: type[M]) -> M:
    """The request body validated into ``model`` (400 naming the offending field otherwise)."""
    return validate(await read_json(request), model)


def validate(obj: dict, model: type[M]) -> M:
    """``obj`` validated into ``model``; pydantic's errors become one OpenAI-shaped 400."""
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise validation_error(e) from None


def validation_error(e: ValidationError) -> APIError:
    """pydantic's errors as one readable 400 whose ``param`` is the first offending field."""
    errors = e.errors(include_url=False)
    parts, first_param = [], None
    for err in errors[:4]:
        loc = [str(x) for x in err["loc"] if not _is_union_tag(x)]
        param = ".".join(loc) if loc else None
        first_param = first_param or param
        parts.append(_describe(err, param))
    more = f" (and {len(errors) - 4} more)" if len(errors) > 4 else ""
    return bad_request("; ".join(parts) + more, param=first_param)


def _is_union_tag(x) -> bool:
    # pydantic inserts the union member's type name into loc ("int", "list[str]"...)
    return isinstance(x, str) and (x in ("int", "float", "str", "bool") or "[" in x or x.startswith("function-"))


def _describe(err: dict, param) -> str:
    kind = err["type"]
    name = param or "body"
    if kind == "missing":
        return f"missing required field '{name}'"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        return f"{name} {msg}" if msg.startswith("must") else f"{name}: {msg}"
    got = err.get("input")
    return f"{name}: {msg} (got {_brief(got)})"


def _brief(v) -> str:
    if isinstance(v, str):
        return repr(v if len(v) <= 40 else v[:40] + "...")
    if isinstance(v, (list, dict)):
        return describe_kind(v)
    return json.dumps(v) if isinstance(v, (bool, int, float, type(None))) else type(v).__name__


def describe_kind(v) -> str:
    """'an object', 'an array', 'a string', ... for messages about a JSON value."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


__all__ = ["read_json", "parse_body", "validate", "validation_error", "describe_kind"]
