"""Prompt forms the engine accepts, normalized once per request (vLLM's ``PromptType``).

- ``"text"``: tokenized with the checkpoint's tokenizer (``<bos>`` prepended).
- ``[1, 2, 3]``: token ids, used as given.
- ``{"prompt": "text"}`` / ``{"prompt_token_ids": [...]}`` (vLLM's ``TextPrompt``/``TokensPrompt``),
  optionally with ``"cache_salt": str`` (a prefix-cache namespace: requests only share cached KV with
  requests of the same salt) and ``"multi_modal_data": {"image": ..., "audio": ...}`` (vLLM's: a
  ``PIL.Image``, an array or a list of them; ``(waveform, sample_rate)`` or a list of them), for a
  multimodal checkpoint. The prompt holds one placeholder token per item where it goes
  (``<image_soft_token>`` / ``<audio_soft_token>``, what the chat template renders for a content part);
  it is expanded to the item's full run (``multimodal/processor.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, TypedDict, Union

import numpy as np


class TextPrompt(TypedDict, total=False):
    """A text prompt with options: ``cache_salt`` keeps its prefix-cache entries apart from other tenants'."""

    prompt: str
    cache_salt: str
    multi_modal_data: dict


class TokensPrompt(TypedDict, total=False):
    """A pre-tokenized prompt (sent as-is, no ``<bos>`` added), with the same options as ``TextPrompt``."""

    prompt_token_ids: list[int]
    prompt: str
    """Optional text of the ids, returned as ``RequestOutput.prompt``."""
    cache_salt: str
    multi_modal_data: dict


PromptType = Union[str, Sequence[int], TextPrompt, TokensPrompt]


@dataclass
class ProcessedPrompt:
    """A prompt ready for the core."""

    prompt: Optional[str]
    token_ids: list[int]
    cache_salt: Optional[str] = None
    mm_items: list = field(default_factory=list)
    """The prompt's image / audio items (``multimodal.processor.MmItem``), offsets set."""


def is_single_prompt(prompts) -> bool:
    """True for one prompt (a str, a dict, or a flat sequence of ints); False for a batch of them."""
    if isinstance(prompts, (str, dict)):
        return True
    if isinstance(prompts, np.ndarray):
        return prompts.ndim == 1
    if isinstance(prompts, Sequence):
        return len(prompts) > 0 and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompts)
    return False


_KEYS = {"prompt", "prompt_token_ids", "cache_salt", "multi_modal_data", "multi_modal_items"}


def process_prompt(prompt, tokenizer, vocab_size: int, mm=None, mm_limits: Optional[dict] = None) -> ProcessedPrompt:
    """Normalize one prompt; ``ValueError`` names what is wrong (empty, ids out of the vocabulary, ...).
    ``mm``: the checkpoint's ``MmProcessor`` (None: the model takes no images or audio); ``mm_limits``:
    the most items per modality (``limit_mm_per_prompt``). ``multi_modal_items`` (processed items, e.g.
    from a server that decoded the media itself) may stand in for ``multi_modal_data``."""
    salt = None
    text: Optional[str] = None
    ids = None
    mm_data = None
    items: list = []
    if isinstance(prompt, dict):
        unknown = set(prompt) - _KEYS
        if unknown:
            raise ValueError(f"prompt dict has unknown key(s) {sorted(unknown)}; "
                             "use 'prompt', 'prompt_token_ids', 'cache_salt' and 'multi_modal_data'")
        mm_data = prompt.get("multi_modal_data")
        items = list(prompt.get("multi_modal_items") or [])
        if mm_data is not None or items:
            if mm is None:
                raise ValueError("this model takes no image or audio inputs (multi_modal_data); serve a multimodal "
                                 "Gemma 3n checkpoint (Gemma3nForConditionalGeneration with its towers)")
            if mm_data is not None:
                check_mm_limits(mm_data, mm_limits)
                items = mm.process(mm_data)
            else:
                check_mm_limits({m: [it for it in items if it.modality == m] for m in ("image", "audio")}, mm_limits)
        salt = prompt.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise ValueError(f"cache_salt must be a string, got {type(salt).__name__}")
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            text = prompt.get("prompt")
        elif "prompt" in prompt:
            text = prompt["prompt"]
            if not isinstance(text, str):
                raise ValueError(f"prompt must be a string, got {type(text).__name__}")
        else:
            raise ValueError("prompt dict needs 'prompt' (text) or 'prompt_token_ids'")
    elif isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, (Sequence, np.ndarray)):
        ids = prompt
    else:
        raise ValueError(f"a prompt must be a str, a list of token ids or a dict, got {type(prompt).__name__}")

    if ids is None:
        if text == "":
            raise ValueError("prompt is empty: give at least one character or token id")
        ids = tokenizer.encode(mm.expand_text(text, items) if items else text)
    else:
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError("prompt_token_ids must be a flat list of integers")
        if arr.size == 0:
            raise ValueError("prompt_token_ids is empty: give at least one token id")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"prompt_token_ids must be in [0, {vocab_size}) (the vocabulary), got {bad}")
        ids = arr.astype(np.int64).tolist()
        if items and mm_data is not None:  # multi_modal_items come with their runs already in the ids
            ids = mm.expand_ids(ids, items)
    if not ids:
        raise ValueError("prompt is empty after tokenization")
    if items:
        mm.locate(ids, items)
    return ProcessedPrompt(prompt=text, token_ids=list(ids), cache_salt=salt, mm_items=items)


def check_mm_limits(data, limits: Optional[dict]) -> None:
    """At most ``limits[modality]`` items per prompt (vLLM's ``limit_mm_per_prompt``); a ValueError naming
    the modality and the limit otherwise."""
    if not isinstance(data, dict) or not limits:
        return
    for modality, v in data.items():
        n = 0 if v is None else (len(v) if isinstance(v, list) else 1)
        if modality == "audio" and isinstance(v, tuple) and len(v) == 2 and np.isscalar(v[1]):
            n = 1
        elif isinstance(v, tuple):
            n = len(v)
        cap = limits.get(modality)
        if cap is not None and n > cap:
            raise ValueError(f"the prompt has {n} {modality} item(s); at most {cap} per prompt are allowed "
                             f"(limit_mm_per_prompt)")


__all__ = ["PromptType", "TextPrompt", "TokensPrompt", "ProcessedPrompt", "process_prompt", "is_single_prompt"]
