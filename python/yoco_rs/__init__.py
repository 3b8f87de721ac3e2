"""yoco-rs: serve Gemma 3n fast. A Rust core (``yoco_rs._core``) schedules; a PyTorch executor runs."""

from typing import Any

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    # The compiled core is imported on first use, so the executor, kernels and graph runner import from a
    # plain checkout (PYTHONPATH=python) where the extension is not built, e.g. benches/gpu_check.sh.
    if name == "__version__":
        from yoco_rs import _core

        return _core.__version__
    raise AttributeError(f"module 'yoco_rs' has no attribute {name!r}")
