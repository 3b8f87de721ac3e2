"""Test harness for the executor: builds paged ``ForwardBatch``es by hand (like the Rust core would) and
runs the transformers oracle.

``PagedSim`` plays the block manager: per KV group it hands out block ids from a shuffled free list (so
block tables are non-contiguous), tracks each request's computed tokens, and builds one step's batch
from ``(request, num_tokens, num_cross)`` rows, with optional padding, KV copy ops and nulled
out-of-window sliding entries. ``hf_reference`` runs transformers on a request's whole token sequence and
returns per-layer AltUp states and logits for comparison at the positions a step computed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from yoco_rs.executor.batch import ForwardBatch


@dataclass
class SimRequest:
    tokens: list[int]
    num_computed: int = 0
    blocks: list[list[int]] = field(default_factory=list)  # per group


@dataclass
class Row:
    rid: str
    num_tokens: int
    num_cross: int = 1  # trailing tokens of the chunk that go through the cross-decoder


class PagedSim:
    def __init__(self, executor, block_size: int, num_blocks: int, seed: int = 0):
        self.ex = executor
        self.bs = block_size
        self.specs = executor.kv_group_specs()
        executor.allocate_kv(num_blocks, block_size)
        rng = random.Random(seed)
        self.free = []
        for _ in self.specs:
            ids = list(range(1, num_blocks))
            rng.shuffle(ids)
            self.free.append(ids)
        self.reqs: dict[str, SimRequest] = {}

    def add(self, rid: str, tokens: list[int]) -> SimRequest:
        r = SimRequest(list(tokens), 0, [[] for _ in self.specs])
        self.reqs[rid] = r
        return r

    def _ensure(self, r: SimRequest, upto: int) -> None:
        need = -(-upto // self.bs)
        for g in range(len(self.specs)):
            while len(r.blocks[g]) < need:
                r.blocks[g].append(self.free[g].pop())

    def share_prefix(self, rid: str, src: str, num_tokens: int) -> list[tuple[int, int, int, int]]:
        """Gives ``rid`` the first ``num_tokens`` of ``src``'s KV: full blocks shared by id, a trailing
        partial block copied into a private block (copy ops returned for the next step)."""
        r, s = self.reqs[rid], self.reqs[src]
        assert r.tokens[:num_tokens] == s.tokens[:num_tokens] and s.num_computed >= num_tokens
        full, part = divmod(num_tokens, self.bs)
        copies = []
        for g in range(len(self.specs)):
            r.blocks[g] = list(s.blocks[g][:full])
            if part:
                dst = self.free[g].pop()
                r.blocks[g].append(dst)
                copies.append((g, s.blocks[g][full], dst, part))
        r.num_computed = num_tokens
        return copies

    def step(self, rows: list[Row], *, pad_tokens: int = 0, pad_cross: int = 0,
             copies: list[tuple[int, int, int, int]] = (), null_out_of_window: bool = False):
        """Builds the batch for ``rows`` and advances the requests. Returns ``(batch, info)`` where ``info``
        lists per token ``(rid, position)`` and per cross row ``(rid, position)``."""
        ids, pos, tok_info = [], [], []
        qsl, seq_lens, cqsl = [0], [], [0]
        cross = []
        for row in rows:
            r = self.reqs[row.rid]
            start, n = r.num_computed, row.num_tokens
            assert start + n <= len(r.tokens) and 0 <= row.num_cross <= n
            self._ensure(r, start + n)
            t0 = len(ids)
            ids += r.tokens[start:start + n]
            pos += list(range(start, start + n))
            tok_info += [(row.rid, p) for p in range(start, start + n)]
            qsl.append(len(ids))
            seq_lens.append(start + n)
            cross += list(range(t0 + n - row.num_cross, t0 + n))
            cqsl.append(len(cross))
        t = len(ids)
        g_count = len(self.specs)
        slot = torch.zeros(g_count, t + pad_tokens, dtype=torch.int64)
        for g in range(g_count):
            for i, (rid, p) in enumerate(tok_info):
                slot[g, i] = self.reqs[rid].blocks[g][p // self.bs] * self.bs + p % self.bs
            slot[g, t:] = torch.arange(pad_tokens) % self.bs
        max_blocks = max(len(self.reqs[row.rid].blocks[0]) for row in rows) + 1
        tables = []
        for g, spec in enumerate(self.specs):
            tab = torch.zeros(len(rows), max_blocks, dtype=torch.int32)
            for ri, row in enumerate(rows):
                r = self.reqs[row.rid]
                blocks = list(r.blocks[g])
                if null_out_of_window and spec.window is not None:
                    first_q = r.num_computed  # first query position of this step
                    lo = first_q - spec.window + 1
                    blocks = [b if (j + 1) * self.bs - 1 >= lo else 0 for j, b in enumerate(blocks)]
                tab[ri, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            tables.append(tab)
        cross_info = [tok_info[i] for i in cross]
        x = len(cross)
        cross_pad = cross + [cross[-1]] * pad_cross if cross else [0] * pad_cross
        batch = ForwardBatch(
            num_tokens=t,
            input_ids=torch.tensor(ids + [0] * pad_tokens, dtype=torch.int64),
            positions=torch.tensor(pos + [0] * pad_tokens, dtype=torch.int64),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=tables,
            slot_mapping=slot,
            kv_copies=torch.tensor(list(copies), dtype=torch.int32).reshape(-1, 4),
            num_cross=x,
            cross_indices=torch.tensor(cross_pad, dtype=torch.int64),
            cross_query_start_loc=torch.tensor(cqsl, dtype=torch.int32),
            max_query_len=max(row.num_tokens for row in rows),
            max_seq_len=max(seq_lens),
        )
        for row in rows:
            self.reqs[row.rid].num_computed += row.num_tokens
        return batch, tok_info, cross_info


@dataclass
class HFRef:
    hidden: list[torch.Tensor]  # per layer [L, A, H]
    logits: torch.Tensor  # [L, V]


@torch.no_grad()
def hf_reference(hf_model, tokens: list[int]) -> HFRef:
    """Per-layer AltUp states (token-major) and logits of transformers on the whole sequence."""
    outs: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda _m, _i, o: outs.append(o[:, 0].permute(1, 0, 2).clone()))
             for layer in hf_model.model.layers]
    try:
        logits = hf_model(torch.tensor([tokens]), use_cache=False).logits[0]
    finally:
        for h in hooks:
            h.remove()
    return HFRef(outs, logits.float())


class CoreWithoutKernel:
    """Stands in for ``yoco_rs._core`` in ``executor/cpu_linear`` as on a CPU without AVX2/FMA: the CPU
    linear kernel reports itself unavailable, and calling it anyway fails the test."""

    @staticmethod
    def cpu_linear_available() -> bool:
        return False

    @staticmethod
    def linear_f32(*_a):
        raise AssertionError("the CPU linear kernel was called although it is unavailable")

    linear_bf16 = linear_f32


def executor_from_hf(hf_model, **kw):
    from yoco_rs.executor.executor import Executor

    cfg = hf_model.config.to_dict()
    cfg["architectures"] = ["Gemma3nForCausalLM"]
    return Executor.from_state_dict(cfg, hf_model.state_dict(), device="cpu", **kw)


def max_diff_step(refs: dict[str, HFRef], logits: torch.Tensor, hidden: list[torch.Tensor], tok_info, cross_info,
                  first_shared: int, fast: bool) -> tuple[float, float]:
    """Max abs differences (hidden over all layers, logits) of one executed step against the oracle."""
    hd = 0.0
    for layer, h in enumerate(hidden):
        rows = cross_info if (fast and layer >= first_shared) else tok_info
        for i, (rid, p) in enumerate(rows):
            hd = max(hd, (h[i] - refs[rid].hidden[layer][p]).abs().max().item())
    ld = 0.0
    for x, (rid, p) in enumerate(cross_info):
        ld = max(ld, (logits[x] - refs[rid].logits[p]).abs().max().item())
    return hd, ld
