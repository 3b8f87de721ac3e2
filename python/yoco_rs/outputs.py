"""What the engine returns: ``RequestOutput`` with one ``CompletionOutput`` per sample, vLLM's shapes.

Streaming: the request's ``SamplingParams.output_kind`` decides what each output holds. With
``CUMULATIVE`` (the default) ``text``/``token_ids``/``logprobs`` are everything so far and the
``delta_*`` fields what this step added; with ``DELTA`` the main fields hold only the new part (and
equal the ``delta_*`` fields); ``FINAL_ONLY`` produces one output at the end. With ``n > 1`` and
``DELTA``, an output lists only the completions that changed this step (``CompletionOutput.index``
says which).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Logprob:
    """Log-probability of one token at one position (vLLM's ``Logprob``)."""

    logprob: float
    rank: Optional[int] = None
    """1 = most likely token at this position."""
    decoded_token: Optional[str] = None


#: One position: token id -> ``Logprob``; holds the top-k tokens plus the sampled (or prompt) token.
PositionLogprobs = dict[int, Logprob]
#: Per output position (``SampleLogprobs``); for the prompt the first entry is None (no context).
SampleLogprobs = list[PositionLogprobs]
PromptLogprobs = list[Optional[PositionLogprobs]]


@dataclass
class RequestMetrics:
    """Per-request timings (``time.monotonic()`` seconds) and counts, for logs and histograms.

    ``arrival_time`` is when the engine accepted the request; ``first_scheduled_time`` the step it was
    first admitted; ``first_token_time`` when its first output token was produced; ``finished_time``
    when it finished. Unset times are None.
    """

    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    finished_time: Optional[float] = None
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def queue_time(self) -> Optional[float]:
        """Arrival -> first admitted."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> Optional[float]:
        """Arrival -> first output token (TTFT, as clients measure it)."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def prefill_time(self) -> Optional[float]:
        """First admitted -> first output token."""
        if self.first_token_time is None or self.first_scheduled_time is None:
            return None
        return self.first_token_time - self.first_scheduled_time

    @property
    def decode_time(self) -> Optional[float]:
        """First output token -> last output token."""
        if self.first_token_time is None or self.last_token_time is None:
            return None
        return self.last_token_time - self.first_token_time

    @property
    def e2e_latency(self) -> Optional[float]:
        """Arrival -> finished."""
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time

    @property
    def time_per_output_token(self) -> Optional[float]:
        """Mean inter-token latency after the first token (None with fewer than 2 tokens)."""
        d = self.decode_time
        if d is None or self.num_generation_tokens < 2:
            return None
        return d / (self.num_generation_tokens - 1)


@dataclass
class CompletionOutput:
    """One completion (sample) of a request (vLLM's ``CompletionOutput`` plus stream deltas)."""

    index: int
    """Which of the request's ``n`` completions this is."""
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float] = None
    """Sum of the sampled tokens' logprobs (set when ``logprobs`` was asked)."""
    logprobs: Optional[SampleLogprobs] = None
    finish_reason: Optional[str] = None
    """None while running; then ``"stop"`` (EOS, stop token or stop string), ``"length"``
    (max_tokens or the context length) or ``"abort"``."""
    stop_reason: Optional[int | str] = None
    """The stop token id or stop string that matched; None for EOS, length and abort."""
    delta_text: str = ""
    """Text added since the previous output of this request."""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: Optional[SampleLogprobs] = None

    def finished(self) -> bool:
        """Whether this completion has ended (it has a ``finish_reason``)."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request (all its completions) after an engine step."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: Optional[PromptLogprobs] = None
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (max over the completions' first admission;
    sub-block hits count too)."""
    metrics: Optional[RequestMetrics] = None
    """Timings; complete once ``finished``."""


__all__ = [
    "Logprob",
    "RequestMetrics",
    "CompletionOutput",
    "RequestOutput",
    "SampleLogprobs",
    "PromptLogprobs",
    "PositionLogprobs",
]
