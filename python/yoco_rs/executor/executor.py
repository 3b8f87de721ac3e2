"""The executor: runs one step plan (a :class:`ForwardBatch`) through Gemma 3n and returns logits.

Engine-facing API (all the engine needs)::

    ex = Executor.from_pretrained(model_dir, dtype=None, device=None, kv_sharing_fast_prefill=True)
    ex.layer_kinds()                 # ["sliding:512", ..., "full", ..., "shared:18", ...] -> Scheduler(layer_kinds=...)
    ex.kv_group_specs()              # per KV group: kind, window, layers, readers, heads, head_dim, dtype
    plan = ex.plan_kv(block_size, budget_bytes=None, max_num_seqs=..., max_num_batched_tokens=...)
    ex.allocate_kv(plan.num_blocks, block_size)     # the core's KvConfig.num_blocks = plan.num_blocks
    logits = ex.execute(batch)       # float32 [num_cross, vocab]: row x is token cross_indices[x]

One step (``execute``): move the batch to the device, apply ``kv_copies``, build the attention metadata,
run the self-decoder on all ``T_pad`` tokens (writing K/V of producing layers), then

* fast prefill (default): gather the ``X_pad`` rows at ``cross_indices``, run the cross-decoder on them
  only (queries per row from ``cross_query_start_loc``, same ``seq_lens`` and block tables: bottom-right
  alignment makes each selected query see exactly its own prefix), logits for the first ``num_cross``.
  The last self-decoder layer already runs past its K/V projection for those rows only
  (``Gemma3nModel.self_decoder_for_rows``; not when ``hidden_states`` are collected, which wants every
  token's self-decoder states);
* ``kv_sharing_fast_prefill=False``: the cross-decoder on all ``T_pad`` tokens, then logits at the same
  ``cross_indices`` rows. (Also taken with fast prefill on when every scheduled token is selected, e.g.
  a pure decode step: the two paths then compute the same rows, the full one without a gather.)

A step with no cross rows (only middle prefill chunks) returns ``[0, vocab]`` and skips the cross half.
On the CPU every projection goes through :class:`~yoco_rs.executor.cpu_linear.RowInvariantLinear`, whose
values do not depend on the number of rows, so a token's numbers are independent of the batch around
it without padding steps (``batch_invariant=False``: plain ``F.linear``, not invariant below 4 rows;
``min_rows`` still pads both halves when asked).

On the CPU a step of more than ``SUB_BATCH_TOKENS`` tokens runs as consecutive sub-batches of whole rows
(activations stay in cache; bit-identical results, see ``sub_batches``), unless ``hidden_states`` are
collected.

The batch may live on the CPU (the engine's zero-copy views of the core's arrays) or on the device; the
host values the metadata needs are read from CPU copies. ``slot_mapping`` may be ``[G, T_pad]`` or the
core's flat group-major ``[G * T_pad]``; integer dtypes are converted as needed.

For CUDA graphs (helper ``gpu``), ``prepare`` and the two halves are separately callable::

    step = ex.prepare(batch)   # validates, applies kv_copies, builds metadata (host work happens here)
    hidden, ple = ex.model.self_decoder(step.input_ids, step.positions, ex.kv_caches, ex.backend, step.self_meta)
    if step.cross_meta is not None:   # fast prefill: the selected rows only
        h = ex.model.cross_decoder(hidden[step.cross_indices], ple[step.cross_indices], step.cross_positions,
                                   ex.kv_caches, ex.backend, step.cross_meta)
    else:                             # all rows, then pick
        h = ex.model.cross_decoder(hidden, ple, step.positions, ex.kv_caches, ex.backend, step.self_meta)
        h = h[step.cross_indices]
    logits = ex.model.compute_logits(h)[: step.num_cross]
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from yoco_rs.attention import AttentionBackend, AttentionMetadata, get_backend
from yoco_rs.executor.batch import ForwardBatch
from yoco_rs.executor.cpu_linear import RowInvariantLinear
from yoco_rs.executor.kv_cache import (
    KVGroupSpec, KVPoolPlan, allocate_kv, apply_kv_copies, kv_group_specs, kv_memory_budget, plan_kv_pools,
)
from yoco_rs.executor.sub_batches import split_rows
from yoco_rs.models.gemma3n.config import (
    MULTIMODAL_ARCHITECTURES, Gemma3nTextArgs, ModelConfig, load_config, parse_config,
)
from yoco_rs.models.gemma3n.model import Gemma3nModel
from yoco_rs.models.loader import load_checkpoint, load_state_dict

log = logging.getLogger(__name__)

SUB_BATCH_TOKENS = 2048
"""On the CPU, a step with more scheduled tokens runs as consecutive sub-batches of whole rows of at most
this many tokens (see ``sub_batches``); 0 turns it off (``Executor.sub_batch_tokens``)."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """For a checkpoint that declares no dtype: float32 on CPU (exactness, speed of CPU fp32 GEMMs),
    bfloat16 on GPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def auto_dtype(checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    """``dtype="auto"``: the checkpoint's ``torch_dtype``, as vLLM resolves it. A 16-bit checkpoint keeps
    its dtype (float16 becomes bfloat16 on the CPU, which has no float16 path); a float32 checkpoint (or
    none declared) runs in bfloat16 on CUDA (float16 where bfloat16 is unsupported) and stays float32 on
    the CPU, where float32 is the exact reference path and bfloat16 buys memory, not speed."""
    declared = _NAMES.get(checkpoint_dtype or "float32", torch.float32)
    if device.type == "cuda":
        if declared == torch.float32:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return declared
    return torch.bfloat16 if declared in (torch.bfloat16, torch.float16) else torch.float32


def _dtype(d: torch.dtype | str | None, device: torch.device, checkpoint_dtype: str | None = None) -> torch.dtype:
    """The model dtype for a requested one (None / "auto": :func:`auto_dtype` of the checkpoint's)."""
    if d is None or d == "auto":
        return auto_dtype(checkpoint_dtype, device)
    if isinstance(d, torch.dtype):
        return d
    if d not in _NAMES:
        raise ValueError(f"dtype={d!r}: allowed are {sorted(_NAMES) + ['auto']}")
    return _NAMES[d]


@dataclass
class PreparedStep:
    """A batch on the device with its attention metadata (what the two halves consume)."""

    num_tokens: int
    input_ids: torch.Tensor  # [T_pad]
    positions: torch.Tensor  # [T_pad]
    self_meta: AttentionMetadata
    num_cross: int
    cross_indices: torch.Tensor  # [X_pad] int64
    cross_positions: torch.Tensor  # [X_pad]
    cross_meta: AttentionMetadata | None
    """None when the cross half runs on all tokens with ``self_meta``: fast prefill off, or every token selected."""
    overlay: tuple[torch.Tensor, torch.Tensor] | None = None
    """Image / audio embeddings over the token embeddings (``ForwardBatch.mm_overlay``), on the device."""


class Executor:
    def __init__(self, model: Gemma3nModel, model_config: ModelConfig | None = None, *,
                 kv_sharing_fast_prefill: bool = True, attn_backend: str | AttentionBackend | None = None,
                 min_rows: int | None = None, batch_invariant: bool = True):
        self.model = model.eval()
        self.args: Gemma3nTextArgs = model.args
        self.model_config = model_config
        self.dtype = model.dtype
        self.device = model.embed_tokens.weight.device
        self.kv_sharing_fast_prefill = kv_sharing_fast_prefill
        self.backend = get_backend(attn_backend)
        self.towers = None
        self.mm = None
        """:class:`~yoco_rs.executor.mm_inputs.MultimodalInputs` when the checkpoint's towers are loaded."""
        self.kv_caches: list[torch.Tensor] = []
        self.block_size = 0
        self._specs = kv_group_specs(self.args, self.dtype)
        # CPU BLAS rounds GEMMs with < 4 rows differently: the row-invariant linear keeps every token's
        # numbers independent of the batch (and equal to a whole-sequence forward) without padding.
        self.batch_invariant = batch_invariant
        if self.device.type == "cpu":
            self.linear = RowInvariantLinear(enabled=batch_invariant)
            self.model.use_linear(self.linear)
        self.min_rows = min_rows if min_rows is not None else 1
        # CPU: large steps run as sub-batches of whole rows (cache-sized activations; same results)
        self.sub_batch_tokens = SUB_BATCH_TOKENS if self.device.type == "cpu" else 0

    # ---- construction -----------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike, *, dtype: torch.dtype | str | None = None,
                        device: torch.device | str | None = None, kv_sharing_fast_prefill: bool = True,
                        attn_backend: str | AttentionBackend | None = None, progress: bool = True,
                        min_rows: int | None = None, per_layer_embeddings_on_host: bool = True,
                        batch_invariant: bool = True, multimodal: bool = True,
                        encoder_cache_bytes: int = 256 << 20) -> "Executor":
        """Loads a local Hugging Face directory (``config.json`` + safetensors; text-only or multimodal
        layout). ``dtype`` None or "auto": the checkpoint's (:func:`auto_dtype`). The per-layer embedding
        table stays memory-mapped in host memory unless ``per_layer_embeddings_on_host=False``. A multimodal
        checkpoint's vision and audio towers are loaded too (unless ``multimodal=False``), with an encoder
        cache of ``encoder_cache_bytes`` (:attr:`Executor.mm`)."""
        dev = torch.device(device) if device is not None else default_device()
        mc = load_config(model_dir)
        dt = _dtype(dtype, dev, mc.checkpoint_dtype)
        model = Gemma3nModel(mc.text, dtype=dt, device=dev, per_layer_embeddings_on_host=per_layer_embeddings_on_host)
        load_checkpoint(model, mc, model_dir, progress=progress)
        ex = cls(model, mc, kv_sharing_fast_prefill=kv_sharing_fast_prefill, attn_backend=attn_backend,
                 min_rows=min_rows, batch_invariant=batch_invariant)
        if multimodal and mc.architecture in MULTIMODAL_ARCHITECTURES:
            from yoco_rs.models.gemma3n.towers import build_towers

            towers = build_towers(mc.raw, model_dir, dtype=dt, device=dev)
            if towers is not None:
                ex.enable_multimodal(towers, encoder_cache_bytes)
        return ex

    def enable_multimodal(self, towers, encoder_cache_bytes: int) -> None:
        """Attaches loaded towers: steps then merge image / audio embeddings (``mm_inputs``)."""
        from yoco_rs.executor.encoder_cache import EncoderCache
        from yoco_rs.executor.mm_inputs import MultimodalInputs

        self.towers = towers
        self.mm = MultimodalInputs(towers, EncoderCache(encoder_cache_bytes), self.dtype)

    @classmethod
    def from_state_dict(cls, config: dict[str, Any], state_dict: dict[str, torch.Tensor], *,
                        dtype: torch.dtype | str | None = None, device: torch.device | str | None = None,
                        kv_sharing_fast_prefill: bool = True,
                        attn_backend: str | AttentionBackend | None = None,
                        min_rows: int | None = None, per_layer_embeddings_on_host: bool = False,
                        batch_invariant: bool = True) -> "Executor":
        """From a ``config.json``-style dict and a state dict with checkpoint key names (tests)."""
        dev = torch.device(device) if device is not None else default_device()
        mc = parse_config(config)
        model = Gemma3nModel(mc.text, dtype=_dtype(dtype, dev, mc.checkpoint_dtype), device=dev,
                             per_layer_embeddings_on_host=per_layer_embeddings_on_host)
        load_state_dict(model, mc, state_dict)
        return cls(model, mc, kv_sharing_fast_prefill=kv_sharing_fast_prefill, attn_backend=attn_backend,
                   min_rows=min_rows, batch_invariant=batch_invariant)

    # ---- layout the core needs ------------------------------------------------------------------------------

    def layer_kinds(self) -> list[str]:
        """Per layer ``"full"``, ``"sliding:W"`` or ``"shared:DONOR"`` (the core's ``layer_kinds``)."""
        return self.args.layer_kinds()

    def kv_group_specs(self) -> list[KVGroupSpec]:
        return list(self._specs)

    def kv_bytes_per_block(self, block_size: int) -> list[int]:
        return [s.bytes_per_block(block_size) for s in self._specs]

    def plan_kv(self, block_size: int, budget_bytes: int | None = None, *, max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                reserve_bytes: int = 0) -> KVPoolPlan:
        """Sizes the pools from ``budget_bytes`` (default: what the device has left after loading, see
        :func:`kv_memory_budget`) and logs how many tokens fit."""
        if budget_bytes is None:
            budget_bytes = kv_memory_budget(self.device, gpu_memory_utilization=gpu_memory_utilization,
                                            reserve_bytes=reserve_bytes)
        plan = plan_kv_pools(self._specs, block_size, budget_bytes, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens)
        log.info(plan.summary(self._specs))
        return plan

    def allocate_kv(self, num_blocks_per_group: int | Sequence[int], block_size: int) -> list[torch.Tensor]:
        """Allocates (zeroed) one KV tensor per group; replaces any previous allocation."""
        self.kv_caches = []
        self.kv_caches = allocate_kv(self._specs, num_blocks_per_group, block_size, self.device)
        self.block_size = block_size
        return self.kv_caches

    def memory_split(self) -> dict[str, int]:
        """Bytes of weights on the device, of weights in host memory (the memory-mapped per-layer embedding
        table, if kept there), and of the KV cache (what the startup line reports)."""
        dev, host = self.model.weight_bytes()
        if self.towers is not None:
            dev += self.towers.weight_bytes()
        kv = sum(t.numel() * t.element_size() for t in self.kv_caches)
        return {"weights_device": dev, "weights_host": host, "kv_cache": kv}

    # ---- one step ------------------------------------------------------------------------------------------------

    def _to_dev(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.device else t.to(self.device, non_blocking=True)

    def _check(self, b: ForwardBatch) -> torch.Tensor:
        """Validates shapes; returns ``slot_mapping`` as ``[G, T_pad]``."""
        if not self.kv_caches:
            raise RuntimeError("no KV cache: call allocate_kv(num_blocks_per_group, block_size) first")
        g = len(self.kv_caches)
        t_pad = int(b.input_ids.shape[0])
        slots = b.slot_mapping
        if slots.dim() == 1 and slots.numel() == g * t_pad:
            slots = slots.view(g, t_pad)  # the core's flat group-major array
        if b.positions.shape[0] != t_pad:
            raise ValueError(f"positions has {b.positions.shape[0]} entries; input_ids has {t_pad}")
        if tuple(slots.shape) != (g, t_pad):
            raise ValueError(f"slot_mapping has shape {list(slots.shape)}; expected [{g}, {t_pad}] "
                             "(one row per KV group)")
        if len(b.block_tables) != g:
            raise ValueError(f"block_tables has {len(b.block_tables)} groups; the model has {g}")
        if not 0 <= b.num_tokens <= t_pad:
            raise ValueError(f"num_tokens={b.num_tokens} not in [0, {t_pad}]")
        x_pad = int(b.cross_indices.shape[0])
        if not 0 <= b.num_cross <= x_pad:
            raise ValueError(f"num_cross={b.num_cross} not in [0, len(cross_indices)={x_pad}]")
        r = b.num_rows
        if b.query_start_loc.shape[0] != r + 1 or b.cross_query_start_loc.shape[0] != r + 1:
            raise ValueError(f"query_start_loc/cross_query_start_loc need {r + 1} entries (R={r} rows)")
        return slots

    def prepare(self, b: ForwardBatch) -> PreparedStep:
        """Validates shapes, moves the batch to the device, applies ``kv_copies``, builds metadata."""
        slot_mapping = self._check(b)
        apply_kv_copies(self.kv_caches, b.kv_copies)
        qsl_cpu, sl_cpu = b.query_start_loc.cpu(), b.seq_lens.cpu()
        qsl, sl = self._to_dev(b.query_start_loc), self._to_dev(b.seq_lens)
        tables = [self._to_dev(t) for t in b.block_tables]
        if self.device.type != "cpu":  # host-resident per-layer embeddings: this step's rows, copied in async
            self.model.stage_per_layer_inputs(b.input_ids)
        ids, pos = self._to_dev(b.input_ids), self._to_dev(b.positions).to(torch.int64)
        slots = self._to_dev(slot_mapping).to(torch.int64)
        cidx = self._to_dev(b.cross_indices).to(torch.int64)
        if ids.shape[0] < self.min_rows:  # padding tokens: id 0, position 0, slots of block 0
            n = self.min_rows - ids.shape[0]
            ids = torch.cat([ids, ids.new_zeros(n)])
            pos = torch.cat([pos, pos.new_zeros(n)])
            pad_slots = torch.arange(n, device=slots.device) % self.block_size
            slots = torch.cat([slots, pad_slots.expand(len(slots), n)], 1)
        if cidx.shape[0] < self.min_rows:  # padding cross rows repeat the last index
            fill = cidx[-1:] if cidx.shape[0] else cidx.new_zeros(1)
            cidx = torch.cat([cidx, fill.expand(self.min_rows - cidx.shape[0])])
        windows = [s.window for s in self._specs]
        common = dict(seq_lens_cpu=sl_cpu, seq_lens=sl, block_tables=tables, windows=windows,
                      block_size=self.block_size, dtype=self.dtype)
        self_meta = self.backend.build_metadata(
            query_start_loc_cpu=qsl_cpu, query_start_loc=qsl, positions=pos,
            slot_mapping=slots, **common)
        cpos = pos.index_select(0, cidx)
        cross_meta = None
        # When every scheduled token is selected (pure decode, all-prompt-logprob steps) the cross rows
        # are all tokens in order: the full path computes the same thing without a gather or new metadata.
        if self.kv_sharing_fast_prefill and b.num_cross < b.num_tokens:
            cross_meta = self.backend.build_metadata(
                query_start_loc_cpu=b.cross_query_start_loc.cpu(),
                query_start_loc=self._to_dev(b.cross_query_start_loc),
                positions=cpos, slot_mapping=None, **common)
        overlay = None
        if b.mm_overlay is not None:
            overlay = (self._to_dev(b.mm_overlay[0]).to(torch.int64), self._to_dev(b.mm_overlay[1]))
        return PreparedStep(b.num_tokens, ids, pos, self_meta, b.num_cross, cidx, cpos, cross_meta, overlay)

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch, *, hidden_states: list | None = None) -> torch.Tensor:
        """Runs one step; returns float32 logits ``[num_cross, vocab]`` (row x: token ``cross_indices[x]``).

        ``hidden_states``, when a list, receives each layer's output AltUp state ``[rows, A, H]``: all
        ``T_pad`` rows for self-decoder layers, and for the cross-decoder layers the ``X_pad`` selected
        rows (fast prefill) or all ``T_pad`` rows (fast prefill off, or a step where every token is
        selected: ``step.cross_meta is None``)."""
        if batch.num_rows == 0:
            return torch.empty(0, self.args.vocab_size, device=self.device)
        if 0 < self.sub_batch_tokens < batch.num_tokens and batch.num_rows > 1 and hidden_states is None:
            parts = split_rows(batch, self.sub_batch_tokens)
            if len(parts) > 1:
                return torch.cat([self._execute(p, None) for p in parts])
        return self._execute(batch, hidden_states)

    def _execute(self, batch: ForwardBatch, hidden_states: list | None) -> torch.Tensor:
        step = self.prepare(batch)
        m, kv = self.model, self.kv_caches
        if step.cross_meta is not None and step.num_cross > 0 and hidden_states is None:
            # fast prefill: the last self-decoder layer only needs its K/V for the tokens nobody samples
            h, ple = m.self_decoder_for_rows(step.input_ids, step.positions, kv, self.backend, step.self_meta,
                                             step.cross_indices, step.cross_meta, overlay=step.overlay)
            h = m.cross_decoder(h, ple, step.cross_positions, kv, self.backend, step.cross_meta)
            return m.compute_logits(h)[: step.num_cross]
        hidden, ple = m.self_decoder(step.input_ids, step.positions, kv, self.backend, step.self_meta, hidden_states,
                                     overlay=step.overlay)
        if step.cross_meta is not None:
            if step.num_cross == 0:  # nothing samples this step (only middle prefill chunks)
                return torch.empty(0, self.args.vocab_size, device=self.device)
            idx = step.cross_indices
            h = m.cross_decoder(hidden.index_select(0, idx), ple.index_select(0, idx), step.cross_positions, kv,
                                self.backend, step.cross_meta, hidden_states)
        else:
            h = m.cross_decoder(hidden, ple, step.positions, kv, self.backend, step.self_meta, hidden_states)
            h = h.index_select(0, step.cross_indices)
        # logits on all X_pad (>= min_rows) rows, then the real ones: same GEMM shapes as any other batch
        return m.compute_logits(h)[: step.num_cross]
