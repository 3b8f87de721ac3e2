"""``Grammars``: an engine's structured-output grammar compiler, built on first use.

Requests are prepared with it (``request_prep.py``): a constraint compiles once (cached by the Rust
compiler, under its time budget, GIL released: ``AsyncEngine`` runs it off the event loop) into a
``_core.CompiledGrammar`` that is submitted with the request. The per-step work (one matcher per
constrained sequence, the masks computed while the forward runs) is the Rust step loop's
(``crates/yoco-server/src/grammar_rows.rs``).
"""

from __future__ import annotations

import threading
from typing import Optional

from yoco_rs import _core
from yoco_rs.structured_outputs import StructuredOutputsParams, compile_limits


class Grammars:
    def __init__(self, tokenizer_file: str, vocab_size: int, eos_ids: list[int], limits: Optional[dict] = None):
        self._tokenizer_file = tokenizer_file
        self._vocab = int(vocab_size)
        self._eos = [int(t) for t in eos_ids]
        self._limits = compile_limits(limits)
        self._compact = bool((limits or {}).get("disable_any_whitespace", False))
        self._compiler: Optional[_core.GrammarCompiler] = None
        self._lock = threading.Lock()

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


__all__ = ["Grammars"]
