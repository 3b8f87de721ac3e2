"""``POST /v1/chat/completions``: the conversation rendered with the chat template, then one prompt
with ``n`` samples. Streaming sends, per choice, a first chunk with ``delta.role = "assistant"``, then
content deltas, and the choice's last chunk carries ``finish_reason``."""

from __future__ import annotations

from starlette.requests import Request

from yoco_rs.serve.body import parse_body
from yoco_rs.serve.generation import final_outputs, new_id, now, stream_error_body, submit, usage
from yoco_rs.serve.logprobs import TokenText, chat_logprobs, prompt_logprobs_json
from yoco_rs.serve.protocol import ChatCompletionRequest
from yoco_rs.serve.unsupported import reject_unsupported
from yoco_rs.serve.sse import DONE, EventStream, cancel_on_disconnect, merge, sse
from yoco_rs.serve.tool_stream import ToolCallStream, merge_deltas
from yoco_rs.serve.tools import finish_reason as tool_finish, parse_tool_calls, plan_tools, tool_constraint
from yoco_rs.serve.validation import chat_prompt, request_chat_template, request_limits, sampling_params, truncate


async def create_chat_completion(state, request: Request):
    """``POST /v1/chat/completions``: render the conversation, submit ``n`` choices, answer with one JSON
    body or an SSE stream of ``chat.completion.chunk``s."""
    req = await parse_body(request, ChatCompletionRequest)
    model, prompt, sp, tools = await chat_inputs(state, req)
    stream = bool(req.stream)
    state.observe_params(req.n, sp.max_tokens)
    rid = new_id("chatcmpl")
    streams = await submit(state, [prompt], [sp], rid, priority=req.priority, cache_salt=req.cache_salt)
    ctx = _Ctx(state, req, model, rid, len(prompt.token_ids), tools)
    if stream:
        return EventStream(ctx.chunks(streams))
    (out,) = await cancel_on_disconnect(request, final_outputs(state, streams))
    return ctx.response(out)


async def chat_inputs(state, req: ChatCompletionRequest):
    """The served model name, the rendered and tokenized conversation (off the event loop, within the
    template budget, truncated, with the tools in play), its sampling parameters (with the tool-call
    grammar when tools are forced) and the tool plan: what ``/v1/chat/completions`` runs and
    ``/v1/chat/completions/render`` shows."""
    model = state.check_model(req.model)
    state.ensure_serving()
    reject_unsupported(req, chat=True)
    limits = state.limits()
    request_limits(req, limits, chat=True)
    tools = plan_tools(req, auto_enabled=state.settings.enable_auto_tool_choice,
                       parser=state.settings.tool_call_parser)
    template = request_chat_template(req, state.settings)
    prompt = await state.offload(chat_prompt, req, state.engine.tokenizer, template, limits, state.template_budget(),
                                 tools, state.media())
    prompt = truncate(prompt, req.truncate_prompt_tokens, limits)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    sp = sampling_params(req, prompt_len=len(prompt.token_ids), limits=limits, max_tokens=max_tokens,
                         logprobs=logprobs, stream=bool(req.stream), prompt_param="messages",
                         constraint=tool_constraint(tools))
    return model, prompt, sp, tools


class _Ctx:
    def __init__(self, state, req: ChatCompletionRequest, model: str, rid: str, prompt_len: int, tools):
        self.state, self.req, self.model, self.rid, self.prompt_len = state, req, model, rid, prompt_len
        self.tools = tools
        self.created = now()
        self.top_n = req.top_logprobs or 0
        self.text = TokenText(state.engine.tokenizer, bool(req.return_tokens_as_token_ids or
                                                           state.settings.return_tokens_as_token_ids))

    def response(self, out) -> dict:
        choices, completion_tokens = [], 0
        for co in sorted(out.outputs, key=lambda c: c.index):
            completion_tokens += len(co.token_ids)
            logprobs = chat_logprobs(co.token_ids, co.logprobs, self.top_n, self.text) if self.req.logprobs else None
            message = {"role": "assistant", "content": co.text}
            reason = co.finish_reason
            if self.tools.active:
                content, calls = parse_tool_calls(co.text, self.tools)
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = tool_finish(reason, self.tools, calls)
            choices.append({"index": co.index, "message": message,
                            "logprobs": logprobs, "finish_reason": reason, "stop_reason": co.stop_reason})
        body = {"id": self.rid, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": choices,
                "usage": usage(self.prompt_len, completion_tokens, int(out.num_cached_tokens or 0))}
        if self.req.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
        return body

    def _chunk(self, choices, usage_block=None) -> str:
        c = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
             "choices": choices}
        if usage_block is not None:
            c["usage"] = usage_block
        return sse(c)

    async def chunks(self, streams):
        req = self.req
        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        gen_tokens, cached = 0, 0
        started: set[int] = set()
        calls: dict[int, ToolCallStream] = {}  # tools in play: each choice's streamed calls
        merged = merge(streams)
        try:
            async for _, out in merged:
                cached = max(cached, int(out.num_cached_tokens or 0))
                for co in out.outputs:
                    idx = co.index
                    toks = co.delta_token_ids
                    if idx not in started:
                        started.add(idx)
                        cont = usage(self.prompt_len, gen_tokens, cached) if continuous else None
                        yield self._chunk([{"index": idx, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}], cont)
                    gen_tokens += len(toks)
                    cont = usage(self.prompt_len, gen_tokens, cached) if continuous else None
                    if not co.delta_text and not toks and co.finish_reason is None:
                        continue
                    logprobs = chat_logprobs(toks, co.delta_logprobs, self.top_n, self.text) if req.logprobs else None
                    delta = {"content": co.delta_text} if (co.delta_text or co.finish_reason is None) else {}
                    reason = co.finish_reason
                    if self.tools.active:
                        # Calls stream as they are generated: a call's first delta names it, later ones
                        # carry fragments of its arguments (serve/tool_stream.py); other text is content.
                        ts = calls.get(idx)
                        if ts is None:
                            ts = calls[idx] = ToolCallStream(self.tools)
                        content, tcs = ts.feed(co.delta_text or "")
                        if reason is not None:
                            more, tail = ts.end()
                            content += more
                            tcs = merge_deltas(tcs + tail)
                            reason = tool_finish(reason, self.tools, ts.calls)
                        delta = {"content": content} if content else {}
                        if tcs:
                            delta["tool_calls"] = tcs
                        if not delta and reason is None and logprobs is None:
                            continue
                    yield self._chunk([{"index": idx, "delta": delta, "logprobs": logprobs,
                                        "finish_reason": reason, "stop_reason": co.stop_reason}], cont)
            if include_usage:
                yield self._chunk([], usage(self.prompt_len, gen_tokens, cached))
        except Exception as e:
            yield sse(stream_error_body(self.state, e))
        finally:
            await merged.aclose()
        yield DONE


__all__ = ["create_chat_completion"]
