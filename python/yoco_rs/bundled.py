"""The bundled default model ``yoco-tiny``: what ``Engine()`` and ``yoco-serve`` run with no model given.

A tiny Gemma 3n-architecture checkpoint (10 layers, the last 5 sharing KV like E2B's last 10 of 30;
hidden 128, vocabulary 2048) with random weights, a real byte-fallback BPE tokenizer and a Gemma chat
template, in the standard Hugging Face layout. The package ships everything but the weights
(``yoco_rs/default_model/``: configs, tokenizer, a manifest of parameter names and shapes, ~100 KB);
the first use writes ``model.safetensors`` (10 MB, float32) into a cache directory, generated
deterministically from the manifest's seed exactly as ``tests/tiny.py``'s ``randomize()`` would
(norms 1 +- 0.1, ``correct_output_scale`` ~ N(0, 0.5^2), matrices N(0, 1/fan_in)), so every install
gets the same model. ``scripts/make_default_model.py`` regenerates the package files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

NAME = "yoco-tiny"
_SRC = Path(__file__).with_name("default_model")
_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "weights_manifest.json")


def cache_root() -> Path:
    """``$YOCO_RS_CACHE``, else ``$XDG_CACHE_HOME/yoco-rs``, else ``~/.cache/yoco-rs``."""
    env = os.environ.get("YOCO_RS_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "yoco-rs"


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in _FILES:
        h.update(name.encode())
        h.update((_SRC / name).read_bytes())
    return h.hexdigest()[:12]


def generate_weights(manifest: dict):
    """The state dict the manifest describes, as ``randomize(model, seed)`` fills it (same order,
    same generator), float32."""
    import torch

    g = torch.Generator().manual_seed(int(manifest["seed"]))
    out = {}
    for name, shape in manifest["params"]:
        x = torch.randn(shape, generator=g)
        if name.endswith("norm.weight") or "norm" in name.split(".")[-2]:
            x = 1.0 + 0.1 * x
        elif "correct_output_scale" in name:
            x = 0.5 * x
        else:
            fan_in = shape[-1] if len(shape) > 1 else 1
            x = x * (0.5 if len(shape) == 1 else fan_in ** -0.5)
        out[name] = x.contiguous()
    return out


def default_model_dir() -> str:
    """Path of the materialized bundled checkpoint (created on first call; safe against concurrent
    first calls: written to a temporary directory, then renamed)."""
    dst = cache_root() / "models" / f"{NAME}-{_fingerprint()}"
    if (dst / "model.safetensors").exists():
        return str(dst)
    from safetensors.torch import save_file

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name in _FILES:
            shutil.copyfile(_SRC / name, tmp / name)
        manifest = json.loads((_SRC / "weights_manifest.json").read_text())
        save_file(generate_weights(manifest), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        try:
            os.rename(tmp, dst)
        except OSError:
            if not (dst / "model.safetensors").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(dst)


def is_bundled(path: str) -> bool:
    """Whether ``path`` is a materialized copy of the bundled model in this machine's cache."""
    return Path(path).name.startswith(NAME + "-") and Path(path).parent == cache_root() / "models"


__all__ = ["NAME", "default_model_dir", "generate_weights", "cache_root"]
