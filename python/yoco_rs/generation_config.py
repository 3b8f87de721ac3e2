"""A checkpoint's ``generation_config.json`` as default sampling parameters, as vLLM applies them.

vLLM's ``--generation-config`` (default ``auto``) reads the model's generation config and uses its
sampling fields as the defaults of requests that do not set them: ``temperature``, ``top_k``,
``top_p``, ``min_p``, ``repetition_penalty`` (and ``max_new_tokens`` as the offline default
``max_tokens``). ``vllm`` ignores the file (vLLM's own defaults: temperature 1, no filters); a PATH names
a directory holding a ``generation_config.json`` (or the file itself). A field a request sets always
wins; HF's ``do_sample`` is ignored, as in vLLM.
"""

from __future__ import annotations

import json
import os

from yoco_rs.sampling_params import SamplingParams

#: generation_config.json keys that become request defaults (vLLM's ``get_diff_sampling_param``).
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def _file(source: str, model_dir: str) -> str | None:
    if source == "auto":
        path = os.path.join(model_dir, "generation_config.json")
        return path if os.path.isfile(path) else None
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        path = os.path.join(path, "generation_config.json")
    if not os.path.isfile(path):
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a directory holding generation_config.json "
                         f"(or that file), got {source!r}: {path} does not exist")
    return path


def sampling_defaults(source: str, model_dir: str) -> dict:
    """The default sampling fields (a dict of ``SamplingParams`` field -> value) that ``source``
    (``auto`` | ``vllm`` | PATH) gives for the checkpoint in ``model_dir``; validated."""
    if source == "vllm":
        return {}
    path = _file(source, model_dir)
    if path is None:
        return {}
    with open(path, encoding="utf-8") as f:
        try:
            cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
    out = {k: cfg[k] for k in SAMPLING_KEYS if cfg.get(k) is not None}
    if cfg.get("max_new_tokens") is not None:
        out["max_tokens"] = cfg["max_new_tokens"]
    try:
        SamplingParams(**out)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return out


__all__ = ["sampling_defaults", "SAMPLING_KEYS"]
