"""Turning an ``EngineConfig`` into running parts: the checkpoint directory, tokenizer, executor (weights
and KV tensors), the Rust scheduler, the sampler and the text batch, with every ``None`` setting
resolved for the device and every impossible combination reported with the value that would work.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import torch

from yoco_rs import _core, bundled
from yoco_rs.generation_config import sampling_defaults
from yoco_rs.config import EngineConfig
from yoco_rs.executor.sampler import Sampler
from yoco_rs.tokenizer import Tokenizer

log = logging.getLogger("yoco_rs.engine")

CPU_KV_BYTES = 1 << 30


@dataclass
class Runtime:
    """Everything an engine drives, built once from an ``EngineConfig``: tokenizer, executor (weights and KV
    caches), the runner steps call, the Rust scheduler sized to the KV pool, sampler and detokenizer."""

    config: EngineConfig
    """Resolved: no ``None`` left except ``tokenizer``/``num_gpu_blocks_override``."""
    model_dir: str
    model_name: str
    tokenizer: Tokenizer
    executor: object
    """The eager :class:`~yoco_rs.executor.Executor` (weights, KV caches, model description)."""
    runner: object
    """What each step calls ``execute`` on: the executor itself, or its CUDA-graph runner on a GPU."""
    scheduler: "_core.Scheduler"
    sampler: Sampler
    text: "_core.TextBatch"
    vocab_size: int
    num_blocks: list[int]
    kv_capacity_tokens: int
    memory_split: str
    """How device memory was split (weights / step / KV), for the server's startup line."""
    sampling_defaults: dict
    """Default sampling fields from the generation config (``yoco_rs.generation_config``)."""
    mm_processor: object = None
    """The checkpoint's :class:`~yoco_rs.multimodal.processor.MmProcessor` when its towers are loaded."""


def resolve_device(name: str) -> torch.device:
    """The torch device for ``EngineConfig.device`` (``auto``: CUDA when present); a clear error when
    CUDA is asked for but missing."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use device='cpu' (or 'auto')")
    return dev


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def resolve_model_dir(model: str | None) -> tuple[str, str]:
    """(directory, name shown to users)."""
    if model is None:
        return bundled.default_model_dir(), bundled.NAME
    path = os.path.expanduser(model)
    if not os.path.isdir(path):
        raise ValueError(f"model={model!r} is not a directory; give a local checkpoint directory in Hugging Face "
                         "layout (config.json, *.safetensors, tokenizer.json), or no model for the bundled one")
    return path, os.path.basename(os.path.normpath(path))


def plan_kv_pool(executor, block_size: int, budget_bytes: int, step=None, **kw):
    """The KV pool that fits ``budget_bytes`` once ``step`` (a ``StepMemory`` from the profiling pass)
    is left free for the step's activations, sampler and graphs."""
    reserve = step.total if step is not None else 0
    left = int(budget_bytes) - reserve
    if left <= 0:
        raise ValueError(f"no memory left for the KV cache: the budget is {budget_bytes / 2**30:.2f} GiB and the "
                         f"largest step needs {reserve / 2**30:.2f} GiB ({step.describe()}); lower "
                         "max_num_batched_tokens / max_num_seqs or raise the memory budget")
    return executor.plan_kv(block_size, left, **kw)


def build_runtime(cfg: EngineConfig, *, progress: bool = False) -> Runtime:
    """Load the checkpoint, size the KV pool, and wire the executor, scheduler, sampler and detokenizer
    together (what ``Engine`` does at construction)."""
    from yoco_rs.executor import Executor

    model_dir, name = resolve_model_dir(cfg.model)
    tokenizer = Tokenizer(os.path.expanduser(cfg.tokenizer) if cfg.tokenizer else model_dir)
    device = resolve_device(cfg.device)
    cuda = device.type == "cuda"
    dtype = cfg.dtype  # "auto": the checkpoint's torch_dtype (executor.auto_dtype)
    if cfg.dtype == "float16" and not cuda:
        raise ValueError("dtype='float16' is not supported on the CPU; use float32 (or bfloat16)")
    from yoco_rs.kernels.backend import select_backend

    # Triton kernels on CUDA, the torch reference elsewhere (YOCO_ATTENTION_BACKEND overrides).
    executor = Executor.from_pretrained(model_dir, dtype=dtype, device=device,
                                        kv_sharing_fast_prefill=cfg.kv_sharing_fast_prefill, progress=progress,
                                        attn_backend=select_backend(device),
                                        per_layer_embeddings_on_host=not cfg.per_layer_embeddings_on_device,
                                        batch_invariant=cfg.batch_invariant,
                                        encoder_cache_bytes=cfg.encoder_cache_memory)
    args = executor.args
    mm_processor = None
    if executor.mm is not None:
        from yoco_rs.multimodal.processor import MmProcessor

        mm_processor = MmProcessor(executor.towers.args, tokenizer, model_dir)

    block_size = cfg.block_size or (64 if cuda else 16)
    sub_block = cfg.sub_block_size or min(16, block_size)
    if block_size % sub_block:
        raise ValueError(f"sub_block_size={sub_block} must divide block_size={block_size}")
    max_num_seqs = cfg.max_num_seqs or (256 if cuda else 64)
    mnbt = cfg.max_num_batched_tokens or (8192 if cuda else 2048)
    largest_item = 0
    if mm_processor is not None:
        largest_item = max(mm_processor.args.vision_soft_tokens, mm_processor.args.audio_soft_tokens)
    encoder_budget = cfg.max_num_encoder_input_tokens or max(mnbt, largest_item)

    # ---- KV pool ------------------------------------------------------------------------------------
    memory_split = ""
    if cfg.num_gpu_blocks_override is not None:
        specs = executor.kv_group_specs()
        num_blocks = [cfg.num_gpu_blocks_override + 1] * len(specs)
        full = [n for s, n in zip(specs, num_blocks) if s.window is None] or num_blocks
        capacity = (min(full) - 1) * block_size
    else:
        mem = cfg.kv_cache_memory
        if mem is None:
            mem = 0.9 if cuda else CPU_KV_BYTES
        if isinstance(mem, float) and cuda:
            # A fraction of the GPU: profile the largest step first and leave it room (vLLM's profile run).
            from yoco_rs.executor.kv_cache import kv_memory_budget
            from yoco_rs.executor.memory_profile import profile_step_memory

            step = profile_step_memory(executor, max_num_batched_tokens=mnbt, max_num_seqs=max_num_seqs,
                                       block_size=block_size, max_logprobs=cfg.max_logprobs,
                                       graphs=not cfg.enforce_eager, max_cross_rows=max_num_seqs)
            budget = kv_memory_budget(device, gpu_memory_utilization=mem)
            plan = plan_kv_pool(executor, block_size, budget, step, max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=mnbt)
            weights = torch.cuda.memory_allocated(device)
            memory_split = (f"weights {weights / 2**30:.2f} GiB | {step.describe()} | "
                            f"KV {plan.total_bytes / 2**30:.2f} GiB")
        elif isinstance(mem, float):
            plan = executor.plan_kv(block_size, int(mem * _physical_memory()), max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=mnbt)
        else:
            plan = executor.plan_kv(block_size, int(mem), max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt)
        num_blocks, capacity = list(plan.num_blocks), plan.max_tokens
        if not memory_split:
            memory_split = f"KV {plan.total_bytes / 2**20:,.0f} MiB (--kv-cache-memory)"

    model_max = int(args.max_position_embeddings)
    if cfg.max_model_len is None:
        max_model_len = min(model_max, capacity)
        if capacity < model_max:
            log.warning("max_model_len set to %d (what the KV pool holds) instead of the model's %d", capacity,
                        model_max)
    else:
        max_model_len = cfg.max_model_len
        if max_model_len > model_max:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={model_max}; "
                             f"use max_model_len <= {model_max}")
        if max_model_len > capacity:
            raise ValueError(
                f"max_model_len={max_model_len} does not fit in the KV cache, which holds {capacity} tokens "
                f"({num_blocks} blocks of {block_size}); the largest max_model_len that fits is {capacity} "
                "(or raise kv_cache_memory / num_gpu_blocks_override)")

    executor.allocate_kv(num_blocks, block_size)
    from yoco_rs.executor.cuda_graphs import maybe_graphed

    # On CUDA, each half is captured in its own graphs (after the KV exists); enforce_eager or a CPU
    # device gives the eager executor back unchanged.
    runner = maybe_graphed(executor, enforce_eager=cfg.enforce_eager, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=mnbt, max_model_len=max_model_len, progress=progress)
    scheduler = _core.Scheduler(
        executor.layer_kinds(), num_blocks=num_blocks, block_size=block_size, sub_block_size=sub_block,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt, max_model_len=max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching, policy=cfg.scheduling_policy,
        enable_kv_events=cfg.enable_kv_events or (cfg.kv_events_config is not None and cfg.kv_events_config.active),
        max_num_encoder_input_tokens=encoder_budget)
    if cfg.kv_events_config is not None and cfg.kv_events_config.active:
        cfg.kv_events_config.start(scheduler)
    sampler = Sampler(max_num_seqs, int(args.vocab_size), executor.device)
    text = _core.TextBatch(tokenizer.tokenizer_file)
    resolved = dataclasses.replace(
        cfg, model=model_dir, dtype=str(executor.dtype).removeprefix("torch."), device=str(executor.device),
        max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt,
        block_size=block_size, sub_block_size=sub_block, max_num_encoder_input_tokens=encoder_budget,
        kv_cache_memory=cfg.kv_cache_memory if cfg.kv_cache_memory is not None else (0.9 if cuda else CPU_KV_BYTES))
    log.info("yoco-rs engine: %s on %s (%s); KV cache holds %d tokens (%s blocks of %d, sub-block %d); "
             "fast prefill %s, prefix caching %s", name, resolved.device, resolved.dtype, capacity, num_blocks,
             block_size, sub_block, "on" if cfg.kv_sharing_fast_prefill else "off",
             "on" if cfg.enable_prefix_caching else "off")
    log.info(memory_line(executor, cfg.dtype))
    defaults = sampling_defaults(cfg.generation_config, model_dir)
    return Runtime(resolved, model_dir, name, tokenizer, executor, runner, scheduler, sampler, text, int(args.vocab_size),
                   num_blocks, capacity, memory_split, defaults, mm_processor)


def memory_line(executor, requested_dtype: str) -> str:
    """The startup line naming the dtype (and where it came from) and the memory split."""
    mc = executor.model_config
    declared = mc.checkpoint_dtype if mc is not None else None
    dtype = str(executor.dtype).removeprefix("torch.")
    why = (f"auto from the checkpoint's {declared}" if declared else "auto, no dtype in config.json") \
        if requested_dtype == "auto" else "requested"
    m = executor.memory_split()
    gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    host = (f"; weights in host memory {gib(m['weights_host'])} (per-layer embeddings, memory-mapped)"
            if m["weights_host"] else "")
    return (f"yoco-rs memory: dtype {dtype} ({why}); weights on {executor.device} {gib(m['weights_device'])}"
            f"{host}; KV cache {gib(m['kv_cache'])}")


__all__ = ["Runtime", "build_runtime", "memory_line", "plan_kv_pool", "resolve_device", "resolve_model_dir"]
