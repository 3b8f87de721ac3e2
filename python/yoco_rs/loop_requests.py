"""``LoopRequests``: the unfinished requests of one ``_core.EngineLoop`` and their loop ids; how a
request is submitted to the loop (one sequence per completion) and how the loop's events become
``RequestOutput``s. ``Engine`` (a manual loop it steps) and ``AsyncEngine`` (a threaded loop)
share it; what they do with a failed request differs (the next ``step()`` returns it finished with
``finish_reason="abort"``; an ``AsyncEngine`` stream raises), so ``dispatch`` hands both the
request and its output.
"""

from __future__ import annotations

from typing import Callable, Optional

from yoco_rs.loop_outputs import LoopRequest
from yoco_rs.outputs import RequestOutput
from yoco_rs.sampling_params import RequestOutputKind, SamplingParams


class LoopRequests:
    """Unfinished requests by request id, and each loop id's request and completion index."""

    def __init__(self) -> None:
        self.requests: dict[str, LoopRequest] = {}
        self.by_loop_id: dict[int, tuple[LoopRequest, int]] = {}

    def submit(self, core, req: LoopRequest, proc, params: SamplingParams, priority: int, base_seed: int,
               max_model_len: int) -> None:
        """Submit ``req``'s ``n`` completions (all or none) and register it. The later completions
        wait for the first's prompt and reuse its cached blocks (``after``). ``ValueError`` for a
        request id in use; whatever ``core.submit`` raises, after aborting what was submitted."""
        if req.request_id in self.requests:
            raise ValueError(f"request_id {req.request_id!r} is already in use by an unfinished request")
        max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - len(req.prompt_ids)
        stop = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        items = proc.mm_items
        media = dict(mm_items=items, mm_placeholders=sorted(it.placeholder() for it in items)) if items else {}
        try:
            for i in range(params.n):
                lid = core.submit(
                    req.prompt_ids, int(max_tokens), min_tokens=params.min_tokens, ignore_eos=params.ignore_eos,
                    stop_token_ids=list(params.stop_token_ids or ()), stop=stop,
                    include_stop_str=params.include_stop_str_in_output,
                    skip_special_tokens=params.skip_special_tokens, detokenize=params.detokenize,
                    stream=params.output_kind != RequestOutputKind.FINAL_ONLY, cache_salt=proc.cache_salt,
                    priority=priority, temperature=params.temperature, top_p=params.top_p,
                    top_k=max(int(params.top_k), 0), min_p=params.min_p, seed=base_seed + i,
                    presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
                    repetition_penalty=params.repetition_penalty, logprobs=params.logprobs,
                    prompt_logprobs=params.prompt_logprobs if i == 0 else None,
                    grammar=getattr(proc, "grammar", None), after=req.loop_ids[0] if i else None, **media)
                req.loop_ids.append(lid)
                self.by_loop_id[lid] = (req, i)
        except BaseException:
            for lid in req.loop_ids:
                self.by_loop_id.pop(lid, None)
                core.abort(lid)
            raise
        self.requests[req.request_id] = req

    def forget(self, req: LoopRequest, abort: Callable[[int], None]) -> None:
        """Abort what is left of ``req`` and drop it: its later events are ignored."""
        for lid in req.loop_ids:
            if self.by_loop_id.pop(lid, None) is not None:
                abort(lid)
        self.requests.pop(req.request_id, None)

    def dispatch(self, events: list, now: float,
                 abort: Callable[[int], None]) -> list[tuple[LoopRequest, Optional[RequestOutput]]]:
        """Turn a batch of loop events into ``(request, output)`` pairs, in order. A request whose
        completion failed (``req.error`` set) has its other completions aborted and appears once,
        when it is finished (its output then has every completion's end)."""
        outs: list = []
        for ev in events:
            entry = self.by_loop_id.get(ev[0])
            if entry is None:
                continue
            req, index = entry
            if len(ev) == 2:
                del self.by_loop_id[ev[0]]
                out = req.on_finished(index, ev[1], now)
                if req.finished:
                    del self.requests[req.request_id]
                if req.error is not None:
                    for lid in req.loop_ids:
                        if lid in self.by_loop_id:
                            abort(lid)
                    if req.finished:
                        outs.append((req, out))
                    continue
            else:
                out = req.on_delta(index, ev[1], ev[2], ev[3], ev[4], now)
            if out is not None:
                outs.append((req, out))
        return outs


__all__ = ["LoopRequests"]
