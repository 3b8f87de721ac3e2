"""The engine's structured-output state: the grammar compiler and one matcher per constrained sequence.

Per step, O(1) calls into Rust whatever the number of constrained rows:

1. after ``schedule``: ``start(plan)`` starts the masks of the step's constrained sampling rows on the
   Rust thread pool (they depend only on tokens already appended), so they are computed while the
   forward runs;
2. after the forward: ``apply(plan, logits)`` waits for them (GIL released) and masks the logits in
   place (``executor/grammar_mask.py``) before the sampler runs;
3. after ``update``: ``advance(outcome)`` feeds every constrained sequence the token the core appended.

A sequence's matcher is added when it is submitted (each of ``n`` completions has its own) and removed
when it finishes or is aborted. Preemption keeps the output tokens (only KV is recomputed), so the
matcher is simply where it was. Compilation (``compile``) is thread-safe and releases the GIL: the
``AsyncEngine`` runs it off the loop thread, under the compiler's time budget.
"""

from __future__ import annotations

import threading
from typing import Optional

import numpy as np

from yoco_rs import _core
from yoco_rs.executor.grammar_mask import apply_token_bitmask_
from yoco_rs.structured_outputs import StructuredOutputsParams, compile_limits


class GrammarState:
    def __init__(self, tokenizer_file: str, vocab_size: int, eos_ids: list[int], limits: Optional[dict] = None):
        self._tokenizer_file = tokenizer_file
        self._vocab = int(vocab_size)
        self._eos = [int(t) for t in eos_ids]
        self._limits = compile_limits(limits)
        self._compact = bool((limits or {}).get("disable_any_whitespace", False))
        self._compiler: Optional[_core.GrammarCompiler] = None
        self._lock = threading.Lock()
        self.table = _core.MatcherTable(self._vocab, self._eos)
        self._started = False

    @property
    def compiler(self) -> "_core.GrammarCompiler":
        """Built on first use (the token trie of a 262k vocabulary takes a moment)."""
        with self._lock:
            if self._compiler is None:
                self._compiler = _core.GrammarCompiler(self._tokenizer_file, self._vocab, self._eos, **self._limits)
            return self._compiler

    def compile(self, so: StructuredOutputsParams) -> "_core.CompiledGrammar":
        """Compile (or fetch from the cache); ``ValueError`` naming the problem."""
        kind, text = so.kind_and_text(self._compact)
        return self.compiler.compile(kind, text)

    def add(self, seq_id: int, grammar: "_core.CompiledGrammar") -> None:
        self.table.add(seq_id, grammar)

    def remove(self, seq_id: int) -> None:
        self.table.remove(seq_id)

    def start(self, plan) -> None:
        """Start the masks of the plan's constrained sampling rows (no-op without constrained sequences)."""
        self._started = False
        if len(self.table) == 0 or plan.num_samples == 0:
            return
        self.table.start_masks(np.ascontiguousarray(plan.req_ids[plan.sample_rows], dtype=np.uint64))
        self._started = True

    def apply(self, plan, logits) -> None:
        """Mask the constrained rows' logits in place (waits for the masks ``start`` began)."""
        if not self._started:
            return
        self._started = False
        rows, bitmask = self.table.wait_masks()
        if len(rows):
            apply_token_bitmask_(logits, bitmask, np.asarray(plan.logits_cross_pos, dtype=np.int64)[rows])

    def advance(self, outcome) -> list[int]:
        """Feed the appended tokens; returns the sequence ids whose grammar rejected theirs."""
        if len(self.table) == 0 or len(outcome) == 0:
            return []
        return self.table.advance(np.ascontiguousarray(outcome.req_ids, dtype=np.uint64),
                                  np.ascontiguousarray(outcome.new_tokens, dtype=np.int32))


__all__ = ["GrammarState"]
