"""Request bodies of the OpenAI-compatible endpoints (pydantic), with vLLM's extra sampling fields.

Field types are strict about kinds (a string is not a number, ``true`` is not ``1``) and lenient
where clients legitimately differ (``100.0`` is accepted as the integer 100, ``stop: null`` is no
stop). Unknown fields are kept (``model_extra``) and ignored, as vLLM does; known fields yoco-serve
does not implement are refused by ``unsupported.reject_unsupported``. Every integer must fit in 64 bits
(larger ones are a 400 here, before they reach an array); tighter ranges are ``SamplingParams``' and
``validation``'s own, so the message is the engine's ("top_p must be in (0, 1], got 0").
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _int(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"must be an integer, got {_show(v)}")
    if isinstance(v, float):
        if not (math.isfinite(v) and v.is_integer()):
            raise ValueError(f"must be an integer, got {v!r}")
        v = int(v)
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"must be an integer in the 64-bit range [-2**63, 2**63 - 1], got {v}")
    return v


def _float(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"must be a number, got {_show(v)}")
    if not math.isfinite(v):
        raise ValueError(f"must be a finite number, got {v!r}")
    return float(v)


def _show(v) -> str:
    if isinstance(v, str):
        return repr(v if len(v) <= 40 else v[:40] + "...")
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, dict)):
        return "an array" if isinstance(v, list) else "an object"
    return repr(v)


Int = Annotated[int, BeforeValidator(_int)]
Float = Annotated[float, BeforeValidator(_float)]
Bool = StrictBool
Str = StrictStr


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds a final usage chunk; ``continuous_usage_stats`` puts usage on
    every chunk."""

    include_usage: Optional[Bool] = False
    continuous_usage_stats: Optional[Bool] = False


class SamplingFields(_Body):
    """Fields shared by completions and chat: OpenAI's plus vLLM's extras at the top level."""

    model: Optional[Str] = None
    n: Int = 1
    best_of: Optional[Int] = None
    temperature: Optional[Float] = None
    top_p: Optional[Float] = None
    top_k: Optional[Int] = None
    min_p: Optional[Float] = None
    seed: Optional[Int] = None
    stop: Optional[Any] = None
    stop_token_ids: Optional[list[Int]] = None
    presence_penalty: Optional[Float] = None
    frequency_penalty: Optional[Float] = None
    repetition_penalty: Optional[Float] = None
    min_tokens: Int = 0
    ignore_eos: Bool = False
    skip_special_tokens: Bool = True
    spaces_between_special_tokens: Bool = True
    include_stop_str_in_output: Bool = False
    stream: Optional[Bool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[Str] = None
    logit_bias: Optional[dict[str, Any]] = None
    allowed_token_ids: Optional[list[Int]] = None
    bad_words: Optional[list[Str]] = None
    prompt_logprobs: Optional[Int] = None
    truncate_prompt_tokens: Optional[Int] = None
    cache_salt: Optional[Str] = None
    priority: Int = 0
    return_tokens_as_token_ids: Optional[Bool] = None
    response_format: Optional[Any] = None
    guided_json: Optional[Any] = None
    guided_regex: Optional[Any] = None
    guided_choice: Optional[Any] = None
    guided_grammar: Optional[Any] = None
    structured_outputs: Optional[Any] = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of strings, a list of token ids or a list
    of lists of token ids (checked in ``validation`` for precise messages)."""

    prompt: Any = Field(...)
    max_tokens: Optional[Int] = 16
    logprobs: Optional[Int] = None
    echo: Optional[Bool] = False
    suffix: Optional[Str] = None
    add_special_tokens: Bool = True


class ChatMessage(_Body):
    """One message of a conversation; ``content`` is text or a list of content parts."""

    role: Str
    content: Optional[Any] = None
    name: Optional[Str] = None


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``. Logprobs use the chat form: ``logprobs: bool`` plus
    ``top_logprobs: int``. ``max_completion_tokens`` (OpenAI's current name) wins over ``max_tokens``."""

    messages: list[ChatMessage] = Field(...)
    max_tokens: Optional[Int] = None
    max_completion_tokens: Optional[Int] = None
    logprobs: Optional[Bool] = False
    top_logprobs: Optional[Int] = None
    echo: Optional[Bool] = False
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[Bool] = None
    add_generation_prompt: Bool = True
    continue_final_message: Bool = False
    add_special_tokens: Bool = False
    chat_template: Optional[Str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None


class TokenizeCompletionRequest(_Body):
    """``POST /tokenize`` with a text ``prompt``."""

    model: Optional[Str] = None
    prompt: Str
    add_special_tokens: Bool = True
    return_token_strs: Optional[Bool] = False


class TokenizeChatRequest(_Body):
    """``POST /tokenize`` with a conversation, rendered by the chat template first."""

    model: Optional[Str] = None
    messages: list[ChatMessage]
    add_generation_prompt: Bool = True
    continue_final_message: Bool = False
    add_special_tokens: Bool = False
    chat_template: Optional[Str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    return_token_strs: Optional[Bool] = False


TokenizeRequest = Union[TokenizeCompletionRequest, TokenizeChatRequest]


class DetokenizeRequest(_Body):
    """``POST /detokenize``: token ids back to text."""

    model: Optional[Str] = None
    tokens: list[Int]


FinishReason = Literal["stop", "length", "abort"]

__all__ = [
    "CompletionRequest",
    "ChatCompletionRequest",
    "ChatMessage",
    "StreamOptions",
    "TokenizeCompletionRequest",
    "TokenizeChatRequest",
    "DetokenizeRequest",
]
