"""Prompt forms the engine accepts, normalized once per request (vLLM's ``PromptType``).

- ``"text"``: tokenized with the checkpoint's tokenizer (``<bos>`` prepended).
- ``[1, 2, 3]``: token ids, used as given.
- ``{"prompt": "text"}`` / ``{"prompt_token_ids": [...]}`` (vLLM's ``TextPrompt``/``TokensPrompt``),
  optionally with ``"cache_salt": str`` (a prefix-cache namespace: requests only share cached KV with
  requests of the same salt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, TypedDict, Union

import numpy as np


class TextPrompt(TypedDict, total=False):
    """A text prompt with options: ``cache_salt`` keeps its prefix-cache entries apart from other tenants'."""

    prompt: str
    cache_salt: str


class TokensPrompt(TypedDict, total=False):
    """A pre-tokenized prompt (sent as-is, no ``<bos>`` added), with the same options as ``TextPrompt``."""

    prompt_token_ids: list[int]
    prompt: str
    """Optional text of the ids, returned as ``RequestOutput.prompt``."""
    cache_salt: str


PromptType = Union[str, Sequence[int], TextPrompt, TokensPrompt]


@dataclass
class ProcessedPrompt:
    """A prompt ready for the core."""

    prompt: Optional[str]
    token_ids: list[int]
    cache_salt: Optional[str] = None


def is_single_prompt(prompts) -> bool:
    """True for one prompt (a str, a dict, or a flat sequence of ints); False for a batch of them."""
    if isinstance(prompts, (str, dict)):
        return True
    if isinstance(prompts, np.ndarray):
        return prompts.ndim == 1
    if isinstance(prompts, Sequence):
        return len(prompts) > 0 and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompts)
    return False


def process_prompt(prompt, tokenizer, vocab_size: int) -> ProcessedPrompt:
    """Normalize one prompt; ``ValueError`` names what is wrong (empty, ids out of the vocabulary, ...)."""
    salt = None
    text: Optional[str] = None
    ids = None
    if isinstance(prompt, dict):
        unknown = set(prompt) - {"prompt", "prompt_token_ids", "cache_salt"}
        if unknown:
            raise ValueError(f"prompt dict has unknown key(s) {sorted(unknown)}; "
                             "use 'prompt', 'prompt_token_ids' and 'cache_salt'")
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
        ids = tokenizer.encode(text)
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
    if not ids:
        raise ValueError("prompt is empty after tokenization")
    return ProcessedPrompt(prompt=text, token_ids=list(ids), cache_salt=salt)


__all__ = ["PromptType", "TextPrompt", "TokensPrompt", "ProcessedPrompt", "process_prompt", "is_single_prompt"]
