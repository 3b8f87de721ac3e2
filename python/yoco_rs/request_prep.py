"""``RequestPreparer``: a request's validation, tokenization and off-loop preparation, shared by
``Engine`` and ``AsyncEngine``.

Thread-safe: ``AsyncEngine`` runs it in a worker thread for requests that compile a grammar or carry
images / audio, so neither the event loop nor the step loop waits on that work.
"""

from __future__ import annotations

from yoco_rs.grammars import Grammars
from yoco_rs.inputs import PromptType, process_prompt
from yoco_rs.runtime import Runtime
from yoco_rs.sampling_params import SamplingParams


class RequestPreparer:
    """Checks a request against the model's limits and resolves its prompt (tokens, media, grammar)."""

    def __init__(self, rt: Runtime, grammars: Grammars) -> None:
        self._tok = rt.tokenizer
        self._vocab = rt.vocab_size
        self._max_model_len = rt.config.max_model_len
        self._max_logprobs = rt.config.max_logprobs
        self._limit_mm = rt.config.limit_mm_per_prompt
        self._mm_processor = rt.mm_processor
        self._mm = rt.executor.mm  # the executor's encoder cache (None: a text-only checkpoint)
        self._grammars = grammars

    def prepare(self, prompt: PromptType, params: SamplingParams):
        """``(processed prompt, params)``; ``ValueError`` naming the problem for bad input. Images /
        audio are encoded ahead and a structured-output grammar is compiled (GIL released, under its
        time budget) here, off the step loop."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        params.check_against(max_logprobs=self._max_logprobs, vocab_size=self._vocab)
        proc = process_prompt(prompt, self._tok, self._vocab, self._mm_processor, self._limit_mm)
        if proc.mm_items and self._mm is not None:
            self._mm.encode_ahead(proc.mm_items)
        proc.grammar = self._grammars.compile(params.structured_outputs) if params.structured_outputs else None
        p, limit = len(proc.token_ids), self._max_model_len
        if p >= limit:
            raise ValueError(f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                             f"{p} input tokens, which leaves no room for output tokens; shorten the prompt to at most "
                             f"{limit - 1} tokens.")
        if params.max_tokens is not None and p + params.max_tokens > limit:
            raise ValueError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{params.max_tokens} output tokens and your prompt contains at least {p} input tokens, for a total "
                f"of at least {p + params.max_tokens} tokens. Please reduce the length of the input prompt or the "
                f"number of requested output tokens (max_tokens <= {limit - p}).")
        return proc, params


__all__ = ["RequestPreparer"]
