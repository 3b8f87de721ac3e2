"""The memory a step needs besides the weights and the KV pool, measured before the pool is sized.

vLLM's profiling run, for yoco: one forward at the largest step the scheduler may plan
(``max_num_batched_tokens`` tokens over ``min(max_num_seqs, tokens)`` rows, each row's last token
sampled) and one sampler call at ``max_num_seqs`` rows with every filter on (top-k/top-p sorts,
min-p, penalties and their ``[max_num_seqs, vocab]`` state, logprobs). The peak bytes of each are
what the KV budget must leave free; with CUDA graphs, the graphs' private pool holds another forward's
activations and the one logits output buffer the cross graphs share. Without this, a GPU sized at
``gpu_memory_utilization`` leaves the step nothing and the first long prompt runs out of memory.

On CUDA the peaks come from the caching allocator's statistics; elsewhere (the CPU tests)
``AllocationCounter`` counts the storages the ops allocate, so the same pass runs under a fake budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from yoco_rs.executor.batch import ForwardBatch


@dataclass(frozen=True)
class StepMemory:
    """Bytes a step needs outside the weights and the KV pool."""

    forward_bytes: int
    """Peak activations of a forward at the largest step (logits included)."""
    sampler_bytes: int
    """Peak of the sampler at the most rows, every filter on, penalty state included."""
    graph_bytes: int = 0
    """CUDA graphs: their private pool (another forward's activations) and the shared logits buffer."""

    @property
    def total(self) -> int:
        return self.forward_bytes + self.sampler_bytes + self.graph_bytes

    def describe(self) -> str:
        """``step 1.23 GiB (forward ..., sampler ..., graphs ...)`` for the startup line."""
        parts = f"forward {_gib(self.forward_bytes)}, sampler {_gib(self.sampler_bytes)}"
        if self.graph_bytes:
            parts += f", graphs {_gib(self.graph_bytes)}"
        return f"step {_gib(self.total)} ({parts})"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 1 << 28 else f"{n / 2**20:.0f} MiB"


class AllocationCounter(TorchDispatchMode):
    """Live and peak bytes of the tensor storages allocated by ops run under it (views and in-place
    or ``out=`` results allocate nothing and are not counted; a storage counts until it is freed)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: dict[int, tuple[object, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()
        returns = func._schema.returns
        flat, _ = tree_flatten(out)
        aliasing = any(r.alias_info is not None for r in returns)
        if not aliasing:
            for t in flat:
                if isinstance(t, torch.Tensor):
                    self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        st = t.untyped_storage()
        n = st.nbytes()
        key = st.data_ptr()
        if n == 0 or key in self._tracked:
            return
        self._tracked[key] = (StorageWeakRef(st), n)
        self.live += n
        self.peak = max(self.peak, self.live)

    def _sweep(self) -> None:
        gone = [k for k, (ref, _) in self._tracked.items() if ref.expired()]
        for k in gone:
            self.live -= self._tracked.pop(k)[1]


class _PeakBytes:
    """Peak bytes allocated inside the block: the CUDA allocator's statistics, else ``AllocationCounter``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._counter = AllocationCounter().__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self._counter.__exit__(*exc)
            self.peak = self._counter.peak
        return False


def largest_step(num_groups: int, *, max_num_batched_tokens: int, max_num_seqs: int,
                 block_size: int) -> ForwardBatch:
    """The biggest plan the scheduler can make: every token budget used, by as many rows as allowed,
    each row a fresh prompt chunk whose last token is sampled. K/V all go to block 0 (a 2-block pool)."""
    t = int(max_num_batched_tokens)
    r = max(1, min(int(max_num_seqs), t))
    q = np.full(r, t // r, dtype=np.int64)
    q[: t % r] += 1
    qsl = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
    positions = np.concatenate([np.arange(n) for n in q]).astype(np.int64)
    ncols = -(-int(q.max()) // block_size)
    return ForwardBatch(
        num_tokens=t,
        input_ids=torch.zeros(t, dtype=torch.int64),
        positions=torch.from_numpy(positions),
        query_start_loc=torch.from_numpy(qsl),
        seq_lens=torch.from_numpy(q.astype(np.int32)),
        block_tables=[torch.zeros(r, ncols, dtype=torch.int32) for _ in range(num_groups)],
        slot_mapping=torch.zeros(num_groups, t, dtype=torch.int64),
        kv_copies=torch.zeros(0, 4, dtype=torch.int32),
        num_cross=r,
        cross_indices=torch.from_numpy((qsl[1:] - 1).astype(np.int64)),
        cross_query_start_loc=torch.arange(r + 1, dtype=torch.int32),
        max_query_len=int(q.max()),
        max_seq_len=int(q.max()),
    )


@torch.inference_mode()
def profile_step_memory(executor, *, max_num_batched_tokens: int, max_num_seqs: int, block_size: int,
                        max_logprobs: int = 20, graphs: bool = False, max_cross_rows: int = 0) -> StepMemory:
    """Run the largest step's forward and sampler once (before the KV pool exists; a 2-block pool
    stands in) and return their peak bytes. ``graphs``: also reserve the CUDA graphs' pool (another
    forward) and the shared logits buffer of ``max_cross_rows`` rows."""
    from yoco_rs.executor.sampler import RowParams, Sampler

    specs = executor.kv_group_specs()
    had = executor.kv_caches
    executor.allocate_kv([2] * len(specs), block_size)
    try:
        batch = largest_step(len(specs), max_num_batched_tokens=max_num_batched_tokens,
                             max_num_seqs=max_num_seqs, block_size=block_size)
        with _PeakBytes(executor.device) as fwd:
            logits = executor.execute(batch)
        vocab = int(logits.shape[1])
        rows = min(int(max_num_seqs), batch.num_cross)
        logits = logits[:rows]
        with _PeakBytes(executor.device) as smp:
            sampler = Sampler(max_num_seqs, vocab, executor.device)
            worst = RowParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, presence_penalty=0.5,
                              frequency_penalty=0.5, repetition_penalty=1.1, seed=1, min_tokens=1,
                              min_tokens_ids=[0], logprobs=max_logprobs)
            ids = np.arange(rows)
            sampler.set_rows(ids.tolist(), [worst] * rows, [np.zeros(1, dtype=np.int32)] * rows,
                             [np.zeros(0, dtype=np.int64)] * rows)
            sampler.sample(logits, ids, ids)
            del sampler
        graph_bytes = 0
        if graphs:
            graph_bytes = fwd.peak + int(max_cross_rows) * vocab * 4
        return StepMemory(forward_bytes=int(fwd.peak), sampler_bytes=int(smp.peak), graph_bytes=graph_bytes)
    finally:
        executor.kv_caches = []
        if had:
            executor.kv_caches = had
        if executor.device.type == "cuda":
            torch.cuda.empty_cache()


__all__ = ["StepMemory", "AllocationCounter", "profile_step_memory", "largest_step"]
