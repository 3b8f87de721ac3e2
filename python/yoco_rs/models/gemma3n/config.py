"""Gemma 3n text-decoder configuration, parsed from a Hugging Face ``config.json`` without transformers.

Defaults and conversions follow transformers 5.24's ``Gemma3nTextConfig`` (the numerical oracle):
a scalar ``intermediate_size`` expands to one value per layer, ``layer_types`` defaults to 4 sliding + 1
full repeated, ``activation_sparsity_pattern`` to 0.95 on the first 10 layers when there are more than 10,
and the legacy ``rope_theta`` / ``rope_local_base_freq`` keys become per-type RoPE thetas.

KV sharing is derived here, never hard-coded: layers ``>= first_shared = N - num_kv_shared_layers`` compute
no K/V and read the K/V of their *donor*, the last layer of the same attention type before
``first_shared``. A config where a shared layer has no such donor is rejected.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"
_LAYER_TYPES = (SLIDING, FULL)
# Fields where an explicit null means something (no softcap, no such token) rather than "use the default".
_NULLABLE = ("final_logit_softcapping", "pad_token_id", "bos_token_id", "eos_token_id")

#: Architectures whose ``config.json`` this module understands, with where the text config lives.
TEXT_ARCHITECTURES = ("Gemma3nForCausalLM",)
MULTIMODAL_ARCHITECTURES = ("Gemma3nForConditionalGeneration",)


class ConfigError(ValueError):
    """A config.json that is not a Gemma 3n text model this executor can run (names the field)."""


@dataclass(frozen=True)
class Gemma3nTextArgs:
    """The fields of the text decoder the forward uses. Build with :meth:`from_dict` (validates)."""

    vocab_size: int = 262_400
    vocab_size_per_layer_input: int = 262_144
    hidden_size: int = 2048
    hidden_size_per_layer_input: int = 256
    intermediate_size: tuple[int, ...] = ()
    num_hidden_layers: int = 35
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 32_768
    rms_norm_eps: float = 1e-6
    sliding_window: int = 512
    layer_types: tuple[str, ...] = ()
    rope_theta: dict[str, float] = field(default_factory=dict)
    final_logit_softcapping: float | None = 30.0
    num_kv_shared_layers: int = 15
    laurel_rank: int = 64
    altup_num_inputs: int = 4
    altup_active_idx: int = 0
    altup_correct_scale: bool = True
    activation_sparsity_pattern: tuple[float, ...] = ()
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 1

    # ---- parsing ---------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Gemma3nTextArgs":
        """Parses a text config dict (``config.json`` of ``Gemma3nForCausalLM`` or the ``text_config``
        of ``Gemma3nForConditionalGeneration``), applying transformers' defaults, then validates."""
        d = dict(d)
        kw: dict[str, Any] = {}
        for name in (
            "vocab_size", "vocab_size_per_layer_input", "hidden_size", "hidden_size_per_layer_input",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "hidden_activation", "max_position_embeddings", "rms_norm_eps", "sliding_window",
            "final_logit_softcapping", "num_kv_shared_layers", "laurel_rank", "altup_num_inputs",
            "altup_active_idx", "altup_correct_scale", "tie_word_embeddings", "pad_token_id",
            "bos_token_id", "eos_token_id",
        ):
            if name in d and (d[name] is not None or name in _NULLABLE):
                kw[name] = d[name]
        n = int(kw.get("num_hidden_layers", cls.num_hidden_layers))

        inter = d.get("intermediate_size", 16_384)
        if isinstance(inter, (list, tuple)):
            if len(inter) != n:
                raise ConfigError(
                    f"intermediate_size has {len(inter)} values; num_hidden_layers={n} needs {n} (or one scalar)")
            kw["intermediate_size"] = tuple(int(x) for x in inter)
        else:
            kw["intermediate_size"] = (int(inter),) * n

        types = d.get("layer_types")
        if types is None:
            types = [FULL if (i + 1) % 5 == 0 else SLIDING for i in range(n)]
        kw["layer_types"] = tuple(types)

        asp = d.get("activation_sparsity_pattern")
        if asp is None:
            k = 10 if n > 10 else 0
            asp = [0.95] * k + [0.0] * (n - k)
        elif isinstance(asp, (int, float)):
            asp = [float(asp)] * n
        kw["activation_sparsity_pattern"] = tuple(float(x) for x in asp)

        kw["rope_theta"] = _parse_rope(d)

        if d.get("attention_bias"):
            raise ConfigError("attention_bias=true is not supported (Gemma 3n has no attention bias)")
        args = cls(**kw)
        args.validate()
        return args

    def validate(self) -> None:
        n = self.num_hidden_layers
        if n < 1:
            raise ConfigError(f"num_hidden_layers={n}: must be >= 1")
        if len(self.layer_types) != n:
            raise ConfigError(f"layer_types has {len(self.layer_types)} entries; num_hidden_layers={n} needs {n}")
        for i, t in enumerate(self.layer_types):
            if t not in _LAYER_TYPES:
                raise ConfigError(f"layer_types[{i}]={t!r}: allowed values are {list(_LAYER_TYPES)}")
        if len(self.activation_sparsity_pattern) != n:
            raise ConfigError(
                f"activation_sparsity_pattern has {len(self.activation_sparsity_pattern)} values; "
                f"num_hidden_layers={n} needs {n}")
        for i, s in enumerate(self.activation_sparsity_pattern):
            if not 0.0 <= s < 1.0:
                raise ConfigError(f"activation_sparsity_pattern[{i}]={s}: must be in [0, 1)")
        if not 0 <= self.num_kv_shared_layers < n:
            raise ConfigError(f"num_kv_shared_layers={self.num_kv_shared_layers}: must be in [0, {n - 1}]")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim}: RoPE needs an even head_dim")
        if self.altup_active_idx != 0:
            raise ConfigError(
                f"altup_active_idx={self.altup_active_idx}: only 0 is supported (transformers hard-codes "
                "stream 0 in the expansion and the per-layer-input injection)")
        if self.altup_num_inputs < 1:
            raise ConfigError(f"altup_num_inputs={self.altup_num_inputs}: must be >= 1")
        if self.hidden_activation not in ("gelu_pytorch_tanh", "gelu_new"):
            raise ConfigError(
                f"hidden_activation={self.hidden_activation!r}: only 'gelu_pytorch_tanh' is supported")
        if self.sliding_window < 1 and SLIDING in self.layer_types:
            raise ConfigError(f"sliding_window={self.sliding_window}: must be >= 1")
        for t in set(self.layer_types):
            if t not in self.rope_theta:
                raise ConfigError(f"rope_parameters has no entry for layer type {t!r}")
        if self.vocab_size_per_layer_input > self.vocab_size or self.vocab_size_per_layer_input < 1:
            raise ConfigError(
                f"vocab_size_per_layer_input={self.vocab_size_per_layer_input}: must be in [1, vocab_size="
                f"{self.vocab_size}]")
        self.donors()  # raises for a shared layer without a donor

    # ---- derived structure ----------------------------------------------------------------------------

    @property
    def first_shared(self) -> int:
        """Index of the first KV-sharing layer (== N when nothing is shared)."""
        return self.num_hidden_layers - self.num_kv_shared_layers

    @property
    def num_groups_of_heads(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == SLIDING

    def window(self, layer: int) -> int | None:
        """Sliding window of ``layer`` (key k visible from query q iff q - W < k <= q), None for full."""
        return self.sliding_window if self.is_sliding(layer) else None

    def donors(self) -> list[int | None]:
        """Per layer: the donor layer whose K/V a shared layer reads, None for producing layers."""
        fs = self.first_shared
        out: list[int | None] = [None] * self.num_hidden_layers
        last: dict[str, int] = {}
        for i in range(fs):
            last[self.layer_types[i]] = i
        for i in range(fs, self.num_hidden_layers):
            t = self.layer_types[i]
            if t not in last:
                raise ConfigError(
                    f"layer {i} ({t}) shares KV (num_kv_shared_layers={self.num_kv_shared_layers}) but no layer "
                    f"before layer {fs} is of type {t!r} to donate it")
            out[i] = last[t]
        return out

    def layer_kinds(self) -> list[str]:
        """The layer description the Rust core's ``Scheduler(layer_kinds=...)`` takes:
        ``"full"``, ``"sliding:W"`` or ``"shared:DONOR"`` per layer."""
        kinds = []
        for i, donor in enumerate(self.donors()):
            if donor is not None:
                kinds.append(f"shared:{donor}")
            elif self.is_sliding(i):
                kinds.append(f"sliding:{self.sliding_window}")
            else:
                kinds.append("full")
        return kinds


def _parse_rope(d: dict[str, Any]) -> dict[str, float]:
    """Per-layer-type RoPE theta from ``rope_parameters`` (5.x) or the legacy keys (4.x)."""
    rp = d.get("rope_parameters")
    legacy_scaling = d.get("rope_scaling")
    theta = {FULL: float(d.get("rope_theta", 1_000_000.0)), SLIDING: float(d.get("rope_local_base_freq", 10_000.0))}
    if legacy_scaling:
        rtype = legacy_scaling.get("rope_type", legacy_scaling.get("type", "default"))
        if rtype != "default":
            raise ConfigError(f"rope_scaling type {rtype!r}: only the default RoPE is supported")
    if rp:
        for t in _LAYER_TYPES:
            p = rp.get(t)
            if p is None:
                continue
            rtype = p.get("rope_type", "default")
            if rtype != "default":
                raise ConfigError(f"rope_parameters[{t!r}].rope_type={rtype!r}: only 'default' is supported")
            if "rope_theta" in p:
                theta[t] = float(p["rope_theta"])
    return theta


@dataclass(frozen=True)
class ModelConfig:
    """A parsed checkpoint config: the text args plus where the text weights live in the checkpoint."""

    text: Gemma3nTextArgs
    architecture: str
    #: Prefix of text-decoder tensors in the checkpoint (``"model."`` or ``"model.language_model."``).
    weight_prefix: str
    #: Prefixes of tensors that belong to other parts (vision/audio towers) and are skipped on load.
    skip_prefixes: tuple[str, ...]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def checkpoint_dtype(self) -> str | None:
        """The checkpoint's declared dtype (``torch_dtype``, or ``dtype`` as transformers 5 writes it; the
        text config's when the top level has none), e.g. ``"bfloat16"``; None when undeclared."""
        for d in (self.raw, self.raw.get("text_config") or {}):
            for k in ("torch_dtype", "dtype"):
                v = d.get(k) if isinstance(d, dict) else None
                if isinstance(v, str) and v:
                    return v.removeprefix("torch.")
        return None


def parse_config(d: dict[str, Any]) -> ModelConfig:
    """Parses a whole ``config.json`` dict: text-only (``Gemma3nForCausalLM``, ``model_type`` ``gemma3n_text``)
    or multimodal (``Gemma3nForConditionalGeneration``, ``model_type`` ``gemma3n``, ``text_config``)."""
    archs = d.get("architectures") or []
    arch = archs[0] if archs else None
    mt = d.get("model_type")
    if arch is None:
        arch = {"gemma3n_text": TEXT_ARCHITECTURES[0], "gemma3n": MULTIMODAL_ARCHITECTURES[0]}.get(mt)
    if arch in TEXT_ARCHITECTURES:
        return ModelConfig(Gemma3nTextArgs.from_dict(d), arch, "model.", ("lm_head.",), d)
    if arch in MULTIMODAL_ARCHITECTURES:
        tc = d.get("text_config")
        if not isinstance(tc, dict):
            raise ConfigError(f"{arch} config has no text_config object")
        return ModelConfig(
            Gemma3nTextArgs.from_dict(tc), arch, "model.language_model.",
            ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.", "lm_head."),
            d,
        )
    raise ConfigError(
        f"unknown architecture {arch!r} (model_type={mt!r}); supported: "
        f"{list(TEXT_ARCHITECTURES + MULTIMODAL_ARCHITECTURES)}")


def load_config(model_dir: str | os.PathLike) -> ModelConfig:
    """Reads and parses ``<model_dir>/config.json`` (clear errors for a missing or malformed file)."""
    path = os.path.join(os.fspath(model_dir), "config.json")
    if not os.path.isdir(os.fspath(model_dir)):
        raise FileNotFoundError(f"model directory {os.fspath(model_dir)!r} does not exist")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: a Hugging Face model directory needs config.json")
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(d, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return parse_config(d)


@dataclass(frozen=True)
class KvGroup:
    """One KV group: the producing layers of one attention type, which share block tables.

    Matches the Rust core's ``kv_groups``: groups in order of first appearance of their type (group 0 is
    the type of layer 0); ``layers[i]`` is slice ``i`` of the group's KV tensor; ``readers`` are the shared
    layers reading a layer of this group, as ``(layer, donor)``.
    """

    kind: str  # "full" | "sliding"
    window: int | None
    layers: tuple[int, ...]
    readers: tuple[tuple[int, int], ...]


def kv_groups(args: Gemma3nTextArgs) -> list[KvGroup]:
    donors = args.donors()
    order: list[str] = []
    layers: dict[str, list[int]] = {}
    for i in range(args.num_hidden_layers):
        if donors[i] is not None:
            continue
        t = args.layer_types[i]
        if t not in layers:
            order.append(t)
            layers[t] = []
        layers[t].append(i)
    groups = []
    for t in order:
        readers = tuple((i, d) for i, d in enumerate(donors) if d is not None and args.layer_types[d] == t)
        sliding = t == SLIDING
        groups.append(KvGroup("sliding" if sliding else "full", args.sliding_window if sliding else None,
                              tuple(layers[t]), readers))
    return groups


def kv_slices(args: Gemma3nTextArgs) -> list[tuple[int, int]]:
    """Per layer ``(group, slice)`` of the KV it writes (producers) or reads (shared: the donor's)."""
    where: dict[int, tuple[int, int]] = {}
    for g, grp in enumerate(kv_groups(args)):
        for s, layer in enumerate(grp.layers):
            where[layer] = (g, s)
    donors = args.donors()
    return [where[i if donors[i] is None else donors[i]] for i in range(args.num_hidden_layers)]
