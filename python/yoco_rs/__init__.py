"""yoco-rs: serve Gemma 3n fast. A Rust core (``yoco_rs._core``) schedules; a PyTorch executor runs."""

from yoco_rs import _core

__version__ = _core.__version__

__all__ = ["__version__"]
