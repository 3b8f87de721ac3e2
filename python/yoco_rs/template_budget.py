"""Chat-template rendering under a budget: a template (the checkpoint's, fed hostile messages, or one a
request supplied where the server trusts them) must not run for minutes or build gigabyte strings.

Jinja's sandbox already blocks unsafe attributes and caps ``range`` at 100k items; ``BudgetedSandbox``
adds a deadline and a size cap, checked at every call, attribute and item access, arithmetic operator
and filter a template runs, and on every chunk of output: nested loops, doubling strings
(``ns.s ~ ns.s``), ``"x" * 10**9``, ``"x"|center(10**9)`` all end in ``TemplateBudgetExceeded`` (a
``ValueError``: the server answers 400). The remaining gap is a single C-level operation with small
arguments that runs long, which needs a process boundary; request templates are therefore off by
default in the server (``--trust-request-chat-template``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateBudgetExceeded(ValueError):
    """Rendering ran past its time or size budget."""


@dataclass(frozen=True)
class TemplateBudget:
    """Limits of one rendering."""

    seconds: float = 1.0
    """Wall-clock time the rendering may take."""
    max_chars: int = 4 << 20
    """Largest string (output, intermediate value, or integer argument of a call) it may build."""


_active = threading.local()


def _check() -> Optional[TemplateBudget]:
    b: Optional[TemplateBudget] = getattr(_active, "budget", None)
    if b is not None and time.monotonic() > _active.deadline:
        raise TemplateBudgetExceeded(f"chat template rendering took longer than its budget of {b.seconds:g} s")
    return b


def _check_size(v, b: Optional[TemplateBudget], what: str):
    if b is not None and isinstance(v, (str, list, tuple, dict)) and len(v) > b.max_chars:
        raise TemplateBudgetExceeded(f"chat template rendering built a {what} of {len(v)} items, over its budget "
                                     f"of {b.max_chars}")
    return v


def _check_args(args, kwargs, b: Optional[TemplateBudget]) -> None:
    if b is None:
        return
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > b.max_chars:
            raise TemplateBudgetExceeded(f"chat template passed the integer {a} to a call, over the budget of "
                                         f"{b.max_chars}")


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the active ``TemplateBudget`` checked at every hook."""

    intercepted_binops = frozenset(["*", "**", "+", "//", "%"])

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.filters = {name: _budgeted_filter(f) for name, f in self.filters.items()}

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        b = _check()
        if b is not None:
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise TemplateBudgetExceeded(f"chat template raised a number to the power {right}")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > b.max_chars:
                        raise TemplateBudgetExceeded(f"chat template repeated a sequence {n} times, over the budget "
                                                     f"of {b.max_chars}")
        return _check_size(super().call_binop(context, operator, left, right), b, "value")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        b = _check()
        _check_args(args, kwargs, b)
        return _check_size(super().call(__context, __obj, *args, **kwargs), b, "value")

    def getattr(self, obj, attribute):
        return _check_size(super().getattr(obj, attribute), _check(), "value")

    def getitem(self, obj, argument):
        return _check_size(super().getitem(obj, argument), _check(), "value")


def _budgeted_filter(f):
    """``f`` with the budget checked on its arguments and result. It takes the context, which also keeps
    jinja from running it at compile time (constant folding, where no budget applies)."""
    from jinja2.utils import _PassArg

    wants = _PassArg.from_obj(f)

    def run(context, *args, **kwargs):
        b = _check()
        _check_args(args[1:], kwargs, b)  # not the value itself
        if wants is _PassArg.context:
            out = f(context, *args, **kwargs)
        elif wants is _PassArg.eval_context:
            out = f(context.eval_ctx, *args, **kwargs)
        elif wants is _PassArg.environment:
            out = f(context.environment, *args, **kwargs)
        else:
            out = f(*args, **kwargs)
        return _check_size(out, b, "value")

    run.jinja_pass_arg = _PassArg.context
    run.__name__ = getattr(f, "__name__", "filter")
    return run


def render(template, budget: Optional[TemplateBudget], **context) -> str:
    """``template.render(**context)`` under ``budget`` (None: unbounded), chunk by chunk."""
    if budget is None:
        return template.render(**context)
    prev = getattr(_active, "budget", None), getattr(_active, "deadline", 0.0)
    _active.budget, _active.deadline = budget, time.monotonic() + budget.seconds
    try:
        out, size = [], 0
        for chunk in template.generate(**context):
            size += len(chunk)
            if size > budget.max_chars:
                raise TemplateBudgetExceeded(f"chat template output is over its budget of {budget.max_chars} "
                                             "characters")
            _check()
            out.append(chunk)
        return "".join(out)
    finally:
        _active.budget, _active.deadline = prev


__all__ = ["BudgetedSandbox", "TemplateBudget", "TemplateBudgetExceeded", "render"]
