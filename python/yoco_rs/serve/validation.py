"""From a validated request body to what the engine takes: token-id prompts and ``SamplingParams``.

The server tokenizes (and renders chat templates) itself so it can check the context length with the
numbers in the message before anything is queued; the engine then receives token ids. Every problem
is an ``APIError`` 400 naming the parameter. Range checks are ``SamplingParams``' own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from yoco_rs.checks import is_int
from yoco_rs.sampling_params import RequestOutputKind, SamplingParams
from yoco_rs.serve.body import describe_kind as _kind
from yoco_rs.serve.structured import structured_outputs_of
from yoco_rs.serve.errors import APIError, bad_request, from_value_error
from yoco_rs.serve.protocol import INT32_MAX, INT32_MIN, ChatCompletionRequest, ChatMessage, CompletionRequest, \
    SamplingFields


@dataclass
class Limits:
    """What the loaded engine allows (read once it is ready)."""

    max_model_len: int
    max_logprobs: int
    vocab_size: int
    max_prompt_chars: int = 1 << 62
    """Texts longer than this cannot fit the context (more tokens than ``max_model_len`` for sure):
    refused without tokenizing them."""
    max_n: int = 128
    max_prompts: int = 256
    priority_scheduling: bool = False
    sampling_defaults: dict = field(default_factory=dict)
    """Defaults of the sampling fields a request leaves unset (the generation config, ``--generation-config``)."""


@dataclass
class Prompt:
    """One validated prompt: the ids the engine runs, and its text when known."""

    token_ids: list[int]
    text: Optional[str]
    """The prompt text (given, or decoded from ids when echo needs it)."""
    mm_items: list = field(default_factory=list)
    """Processed image / audio items whose placeholder runs are in ``token_ids`` (chat content parts)."""


# ---- prompts ----------------------------------------------------------------------------------------


def request_limits(req: SamplingFields, limits: Limits, *, chat: bool) -> None:
    """The server's caps that do not need the prompt: ``n``, prompts per request, ``priority`` (only
    under priority scheduling, in the scheduler's 32-bit range), ``top_k`` and ``truncate_prompt_tokens``
    (values that reach fixed-width arrays)."""
    if req.n > limits.max_n:
        raise bad_request(f"n must be <= {limits.max_n} (the server's --max-n), got {req.n}", "n")
    if not chat:
        p = req.prompt
        if isinstance(p, list) and len(p) > limits.max_prompts and not all(is_int(t) for t in p):
            raise bad_request(f"prompt holds {len(p)} prompts; at most {limits.max_prompts} per request (the "
                              "server's --max-prompts-per-request)", "prompt")
    if req.priority != 0 and not limits.priority_scheduling:
        raise bad_request(f"priority is only supported with --scheduling-policy priority (this server schedules "
                          f"first come, first served), got {req.priority}", "priority")
    if not INT32_MIN <= req.priority <= INT32_MAX:
        raise bad_request(f"priority must be in [-2**31, 2**31 - 1], got {req.priority}", "priority")
    if req.top_k is not None and req.top_k > INT32_MAX:
        raise bad_request(f"top_k must be 0 or -1 (disabled) or in [1, 2**31 - 1], got {req.top_k}", "top_k")
    k = req.truncate_prompt_tokens
    if k is not None and k > limits.max_model_len:
        raise bad_request(f"truncate_prompt_tokens must be <= max_model_len ({limits.max_model_len}), got {k}",
                          "truncate_prompt_tokens")


def _too_long(where: str, chars: int, limits: Limits, param: str) -> APIError:
    return bad_request(f"{where} is too long: {chars} characters make more than {limits.max_model_len} tokens, "
                       f"this model's maximum context length", param)


def encode_text(tokenizer, text: str, *, add_special_tokens: bool, truncate_to: Optional[int], limits: Limits,
                where: str, param: str) -> list[int]:
    """Token ids of a prompt text, without tokenizing what cannot fit: a text over
    ``limits.max_prompt_chars`` is a 400 at once; with ``truncate_to`` only its tail is tokenized
    (enough characters for ``truncate_to`` + 16 tokens, so the cut falls among tokens dropped anyway)."""
    per_token = max(1, limits.max_prompt_chars // max(1, limits.max_model_len))
    if truncate_to is not None:
        tail = (truncate_to + 16) * per_token
        if len(text) > tail:
            return tokenizer.encode(text[-tail:], add_special_tokens=False)
    elif len(text) > limits.max_prompt_chars:
        raise _too_long(where, len(text), limits, param)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def completion_prompts(req: CompletionRequest, tokenizer, limits: Limits) -> list[Prompt]:
    """``prompt`` as a string, list of strings, list of ids or list of lists of ids (thread-safe: the
    server runs it off the event loop)."""
    p = req.prompt
    if isinstance(p, str):
        items = [p]
    elif isinstance(p, list) and p and all(is_int(t) for t in p):
        items = [p]
    elif isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        items = p
    elif isinstance(p, list) and not p:
        raise bad_request("prompt is an empty list: give a string, a list of strings, a list of token ids "
                          "or a list of lists of token ids", "prompt")
    else:
        raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of lists "
                          f"of token ids, got {_kind(p)}", "prompt")
    out = []
    for i, item in enumerate(items):
        where = "prompt" if len(items) == 1 else f"prompt[{i}]"
        if isinstance(item, str):
            if item == "":
                raise bad_request(f"{where} is empty: give at least one character or token id", "prompt")
            ids = encode_text(tokenizer, item, add_special_tokens=req.add_special_tokens,
                              truncate_to=_truncate_k(req.truncate_prompt_tokens, limits), limits=limits,
                              where=where, param="prompt")
            out.append(Prompt(ids, item))
        else:
            if not item:
                raise bad_request(f"{where} is an empty list of token ids: give at least one token id", "prompt")
            for t in item:
                if not is_int(t):
                    raise bad_request(f"{where} must hold integer token ids, got {_kind(t)}", "prompt")
            bad = [t for t in item if t < 0 or t >= limits.vocab_size]
            if bad:
                raise bad_request(f"{where} holds token id {bad[0]}, outside the vocabulary [0, {limits.vocab_size})",
                                  "prompt")
            out.append(Prompt(list(item), None))
    return out


def _truncate_k(k: Optional[int], limits: Limits) -> Optional[int]:
    return limits.max_model_len if k == -1 else k


def chat_messages(messages: Sequence[ChatMessage]) -> list[dict]:
    """Messages as template input: text parts joined; anything but text is refused by name."""
    if not messages:
        raise bad_request("messages is empty: give at least one {'role': ..., 'content': ...}", "messages")
    out = []
    for i, m in enumerate(messages):
        c = m.content
        if c is None:
            text = ""
        elif isinstance(c, str):
            text = c
        elif isinstance(c, list):
            texts = []
            for j, part in enumerate(c):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(f"messages[{i}].content[{j}]: only text parts "
                                      f"({{'type': 'text', 'text': ...}}) are supported, got "
                                      f"{kind if kind else _kind(part)!r}", "messages")
                texts.append(part["text"])
            text = "\n".join(texts)
        else:
            raise bad_request(f"messages[{i}].content must be a string or a list of text parts, got {_kind(c)}",
                              "messages")
        d = {"role": m.role, "content": text}
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def request_chat_template(req, settings) -> Optional[str]:
    """The template a request renders with: its own ``chat_template`` only where the server trusts
    request templates (vLLM's ``--trust-request-chat-template``; templates are code), else a 400."""
    if req.chat_template is not None and not settings.trust_request_chat_template:
        raise bad_request("chat_template in a request is refused: templates are code, and this server does not "
                          "trust request templates (start it with --trust-request-chat-template)", "chat_template")
    if req.chat_template_kwargs and "chat_template" in req.chat_template_kwargs \
            and not settings.trust_request_chat_template:
        raise bad_request("chat_template_kwargs.chat_template is refused (see chat_template)", "chat_template_kwargs")
    return req.chat_template or settings.chat_template


def render_chat(tokenizer, messages: list[dict], *, add_generation_prompt: bool, continue_final_message: bool,
                chat_template: Optional[str], chat_template_kwargs: Optional[dict], budget=None) -> str:
    """A conversation rendered with the chat template (under ``budget``); template errors, a blown budget
    and conflicting options become 400s."""
    if continue_final_message and add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be true "
                          "(set add_generation_prompt to false to continue the last message)",
                          "continue_final_message")
    kwargs = dict(chat_template_kwargs or {})
    for reserved in ("messages", "add_generation_prompt", "bos_token", "eos_token", "pad_token"):
        kwargs.pop(reserved, None)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                             chat_template=chat_template, budget=budget, **kwargs)
    except APIError:
        raise
    except Exception as e:  # template errors (jinja, raise_exception) are the request's fault
        msg = str(e)
        raise bad_request(msg if msg.startswith("chat template") else f"chat template error: {msg}",
                          "messages") from None
    if continue_final_message:
        last = messages[-1]["content"].strip()
        cut = text.rfind(last) if last else -1
        if cut >= 0:
            text = text[:cut + len(last)]
    return text


def chat_prompt(req: ChatCompletionRequest, tokenizer, template: Optional[str], limits: Limits,
                budget=None, tools=None, media=None) -> Prompt:
    """The prompt of a chat request: rendered conversation (under ``budget``), tokenized (400 when it is
    empty or cannot fit). Thread-safe: the server runs it off the event loop. With ``tools`` (a
    ``serve.tools.ToolPlan`` in play) the tools reach the template, by default the shipped tool-aware
    Gemma 3n template. ``media`` (a ``chat_media.MediaContext``, multimodal checkpoints): image and audio
    content parts are fetched, decoded and processed, and their placeholders expanded."""
    from yoco_rs.serve import chat_media

    refs = []
    if media is not None and chat_media.has_media(req.messages):
        messages, refs = chat_media.split_messages(req.messages)
        chat_media.check_limits(refs, media.limits)
    else:
        messages = chat_messages(req.messages)
    kwargs = dict(req.chat_template_kwargs or {})
    if tools is not None and tools.tools:
        from yoco_rs.serve.tools import template_messages, tool_template

        messages = template_messages(messages, req.messages)
        kwargs["tools"] = [{"type": "function", "function": f} for f in tools.tools]
        template = template or tool_template()
    text = render_chat(tokenizer, messages, add_generation_prompt=req.add_generation_prompt,
                       continue_final_message=req.continue_final_message, chat_template=template,
                       chat_template_kwargs=kwargs, budget=budget)
    items = []
    expanded = text
    if refs:
        items = chat_media.resolve(refs, media)
        try:
            expanded = media.processor.expand_text(text, items)
        except ValueError as e:
            raise bad_request(f"{e} (does the chat template render image/audio parts?)", "messages") from None
        if req.truncate_prompt_tokens is not None:
            raise bad_request("truncate_prompt_tokens cannot be combined with image or audio parts (truncation "
                              "could cut a placeholder run)", "truncate_prompt_tokens")
    ids = encode_text(tokenizer, expanded, add_special_tokens=req.add_special_tokens,
                      truncate_to=_truncate_k(req.truncate_prompt_tokens, limits), limits=limits,
                      where="the rendered conversation", param="messages")
    if not ids:
        raise bad_request("the rendered conversation is empty", "messages")
    if items:
        try:
            media.processor.locate(ids, items)
        except ValueError as e:
            raise bad_request(str(e), "messages") from None
    return Prompt(ids, text, items)


def truncate(prompt: Prompt, k: Optional[int], limits: Limits) -> Prompt:
    """vLLM's ``truncate_prompt_tokens``: keep the last k tokens (-1: the context length)."""
    if k is None:
        return prompt
    if k == -1:
        k = limits.max_model_len
    if k < 1:
        raise bad_request(f"truncate_prompt_tokens must be -1 or an integer >= 1, got {k}", "truncate_prompt_tokens")
    if len(prompt.token_ids) <= k:
        return prompt
    return Prompt(prompt.token_ids[-k:], None)


# ---- sampling params --------------------------------------------------------------------------------

def stop_strings(stop) -> Optional[list[str]]:
    """``stop`` as a list of non-empty strings (None for none); other shapes are a 400."""
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop] if stop else None
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s] or None
    raise bad_request(f"stop must be a string, a list of strings or null, got {_kind(stop)}", "stop")


def context_error(limits: Limits, prompt_len: int, max_tokens: Optional[int], prompt_param: str) -> APIError:
    """vLLM's wording, with the numbers and the value that would fit."""
    n = limits.max_model_len
    if prompt_len >= n:
        asked = (f" and you requested {max_tokens} output tokens, for a total of {prompt_len + max_tokens} tokens"
                 if max_tokens is not None else "")
        return bad_request(
            f"This model's maximum context length is {n} tokens. However, your prompt contains {prompt_len} "
            f"input tokens{asked}. The prompt must be at most {n - 1} tokens to leave room for at least one "
            f"output token; please reduce the length of the prompt.", prompt_param)
    return bad_request(
        f"This model's maximum context length is {n} tokens. However, you requested {max_tokens} output tokens "
        f"and your prompt contains {prompt_len} input tokens, for a total of {prompt_len + max_tokens} tokens. "
        f"Please reduce the length of the prompt or the number of requested output tokens "
        f"(max_tokens <= {n - prompt_len} fits this prompt).", "max_tokens")


def sampling_params(req: SamplingFields, *, prompt_len: int, limits: Limits, max_tokens: Optional[int],
                    logprobs: Optional[int], stream: bool, prompt_param: str, constraint=None) -> SamplingParams:
    """``SamplingParams`` for one prompt; ``max_tokens`` None means "the rest of the context"."""
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"max_tokens must be an integer >= 1 (or omitted for up to the context length), "
                          f"got {max_tokens}", "max_tokens")
    room = limits.max_model_len - prompt_len
    if room < 1:
        raise context_error(limits, prompt_len, max_tokens, prompt_param)
    if max_tokens is not None and max_tokens > room:
        raise context_error(limits, prompt_len, max_tokens, prompt_param)
    if logprobs is not None and logprobs > limits.max_logprobs:
        raise bad_request(f"logprobs must be <= max_logprobs ({limits.max_logprobs}; the server's --max-logprobs), "
                          f"got {logprobs}", "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs")
    if req.prompt_logprobs is not None and req.prompt_logprobs > limits.max_logprobs:
        raise bad_request(f"prompt_logprobs must be <= max_logprobs ({limits.max_logprobs}; the server's "
                          f"--max-logprobs), got {req.prompt_logprobs}", "prompt_logprobs")
    bad = [t for t in (req.stop_token_ids or ()) if t < 0 or t >= limits.vocab_size]
    if bad:
        raise bad_request(f"stop_token_ids holds {bad[0]}, outside the vocabulary [0, {limits.vocab_size})",
                          "stop_token_ids")
    d = limits.sampling_defaults

    def pick(name: str, default):
        v = getattr(req, name)
        return d.get(name, default) if v is None else v

    fields = dict(
        n=req.n,
        temperature=pick("temperature", 1.0),
        top_p=pick("top_p", 1.0),
        top_k=pick("top_k", 0),
        min_p=pick("min_p", 0.0),
        seed=req.seed,
        stop=stop_strings(req.stop),
        stop_token_ids=req.stop_token_ids,
        max_tokens=room if max_tokens is None else max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=req.prompt_logprobs,
        presence_penalty=0.0 if req.presence_penalty is None else req.presence_penalty,
        frequency_penalty=0.0 if req.frequency_penalty is None else req.frequency_penalty,
        repetition_penalty=pick("repetition_penalty", 1.0),
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=structured_outputs_of(req, constraint),
    )
    try:
        return SamplingParams(**fields)
    except (ValueError, TypeError) as e:
        raise from_value_error(e) from None


__all__ = ["Limits", "Prompt", "request_limits", "encode_text", "request_chat_template", "completion_prompts", "chat_prompt", "chat_messages", "render_chat", "truncate",
           "sampling_params", "stop_strings", "context_error"]
