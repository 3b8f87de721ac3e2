"""Exceptions of the engine's public API.

Bad input is always a ``ValueError`` (a server answers 400 with its message). The classes here are
for the engine's own state: a server answers 503/500 with them.
"""


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an unexpected error; every pending and future request fails with this.
    ``__cause__`` holds the original exception."""


class EngineClosedError(RuntimeError):
    """The engine is shutting down (or was shut down) and accepts no new requests."""


class RequestFailedError(RuntimeError):
    """The engine step running this request failed (the executor raised, an allocation failed): the
    request was aborted, the engine keeps serving the others. ``__cause__`` holds the step's error; a
    server answers 500 naming it."""


__all__ = ["EngineDeadError", "EngineClosedError", "RequestFailedError"]
