"""Loading a Gemma 3n checkpoint from a local Hugging Face directory (safetensors only, never unpickled).

Accepted layouts:

* text-only ``Gemma3nForCausalLM``: text tensors under ``model.``;
* multimodal ``Gemma3nForConditionalGeneration`` (the released checkpoints): text tensors under
  ``model.language_model.``; the vision and audio towers and their embedders are skipped unread;
* a single ``model.safetensors`` or a sharded ``model.safetensors.index.json``;
* with or without the K/V projections of KV-sharing layers (Google's files ship them, transformers' do
  not; they are never used and are skipped). ``lm_head.weight`` is skipped when the head is tied.

Tensors are converted to the model dtype on load, except the per-layer embedding table of a model that
keeps it on the host (``Gemma3nModel.per_layer_embeddings_on_host``): that one is memory-mapped from its
file as stored (rows are cast when gathered), so loading neither reads nor copies its 2.0B parameters. Every error names the file and, where it applies, the
tensor: a missing file, a pickle-only directory, an unknown architecture, a shape mismatch, a missing
tensor, a truncated or corrupted file.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Iterable, Iterator

import torch
from torch import nn

from yoco_rs.executor.cpu_linear import copy_weight, weight_shape
from yoco_rs.models.gemma3n.config import ModelConfig

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
HOST_TABLE = "embed_tokens_per_layer.weight"
_SHARED_KV = re.compile(r"^layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded into the model (the message names the file and tensor)."""


def weight_files(model_dir: str | os.PathLike) -> list[str]:
    """The safetensors files of ``model_dir``, from the index when sharded."""
    d = os.fspath(model_dir)
    single, index = os.path.join(d, SINGLE_FILE), os.path.join(d, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index (needs a 'weight_map'): {e}") from e
        files = [os.path.join(d, name) for name in dict.fromkeys(weight_map.values())]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"{index} lists shard(s) that do not exist: {missing}")
        return files
    if os.path.isfile(single):
        return [single]
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    pickles = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    hint = (f"; found only pickle checkpoints {pickles}, which are never loaded (unsafe): convert them to "
            "safetensors") if pickles else ""
    raise FileNotFoundError(f"no weights in {d}: expected {SINGLE_FILE} or {INDEX_FILE}{hint}")


def iter_safetensors(files: Iterable[str]) -> Iterator[tuple[str, str, "callable"]]:
    """Yields ``(file, key, load)`` for every tensor; ``load()`` reads it (errors name file and tensor)."""
    from safetensors import safe_open

    for path in files:
        try:
            handle = safe_open(path, framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types for bad headers / sizes
            size = os.path.getsize(path) if os.path.exists(path) else 0
            raise CheckpointError(
                f"{path} ({size:,} bytes) is not a readable safetensors file; it is truncated or corrupted "
                f"(re-download or re-save it): {e}") from e
        with handle as f:
            keys = list(f.keys())
        for key in keys:
            # each tensor through its own short-lived map: the pages read leave this process's RSS once
            # the tensor is copied (one long-lived map would keep a whole shard resident while loading)
            def load(key=key, path=path):
                try:
                    with safe_open(path, framework="pt", device="cpu") as f:
                        return f.get_tensor(key)
                except Exception as e:
                    raise CheckpointError(f"{path}: tensor {key!r} cannot be read (truncated or corrupted "
                                          f"file?): {e}") from e
            yield path, key, load


def text_param_name(key: str, mc: ModelConfig) -> str | None:
    """The model parameter a checkpoint key loads into, or None when the key is skipped."""
    if key.startswith(mc.weight_prefix):
        name = key[len(mc.weight_prefix):]
        m = _SHARED_KV.match(name)
        if m and int(m.group(1)) >= mc.text.first_shared:
            return None  # K/V of a KV-sharing layer: computed by nobody
        return name
    if key == "lm_head.weight":
        return None if mc.text.tie_word_embeddings else "lm_head.weight"
    return None


def load_weights(model: nn.Module, mc: ModelConfig, tensors: Iterable[tuple[str, str, "callable"]], *,
                 total: int | None = None, progress: bool = True) -> None:
    """Copies checkpoint tensors into ``model`` (by transformers' names), converting dtype/device."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    unexpected: list[str] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="Loading weights", unit="tensor", leave=False)
    try:
        for path, key, load in tensors:
            if bar is not None:
                bar.update(1)
            name = text_param_name(key, mc)
            if name is None:
                known = key.startswith(mc.weight_prefix) or key == "lm_head.weight"
                if not known and not any(key.startswith(s) for s in mc.skip_prefixes):
                    unexpected.append(key)
                continue
            if name == HOST_TABLE and getattr(model, "per_layer_embeddings_on_host", False):
                _attach_host_table(model, mc, path, key, load)
                loaded.add(name)
                continue
            p = params.get(name)
            if p is None:
                unexpected.append(key)
                continue
            t = load()
            if tuple(t.shape) != weight_shape(p):  # (a CPU weight in panels stands for [out, in])
                raise CheckpointError(
                    f"{path}: tensor {key!r} has shape {list(t.shape)}, but config.json "
                    f"({mc.architecture}) implies {list(weight_shape(p))} for {name!r}")
            if not (t.is_floating_point() or t.dtype == p.dtype):
                raise CheckpointError(f"{path}: tensor {key!r} has dtype {t.dtype}; expected a floating type")
            with torch.no_grad():
                copy_weight(p, t)  # CPU projections in panels / K-major: a fast transposing copy
            loaded.add(name)
    finally:
        if bar is not None:
            bar.close()
    if getattr(model, "per_layer_embeddings_on_host", False) and HOST_TABLE not in loaded:
        raise CheckpointError(f"checkpoint lacks the tensor {mc.weight_prefix}{HOST_TABLE} the model needs")
    missing = [n for n in params if n not in loaded]
    if missing:
        shown = ", ".join(mc.weight_prefix + n for n in missing[:8])
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensor(s) the model needs: {shown}"
                              + (" ..." if len(missing) > 8 else ""))
    if unexpected:
        log.warning("ignored %d unexpected tensor(s): %s%s", len(unexpected), ", ".join(unexpected[:8]),
                    " ..." if len(unexpected) > 8 else "")


def _attach_host_table(model: nn.Module, mc: ModelConfig, path: str, key: str, load) -> None:
    """The per-layer embedding table, mapped from ``path`` when it is a safetensors file (else ``load()``)."""
    from yoco_rs.models.gemma3n.ple_host import mmap_safetensors

    table = None
    if os.path.isfile(path):
        try:
            table = mmap_safetensors(path, key)
        except (KeyError, ValueError, OSError) as e:
            raise CheckpointError(f"{path}: tensor {key!r} cannot be mapped (truncated or corrupted file?): {e}") from e
    else:
        table = load()
    if not table.is_floating_point():
        raise CheckpointError(f"{path}: tensor {key!r} has dtype {table.dtype}; expected a floating type")
    try:
        model.embed_tokens_per_layer.attach(table)
    except ValueError as e:
        raise CheckpointError(f"{path}: tensor {key!r}: {e} ({mc.architecture} config.json)") from e


def count_tensors(files: Iterable[str]) -> int | None:
    from safetensors import safe_open

    try:
        n = 0
        for path in files:
            with safe_open(path, framework="pt", device="cpu") as f:
                n += len(list(f.keys()))
        return n
    except Exception:
        return None  # the load itself reports the broken file


def load_checkpoint(model: nn.Module, mc: ModelConfig, model_dir: str | os.PathLike, *, progress: bool = True) -> None:
    files = weight_files(model_dir)
    load_weights(model, mc, iter_safetensors(files), total=count_tensors(files), progress=progress)


def load_state_dict(model: nn.Module, mc: ModelConfig, state_dict: dict[str, torch.Tensor]) -> None:
    """Loads an in-memory state dict with checkpoint key names (tests: a transformers model's state_dict)."""
    load_weights(model, mc, (("<state_dict>", k, (lambda v=v: v)) for k, v in state_dict.items()), progress=False)
