"""The executor: KV tensors, the model forward split into self- and cross-decoder, the sampler.

``Executor`` (executor.py) is what the engine drives; ``ForwardBatch`` (batch.py) is its input. Imports
are lazy so that ``yoco_rs.models`` can import the attention interface without a cycle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Executor", "ForwardBatch", "KVGroupSpec", "KVPoolPlan"]


def __getattr__(name: str) -> Any:
    if name == "Executor":
        from yoco_rs.executor.executor import Executor

        return Executor
    if name == "ForwardBatch":
        from yoco_rs.executor.batch import ForwardBatch

        return ForwardBatch
    if name in ("KVGroupSpec", "KVPoolPlan"):
        from yoco_rs.executor import kv_cache

        return getattr(kv_cache, name)
    raise AttributeError(name)
