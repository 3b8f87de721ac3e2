"""Request fields yoco-serve knows but does not implement: each is refused with a 400 that names it,
never silently ignored (a client asking for JSON output or a tool call must not get free text).

One table, ``UNSUPPORTED``: the structured-output and tool-calling work replaces its rows with real
implementations. Fields nobody knows are ignored, as vLLM does (``protocol``'s ``extra="allow"``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from yoco_rs.serve.errors import bad_request

STRUCTURED = "(structured output) is not supported by yoco-serve"
TOOLS = "(tool calling) is not supported by yoco-serve"


def _set(v) -> bool:
    """Anything but an absent value (None) asks for the feature."""
    return v is not None


def _nonempty(v) -> bool:
    return v is not None and v != [] and v != {} and v != ""


def _response_format(v) -> Optional[str]:
    if v is None:
        return None
    kind = v.get("type") if isinstance(v, dict) else None
    return None if kind == "text" else f"{kind!r} is not supported by yoco-serve (only {{'type': 'text'}})"


def _tool_choice(v) -> Optional[str]:
    return None if v in (None, "none") else f"{v!r} {TOOLS} (omit it or use 'none')"


def _tools(v, req) -> Optional[str]:
    if not _nonempty(v) or _value(req, "tool_choice") == "none":
        return None
    return f"{TOOLS}; omit tools or set tool_choice to 'none'"


def _modalities(v) -> Optional[str]:
    return None if v is None or v == ["text"] else f"{v!r} is not supported by yoco-serve (only ['text'])"


def _flag(why: str, present: Callable[[Any], bool] = _set) -> Callable[[Any], Optional[str]]:
    return lambda v: why if present(v) else None


#: field -> (endpoints it applies to, check: the value -> None if fine, else why it is refused).
UNSUPPORTED: dict[str, tuple[tuple[str, ...], Callable[[Any], Optional[str]]]] = {
    # structured outputs (issue 15 replaces these)
    "response_format": (("chat", "completion"), _response_format),
    "guided_json": (("chat", "completion"), _flag(STRUCTURED)),
    "guided_regex": (("chat", "completion"), _flag(STRUCTURED)),
    "guided_choice": (("chat", "completion"), _flag(STRUCTURED)),
    "guided_grammar": (("chat", "completion"), _flag(STRUCTURED)),
    "structured_outputs": (("chat", "completion"), _flag(STRUCTURED)),
    # tool calling (issue 15 replaces these)
    "tools": (("chat",), _tools),
    "tool_choice": (("chat",), _tool_choice),
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
            why = check(_value(req, name), req) if check is _tools else check(_value(req, name))
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
