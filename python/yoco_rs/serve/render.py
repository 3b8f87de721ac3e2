"""``POST /v1/completions/render`` and ``POST /v1/chat/completions/render`` (vLLM's render endpoints):
the prompt a request would run, template applied and tokenized, without generating.

Prefix-aware routers ask these before choosing a replica (llm-d's token producer, vllm-router's
``cache_aware`` policy, which falls back to ``/tokenize``): they hash the ``token_ids`` in blocks and
look them up in what the replicas' KV events announced. The ids are exactly those the matching
generation request runs (the same validation, template, special tokens and truncation), and the same
as ``/tokenize`` returns for the same prompt or conversation.

The body follows vLLM's: a generate request (``request_id``, ``token_ids``, ``features``,
``sampling_params``, ``model``, ``stream``, ``cache_salt``, ``priority``); the completions form answers
with a list of them, one per prompt, as vLLM does.
"""

from __future__ import annotations

from starlette.requests import Request

from yoco_rs.serve.body import parse_body
from yoco_rs.serve.generation import new_id
from yoco_rs.serve.protocol import ChatCompletionRequest, CompletionRequest
from yoco_rs.serve.chat import chat_inputs
from yoco_rs.serve.completions import completion_inputs
from yoco_rs.serve.validation import Prompt

_SAMPLING_KEYS = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "max_tokens",
                  "min_tokens", "ignore_eos", "logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "skip_special_tokens", "include_stop_str_in_output")


def _generate_request(rid: str, prompt: Prompt, sp, model: str, req) -> dict:
    return {
        "request_id": rid,
        "token_ids": list(prompt.token_ids),
        "features": None,
        "sampling_params": {k: getattr(sp, k) for k in _SAMPLING_KEYS},
        "model": model,
        "stream": bool(req.stream),
        "cache_salt": req.cache_salt,
        "priority": req.priority or 0,
    }


async def render_completion(state, request: Request) -> list[dict]:
    """``POST /v1/completions/render``: one generate request per prompt."""
    req = await parse_body(request, CompletionRequest)
    model, prompts, params = await completion_inputs(state, req)
    rid = new_id("cmpl")
    return [_generate_request(rid if len(prompts) == 1 else f"{rid}-{i}", p, sp, model, req)
            for i, (p, sp) in enumerate(zip(prompts, params))]


async def render_chat_completion(state, request: Request) -> dict:
    """``POST /v1/chat/completions/render``: the conversation rendered by the chat template, tokenized."""
    req = await parse_body(request, ChatCompletionRequest)
    model, prompt, sp, _ = await chat_inputs(state, req)
    return _generate_request(new_id("chatcmpl"), prompt, sp, model, req)


__all__ = ["render_completion", "render_chat_completion"]
