"""CUDA graphs for the two halves of the split forward, each replayed at its *own* padded size.

In a fast-prefill step the self-decoder runs on every scheduled token (T) and the cross-decoder only on
the rows whose hidden states are needed (X, normally one per sampling request), so the two halves are
captured separately: the self-decoder at a ladder of token counts, the cross-decoder at a ladder of
selection counts. vLLM's Gemma 3n port replayed the cross-decoder graph at the *full batch* size (its
issue #38834), which wastes most of its work; here each half picks its own bucket.

A step (``forward``) goes:

1. **Self half.** Bucket ``T_b`` = the smallest captured size >= T (eager above the largest). The step's
   metadata (computed by the core on the CPU) is copied into static buffers; the only host values read
   are T, R and X (batch fields and shapes), never tensor contents, and the captured region never
   syncs. Padding (the core's own padding past T is ignored and redone here):
   * tokens ``T..T_b``: id 0, position 0, slot 0 of the reserved block 0 (in every group);
   * *mixed* steps (some row has > 1 query): the padding tokens form one extra row with
     ``seq_len = T_b - T`` and an all-zero block table, so every query belongs to a row and reads
     only block 0 (finite: the cache is zeroed and padding writes finite K/V there); rows after it
     are empty;
   * *pure decode* steps (T == R): each padding token is a 1-query row with ``seq_len = 1`` on block 0,
     so the graph uses the split-KV decode kernel.
2. **Glue** (eager, between the graphs): gather the hidden rows, per-layer inputs and positions at
   ``cross_indices`` into the cross half's static inputs.
3. **Cross half.** Bucket ``X_b`` >= X from the cross ladder; ``cross_indices[X..X_b]`` repeat the last
   real index. Every cross row becomes a 1-query attention row of its own: ``seq_len = position + 1``
   (bottom-right causal: the key range of a trailing query of its request) and its request's block-table
   row, found with ``searchsorted`` over ``query_start_loc`` (:func:`cross_attention_rows`, on the
   batch's device: the CPU in the engine). Padding rows are exact
   duplicates of the last real row, and even prompt-logprob steps (several trailing rows per request)
   fit the decode kernel. The graph ends with the logits head, on ``X_b`` rows only.
4. Logits ``[:X]`` are returned (a view into graph memory, valid until the next ``forward``).

With fast prefill off, the cross half runs on all ``T_b`` rows with the self half's metadata (the
"full" graphs) and the head runs eagerly on the selected rows.

Each graph is captured on its own all-padding layout (the ``T = R = 0`` case of the padding above), a
valid batch of exactly its size, so warm-up and capture never index past their buffers. Capture runs
largest first in one memory pool, with a progress bar; time and memory are logged.

Modes: ``"graphs"`` captures and replays CUDA graphs (needs CUDA and a backend whose metadata can live
in static buffers: Triton); ``"replay"`` runs exactly the same bucket choice, padding, static buffer
reuse and scatter-back *without* capture, on any device and backend (the CPU tests use it to show that
padded execution equals unpadded), and its ``capture()`` rehearses every graph's capture-time run.
:class:`GraphedExecutor` wraps an ``Executor``; :func:`maybe_graphed` is the engine's entry point
(``enforce_eager`` returns the plain executor).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from yoco_rs.attention import AttentionBackend, AttentionMetadata
from yoco_rs.executor.batch import ForwardBatch

log = logging.getLogger(__name__)

DEFAULT_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def capture_sizes(limit: int, ladder: Sequence[int] = DEFAULT_LADDER) -> tuple[int, ...]:
    """The ladder's sizes up to ``limit``, plus ``limit`` itself when it is not on the ladder."""
    sizes = sorted({s for s in ladder if 1 <= s <= limit} | ({limit} if limit >= 1 else set()))
    return tuple(sizes)


def pick_bucket(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size >= n, or None above the largest (run eagerly)."""
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


@dataclass(frozen=True)
class GraphConfig:
    """Which batch sizes get a captured graph, per decoder half and step kind, and the table shapes the
    static buffers need; steps larger than the biggest size run eagerly."""

    token_sizes: tuple[int, ...]
    """Self-decoder capture sizes for mixed prefill/decode steps."""
    decode_sizes: tuple[int, ...]
    """Self-decoder capture sizes for pure decode steps (<= max_num_seqs)."""
    cross_sizes: tuple[int, ...]
    """Cross-decoder capture sizes (selected rows)."""
    max_num_seqs: int
    max_blocks_per_seq: int
    fast_prefill: bool = True

    @classmethod
    def default(cls, *, max_num_seqs: int, max_num_batched_tokens: int, max_blocks_per_seq: int,
                fast_prefill: bool = True, max_capture_tokens: int = 512) -> "GraphConfig":
        """Capture sizes from the engine's limits: a ladder of token counts up to ``max_capture_tokens`` (or the
        batch budget) and of request counts up to ``max_num_seqs``."""
        tok = capture_sizes(min(max_capture_tokens, max_num_batched_tokens))
        seqs = capture_sizes(min(max_num_seqs, tok[-1]))
        return cls(tok, seqs, seqs, max_num_seqs, max_blocks_per_seq, fast_prefill)

    def __post_init__(self):
        for name in ("token_sizes", "decode_sizes", "cross_sizes"):
            sizes = getattr(self, name)
            if list(sizes) != sorted(set(sizes)) or (sizes and sizes[0] < 1):
                raise ValueError(f"{name} must be ascending distinct sizes >= 1, got {sizes}")
        if self.decode_sizes and self.decode_sizes[-1] > self.max_num_seqs:
            raise ValueError(f"decode_sizes go up to {self.decode_sizes[-1]} but max_num_seqs={self.max_num_seqs}: "
                             "a pure decode step has one token per sequence")


@dataclass
class _Graph:
    """One captured (or, in replay mode, prepared) half at one size."""

    meta: AttentionMetadata | None
    graph: Any = None  # torch.cuda.CUDAGraph
    outputs: tuple[torch.Tensor, ...] = ()


@dataclass
class RunStats:
    """What the last ``forward`` did (tests pin the buckets; benches count graph hits)."""

    self_kind: str = ""
    """"mixed", "decode" or "eager"."""
    self_size: int = 0
    cross_size: int = 0
    cross_graphed: bool = False
    padded_hidden: torch.Tensor | None = None
    """The self half's output state over all its padded rows (tests check padding stays finite)."""
    padded_logits: torch.Tensor | None = None
    """The cross half's logits over all its padded rows (padding rows duplicate the last real row)."""
    history: deque = field(default_factory=lambda: deque(maxlen=64))
    """(self kind, self size, cross size) of the last steps."""


class CudaGraphRunner:
    """Runs a split model (``self_decoder`` / ``cross_decoder`` / ``compute_logits``, see
    ``yoco_rs.models.gemma3n.model``) through padded static buffers, captured (``mode="graphs"``) or
    not (``mode="replay"``)."""

    def __init__(self, model, kv_caches: Sequence[torch.Tensor], backend: AttentionBackend, *,
                 windows: Sequence[int | None], block_size: int, config: GraphConfig,
                 mode: str = "graphs", device: torch.device | str | None = None):
        if mode not in ("graphs", "replay"):
            raise ValueError(f"mode must be 'graphs' or 'replay', got {mode!r}")
        self.device = torch.device(device) if device is not None else kv_caches[0].device
        if mode == "graphs":
            if self.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a CUDA device, got {self.device}; use mode='replay'")
            if not _has_static_metadata(backend):
                raise ValueError(f"the {backend.name!r} attention backend builds metadata with host syncs and "
                                 "cannot be captured; use the triton backend or enforce_eager")
        self.model, self.kv_caches, self.backend = model, list(kv_caches), backend
        self.windows, self.block_size, self.cfg, self.mode = list(windows), block_size, config, mode
        self.stats = RunStats()
        self.capture_seconds = 0.0
        self.capture_bytes = 0
        self._alloc_static()
        self._self_graphs: dict[tuple[str, int], _Graph] = {}
        self._cross_graphs: dict[tuple[str, int], _Graph] = {}
        self._pool = None

    # ---- static buffers ---------------------------------------------------------------------------------

    def _alloc_static(self) -> None:
        c, dev, g = self.cfg, self.device, len(self.kv_caches)
        t_max = max(c.token_sizes + c.decode_sizes, default=1)
        x_max = max(c.cross_sizes, default=1)
        if not c.fast_prefill:
            x_max = max(x_max, t_max)
        self.rows_max = max([min(t, c.max_num_seqs) + 1 for t in c.token_sizes] + list(c.decode_sizes) + [1])
        i32, i64 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int64, device=dev)
        # the padding row of a mixed graph spans cdiv(T_b - T, block_size) columns (all block 0)
        width = max(c.max_blocks_per_seq, -(-t_max // self.block_size))
        self.s_ids = torch.zeros(t_max, **i64)
        self.s_pos = torch.zeros(t_max, **i64)
        self.s_slots = torch.zeros(g, t_max, **i64)
        self.s_qsl = torch.zeros(self.rows_max + 1, **i32)
        self.s_seq = torch.zeros(self.rows_max, **i32)
        self.s_tables = [torch.zeros(self.rows_max, width, **i32) for _ in range(g)]
        self.arange = torch.arange(max(t_max, x_max, self.rows_max) + 1, **i32)
        self.x_idx = torch.zeros(x_max, **i64)
        self.x_pos = torch.zeros(x_max, **i64)
        self.x_seq = torch.zeros(x_max, **i32)
        self.x_tables = [torch.zeros(x_max, width, **i32) for _ in range(g)]
        reserve = getattr(self.model, "reserve_per_layer_inputs", None)
        if reserve is not None:  # host-resident per-layer embeddings: a fixed staging buffer the graphs read
            reserve(t_max)
        self.x_hidden: torch.Tensor | None = None  # allocated on first use (shape from the model)
        self.x_ple: torch.Tensor | None = None
        # One float32 logits output shared by every cross graph (each writes its first rows): graphs
        # that returned their own would keep one [size, vocab] buffer alive per capture size (~1.3 GB
        # over the default ladder at a 262k vocabulary). Allocated before capture, outside the pool.
        self.x_logits: torch.Tensor | None = None

    def _fill_self(self, b: ForwardBatch, kind: str, tb: int) -> None:
        """Copies the batch's self-half inputs into the static buffers, padded to ``tb`` (device ops only)."""
        t, r = b.num_tokens, b.num_rows
        self.s_ids[:t].copy_(b.input_ids[:t])
        self.s_pos[:t].copy_(b.positions[:t])
        self.s_slots[:, :t].copy_(b.slot_mapping[:, :t])
        self.s_seq[:r].copy_(b.seq_lens)
        if kind == "mixed":
            self.s_qsl[: r + 1].copy_(b.query_start_loc)
        rows = self._rows(kind, tb)
        for st, bt in zip(self.s_tables, b.block_tables):
            _copy_table(st, bt[:r], rows)
        self._pad_self(kind, tb, t, r)

    def _pad_self(self, kind: str, tb: int, t: int, r: int) -> None:
        """Padding of tokens ``t..tb`` and rows ``r..``: id 0, position 0, slot 0 of block 0; a decode
        graph gets one 1-token row per padding token, a mixed graph one row holding all of them. With
        ``t = r = 0`` this is the all-padding layout a graph is captured with."""
        rows = self._rows(kind, tb)
        self.s_ids[t:tb].zero_()
        self.s_pos[t:tb].zero_()
        self.s_slots[:, t:tb].zero_()
        if kind == "decode":
            self.s_qsl[: rows + 1].copy_(self.arange[: rows + 1])
            self.s_seq[r:rows].fill_(1)
        else:
            if r == 0:
                self.s_qsl[:1].zero_()
            self.s_qsl[r + 1: rows + 1].fill_(tb)
            self.s_seq[r:r + 1].fill_(tb - t)
            self.s_seq[r + 1: rows].zero_()
        for st in self.s_tables:
            st[r:rows].zero_()

    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.device else t.to(self.device, non_blocking=True)

    def _rows(self, kind: str, tb: int) -> int:
        return tb if kind == "decode" else min(tb, self.cfg.max_num_seqs) + 1

    # ---- metadata over the static buffers ---------------------------------------------------------------

    def _self_meta(self, kind: str, tb: int) -> AttentionMetadata:
        rows = self._rows(kind, tb)
        return self._meta(self.s_qsl[: rows + 1], self.s_seq[:rows], self.s_pos[:tb],
                          [t[:rows] for t in self.s_tables], self.s_slots[:, :tb],
                          max_query_len=1 if kind == "decode" else 0)

    def _cross_meta(self, xb: int) -> AttentionMetadata:
        return self._meta(self.arange[: xb + 1], self.x_seq[:xb], self.x_pos[:xb],
                          [t[:xb] for t in self.x_tables], None, max_query_len=1)

    def _meta(self, qsl, seq, pos, tables, slots, *, max_query_len: int) -> AttentionMetadata:
        if _has_static_metadata(self.backend):
            from yoco_rs.kernels.backend import TritonAttentionMetadata

            return TritonAttentionMetadata(
                num_queries=int(pos.shape[0]), block_size=self.block_size, positions=pos,
                query_start_loc=qsl, seq_lens=seq, block_tables=tables, windows=self.windows,
                slot_mapping=slots, max_query_len=max_query_len, max_seq_len=0, num_covered=-1,
            )
        # a host-built backend (the torch reference): rebuilt from the buffers' current contents
        return self.backend.build_metadata(
            query_start_loc_cpu=qsl.cpu(), seq_lens_cpu=seq.cpu(), query_start_loc=qsl, seq_lens=seq,
            positions=pos, block_tables=tables, slot_mapping=slots, windows=self.windows,
            block_size=self.block_size, dtype=self.model.dtype,
        )

    # ---- the halves -------------------------------------------------------------------------------------

    def _run_self(self, tb: int, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.self_decoder(self.s_ids[:tb], self.s_pos[:tb], self.kv_caches, self.backend, meta)

    def _run_cross(self, xb: int, meta: AttentionMetadata, with_logits: bool) -> tuple[torch.Tensor, ...]:
        h = self.model.cross_decoder(self.x_hidden[:xb], self.x_ple[:xb], self.x_pos[:xb], self.kv_caches,
                                     self.backend, meta)
        if not with_logits:
            return (h,)
        logits = self.model.compute_logits(h)
        if self.x_logits is None or self.x_logits.shape[1] != logits.shape[1] or xb > self.x_logits.shape[0]:
            return (logits,)
        out = self.x_logits[:xb]
        out.copy_(logits)  # the temporary goes back to the (shared) pool; only the shared buffer stays
        return (out,)

    def _ensure_cross_inputs(self, hidden: torch.Tensor, ple: torch.Tensor) -> None:
        if self.x_hidden is None:
            n = self.x_idx.shape[0]
            self.x_hidden = hidden.new_zeros((n, *hidden.shape[1:]))
            self.x_ple = ple.new_zeros((n, *ple.shape[1:]))

    def _prepared(self, table: dict, key: tuple[str, int], make_meta: Callable[[], AttentionMetadata]) -> _Graph:
        """The graph (or, in replay mode, the metadata holder) of one half at one size."""
        g = table.get(key)
        if g is None:
            if self.mode == "graphs":
                raise RuntimeError(f"no CUDA graph captured for {key}; call capture() first")
            g = table[key] = _Graph(meta=None)
        if self.mode == "replay" and (g.meta is None or not _has_static_metadata(self.backend)):
            g.meta = make_meta()  # torch backend: rebuilt per step from the static buffers
        return g

    # ---- one step ---------------------------------------------------------------------------------------

    def forward(self, b: ForwardBatch) -> torch.Tensor:
        """Logits ``[X, V]`` (float32) of the batch's cross rows; KV copies must already be applied."""
        t, r, x = b.num_tokens, b.num_rows, b.num_cross
        if b.slot_mapping.dim() == 1:  # the core's flat group-major [G * T_pad]
            b = dataclasses.replace(b, slot_mapping=b.slot_mapping.view(len(self.kv_caches), -1))
        if r > self.cfg.max_num_seqs:
            raise ValueError(f"batch has {r} rows but the graph runner was built for max_num_seqs={self.cfg.max_num_seqs}")
        stage = getattr(self.model, "stage_per_layer_inputs", None)
        if stage is not None:  # the step's per-layer embedding rows, gathered on the host, copied in async
            stage(b.input_ids[:t])
        c = self.cfg
        decode = t == r
        tb = pick_bucket(t, c.decode_sizes if decode else c.token_sizes)
        kind = "decode" if decode else "mixed"
        if tb is None and decode:  # decode steps above the decode ladder may still fit a mixed graph
            tb, kind = pick_bucket(t, c.token_sizes), "mixed"
        st = self.stats
        if tb is None:
            hidden, ple, self_meta = self._eager_self(b)
            st.self_kind, st.self_size = "eager", t
        else:
            self._fill_self(b, kind, tb)
            g = self._prepared(self._self_graphs, (kind, tb), lambda: self._self_meta(kind, tb))
            hidden, ple = self._replay(g, lambda: self._run_self(tb, g.meta))
            self_meta = g.meta
            st.self_kind, st.self_size = kind, tb
        self._ensure_cross_inputs(hidden, ple)
        st.padded_hidden, st.padded_logits = hidden, None
        if x == 0:
            st.cross_size, st.cross_graphed = 0, False
            st.history.append((st.self_kind, st.self_size, 0))
            return hidden.new_zeros((0, self.model.args.vocab_size), dtype=torch.float32)
        if c.fast_prefill:
            logits = self._cross_fast(b, hidden, ple)
        else:
            logits = self._cross_full(b, hidden, ple, tb if tb is not None else None, self_meta, kind)
        st.history.append((st.self_kind, st.self_size, st.cross_size))
        st.padded_logits = logits
        return logits[:x]

    def _cross_fast(self, b: ForwardBatch, hidden, ple) -> torch.Tensor:
        x, st = b.num_cross, self.stats
        xb = pick_bucket(x, self.cfg.cross_sizes)
        n = xb if xb is not None else x
        idx, seq, tables = cross_attention_rows(b, n)  # on the batch's device (the CPU in the engine)
        st.cross_size = n
        if xb is None:  # above the cross ladder: eager on fresh tensors
            st.cross_graphed = False
            idx, seq, tables = self._dev(idx), self._dev(seq), [self._dev(t) for t in tables]
            meta = self._meta(torch.arange(n + 1, dtype=torch.int32, device=self.device), seq,
                              self._dev(b.positions).index_select(0, idx), tables, None, max_query_len=1)
            h = self.model.cross_decoder(hidden.index_select(0, idx), ple.index_select(0, idx), meta.positions,
                                         self.kv_caches, self.backend, meta)
            return self.model.compute_logits(h)
        self.x_idx[:n].copy_(idx)
        self.x_seq[:n].copy_(seq)
        for xt, t in zip(self.x_tables, tables):
            _copy_table(xt, t, n)
        idx = self.x_idx[:n]
        torch.index_select(hidden, 0, idx, out=self.x_hidden[:n])
        torch.index_select(ple, 0, idx, out=self.x_ple[:n])
        torch.index_select(self._dev(b.positions), 0, idx, out=self.x_pos[:n])
        st.cross_graphed = True
        g = self._prepared(self._cross_graphs, ("fast", xb), lambda: self._cross_meta(xb))
        return self._replay(g, lambda: self._run_cross(xb, g.meta, with_logits=True))[0]

    def _cross_full(self, b: ForwardBatch, hidden, ple, tb, self_meta, kind) -> torch.Tensor:
        """Fast prefill off: the cross half on all rows with the self half's metadata, then the head on
        the selected rows."""
        st = self.stats
        meta = _without_slots(self_meta)
        if tb is None:
            t = b.num_tokens
            h = self.model.cross_decoder(hidden, ple, meta.positions, self.kv_caches, self.backend, meta)
            st.cross_graphed, st.cross_size = False, t
        else:
            self.x_hidden[:tb].copy_(hidden)
            self.x_ple[:tb].copy_(ple)
            self.x_pos[:tb].copy_(self.s_pos[:tb])
            g = self._prepared(self._cross_graphs, ("full-" + kind, tb), lambda: meta)
            if self.mode == "replay":
                g.meta = meta
            h = self._replay(g, lambda: self._run_cross(tb, g.meta, with_logits=False))[0]
            st.cross_graphed, st.cross_size = True, tb
        return self.model.compute_logits(h.index_select(0, self._dev(b.cross_indices[: b.num_cross]).to(torch.int64)))

    def _eager_self(self, b: ForwardBatch):
        """Above the largest capture size: the unpadded batch with per-step metadata (host copies)."""
        t, d = b.num_tokens, self._dev
        pos = d(b.positions[:t]).to(torch.int64)
        meta = self.backend.build_metadata(
            query_start_loc_cpu=b.query_start_loc.cpu(), seq_lens_cpu=b.seq_lens.cpu(),
            query_start_loc=d(b.query_start_loc), seq_lens=d(b.seq_lens), positions=pos,
            block_tables=[d(bt) for bt in b.block_tables], slot_mapping=d(b.slot_mapping[:, :t]).to(torch.int64),
            windows=self.windows, block_size=self.block_size, dtype=self.model.dtype,
        )
        h, ple = self.model.self_decoder(d(b.input_ids[:t]), pos, self.kv_caches, self.backend, meta)
        return h, ple, meta

    def _replay(self, g: _Graph, run: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        if self.mode == "replay":
            out = run()
            return out if isinstance(out, tuple) else (out,)
        g.graph.replay()
        return g.outputs

    # ---- capture ----------------------------------------------------------------------------------------

    def capture(self, progress: bool = True) -> None:
        """Captures every half at every size, largest first (smaller graphs reuse the shared memory
        pool), logging the time and device memory it took. In replay mode this is a rehearsal: each
        half runs once at each size on the all-padding layout it would be captured with."""
        c = self.cfg
        jobs: list[tuple[str, str, int]] = [("self", "mixed", s) for s in c.token_sizes]
        jobs += [("self", "decode", s) for s in c.decode_sizes]
        if c.fast_prefill:
            jobs += [("cross", "fast", s) for s in c.cross_sizes]
        else:
            jobs += [("cross", "full-mixed", s) for s in c.token_sizes]
            jobs += [("cross", "full-decode", s) for s in c.decode_sizes]
        jobs.sort(key=lambda j: -j[2])
        graphs = self.mode == "graphs"
        if graphs:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # torch.cuda.graph() empties the cache itself: count from an empty one
            free0 = torch.cuda.mem_get_info(self.device)[0]
            self._pool = torch.cuda.graph_pool_handle()
        t0 = time.perf_counter()
        self._dummy_inputs()
        bar = _progress_bar(jobs, progress)
        for half, kind, size in bar:
            bar.set_postfix_str(f"{half} {kind} {size}")
            if half == "self" or kind.startswith("full-"):
                self._pad_self(kind.removeprefix("full-"), size, 0, 0)
            if half == "self":
                meta = self._self_meta(kind, size)
                run = (lambda m=meta, s=size: self._run_self(s, m))
                self._self_graphs[(kind, size)] = self._capture_one(meta, run) if graphs else self._rehearse(meta, run)
            else:
                if kind == "fast":
                    meta = self._cross_meta(size)
                    run = (lambda m=meta, s=size: self._run_cross(s, m, with_logits=True))
                else:
                    meta = _without_slots(self._self_graphs[(kind[5:], size)].meta)
                    run = (lambda m=meta, s=size: self._run_cross(s, m, with_logits=False))
                self._cross_graphs[(kind, size)] = self._capture_one(meta, run) if graphs else self._rehearse(meta, run)
        if graphs:
            torch.cuda.synchronize(self.device)
            self.capture_bytes = free0 - torch.cuda.mem_get_info(self.device)[0]
        self.capture_seconds = time.perf_counter() - t0
        log.info("CUDA graphs: %s %d graphs in %.1f s using %.0f MiB of device memory",
                 "captured" if graphs else "rehearsed (replay mode)", len(jobs), self.capture_seconds,
                 self.capture_bytes / 2**20)

    def _dummy_inputs(self) -> None:
        """Capture-time contents: every token is padding (writes and reads only block 0); one eager run
        of the self half at size 1 gives the cross inputs' shapes."""
        self.x_idx.zero_()
        self.x_pos.zero_()
        self.x_seq.fill_(1)
        for t in self.x_tables:
            t.zero_()
        kind = "decode" if self.cfg.decode_sizes else "mixed"
        self._pad_self(kind, 1, 0, 0)
        h, ple = self._run_self(1, self._self_meta(kind, 1))
        self._ensure_cross_inputs(h, ple)
        if self.cfg.fast_prefill and self.x_logits is None:
            vocab = int(self.model.compute_logits(h).shape[-1])
            self.x_logits = torch.zeros(self.x_idx.shape[0], vocab, dtype=torch.float32, device=self.device)

    def _rehearse(self, meta: AttentionMetadata, run: Callable[[], Any]) -> _Graph:
        run()
        return _Graph(meta=meta)

    def _capture_one(self, meta: AttentionMetadata, run: Callable[[], Any]) -> _Graph:
        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            for _ in range(2):  # warm-up: Triton JIT, cuBLAS workspaces
                run()
        torch.cuda.current_stream(self.device).wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = run()
        return _Graph(meta=meta, graph=graph, outputs=out if isinstance(out, tuple) else (out,))


def cross_attention_rows(b: ForwardBatch, n: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The cross half as one attention row per selected token: the batch's ``cross_indices[:X]`` padded
    to ``n`` by repeating the last one (int64), each row's ``seq_lens`` (int32; bottom-right aligned, so
    a trailing token ``idx`` of a row ending at ``q_end`` sees ``seq_len - (q_end - 1 - idx)`` keys) and
    per group its request's block-table row. Tensor ops only, on the batch's device: no host reads."""
    x, r = b.num_cross, b.num_rows
    if x == 0:
        raise ValueError("no cross rows to lay out (num_cross == 0)")
    idx = b.cross_indices[:x].to(torch.int64)
    if n > x:
        idx = torch.cat([idx, idx[x - 1:].expand(n - x)])
    ends = b.query_start_loc[1: r + 1].to(torch.int64)
    rows = torch.searchsorted(ends, idx, right=True)
    seq = b.seq_lens.to(torch.int64)[rows] - ends[rows] + idx + 1
    return idx, seq.to(torch.int32), [bt.index_select(0, rows) for bt in b.block_tables]


def _progress_bar(jobs: list, progress: bool):
    """A tqdm bar over ``jobs``, or the bare list where tqdm is absent (the GPU script runs from a plain
    checkout with only torch and triton): capturing does not depend on a progress display."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar(jobs)
    return tqdm(jobs, desc="Capturing CUDA graphs", unit="graph", disable=not progress)


class _NoBar(list):
    """What ``capture`` uses of a tqdm bar (iteration, ``set_postfix_str``), doing nothing."""

    def set_postfix_str(self, s: str) -> None:
        pass


def _copy_table(static: torch.Tensor, table: torch.Tensor, rows: int) -> None:
    """``static[:rows]`` = ``table`` zero-extended (columns and rows): stale entries never survive."""
    if table.shape[1] > static.shape[1]:
        raise ValueError(f"block tables have {table.shape[1]} columns; the graph runner holds {static.shape[1]} "
                         "(build it with max_model_len >= the engine's)")
    static[:rows].zero_()
    static[: table.shape[0], : table.shape[1]].copy_(table)


def _has_static_metadata(backend: AttentionBackend) -> bool:
    """Backends whose metadata is plain views of the inputs (safe to keep across steps and capture)."""
    return getattr(backend, "name", "") == "triton"


def _without_slots(meta: AttentionMetadata) -> AttentionMetadata:
    import copy

    m = copy.copy(meta)
    m.slot_mapping = None
    return m


class GraphedExecutor:
    """An ``Executor`` whose forward runs through a :class:`CudaGraphRunner` (everything else delegates
    to the wrapped executor). Build it after ``allocate_kv``; a new KV allocation needs a new wrapper.

    ``execute(batch)`` = the executor's checks, KV copies (the Triton copy kernel when the backend has
    one, no host sync), then the runner's padded halves; same return value as ``Executor.execute``:
    float32 logits ``[num_cross, vocab]``, here a view valid until the next call."""

    def __init__(self, executor, *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 mode: str | None = None, backend: AttentionBackend | None = None,
                 config: GraphConfig | None = None, max_capture_tokens: int = 512):
        if not executor.kv_caches:
            raise RuntimeError("allocate the KV cache (executor.allocate_kv) before building a GraphedExecutor")
        dev = executor.device
        mode = mode or ("graphs" if dev.type == "cuda" else "replay")
        if backend is None:
            backend = executor.backend
            if mode == "graphs" and not _has_static_metadata(backend):
                from yoco_rs.kernels.backend import TritonAttentionBackend

                backend = TritonAttentionBackend()
        bs = executor.block_size
        self.config = config or GraphConfig.default(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_blocks_per_seq=-(-max_model_len // bs), fast_prefill=executor.kv_sharing_fast_prefill,
            max_capture_tokens=max_capture_tokens)
        self.executor = executor
        self.runner = CudaGraphRunner(executor.model, executor.kv_caches, backend,
                                      windows=[s.window for s in executor.kv_group_specs()], block_size=bs,
                                      config=self.config, mode=mode, device=dev)

    def capture(self, progress: bool = True) -> None:
        """Capture (or, in replay mode, rehearse) every graph; done once before serving."""
        with torch.inference_mode():
            self.runner.capture(progress)

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        """``Executor.execute`` with the same contract: apply the step's KV copies, then run each half through
        its captured graph when one fits the batch, eagerly otherwise. A step with image / audio
        embeddings (``mm_overlay``, prefill only) runs eagerly: the graphs read token ids only."""
        ex = self.executor
        if batch.mm_overlay is not None:
            return ex.execute(batch)
        slots = ex._check(batch)  # validated; [G, T_pad] even when the core passed its flat array
        if slots is not None and slots is not batch.slot_mapping:
            batch = dataclasses.replace(batch, slot_mapping=slots)
        if batch.kv_copies.numel():
            copy = getattr(self.runner.backend, "copy_kv", None)
            if copy is not None:
                copy(ex.kv_caches, self.runner._dev(batch.kv_copies).to(torch.int32))
            else:
                from yoco_rs.executor.kv_cache import apply_kv_copies

                apply_kv_copies(ex.kv_caches, batch.kv_copies)
        return self.runner.forward(batch)

    def __getattr__(self, name: str):
        return getattr(self.executor, name)


def maybe_graphed(executor, *, enforce_eager: bool, max_num_seqs: int, max_num_batched_tokens: int,
                  max_model_len: int, progress: bool = True):
    """What the engine should drive: the executor itself with ``enforce_eager`` or off CUDA, else a
    :class:`GraphedExecutor` with its graphs captured (after ``allocate_kv``)."""
    if enforce_eager or executor.device.type != "cuda":
        return executor
    g = GraphedExecutor(executor, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        max_model_len=max_model_len, mode="graphs")
    g.capture(progress=progress)
    return g
