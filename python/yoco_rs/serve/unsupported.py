"""Request fields yoco-serve knows but does not implement: each is refused with a 400 that names it,
never silently ignored (a client asking for JSON output or a tool call must not get free text).

One table, ``UNSUPPORTED``. Structured outputs and tools are implemented (``serve/structured.py``,
``serve/tools.py``); fields nobody knows are ignored, as vLLM does (``protocol``'s ``extra="allow"``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from yoco_rs.serve.errors import bad_request

TOOLS = "(tool calling) is not supported by yoco-serve"


def _set(v) -> bool:
    """Anything but an absent value (None) asks for the feature."""
    return v is not None


def _nonempty(v) -> bool:
    return v is not None and v != [] and v != {} and v != ""


def _modalities(v) -> Optional[str]:
    return None if v is None or v == ["text"] else f"{v!r} is not supported by yoco-serve (only ['text'])"


def _flag(why: str, present: Callable[[Any], bool] = _set) -> Callable[[Any], Optional[str]]:
    return lambda v: why if present(v) else None


#: field -> (endpoints it applies to, check: the value -> None if fine, else why it is refused).
UNSUPPORTED: dict[str, tuple[tuple[str, ...], Callable[[Any], Optional[str]]]] = {
    # response_format, structured_outputs, guided_*: serve/structured.py; tools, tool_choice: serve/tools.py
    # legacy function calling (before tools)
    "functions": (("chat",), _flag(f"{TOOLS}; omit functions", _nonempty)),
    "function_call": (("chat",), _flag(TOOLS)),
    # sampling controls the sampler does not implement
    "logit_bias": (("chat", "completion"), _flag("is not supported by yoco-serve", _nonempty)),
    "allowed_token_ids": (("chat", "completion"), _flag("is not supported by yoco-serve", _nonempty)),
    "bad_words": (("chat", "completion"), _flag("is not supported by yoco-serve", _nonempty)),
    # other OpenAI features
    "suffix": (("completion",), _flag("is not supported by yoco-serve")),
    "echo": (("chat",), _flag("is not supported for chat completions", lambda v: bool(v))),
    "audio": (("chat",), _flag("(audio output) is not supported by yoco-serve")),
    "modalities": (("chat",), _modalities),
    "prediction": (("chat",), _flag("(predicted outputs) is not supported by yoco-serve")),
    "web_search_options": (("chat",), _flag("is not supported by yoco-serve")),
}


def _value(req, name: str):
    v = getattr(req, name, None)
    if v is None and req.model_extra:
        v = req.model_extra.get(name)
    return v


def reject_unsupported(req, *, chat: bool) -> None:
    """A 400 naming the first requested feature yoco-serve does not implement, rather than ignoring it
    (plus the field combinations that make no sense)."""
    endpoint = "chat" if chat else "completion"
    for name, (endpoints, check) in UNSUPPORTED.items():
        if endpoint in endpoints:
            why = check(_value(req, name))
            if why is not None:
                raise bad_request(f"{name} {why}", name)
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of is not supported (it must equal n={req.n} or be omitted), got {req.best_of}",
                          "best_of")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if chat and req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")


__all__ = ["UNSUPPORTED", "reject_unsupported"]
