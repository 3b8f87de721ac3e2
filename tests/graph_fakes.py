"""A small stand-in for the split Gemma 3n model with the same three-part API (``self_decoder``,
``cross_decoder``, ``compute_logits``) and the same attention use (K/V written by producing layers,
shared layers attending to their donor's cache, one sliding and one full group), but a few thousand
parameters: the graph runner's bucket/padding tests run many steps through it in seconds. Every query
row depends on its position (RoPE-like phase) and on its whole visible context, so a padding or
metadata mistake changes the logits."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from step_plans import MiniPlanner
from torch import nn

from yoco_rs.attention import get_backend
from yoco_rs.executor.cuda_graphs import CudaGraphRunner, GraphConfig

WINDOWS = [5, None]  # group 0 sliding (window shorter than a block), group 1 full
BS = 8
NUM_BLOCKS = 96
TOL = dict(atol=2e-5, rtol=2e-5)


class FakeSplitModel(nn.Module):
    def __init__(self, *, vocab: int = 61, hidden: int = 32, streams: int = 2, heads: int = 4, kv_heads: int = 2,
                 head_dim: int = 16, ple_layers: int = 3, ple_dim: int = 8, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def w(*shape):
            return nn.Parameter(torch.randn(shape, generator=g) * shape[-1] ** -0.5, requires_grad=False)

        self.args = SimpleNamespace(vocab_size=vocab)
        self.dtype = torch.float32
        self.h, self.a, self.nh, self.nkv, self.d = hidden, streams, heads, kv_heads, head_dim
        self.embed = w(vocab, hidden)
        self.ple_table = w(vocab, ple_layers * ple_dim)
        self.ple_shape = (ple_layers, ple_dim)
        # producers: layer 0 -> group 0 (sliding), layer 1 -> group 1 (full); consumers read them back
        self.wq = nn.ParameterList([w(heads * head_dim, hidden) for _ in range(4)])
        self.wk = nn.ParameterList([w(kv_heads * head_dim, hidden) for _ in range(2)])
        self.wv = nn.ParameterList([w(kv_heads * head_dim, hidden) for _ in range(2)])
        self.wo = nn.ParameterList([w(hidden, heads * head_dim) for _ in range(4)])
        self.ple_proj = w(hidden, ple_layers * ple_dim)
        self.head = w(vocab, hidden)

    def _phase(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x * torch.cos(positions.to(torch.float32)[:, None] * 0.37)[:, None]

    def _attn(self, i: int, group: int, h, positions, kv_caches, backend, meta, write: bool):
        t = h.shape[0]
        q = self._phase((h @ self.wq[i].T).view(t, self.nh, self.d), positions)
        kv = kv_caches[group][0]
        if write:
            k = self._phase((h @ self.wk[i].T).view(t, self.nkv, self.d), positions)
            v = (h @ self.wv[i].T).view(t, self.nkv, self.d)
            backend.write_kv(kv, k.contiguous(), v.contiguous(), meta, group)
        o = backend.attend(q.contiguous(), kv, meta, group, 1.0)
        return h + torch.tanh(o.reshape(t, self.nh * self.d) @ self.wo[i].T)

    def self_decoder(self, input_ids, positions, kv_caches, backend, meta, collect=None):
        ids = input_ids.to(torch.int64)
        h = self.embed[ids]
        ple = self.ple_table[ids].view(ids.shape[0], *self.ple_shape)
        for i in range(2):
            h = self._attn(i, i, h, positions, kv_caches, backend, meta, write=True)
        return torch.stack([h, torch.sin(h)], dim=1), ple

    def cross_decoder(self, hidden, per_layer_inputs, positions, kv_caches, backend, meta, collect=None):
        h = hidden[:, 0] + hidden[:, 1] * 0.5 + per_layer_inputs.flatten(1) @ self.ple_proj.T
        for i in range(2, 4):
            h = self._attn(i, i - 2, h, positions, kv_caches, backend, meta, write=False)
        return torch.stack([h, hidden[:, 1]], dim=1)

    def compute_logits(self, hidden):
        return (hidden.sum(1) @ self.head.T).float()


def make_kv(windows, *, num_blocks: int, block_size: int, kv_heads: int = 2, head_dim: int = 16,
            device="cpu", dtype=torch.float32):
    """One single-layer group per window, zeroed like the executor's."""
    return [torch.zeros((1, 2, num_blocks, block_size, kv_heads, head_dim), dtype=dtype, device=device)
            for _ in windows]


def eager_forward(model, kv_caches, backend, windows, block_size, b, *, fast_prefill: bool = True):
    """The executor's unpadded eager path (model's ``Executor.execute``), the runner's oracle: the
    cross half uses the plan's own ``cross_query_start_loc`` rows."""
    t = b.num_tokens
    common = dict(seq_lens_cpu=b.seq_lens.cpu(), seq_lens=b.seq_lens, block_tables=b.block_tables,
                  windows=windows, block_size=block_size, dtype=model.dtype)
    pos = b.positions[:t]
    meta = backend.build_metadata(query_start_loc_cpu=b.query_start_loc.cpu(), query_start_loc=b.query_start_loc,
                                  positions=pos, slot_mapping=b.slot_mapping[:, :t], **common)
    hidden, ple = model.self_decoder(b.input_ids[:t], pos, kv_caches, backend, meta)
    idx = b.cross_indices[: b.num_cross].to(torch.int64)
    if not fast_prefill:
        h = model.cross_decoder(hidden, ple, pos, kv_caches, backend, meta)
        return model.compute_logits(h.index_select(0, idx))
    xmeta = backend.build_metadata(query_start_loc_cpu=b.cross_query_start_loc.cpu(),
                                   query_start_loc=b.cross_query_start_loc, positions=pos.index_select(0, idx),
                                   slot_mapping=None, **common)
    h = model.cross_decoder(hidden.index_select(0, idx), ple.index_select(0, idx), pos.index_select(0, idx),
                            kv_caches, backend, xmeta)
    return model.compute_logits(h)


class Pair:
    """The eager executor path and the runner, in lock step on one plan, each with its own KV cache."""

    def __init__(self, cfg: GraphConfig, backend=None, seed=0, device="cpu", mode="replay"):
        self.model = FakeSplitModel(seed=seed).to(device)
        self.backend = backend or get_backend("torch")
        self.ref_backend = get_backend("torch")
        self.kv_eager = make_kv(WINDOWS, num_blocks=NUM_BLOCKS, block_size=BS, device=device)
        self.kv_graph = make_kv(WINDOWS, num_blocks=NUM_BLOCKS, block_size=BS, device=device)
        self.cfg = cfg
        self.runner = CudaGraphRunner(self.model, self.kv_graph, self.backend, windows=WINDOWS, block_size=BS,
                                      config=cfg, mode=mode)
        if mode == "graphs":
            self.runner.capture(progress=False)
        self.planner = MiniPlanner(windows=WINDOWS, block_size=BS, num_blocks=NUM_BLOCKS,
                                   max_blocks_per_seq=cfg.max_blocks_per_seq, seed=seed, device=device)

    def step(self, rows, counts, pad_to=None):
        b = self.planner.batch(rows, counts, pad_to=pad_to)
        want = eager_forward(self.model, self.kv_eager, self.ref_backend, WINDOWS, BS, b,
                             fast_prefill=self.cfg.fast_prefill)
        got = self.runner.forward(b).clone()
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, **TOL)
        if want.shape[0]:
            assert torch.equal(got.argmax(-1), want.argmax(-1))
        st = self.runner.stats
        if st.self_kind != "eager":
            check_self_layout(self.runner, st.self_kind, st.self_size)
        assert torch.isfinite(st.padded_hidden).all(), "padding rows of the self half went non-finite"
        if b.num_cross:
            pad = st.padded_logits[b.num_cross:]
            assert torch.equal(pad, st.padded_logits[b.num_cross - 1].expand_as(pad)), \
                "cross padding rows must duplicate the last real row"
        for ke, kg in zip(self.kv_eager, self.kv_graph):
            torch.testing.assert_close(kg[:, :, 1:], ke[:, :, 1:], **TOL)  # block 0 is the padding sink
        MiniPlanner.advance(rows, counts, b, want.argmax(-1))
        return b




def check_self_layout(runner, kind: str, tb: int) -> None:
    """The static self-half buffers describe a valid batch of exactly ``tb`` tokens: every query in one
    row and none beyond ``tb`` (a kernel would read and write past ``q``), each row with at least as
    many keys as queries, its key blocks inside its table row, every slot inside the cache."""
    rows = runner._rows(kind, tb)
    qsl = runner.s_qsl[: rows + 1].cpu().long()
    seq = runner.s_seq[:rows].cpu().long()
    qlen = qsl[1:] - qsl[:-1]
    assert qsl[0] == 0 and (qlen >= 0).all() and qsl[-1] == tb, (kind, tb, qsl.tolist())
    assert (seq >= qlen).all(), (kind, tb, seq.tolist(), qlen.tolist())
    bs = runner.block_size
    for st, kv in zip(runner.s_tables, runner.kv_caches):
        assert ((seq + bs - 1) // bs <= st.shape[1]).all()
        assert (st[:rows] >= 0).all() and (st[:rows] < kv.shape[2]).all()
        assert (runner.s_slots[:, :tb] < kv.shape[2] * bs).all()
