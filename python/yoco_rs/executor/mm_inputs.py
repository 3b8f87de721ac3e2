"""Merging image / audio embeddings into a step's input embeddings (the executor side of multimodal).

A step's batch holds chunks of prompts; a chunk may cover all of an item's placeholder run, part of it
(chunked prefill split it, or a prefix hit ended inside it), or none. :meth:`MultimodalInputs.overlay`
turns the plan into one ``(token_index [M], embeddings [M, H])`` pair the model writes over its token
embeddings before anything else (``Gemma3nModel.embed``):

* every token id at or past the vision vocabulary offset gets its multimodal *hard* embedding
  (``<end_of_image>``, ``<end_of_audio>``, the placeholder ids themselves), as transformers'
  ``Gemma3nModel.forward`` does: these ids have no text embedding in the multimodal model;
* the placeholder positions of the chunk's items then get the item's encoder output rows (*soft*
  embeddings), read from the :class:`EncoderCache` or encoded now.

The per-layer embeddings are untouched here: ids past ``vocab_size_per_layer_input`` are masked to
row 0 there already, and the projection half of the per-layer input is computed from the merged
embeddings. Python work is O(rows with items x their items), vectorized over tokens.

Items are normally encoded ahead (:meth:`MultimodalInputs.encode_ahead`), while their request is
prepared (the AsyncEngine does that in a worker thread, so the step loop's decodes keep running while an
image is encoded); a step then only gathers rows. An item without embeddings (a caller that skipped the
preparation) is encoded in the step, under the scheduler's encoder budget.

The interface is plain arrays (request ids, ``query_start_loc``, ``seq_lens``, ``input_ids``) plus the
items registered per request id, so any front end that produces a core plan can use it.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import numpy as np
import torch

from yoco_rs.executor.encoder_cache import EncoderCache


class MultimodalInputs:
    def __init__(self, towers, cache: EncoderCache, dtype: torch.dtype):
        self.towers = towers
        self.cache = cache
        self.dtype = dtype
        self.offset = int(towers.args.vision_vocab_offset)
        self._items: dict[int, Sequence] = {}
        self._ids = np.zeros(0, dtype=np.uint64)
        self.encoder_seconds = 0.0
        self.items_encoded = 0
        self._stats = threading.Lock()

    # ---- requests -------------------------------------------------------------------------------------
    def add(self, req_id: int, items: Sequence) -> None:
        """Registers the items of core request ``req_id`` (offsets set)."""
        if items:
            self._items[int(req_id)] = list(items)
            self._ids = np.fromiter(self._items, dtype=np.uint64)

    def remove(self, req_id: int) -> None:
        if self._items.pop(int(req_id), None) is not None:
            self._ids = np.fromiter(self._items, dtype=np.uint64)

    def num_requests(self) -> int:
        return len(self._items)

    # ---- encoder ----------------------------------------------------------------------------------------
    def encode_ahead(self, items: Sequence) -> None:
        """Computes (or finds in the cache) every item's embeddings and stores them on the item. Thread-safe;
        called off the step loop while a request is prepared."""
        for it in items:
            if getattr(it, "embeddings", None) is None:
                it.embeddings = self.embeddings(it)

    def embeddings(self, item) -> torch.Tensor:
        """``[num_tokens, H]`` encoder output of ``item`` (cached by identifier)."""
        emb = self.cache.get(item.identifier)
        if emb is None:
            t0 = time.perf_counter()
            if item.modality == "image":
                emb = self.towers.encode_image(item.inputs["pixel_values"])
            else:
                emb = self.towers.encode_audio(item.inputs["input_features"], item.inputs["input_features_mask"])
            emb = emb.to(self.dtype)
            with self._stats:
                self.encoder_seconds += time.perf_counter() - t0
                self.items_encoded += 1
            self.cache.put(item.identifier, emb)
        return emb

    # ---- one step ---------------------------------------------------------------------------------------
    @torch.inference_mode()
    def overlay(self, req_ids: np.ndarray, query_start_loc: np.ndarray, seq_lens: np.ndarray,
                input_ids: np.ndarray, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step's ``(token_index, embeddings)``, or None when no token needs one."""
        ids = np.asarray(input_ids[:num_tokens])
        hard = np.flatnonzero(ids >= self.offset)
        if not len(hard):
            return None
        vals = self.towers.embed_hard(torch.from_numpy(ids[hard].astype(np.int64))).to(self.dtype)
        if self._items:
            rows = np.flatnonzero(np.isin(np.asarray(req_ids, dtype=np.uint64), self._ids))
            for r in rows.tolist():
                q0, q1 = int(query_start_loc[r]), int(query_start_loc[r + 1])
                c1 = int(seq_lens[r])
                c0 = c1 - (q1 - q0)
                for it in self._items[int(req_ids[r])]:
                    s, e = max(c0, it.offset), min(c1, it.offset + it.num_tokens)
                    if s >= e:
                        continue
                    emb = it.embeddings if getattr(it, "embeddings", None) is not None else self.embeddings(it)
                    at = np.searchsorted(hard, np.arange(q0 + s - c0, q0 + e - c0))
                    vals[torch.from_numpy(at)] = emb[s - it.offset:e - it.offset]
        return torch.from_numpy(hard), vals


__all__ = ["MultimodalInputs"]
