"""``StructuredOutputsParams``: what a request's output must conform to (vLLM's class of that name).

Exactly one of ``json`` (a JSON Schema, as a dict or its JSON text), ``json_object`` (any JSON
object), ``regex``, ``choice`` (one of these strings) or ``grammar`` (a Lark grammar in llguidance's
dialect) is set. The engine compiles it with llguidance in the Rust core (``yoco-grammar``) before the
request is queued; a malformed or unsupported constraint raises ``ValueError`` naming the problem.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any, Optional, Union


@dataclass
class StructuredOutputsParams:
    json: Optional[Union[str, dict, bool]] = None
    """A JSON Schema (dict or JSON text)."""
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    """A Lark grammar (llguidance's dialect: ``start: ...``, ``/regex/`` terminals, ``%json {...}``)."""
    json_object: Optional[bool] = None
    """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
    disable_any_whitespace: bool = False
    """JSON without optional whitespace (llguidance's ``whitespace_flexible: false``): compact output, and
    no runs of blank tokens from a weak model. Default (False) allows JSON's whitespace, as vLLM does."""
    disable_fallback: bool = False
    """Accepted for vLLM compatibility (there is one backend: llguidance)."""
    whitespace_pattern: Optional[str] = None
    """Accepted for vLLM compatibility; ignored."""

    def __post_init__(self) -> None:
        set_ = [n for n in ("json", "regex", "choice", "grammar", "json_object")
                if getattr(self, n) not in (None, False)]
        if len(set_) != 1:
            raise ValueError("structured outputs need exactly one of json, regex, choice, grammar, json_object; "
                             f"got {set_ or 'none'}")
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice or \
                    not all(isinstance(c, str) for c in self.choice):
                raise ValueError(f"structured outputs choice must be a non-empty list of strings, got {self.choice!r}")
            self.choice = list(self.choice)
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise ValueError(f"structured outputs {name} must be a non-empty string, got {v!r}")
        if self.json is not None and not isinstance(self.json, (str, dict, bool)):
            raise ValueError(f"structured outputs json must be a JSON Schema (dict or JSON text), got {type(self.json).__name__}")

    def kind_and_text(self, disable_any_whitespace: bool = False) -> tuple[str, str]:
        """What ``_core.GrammarCompiler.compile`` takes: ``(kind, text)``. ``disable_any_whitespace``
        (the server default) or the field's own setting makes JSON compact."""
        compact = self.disable_any_whitespace or disable_any_whitespace
        if self.json is not None or self.json_object:
            if not compact:
                if self.json_object:
                    return "json_object", ""
                return "json", self.json if isinstance(self.json, str) else _json.dumps(self.json)
            schema = {"type": "object"} if self.json_object else self.json
            if isinstance(schema, str):
                try:
                    schema = _json.loads(schema)
                except ValueError:
                    return "json", schema  # the compiler names the JSON error
            if isinstance(schema, dict):
                schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), "whitespace_flexible": False}}
            return "json", _json.dumps(schema)
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", _json.dumps(self.choice)
        return "grammar", str(self.grammar)

    @classmethod
    def from_any(cls, value: Any) -> "StructuredOutputsParams":
        """From an instance or a dict of its fields (the HTTP ``structured_outputs`` object)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown structured_outputs fields: {sorted(unknown)}")
            return cls(**value)
        raise ValueError(f"structured_outputs must be an object, got {type(value).__name__}")


#: ``structured_outputs_config`` keys that bound compilation (passed to ``_core.GrammarCompiler``).
COMPILE_LIMIT_KEYS = ("time_budget_ms", "max_grammar_size", "initial_lexer_fuel", "max_in_flight", "cache_size")
_CONFIG_KEYS = COMPILE_LIMIT_KEYS + ("backend", "disable_any_whitespace", "disable_fallback",
                                     "disable_additional_properties", "reasoning_parser", "enable_in_reasoning")
_BACKENDS = ("auto", "guidance", "llguidance")


def check_structured_outputs_config(cfg: Any) -> None:
    """Validate ``EngineConfig.structured_outputs_config`` (``ValueError`` naming the key)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"structured_outputs_config must be a dict, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown structured_outputs_config keys {unknown}; known: {sorted(_CONFIG_KEYS)}")
    b = cfg.get("backend", "auto")
    if b not in _BACKENDS:
        raise ValueError(f"structured_outputs_config backend must be one of {list(_BACKENDS)} "
                         f"(llguidance is the only grammar engine), got {b!r}")
    for k in COMPILE_LIMIT_KEYS:
        v = cfg.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"structured_outputs_config {k} must be an integer >= 1, got {v!r}")


def compile_limits(cfg: Optional[dict]) -> dict:
    """The compile-budget keys of a (validated) ``structured_outputs_config``."""
    return {k: v for k, v in (cfg or {}).items() if k in COMPILE_LIMIT_KEYS and v is not None}


__all__ = ["StructuredOutputsParams", "check_structured_outputs_config", "compile_limits"]
