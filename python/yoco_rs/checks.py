"""Value checks shared by the configuration, the sampling parameters and the server's validation: one
definition of "an integer" (``bool`` is not one) and one wording for a field's error."""

from __future__ import annotations


def is_int(x) -> bool:
    """An ``int`` that is not a ``bool`` (JSON ``true`` must not pass as 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x) -> bool:
    """An ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def field_error(name: str, allowed: str, got) -> ValueError:
    """``ValueError("<name> must be <allowed>, got <got!r>")``: the message names the field and the value."""
    return ValueError(f"{name} must be {allowed}, got {got!r}")


__all__ = ["is_int", "is_num", "field_error"]
