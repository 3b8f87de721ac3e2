"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes (routers such as vllm-router's
cache_aware policy call ``/tokenize`` to match prefixes on tokens)."""

from __future__ import annotations

from starlette.requests import Request

from yoco_rs.serve.body import read_json, validate
from yoco_rs.serve.errors import bad_request
from yoco_rs.serve.protocol import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest
from yoco_rs.serve.validation import chat_messages, encode_text, render_chat, request_chat_template


async def tokenize(state, request: Request) -> dict:
    """``POST /tokenize``: the ids (and optionally token strings) of a prompt or rendered conversation, with the
    context limit so clients can budget."""
    obj = await read_json(request)
    chat = "messages" in obj
    if not chat and "prompt" not in obj:
        raise bad_request("give 'prompt' (text) or 'messages' (a conversation) to tokenize", "prompt")
    req = validate(obj, TokenizeChatRequest if chat else TokenizeCompletionRequest)
    state.check_model(req.model)
    state.ensure_serving()
    tok = state.engine.tokenizer
    limits = state.limits()
    if chat:
        template = request_chat_template(req, state.settings)
        text = await state.offload(
            lambda: render_chat(tok, chat_messages(req.messages), add_generation_prompt=req.add_generation_prompt,
                                continue_final_message=req.continue_final_message, chat_template=template,
                                chat_template_kwargs=req.chat_template_kwargs, budget=state.template_budget()))
    else:
        text = req.prompt
    # Refuse what cannot fit the context before tokenizing it (off the event loop).
    ids = await state.offload(lambda: encode_text(tok, text, add_special_tokens=req.add_special_tokens,
                                                  truncate_to=None, limits=limits, where="prompt",
                                                  param="messages" if chat else "prompt"))
    body = {"count": len(ids), "max_model_len": state.limits().max_model_len, "tokens": ids}
    if req.return_token_strs:
        body["token_strs"] = tok.convert_ids_to_tokens(ids)
    return body


async def detokenize(state, request: Request) -> dict:
    """``POST /detokenize``: ids back to text (special tokens kept); ids outside the vocabulary are a 400."""
    req = validate(await read_json(request), DetokenizeRequest)
    state.check_model(req.model)
    state.ensure_serving()
    vocab = state.limits().vocab_size
    bad = [t for t in req.tokens if t < 0 or t >= vocab]
    if bad:
        raise bad_request(f"tokens holds token id {bad[0]}, outside the vocabulary [0, {vocab})", "tokens")
    tok = state.engine.tokenizer
    return {"prompt": await state.offload(lambda: tok.decode(req.tokens, skip_special_tokens=False))}


__all__ = ["tokenize", "detokenize"]
