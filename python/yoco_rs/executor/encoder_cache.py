"""The encoder cache: each image / audio item's encoder output, kept by content identifier under a
memory budget (vLLM's encoder cache).

An item is encoded once; the chunks of its placeholder run that later steps prefill, the same image
in another request, and a preempted request's recompute read the stored embeddings. Entries are
evicted least recently used first when the budget would be exceeded, except those the current step
uses (:meth:`EncoderCache.pin` / :meth:`EncoderCache.unpin_all`); an entry larger than the whole
budget is used for its step and not kept. Eviction only costs recomputation: the executor encodes
whatever a step needs that is not here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch


class EncoderCache:
    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"encoder cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self._entries: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._lock = threading.Lock()  # requests are encoded in their preparation threads

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> torch.Tensor | None:
        with self._lock:
            t = self._entries.get(key)
            if t is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return t

    def put(self, key: str, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            if size > self.budget_bytes:
                return  # used by its request only
            self._shrink(size)
            self._entries[key] = value
            self.bytes += size

    def _shrink(self, incoming: int) -> None:
        if self.bytes + incoming <= self.budget_bytes:
            return
        for key in list(self._entries):
            if self.bytes + incoming <= self.budget_bytes:
                break
            t = self._entries.pop(key)
            self.bytes -= t.numel() * t.element_size()
            self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def stats(self) -> dict:
        return {"entries": len(self._entries), "bytes": self.bytes, "budget_bytes": self.budget_bytes,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}


__all__ = ["EncoderCache"]
