"""A miniature step planner for executor-level tests and the GPU check script: requests with prompts,
chunked prefill and decode under a token budget, blocks drawn at random from a free list (so block
tables are non-contiguous), separate tables per KV group, sliding groups dropping blocks out of the
window as the core does (table entry 0). It builds ``ForwardBatch``es with the core's conventions
(``crates/yoco-core/src/sched/plan.rs``) without the compiled ``_core``, so it runs from a plain checkout.
Not a scheduler: no preemption, no prefix cache."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from yoco_rs.executor.batch import ForwardBatch


@dataclass
class Req:
    tokens: list[int]
    prompt_len: int
    num_computed: int = 0
    max_new: int = 8
    prompt_logprobs: int = 0
    """Extra trailing rows to select in the cross-decoder on the step that completes the prompt."""
    tables: list[list[int]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.tokens) - self.prompt_len >= self.max_new


class MiniPlanner:
    def __init__(self, *, windows: list[int | None], block_size: int, num_blocks: int, max_blocks_per_seq: int,
                 seed: int = 0, device: str | torch.device = "cpu"):
        self.windows, self.bs, self.max_blocks = windows, block_size, max_blocks_per_seq
        self.rng = random.Random(seed)
        self.free = [list(range(1, num_blocks)) for _ in windows]
        for f in self.free:
            self.rng.shuffle(f)
        self.device = torch.device(device)

    def _ensure_blocks(self, req: Req, upto: int, first_query: int) -> None:
        need = -(-upto // self.bs)
        if need > self.max_blocks:
            raise ValueError(f"request needs {need} blocks > max_blocks_per_seq={self.max_blocks}")
        while len(req.tables) < len(self.windows):
            req.tables.append([])
        for g, w in enumerate(self.windows):
            tab = req.tables[g]
            while len(tab) < need:
                tab.append(self.free[g].pop())
            if w is not None:  # free blocks no query of this step (or later) can reach
                reach = max(0, first_query - w + 1)
                for b in range(reach // self.bs):
                    if tab[b]:
                        self.free[g].append(tab[b])
                        tab[b] = 0

    def release(self, req: Req) -> None:
        for g, tab in enumerate(req.tables):
            self.free[g].extend(b for b in tab if b)
        req.tables = []

    def batch(self, reqs: list[Req], counts: list[int], *, pad_to: int | None = None) -> ForwardBatch:
        """Schedules ``counts[i]`` new tokens of ``reqs[i]`` (rows in this order)."""
        ids, pos, slots, qsl, seq_lens, cross = [], [], [[] for _ in self.windows], [0], [], []
        xqsl = [0]
        for req, n in zip(reqs, counts):
            if n < 1 or req.num_computed + n > len(req.tokens):
                raise ValueError(f"cannot schedule {n} tokens of a request with {req.num_computed} computed "
                                 f"of {len(req.tokens)}")
            start = req.num_computed
            self._ensure_blocks(req, start + n, start)
            base = len(ids)
            for p in range(start, start + n):
                ids.append(req.tokens[p])
                pos.append(p)
                for g in range(len(self.windows)):
                    slots[g].append(req.tables[g][p // self.bs] * self.bs + p % self.bs)
            qsl.append(len(ids))
            seq_lens.append(start + n)
            if start + n >= req.prompt_len and start + n == len(req.tokens):  # samples this step
                k = 1 + (req.prompt_logprobs if start < req.prompt_len else 0)
                k = min(k, n)
                cross.extend(range(base + n - k, base + n))
            xqsl.append(len(cross))
        t = len(ids)
        tp = max(t, pad_to or t)
        ids += [0] * (tp - t)
        pos += [0] * (tp - t)
        for g in range(len(self.windows)):
            slots[g] += [i % self.bs for i in range(tp - t)]  # padding: block 0
        x = len(cross)
        tables = []
        width = max([len(r.tables[0]) for r in reqs] + [1])
        for g in range(len(self.windows)):
            tab = torch.zeros((len(reqs), width), dtype=torch.int32)
            for i, r in enumerate(reqs):
                tab[i, : len(r.tables[g])] = torch.tensor(r.tables[g], dtype=torch.int32)
            tables.append(tab.to(self.device))
        d = self.device
        return ForwardBatch(
            num_tokens=t,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=d),
            positions=torch.tensor(pos, dtype=torch.int64, device=d),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=d),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=d),
            block_tables=tables,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=d).reshape(len(self.windows), tp),
            kv_copies=torch.zeros((0, 4), dtype=torch.int32, device=d),
            num_cross=x,
            cross_indices=torch.tensor(cross, dtype=torch.int64, device=d),
            cross_query_start_loc=torch.tensor(xqsl, dtype=torch.int32, device=d),
            max_query_len=max(counts, default=0),
            max_seq_len=max(seq_lens, default=0),
        )

    @staticmethod
    def advance(reqs: list[Req], counts: list[int], batch: ForwardBatch, sampled: torch.Tensor) -> None:
        """Marks the scheduled tokens computed and appends the sampled token of each sampling request
        (``sampled`` is indexed by cross row; a request's last cross row is its sampling row)."""
        sampled = sampled.tolist()
        xqsl = batch.cross_query_start_loc.tolist()
        for i, (req, n) in enumerate(zip(reqs, counts)):
            req.num_computed += n
            if xqsl[i + 1] > xqsl[i]:
                req.tokens.append(int(sampled[xqsl[i + 1] - 1]))


def schedule(reqs: list[Req], *, budget: int, max_seqs: int, rng: random.Random,
             max_chunk: int | None = None) -> tuple[list[Req], list[int]]:
    """Running requests in order: a decode takes 1 token, a prefill the rest of its prompt (capped by
    ``max_chunk`` and the budget, so long prompts are chunked), until the token budget or the sequence
    limit is used up."""
    rows, counts, left = [], [], budget
    for r in reqs:
        if left == 0 or len(rows) == max_seqs or r.done:
            continue
        remaining = len(r.tokens) - r.num_computed
        if remaining <= 0:
            continue
        n = min(remaining, left, max_chunk or remaining)
        if r.num_computed < r.prompt_len and n < remaining and max_chunk is None:
            n = max(1, rng.randint(max(1, n // 2), n))
        rows.append(r)
        counts.append(n)
        left -= n
    return rows, counts
