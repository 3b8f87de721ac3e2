"""From a validated request body to what the engine takes: token-id prompts and ``SamplingParams``.

The server tokenizes (and renders chat templates) itself so it can check the context length with the
numbers in the message before anything is queued; the engine then receives token ids. Every problem
is an ``APIError`` 400 naming the parameter. Range checks are ``SamplingParams``' own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from yoco_rs.sampling_params import RequestOutputKind, SamplingParams
from yoco_rs.serve.body import describe_kind as _kind
from yoco_rs.serve.structured import structured_outputs_of
from yoco_rs.serve.errors import APIError, bad_request, from_value_error
from yoco_rs.serve.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields


@dataclass
class Limits:
    """What the loaded engine allows (read once it is ready)."""

    max_model_len: int
    max_logprobs: int
    vocab_size: int


@dataclass
class Prompt:
    """One validated prompt: the ids the engine runs, and its text when known."""

    token_ids: list[int]
    text: Optional[str]
    """The prompt text (given, or decoded from ids when echo needs it)."""


# ---- prompts ----------------------------------------------------------------------------------------

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def completion_prompts(req: CompletionRequest, tokenizer, limits: Limits) -> list[Prompt]:
    """``prompt`` as a string, list of strings, list of ids or list of lists of ids."""
    p = req.prompt
    if isinstance(p, str):
        items = [p]
    elif isinstance(p, list) and p and all(_is_int(t) for t in p):
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
            ids = tokenizer.encode(item, add_special_tokens=req.add_special_tokens)
            out.append(Prompt(ids, item))
        else:
            if not item:
                raise bad_request(f"{where} is an empty list of token ids: give at least one token id", "prompt")
            for t in item:
                if not _is_int(t):
                    raise bad_request(f"{where} must hold integer token ids, got {_kind(t)}", "prompt")
            bad = [t for t in item if t < 0 or t >= limits.vocab_size]
            if bad:
                raise bad_request(f"{where} holds token id {bad[0]}, outside the vocabulary [0, {limits.vocab_size})",
                                  "prompt")
            out.append(Prompt(list(item), None))
    return out


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


def render_chat(tokenizer, messages: list[dict], *, add_generation_prompt: bool, continue_final_message: bool,
                chat_template: Optional[str], chat_template_kwargs: Optional[dict]) -> str:
    """A conversation rendered with the chat template; template errors and conflicting options become 400s."""
    if continue_final_message and add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be true "
                          "(set add_generation_prompt to false to continue the last message)",
                          "continue_final_message")
    kwargs = dict(chat_template_kwargs or {})
    for reserved in ("messages", "add_generation_prompt", "bos_token", "eos_token", "pad_token"):
        kwargs.pop(reserved, None)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                             chat_template=chat_template, **kwargs)
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


def chat_prompt(req: ChatCompletionRequest, tokenizer, default_template: Optional[str], tools=None) -> Prompt:
    """The prompt of a chat request: rendered conversation, tokenized (400 when it is empty). With
    ``tools`` (a ``serve.tools.ToolPlan`` in play) the tools reach the template, by default the shipped
    tool-aware Gemma 3n template."""
    messages = chat_messages(req.messages)
    kwargs = dict(req.chat_template_kwargs or {})
    template = req.chat_template or default_template
    if tools is not None and tools.active:
        from yoco_rs.serve.tools import template_messages, tool_template

        messages = template_messages(messages, req.messages)
        kwargs["tools"] = [{"type": "function", "function": f} for f in tools.tools]
        template = template or tool_template()
    text = render_chat(tokenizer, messages, add_generation_prompt=req.add_generation_prompt,
                       continue_final_message=req.continue_final_message,
                       chat_template=template, chat_template_kwargs=kwargs)
    ids = tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
    if not ids:
        raise bad_request("the rendered conversation is empty", "messages")
    return Prompt(ids, text)


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


# ---- unsupported features -----------------------------------------------------------------------------

def reject_unsupported(req: SamplingFields, *, chat: bool) -> None:
    """A 400 naming the first requested feature yoco-serve does not implement, rather than ignoring it."""
    def no(name, why="is not supported by yoco-serve"):
        raise bad_request(f"{name} {why}", name)

    if req.logit_bias:
        no("logit_bias")
    if req.allowed_token_ids:
        no("allowed_token_ids")
    if req.bad_words:
        no("bad_words")
    # response_format / structured_outputs / guided_*: serve/structured.py (in sampling_params below).
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of is not supported (it must equal n={req.n} or be omitted), got {req.best_of}",
                          "best_of")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if chat:
        assert isinstance(req, ChatCompletionRequest)
        # tools / tool_choice: serve/tools.py (plan_tools in chat.py).
        if req.echo:
            no("echo", "is not supported for chat completions")
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    else:
        assert isinstance(req, CompletionRequest)
        if req.suffix is not None:
            no("suffix")


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
    fields = dict(
        n=req.n,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if req.top_k is None else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
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
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
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


__all__ = ["Limits", "Prompt", "completion_prompts", "chat_prompt", "chat_messages", "render_chat", "truncate",
           "reject_unsupported", "sampling_params", "stop_strings", "context_error"]
