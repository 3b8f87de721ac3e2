"""The engine's structured-output state: the grammar compiler and one matcher per constrained sequence.

Per step, O(1) calls into Rust whatever the number of constrained rows:

1. after ``update`` of step N: ``advance(outcome)`` records the tokens the core appended (a copy of
   two flat arrays; nothing is consumed yet);
2. after ``schedule`` of step N+1: ``start(plan)`` starts, on the Rust thread pool, first the matchers'
   advance by those tokens, then the masks of the step's constrained sampling rows, so both run while
   the forward does;
3. after the forward: ``apply(plan, logits)`` waits for them (GIL released) and masks the logits in
   place (``executor/grammar_mask.py``) before the sampler runs. Sequences whose grammar failed while
   advancing come back from ``take_failed`` (the engine ends them, ``finish_reason="abort"``).

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
        self._pending: Optional[tuple[np.ndarray, np.ndarray]] = None
        self._failed: list[int] = []

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
        """Start the deferred advance and the masks of the plan's constrained sampling rows (no-op
        without constrained sequences)."""
        self._started = False
        if len(self.table) == 0:
            self._pending = None
            return
        adv_ids, adv_toks = self._pending if self._pending is not None else (None, None)
        self._pending = None
        self.table.start_masks(np.ascontiguousarray(plan.req_ids[plan.sample_rows], dtype=np.uint64),
                               adv_ids, adv_toks)
        self._started = True

    def apply(self, plan, logits) -> None:
        """Mask the constrained rows' logits in place (waits for the masks ``start`` began)."""
        if not self._started:
            return
        self._started = False
        rows, bitmask, failed = self.table.wait_masks()
        self._failed.extend(failed)
        if len(rows):
            apply_token_bitmask_(logits, bitmask, np.asarray(plan.logits_cross_pos, dtype=np.int64)[rows])

    def advance(self, outcome) -> None:
        """Record the appended tokens; the next ``start`` feeds them to the matchers off the loop. (A
        step that did not reach ``start`` leaves them for the one after: they accumulate in order.)"""
        if len(self.table) == 0 or len(outcome) == 0:
            return
        ids = np.array(outcome.req_ids, dtype=np.uint64)
        toks = np.array(outcome.new_tokens, dtype=np.int32)
        if self._pending is not None:
            ids = np.concatenate([self._pending[0], ids])
            toks = np.concatenate([self._pending[1], toks])
        self._pending = (ids, toks)

    def take_failed(self) -> list[int]:
        """Sequences whose grammar failed (token rejected, or a mask over llguidance's per-step budget)
        since the last call."""
        f, self._failed = self._failed, []
        return f


__all__ = ["GrammarState"]
