"""``LoopRequest``: one request as the Rust step loop (``_core.EngineLoop``) runs it, and the
``RequestOutput``s its events turn into.

The loop runs each of a request's ``n`` completions as its own sequence and sends, per sequence, a
delta per step (streaming kinds) and a final event with whatever was not delivered yet. Text is the
loop's (incremental detokenization and stop strings in Rust); this module only accumulates it and
shapes it by ``output_kind`` as ``Engine`` does: ``CUMULATIVE`` outputs hold everything so far plus
this event's ``delta_*``, ``DELTA`` outputs only the completion that changed and only what is new,
``FINAL_ONLY`` one output at the end. Per-token Python work happens only for requests that asked for
logprobs (vLLM's per-position dicts are Python objects by definition).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from yoco_rs.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from yoco_rs.sampling_params import RequestOutputKind, SamplingParams

#: ``(token, logprob, rank, [(id, logprob), ...])`` as ``EngineLoop.poll`` hands a position over.
LoopLogprob = tuple
Decode = Callable[[Sequence[int]], list]


def position_dict(lp: LoopLogprob, decode: Decode) -> dict[int, Logprob]:
    """vLLM's per-position dict: the chosen token first, then the top-k (rank 1..k)."""
    token, value, rank, top = lp
    ids = [token] + [t for t, _ in top]
    texts = dict(zip(ids, decode(ids)))
    d = {int(token): Logprob(float(value), int(rank), texts.get(token))}
    for r, (t, v) in enumerate(top):
        if t not in d:
            d[int(t)] = Logprob(float(v), r + 1, texts.get(t))
    return d


def prompt_logprobs_list(plp, decode: Decode) -> list:
    return [None if e is None else position_dict(e, decode) for e in plp]


class _Completion:
    __slots__ = ("index", "token_ids", "text", "logprobs", "cumulative_logprob", "finish_reason", "stop_reason")

    def __init__(self, index: int, want_logprobs: bool) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: Optional[list] = [] if want_logprobs else None
        self.cumulative_logprob: Optional[float] = 0.0 if want_logprobs else None
        self.finish_reason: Optional[str] = None
        self.stop_reason = None


class LoopRequest:
    """A request's completions (one loop sequence each) and its outputs so far."""

    def __init__(self, request_id: str, prompt: Optional[str], prompt_ids: list[int], params: SamplingParams,
                 arrival: float, decode: Decode) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.params = params
        self.kind = params.output_kind
        self.loop_ids: list[int] = []
        self._decode = decode
        want = params.logprobs is not None
        self._done: list[_Completion] = [_Completion(i, want) for i in range(params.n)]
        self.prompt_logprobs: Optional[list] = None
        self._plp_sent = False
        self.num_cached_tokens = 0
        self.error: Optional[tuple[str, bool]] = None
        """``(message, engine_dead)`` of the first failed completion."""
        self.metrics = RequestMetrics(arrival_time=arrival, num_prompt_tokens=len(prompt_ids))

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self._done)

    def on_delta(self, index: int, token: Optional[int], text: str, lp, plp, now: float) -> Optional[RequestOutput]:
        """A step's delta of completion ``index``; the output to deliver, or None."""
        c = self._done[index]
        if plp is not None:
            self.prompt_logprobs = prompt_logprobs_list(plp, self._decode)
        ids = [] if token is None else [int(token)]
        lps = self._extend(c, ids, text, [] if lp is None else [lp], now)
        if not ids and not text and plp is None:
            return None
        if self.kind == RequestOutputKind.FINAL_ONLY:
            return None
        return self._output(c, text, ids, lps)

    def on_finished(self, index: int, f: dict, now: float) -> Optional[RequestOutput]:
        """Completion ``index`` ended; the output to deliver (the request's last once all ended)."""
        c = self._done[index]
        if f["prompt_logprobs"] is not None:
            self.prompt_logprobs = prompt_logprobs_list(f["prompt_logprobs"], self._decode)
        ids = [int(t) for t in f["token_ids"]]
        lps = self._extend(c, ids, f["text"], f["logprobs"], now)
        c.finish_reason = f["reason"]
        c.stop_reason = f["stop_reason"]
        self.num_cached_tokens = max(self.num_cached_tokens, int(f["cached_tokens"]))
        self.metrics.num_generation_tokens += int(f["completion_tokens"])
        self.metrics.num_preemptions += int(f["preemptions"])
        self.metrics.num_cached_tokens = self.num_cached_tokens
        if f["error"] is not None and self.error is None:
            self.error = (f["error"], bool(f["engine_dead"]))
        if self.finished:
            self.metrics.finished_time = now
        elif self.kind == RequestOutputKind.FINAL_ONLY:
            return None
        return self._output(c, f["text"], ids, lps)

    def _extend(self, c: _Completion, ids: list[int], text: str, lps, now: float) -> Optional[list]:
        if ids:
            if self.metrics.first_token_time is None:
                self.metrics.first_token_time = now
            self.metrics.last_token_time = now
        c.token_ids += ids
        c.text += text
        if c.logprobs is None:
            return None
        new = [position_dict(lp, self._decode) for lp in lps]
        c.logprobs += new
        c.cumulative_logprob += sum(float(lp[1]) for lp in lps)
        return new

    def _output(self, changed: _Completion, text: str, ids: list[int], lps) -> RequestOutput:
        if self.kind == RequestOutputKind.CUMULATIVE or self.kind == RequestOutputKind.FINAL_ONLY:
            outs = []
            for c in self._done:
                new = c is changed
                outs.append(CompletionOutput(
                    index=c.index, text=c.text, token_ids=list(c.token_ids), cumulative_logprob=c.cumulative_logprob,
                    logprobs=None if c.logprobs is None else list(c.logprobs), finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason, delta_text=text if new else "", delta_token_ids=ids if new else [],
                    delta_logprobs=lps if new else None))
            plp = self.prompt_logprobs
        else:
            outs = [CompletionOutput(
                index=changed.index, text=text, token_ids=ids, cumulative_logprob=changed.cumulative_logprob,
                logprobs=lps, finish_reason=changed.finish_reason, stop_reason=changed.stop_reason, delta_text=text,
                delta_token_ids=ids, delta_logprobs=lps)]
            plp = None
            if self.prompt_logprobs is not None and not self._plp_sent:
                plp, self._plp_sent = self.prompt_logprobs, True
        return RequestOutput(request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_ids,
                             outputs=outs, finished=self.finished, prompt_logprobs=plp,
                             num_cached_tokens=self.num_cached_tokens, metrics=self.metrics)


__all__ = ["LoopRequest", "position_dict", "prompt_logprobs_list"]
