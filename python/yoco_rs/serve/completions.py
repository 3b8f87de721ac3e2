"""``POST /v1/completions``: one or several prompts, ``n`` samples each, streaming or not.

Choice ``index`` is ``prompt_index * n + sample_index`` (OpenAI's layout). ``usage`` counts each
prompt once and every generated token of every sample; ``prompt_tokens_details.cached_tokens`` is the
number of prompt tokens served from the prefix cache (sub-block hits included).
"""

from __future__ import annotations

from starlette.requests import Request

from yoco_rs.serve.body import parse_body
from yoco_rs.serve.generation import final_outputs, new_id, now, stream_error_body, submit, usage
from yoco_rs.serve.logprobs import CompletionLogprobs, TokenText, merge_blocks, prompt_logprobs_json
from yoco_rs.serve.protocol import CompletionRequest
from yoco_rs.serve.unsupported import reject_unsupported
from yoco_rs.serve.sse import DONE, EventStream, cancel_on_disconnect, merge, sse
from yoco_rs.serve.validation import completion_prompts, request_limits, sampling_params, truncate


async def create_completion(state, request: Request):
    """``POST /v1/completions``: submit every prompt times ``n``, answer with one JSON body or an SSE stream
    of ``text_completion`` chunks."""
    req = await parse_body(request, CompletionRequest)
    model, prompts, params = await completion_inputs(state, req)
    tok = state.engine.tokenizer
    stream = bool(req.stream)
    for p in prompts:
        if req.echo and p.text is None:
            p.text = tok.decode(p.token_ids, skip_special_tokens=False)
    state.observe_params(req.n, params[0].max_tokens)
    rid = new_id("cmpl")
    streams = await submit(state, prompts, params, rid, priority=req.priority, cache_salt=req.cache_salt)
    ctx = _Ctx(state, req, model, rid, prompts)
    if stream:
        return EventStream(ctx.chunks(streams))
    outs = await cancel_on_disconnect(request, final_outputs(state, streams))
    return ctx.response(outs)


async def completion_inputs(state, req: CompletionRequest):
    """The served model name, the prompts (validated, tokenized off the event loop, truncated) and their
    sampling parameters: what ``/v1/completions`` runs and ``/v1/completions/render`` shows."""
    model = state.check_model(req.model)
    state.ensure_serving()
    reject_unsupported(req, chat=False)
    limits = state.limits()
    request_limits(req, limits, chat=False)
    prompts = [truncate(p, req.truncate_prompt_tokens, limits)
               for p in await state.offload(completion_prompts, req, state.engine.tokenizer, limits)]
    echo_lp = bool(req.echo) and req.logprobs is not None
    params = []
    for p in prompts:
        sp = sampling_params(req, prompt_len=len(p.token_ids), limits=limits, max_tokens=req.max_tokens,
                             logprobs=req.logprobs, stream=bool(req.stream), prompt_param="prompt")
        if echo_lp and (sp.prompt_logprobs is None or sp.prompt_logprobs < req.logprobs):
            sp = sp.replace(prompt_logprobs=req.logprobs)
        params.append(sp)
    return model, prompts, params


class _Ctx:
    def __init__(self, state, req: CompletionRequest, model: str, rid: str, prompts):
        self.state, self.req, self.model, self.rid, self.prompts = state, req, model, rid, prompts
        self.created = now()
        self.text = TokenText(state.engine.tokenizer, bool(req.return_tokens_as_token_ids or
                                                           state.settings.return_tokens_as_token_ids))

    def _echo_block(self, lp: CompletionLogprobs, i: int, plp) -> dict:
        return lp.block(self.prompts[i].token_ids, plp)

    # ---- non-streaming --------------------------------------------------------------------------
    def response(self, outs) -> dict:
        req, n = self.req, self.req.n
        choices, prompt_tokens, completion_tokens, cached = [], 0, 0, 0
        for i, out in enumerate(outs):
            prompt_tokens += len(self.prompts[i].token_ids)
            cached += int(out.num_cached_tokens or 0)
            for co in sorted(out.outputs, key=lambda c: c.index):
                completion_tokens += len(co.token_ids)
                text = co.text
                logprobs = None
                if req.logprobs is not None:
                    lp = CompletionLogprobs(self.text)
                    if req.echo:
                        head = self._echo_block(lp, i, out.prompt_logprobs)
                        logprobs = merge_blocks(head, lp.block(co.token_ids, co.logprobs))
                    else:
                        logprobs = lp.block(co.token_ids, co.logprobs)
                if req.echo:
                    text = self.prompts[i].text + text
                choice = {"index": i * n + co.index, "text": text, "logprobs": logprobs,
                          "finish_reason": co.finish_reason, "stop_reason": co.stop_reason}
                if req.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
                choices.append(choice)
        return {"id": self.rid, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices, "usage": usage(prompt_tokens, completion_tokens, cached)}

    # ---- streaming --------------------------------------------------------------------------------
    async def chunks(self, streams):
        req, n = self.req, self.req.n
        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        prompt_lens = [len(p.token_ids) for p in self.prompts]
        gen_tokens = [0] * len(self.prompts)
        cached = [0] * len(self.prompts)
        lps: dict[int, CompletionLogprobs] = {}
        started: set[int] = set()
        plps: dict[int, object] = {}
        merged = merge(streams)
        try:
            async for i, out in merged:
                cached[i] = max(cached[i], int(out.num_cached_tokens or 0))
                if out.prompt_logprobs is not None and i not in plps:
                    plps[i] = out.prompt_logprobs
                for co in out.outputs:
                    idx = i * n + co.index
                    toks = co.delta_token_ids
                    gen_tokens[i] += len(toks)
                    first = idx not in started
                    text = co.delta_text
                    if not text and not toks and co.finish_reason is None and not first:
                        continue
                    logprobs = None
                    if req.logprobs is not None:
                        lp = lps.setdefault(idx, CompletionLogprobs(self.text))
                        head = self._echo_block(lp, i, plps.get(i)) if first and req.echo else None
                        logprobs = lp.block(toks, co.delta_logprobs)
                        if head is not None:
                            logprobs = merge_blocks(head, logprobs)
                    if first and req.echo:
                        text = self.prompts[i].text + text
                    choice = {"index": idx, "text": text, "logprobs": logprobs,
                              "finish_reason": co.finish_reason, "stop_reason": co.stop_reason}
                    if first and req.prompt_logprobs is not None:
                        choice["prompt_logprobs"] = prompt_logprobs_json(plps.get(i))
                    started.add(idx)
                    chunk = {"id": self.rid, "object": "text_completion", "created": self.created,
                             "model": self.model, "choices": [choice]}
                    if continuous:
                        chunk["usage"] = usage(prompt_lens[i], gen_tokens[i], cached[i])
                    yield sse(chunk)
            if include_usage:
                yield sse({"id": self.rid, "object": "text_completion", "created": self.created,
                           "model": self.model, "choices": [],
                           "usage": usage(sum(prompt_lens), sum(gen_tokens), sum(cached))})
        except Exception as e:
            yield sse(stream_error_body(self.state, e))
        finally:
            await merged.aclose()
        yield DONE


__all__ = ["create_completion"]
