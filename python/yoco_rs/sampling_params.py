"""``SamplingParams``: how one prompt is continued, with vLLM's field names, defaults and ranges.

Validation happens in the constructor (and again on ``replace``); every error is a ``ValueError``
whose message names the field, the allowed range and the value received, so a server can return it
as a 400 unchanged (``"top_p must be in (0, 1], got 0"``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from yoco_rs.checks import field_error, is_int, is_num
from yoco_rs.structured_outputs import StructuredOutputsParams

#: Temperatures below this sample greedily (top_p, top_k and min_p are then ignored), as in vLLM.
GREEDY_EPS = 1e-5


class RequestOutputKind(enum.IntEnum):
    """What each ``RequestOutput`` of a request carries (vLLM's ``RequestOutputKind``)."""

    CUMULATIVE = 0
    """Every output holds the whole text and token ids so far (plus the ``delta_*`` of this step)."""
    DELTA = 1
    """Every output holds only what is new since the previous one (``text`` == ``delta_text``).
    Cheapest for streaming: nothing is re-sent."""
    FINAL_ONLY = 2
    """Only the final output is produced (``Engine.generate`` uses this)."""


@dataclass
class SamplingParams:
    """Sampling parameters of one request (vLLM's ``SamplingParams`` fields and defaults).

    ``n > 1`` generates n independent completions of the same prompt (with a ``seed``, completion
    ``i`` samples with ``seed + i``). They share the prompt's KV through the prefix cache: the first
    computes the prompt, the others wait until it has been scheduled, then reuse its cached blocks
    (recomputing at least the last prompt token; with full-block caching, the trailing partial block).
    Per-request ``seed`` makes sampling reproducible whatever else is in the batch.

    Limit: with ``enable_prefix_caching=False`` there is nothing to share through, so every sibling
    recomputes the whole prompt and holds its own copy of the prompt's KV (n times the prefill work
    and memory), and they still start only after the first's prompt was scheduled. Keep prefix
    caching on (the default) when using ``n > 1``.
    """

    n: int = 1
    """Completions to generate for the prompt (>= 1). They share the prompt's KV only through the
    prefix cache: without prefix caching each recomputes the prompt (see the class docstring)."""
    temperature: float = 1.0
    """>= 0; below 1e-5 decodes greedily (top_p, top_k, min_p ignored)."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]; 1 disables."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 or -1 disables, otherwise >= 1."""
    min_p: float = 0.0
    """Drop tokens less likely than ``min_p`` times the most likely one, in [0, 1]; 0 disables."""
    seed: Optional[int] = None
    """Per-request RNG seed (any integer; reduced mod 2**63). None: derived from the engine seed and
    the request, so runs of one engine are reproducible but requests differ."""
    stop: Optional[Union[str, list[str]]] = None
    """Stop strings: generation stops when the text contains one; it is removed from the output
    unless ``include_stop_str_in_output``."""
    stop_token_ids: Optional[list[int]] = None
    """Token ids that stop generation; the token is kept in ``token_ids`` (and in the text unless it
    is a special token skipped by ``skip_special_tokens``)."""
    max_tokens: Optional[int] = 16
    """Output tokens at most (>= 1). None: up to the model's context length."""
    min_tokens: int = 0
    """EOS and ``stop_token_ids`` are suppressed until this many tokens were generated (<= max_tokens)."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks set this)."""
    logprobs: Optional[int] = None
    """Return the log-probabilities of the ``logprobs`` most likely tokens at each output position,
    plus the sampled token's (>= 0; at most the engine's ``max_logprobs``)."""
    prompt_logprobs: Optional[int] = None
    """Same for each prompt position (>= 0). Exact even with fast prefill (the scheduler widens the
    cross-decoder selection and skips cached prefixes for such requests)."""
    presence_penalty: float = 0.0
    """OpenAI semantics: subtracted once from the logit of every token already generated, [-2, 2]."""
    frequency_penalty: float = 0.0
    """OpenAI semantics: subtracted per occurrence in the generated tokens, [-2, 2]."""
    repetition_penalty: float = 1.0
    """HF semantics (> 0): logits of tokens in the prompt or output are divided by it when positive,
    multiplied when negative; 1 disables."""
    skip_special_tokens: bool = True
    """Leave special tokens (``<eos>``, ``<end_of_turn>``, ...) out of the text."""
    spaces_between_special_tokens: bool = True
    """Accepted for vLLM compatibility (the tokenizer's decoder decides spacing)."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the text."""
    detokenize: bool = True
    """False: return token ids only (``text`` stays empty; stop strings then need detokenize)."""
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    """What each streamed output holds; see ``RequestOutputKind``."""
    structured_outputs: Optional[StructuredOutputsParams] = None
    """Constrain the output to a JSON Schema, any JSON object, a regex, a choice or a Lark grammar
    (vLLM's ``StructuredOutputsParams``; a dict of its fields is accepted). Masked in the sampler, so
    ``logprobs`` are those of the masked distribution."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is not None:
            self.stop = list(self.stop)
        if self.stop_token_ids is not None:
            self.stop_token_ids = list(self.stop_token_ids)
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.from_any(self.structured_outputs)
        if not isinstance(self.output_kind, RequestOutputKind):
            try:
                self.output_kind = RequestOutputKind(self.output_kind)
            except (ValueError, TypeError):
                raise field_error("output_kind", "one of CUMULATIVE (0), DELTA (1), FINAL_ONLY (2)", self.output_kind) from None
        self._validate()

    # ---- validation -----------------------------------------------------------------------------
    def _validate(self) -> None:
        if not is_int(self.n) or self.n < 1:
            raise field_error("n", "an integer >= 1", self.n)
        if not is_num(self.temperature) or not self.temperature >= 0:
            raise field_error("temperature", "a number >= 0 (0 means greedy)", self.temperature)
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            raise field_error("top_p", "in (0, 1]", self.top_p)
        if not is_int(self.top_k) or not (self.top_k in (0, -1) or self.top_k >= 1):
            raise field_error("top_k", "0 or -1 (disabled) or an integer >= 1", self.top_k)
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            raise field_error("min_p", "in [0, 1]", self.min_p)
        if self.seed is not None and not is_int(self.seed):
            raise field_error("seed", "an integer or None", self.seed)
        if self.stop is not None:
            for s in self.stop:
                if not isinstance(s, str) or not s:
                    raise field_error("stop", "a non-empty string or a list of non-empty strings", s)
        if self.stop_token_ids is not None:
            for t in self.stop_token_ids:
                if not is_int(t) or t < 0:
                    raise field_error("stop_token_ids", "a list of token ids >= 0", t)
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 1):
            raise field_error("max_tokens", "an integer >= 1 (or None for up to the context length)", self.max_tokens)
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            raise field_error("min_tokens", "an integer >= 0", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise field_error("min_tokens", f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        if self.logprobs is not None and (not is_int(self.logprobs) or self.logprobs < 0):
            raise field_error("logprobs", "an integer >= 0 or None", self.logprobs)
        if self.prompt_logprobs is not None and (not is_int(self.prompt_logprobs) or self.prompt_logprobs < 0):
            raise field_error("prompt_logprobs", "an integer >= 0 or None", self.prompt_logprobs)
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not is_num(v) or not -2.0 <= v <= 2.0:
                raise field_error(name, "in [-2, 2]", v)
        if not is_num(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise field_error("repetition_penalty", "> 0 (1 disables)", self.repetition_penalty)
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise field_error(name, "a bool", getattr(self, name))
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (got stop=%r with detokenize=False)" % (self.stop,))

    def check_against(self, *, max_logprobs: int, vocab_size: int) -> None:
        """Engine-dependent limits (raised as ``ValueError`` at submission)."""
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and v > max_logprobs:
                raise field_error(name, f"<= max_logprobs ({max_logprobs})", v)
        for t in self.stop_token_ids or ():
            if t >= vocab_size:
                raise field_error("stop_token_ids", f"token ids in [0, {vocab_size})", t)

    # ---- conveniences ---------------------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        """True when this request decodes greedily."""
        return self.temperature < GREEDY_EPS

    def replace(self, **changes) -> "SamplingParams":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def clone(self) -> "SamplingParams":
        """An independent copy (vLLM's ``clone``), to change without touching the original."""
        return dataclasses.replace(self)


#: What ``generate`` accepts for its ``sampling_params`` argument.
SamplingParamsLike = Union[SamplingParams, Sequence[SamplingParams], None]

__all__ = ["SamplingParams", "RequestOutputKind", "GREEDY_EPS"]
