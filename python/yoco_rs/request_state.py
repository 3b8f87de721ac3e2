"""Engine-side state of one request (``RequestState``) and of each of its ``n`` completions
(``SeqState``, one core request each), and how they become ``RequestOutput``s.

Token ids and text of non-streaming completions live in the Rust ``TextBatch`` until they finish;
streaming completions also accumulate here (what each output holds follows ``output_kind``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from yoco_rs.executor.sampler import RowParams
from yoco_rs.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from yoco_rs.sampling_params import RequestOutputKind, SamplingParams

#: Core finish codes (``yoco_rs._core.FINISH_*``) as vLLM's finish reasons.
FINISH_NAMES = {1: "stop", 2: "stop", 3: "length", 4: "abort", 5: "stop"}


class SeqState:
    """One completion: one core request."""

    __slots__ = ("core_id", "index", "req", "row_params", "stream", "row", "admitted", "finished",
                 "finish_reason", "stop_reason", "text", "token_ids", "logprobs", "cumulative_logprob",
                 "delta_text", "delta_token_ids", "delta_logprobs", "plp_next", "wants_logprobs")

    def __init__(self, core_id: int, index: int, req: "RequestState", row_params: RowParams):
        self.core_id = core_id
        self.index = index
        self.req = req
        self.row_params = row_params
        self.stream = req.params.output_kind != RequestOutputKind.FINAL_ONLY
        self.row = -1
        self.admitted = False
        self.finished = False
        self.finish_reason: Optional[str] = None
        self.stop_reason: Optional[int | str] = None
        self.text = ""
        self.token_ids: list[int] = []
        self.wants_logprobs = req.params.logprobs is not None
        self.logprobs: Optional[list] = [] if self.wants_logprobs else None
        self.cumulative_logprob: Optional[float] = 0.0 if self.wants_logprobs else None
        self.delta_text = ""
        self.delta_token_ids: list[int] = []
        self.delta_logprobs: Optional[list] = [] if self.wants_logprobs else None
        self.plp_next = 1
        """Next prompt position whose logprob is still to come (prompt_logprobs only)."""

    def completion(self, kind: RequestOutputKind) -> CompletionOutput:
        """This completion as a ``CompletionOutput``: everything so far, or only the delta for ``DELTA``."""
        if kind == RequestOutputKind.DELTA:
            text, ids, lps = self.delta_text, self.delta_token_ids, self.delta_logprobs
        else:
            text, ids = self.text, list(self.token_ids)
            lps = list(self.logprobs) if self.logprobs is not None else None
        return CompletionOutput(
            index=self.index, text=text, token_ids=ids, cumulative_logprob=self.cumulative_logprob,
            logprobs=lps, finish_reason=self.finish_reason, stop_reason=self.stop_reason,
            delta_text=self.delta_text, delta_token_ids=self.delta_token_ids,
            delta_logprobs=self.delta_logprobs)

    def clear_delta(self) -> None:
        """Start a new delta once an output carried the current one."""
        self.delta_text = ""
        self.delta_token_ids = []
        if self.delta_logprobs is not None:
            self.delta_logprobs = []


class RequestState:
    """One user request: its prompt, parameters, completions and timings."""

    __slots__ = ("request_id", "prompt", "prompt_ids", "prompt_list", "params", "seqs", "metrics", "num_finished",
                 "prompt_logprobs", "sent_prompt_logprobs", "num_cached_tokens", "priority", "done")

    def __init__(self, request_id: str, prompt: Optional[str], prompt_ids: np.ndarray, params: SamplingParams,
                 arrival_time: float, priority: int):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.prompt_list = prompt_ids.tolist()
        """The prompt ids as a list, shared by every output of the request (do not mutate)."""
        self.params = params
        self.seqs: list[SeqState] = []
        self.metrics = RequestMetrics(arrival_time=arrival_time, num_prompt_tokens=len(prompt_ids))
        self.num_finished = 0
        self.prompt_logprobs: Optional[list] = [None] if params.prompt_logprobs is not None else None
        self.sent_prompt_logprobs = False
        self.num_cached_tokens = 0
        self.priority = priority
        self.done = False

    @property
    def finished(self) -> bool:
        """Whether every completion has finished (the request's last output)."""
        return self.num_finished == len(self.seqs)

    def output(self, seqs: Optional[list[SeqState]] = None) -> RequestOutput:
        """The request's output now: ``seqs`` are the completions to include (DELTA: those that
        changed); default all. Clears the completions' deltas."""
        kind = self.params.output_kind
        chosen = self.seqs if seqs is None or kind != RequestOutputKind.DELTA else seqs
        outs = [s.completion(kind) for s in chosen]
        for s in chosen:
            s.clear_delta()
        plp = None
        if self.prompt_logprobs is not None and (kind != RequestOutputKind.DELTA or not self.sent_prompt_logprobs):
            plp = list(self.prompt_logprobs)
            self.sent_prompt_logprobs = True
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_list,
            outputs=outs, finished=self.finished, prompt_logprobs=plp,
            num_cached_tokens=self.num_cached_tokens, metrics=self.metrics)


def position_logprobs(token: int, token_lp: float, token_rank: int, top_ids, top_lps, k: int,
                      texts: dict[int, str]) -> dict[int, Logprob]:
    """vLLM's per-position dict: the chosen token first, then the top-k (rank 1..k)."""
    d = {int(token): Logprob(float(token_lp), int(token_rank), texts.get(int(token)))}
    for r in range(k):
        t = int(top_ids[r])
        if t not in d:
            d[t] = Logprob(float(top_lps[r]), r + 1, texts.get(t))
    return d


__all__ = ["SeqState", "RequestState", "FINISH_NAMES", "position_logprobs"]
