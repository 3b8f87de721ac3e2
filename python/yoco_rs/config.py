"""``EngineConfig``: every engine setting in one validated object, named like vLLM's flags.

``Engine(model, **kwargs)`` and ``yoco-serve --flag`` map 1:1 onto these fields (``--max-model-len``
is ``max_model_len``). ``None`` means "pick what suits the device and the model"; ``resolve()`` turns
the config into concrete values once the model and the device are known, and its errors name the
value that would work (for example the largest ``max_model_len`` the KV pool can hold).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

from yoco_rs.checks import field_error, is_int

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_POLICIES = ("fcfs", "priority")


@dataclass
class EngineConfig:
    """Engine settings. Construct directly or through ``Engine(model, **fields)``."""

    model: Optional[str] = None
    """Checkpoint directory in Hugging Face layout (config.json, *.safetensors, tokenizer.json).
    None: the bundled default model yoco-tiny (trained; see yoco_rs/default_model/README.md)."""
    tokenizer: Optional[str] = None
    """Directory holding tokenizer.json / tokenizer_config.json; None: the model directory."""
    dtype: str = "auto"
    """auto | float32 | bfloat16 | float16. auto: the checkpoint's ``torch_dtype`` (vLLM's rule): a bfloat16
    checkpoint runs in bfloat16 everywhere; a float32 one in bfloat16 on CUDA (float16 where bfloat16 is
    unsupported) and in float32 on the CPU; a float16 one in float16 on CUDA, bfloat16 on the CPU."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N. auto: cuda when available."""
    seed: int = 0
    """Engine seed: requests without their own ``seed`` derive theirs from it."""

    max_model_len: Optional[int] = None
    """Context limit (prompt + output tokens). None: the model's ``max_position_embeddings``, capped by
    what the KV pool holds."""
    max_num_seqs: Optional[int] = None
    """Most requests running at once. None: 256 on CUDA, 64 on CPU."""
    max_num_batched_tokens: Optional[int] = None
    """Token budget per step (longer prompts are prefilled in chunks). None: 8192 on CUDA, 2048 on CPU."""
    block_size: Optional[int] = None
    """KV block size in tokens (a power of two). None: 64 on CUDA, 16 on CPU."""
    sub_block_size: Optional[int] = None
    """Prefix-cache match grain in tokens; divides ``block_size``. None: ``min(16, block_size)``."""
    enable_prefix_caching: bool = True
    kv_sharing_fast_prefill: bool = True
    """YOCO fast prefill: the KV-sharing layers run only on rows whose logits are needed."""
    kv_cache_memory: Optional[Union[int, float]] = None
    """KV pool size: an int is bytes for the KV cache; a float in (0, 1] is the fraction of device
    memory the engine may use in total (weights and activations included, like vLLM's
    ``gpu_memory_utilization``). None: 0.9 on CUDA, 1 GiB on CPU."""
    num_gpu_blocks_override: Optional[int] = None
    """Exact number of usable KV blocks per group (overrides ``kv_cache_memory``; vLLM's name)."""
    enforce_eager: bool = False
    """Skip CUDA graph capture (faster startup, slower steps). Ignored on CPU."""
    scheduling_policy: str = "fcfs"
    """fcfs | priority (lower ``priority`` value first; preempts the least important)."""
    max_logprobs: int = 20
    """Largest ``logprobs`` / ``prompt_logprobs`` a request may ask for."""
    enable_kv_events: bool = False
    """Collect vLLM-format KV cache events (``Engine.take_kv_events``)."""
    batch_invariant: bool = True
    """CPU: every projection rounds the same whatever the number of rows in the step (the row-invariant
    linear, ``executor/cpu_linear.py``), so that a token's numbers do not depend on the batch around it
    (greedy output identical across batch compositions, chunkings and fast prefill on/off). False: plain
    ``F.linear`` (MKL's GEMV below 4 rows, torch's bf16 GEMM): near-ties may then break differently
    between batch compositions, and it is no faster. Ignored on CUDA."""
    per_layer_embeddings_on_device: bool = False
    """Gemma 3n: keep the per-layer embedding table (2.0B of E2B's 4.4B parameters, one row read per token
    and layer) in device memory. False: it stays in host memory, memory-mapped from the checkpoint, and each
    step's rows are gathered on the host and copied in."""
    kv_events_config: Optional[Any] = None
    """Publish KV events over ZMQ in vLLM's wire format: vLLM's ``KVEventsConfig`` keys as a dict or JSON
    string (``yoco_rs.kv_events``). Parsed into a ``KVEventsConfig`` at construction."""
    generation_config: str = "auto"
    """Where requests' default sampling fields come from (vLLM's ``--generation-config``): ``auto``, the
    checkpoint's generation_config.json; ``vllm``, none (temperature 1, no filters); or a directory
    holding a generation_config.json. Fields a request sets always win."""
    structured_outputs_config: Optional[dict] = None
    """Structured-output settings (vLLM's ``--structured-outputs-config``): ``backend`` (``auto``,
    ``guidance`` or ``llguidance``: the only engine), ``disable_any_whitespace``, and the compile
    budget: ``time_budget_ms`` (10000), ``max_grammar_size`` (500000), ``initial_lexer_fuel``,
    ``max_in_flight`` (4), ``cache_size`` (256)."""

    limit_mm_per_prompt: Optional[Any] = None
    """Most image / audio items one prompt may carry, ``{"image": N, "audio": M}`` (a dict or its JSON
    string; vLLM's ``--limit-mm-per-prompt``). None: no limit but the context length."""
    max_num_encoder_input_tokens: Optional[int] = None
    """Encoder budget of one step: image / audio soft tokens the step's chunks may need encoded (vLLM's
    name); a chunk that would need more stops before the item. None: ``max_num_batched_tokens``, raised to
    the largest item (256 for a Gemma 3n image)."""
    encoder_cache_memory: int = 256 << 20
    """Bytes of encoder outputs (image / audio embeddings) kept by content hash, least recently used
    evicted first (an evicted item is encoded again when needed)."""

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        for name in ("model", "tokenizer"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, os.PathLike):
                    v = os.fspath(v)
                    setattr(self, name, v)
                if not isinstance(v, str) or not v:
                    raise field_error(name, "a directory path or None", v)
        if self.dtype not in _DTYPES:
            raise field_error("dtype", "one of " + ", ".join(_DTYPES), self.dtype)
        if not isinstance(self.device, str) or not (
            self.device in ("auto", "cpu", "cuda") or (self.device.startswith("cuda:") and self.device[5:].isdigit())
        ):
            raise field_error("device", "auto, cpu, cuda or cuda:N", self.device)
        if not is_int(self.seed):
            raise field_error("seed", "an integer", self.seed)
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or v < 1):
                raise field_error(name, "an integer >= 1 or None (auto)", v)
        if self.block_size is not None:
            b = self.block_size
            if not is_int(b) or b < 1 or b & (b - 1):
                raise field_error("block_size", "a power of two >= 1 (e.g. 16) or None (auto)", b)
        if self.sub_block_size is not None:
            s = self.sub_block_size
            if not is_int(s) or s < 1:
                raise field_error("sub_block_size", "an integer >= 1 dividing block_size, or None", s)
            if self.block_size is not None and self.block_size % s:
                divisors = [d for d in range(1, self.block_size + 1) if self.block_size % d == 0]
                raise field_error("sub_block_size", f"a divisor of block_size={self.block_size} ({divisors})", s)
        for name in ("enable_prefix_caching", "kv_sharing_fast_prefill", "enforce_eager", "enable_kv_events",
                     "per_layer_embeddings_on_device", "batch_invariant"):
            if not isinstance(getattr(self, name), bool):
                raise field_error(name, "a bool", getattr(self, name))
        m = self.kv_cache_memory
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, (int, float)):
                raise field_error("kv_cache_memory", "bytes (int) or a fraction in (0, 1] (float), or None", m)
            if isinstance(m, float) and not 0.0 < m <= 1.0:
                raise field_error("kv_cache_memory", "a fraction in (0, 1] when a float (use an int for bytes)", m)
            if isinstance(m, int) and m < 1:
                raise field_error("kv_cache_memory", "a positive number of bytes when an int", m)
        if self.num_gpu_blocks_override is not None and (
            not is_int(self.num_gpu_blocks_override) or self.num_gpu_blocks_override < 1
        ):
            raise field_error("num_gpu_blocks_override", "an integer >= 1 or None", self.num_gpu_blocks_override)
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise field_error("generation_config", "'auto', 'vllm' or a directory path", self.generation_config)
        if self.scheduling_policy not in _POLICIES:
            raise field_error("scheduling_policy", "fcfs or priority", self.scheduling_policy)
        if not is_int(self.max_logprobs) or self.max_logprobs < 0:
            raise field_error("max_logprobs", "an integer >= 0", self.max_logprobs)
        self.limit_mm_per_prompt = parse_mm_limits(self.limit_mm_per_prompt)
        if self.max_num_encoder_input_tokens is not None and (
                not is_int(self.max_num_encoder_input_tokens) or self.max_num_encoder_input_tokens < 1):
            raise field_error("max_num_encoder_input_tokens", "an integer >= 1 or None (auto)",
                              self.max_num_encoder_input_tokens)
        if not is_int(self.encoder_cache_memory) or self.encoder_cache_memory < 0:
            raise field_error("encoder_cache_memory", "bytes, an integer >= 0", self.encoder_cache_memory)
        from yoco_rs.kv_events import KVEventsConfig

        self.kv_events_config = KVEventsConfig.parse(self.kv_events_config)

        if self.structured_outputs_config is not None:
            from yoco_rs.structured_outputs import check_structured_outputs_config

            check_structured_outputs_config(self.structured_outputs_config)

    @classmethod
    def from_kwargs(cls, model=None, **kwargs) -> "EngineConfig":
        """``EngineConfig(model=model, **kwargs)``, with a clear error for an unknown keyword."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine setting(s) {unknown}; known: {sorted(names)}")
        return cls(model=model, **kwargs)

    def replace(self, **changes) -> "EngineConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Every field as plain data (JSON-ready), e.g. to log the resolved settings."""
        return dataclasses.asdict(self)


def parse_mm_limits(v) -> Optional[dict]:
    """``limit_mm_per_prompt`` as ``{modality: int >= 0}`` (from a dict or its JSON string), or None."""
    if v is None:
        return None
    if isinstance(v, str):
        import json

        try:
            v = json.loads(v)
        except json.JSONDecodeError as e:
            raise field_error("limit_mm_per_prompt", 'JSON like {"image": 2, "audio": 1}', v) from e
    if not isinstance(v, dict) or not all(k in ("image", "audio") and is_int(n) and n >= 0 for k, n in v.items()):
        raise field_error("limit_mm_per_prompt", 'a mapping of "image" / "audio" to an integer >= 0', v)
    return dict(v)


__all__ = ["EngineConfig", "parse_mm_limits"]
