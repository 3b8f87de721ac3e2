"""The bundled default model ``yoco-tiny``: what ``Engine()`` and ``yoco-serve`` run with no model given.

A small Gemma 3n-architecture checkpoint (6 layers: sliding and full attention, the last 3 sharing KV,
per-layer embeddings, AltUp, LAuReL; 2.6M parameters, vocabulary 4096, sliding window 64) trained on
CPU from scratch on English that ships with Python plus a long-context key/value recall task, with its
byte-fallback BPE tokenizer and a Gemma chat template, in the standard Hugging Face layout. Every file,
the weights included (``model.safetensors``, float32, ~10 MB), is a package file in
``yoco_rs/default_model/``: nothing is generated or downloaded on first use.
``scripts/train_default_model.py`` reproduces them; ``default_model/README.md`` is the model card.
"""

from __future__ import annotations

from pathlib import Path

NAME = "yoco-tiny"
_SRC = Path(__file__).with_name("default_model")
FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")


def default_model_dir() -> str:
    """Path of the bundled checkpoint (inside the installed package)."""
    return str(_SRC)


def is_bundled(path: str) -> bool:
    """Whether ``path`` is the bundled model's directory."""
    return Path(path).resolve() == _SRC.resolve()


__all__ = ["NAME", "FILES", "default_model_dir", "is_bundled"]
