"""A checkpoint with ``google/gemma-3n-E2B-it``'s exact layout and size, random weights, written in seconds.

What a user downloads, minus the values: ``Gemma3nForConditionalGeneration`` config.json in the released
style (``torch_dtype: bfloat16``, ``text_config`` with the E2B shapes), three bf16 safetensors shards and
an index, text tensors under ``model.language_model.``, the KV-sharing layers' K/V projections present,
and stand-ins for the vision and audio towers (``model.vision_tower.*``, ``model.audio_tower.*``,
``model.embed_vision.*``, ``model.embed_audio.*``; small, since nothing reads them). The tokenizer is the
bundled model's (the real Gemma 3 tokenizer).

Values follow ``tiny.randomize`` (norms 1 +- 0.1, ``correct_output_scale`` ~ N(0, 0.5^2), matrices
N(0, fan_in^-1/2)), except the q/k norms, scaled by ``QK_NORM_SCALE``: Gemma 3n attends with scale 1.0,
so unit-RMS q and k of random weights give scores in the hundreds, where transformers' own eager and sdpa
disagree by 0.4 in the logits; x0.25 brings that to ~2e-5 and makes greedy tokens a meaningful check.

The files are streamed tensor by tensor, as slices of a few pools of normal draws at random offsets (see
``_Draws``), so building needs under 1 GB of memory and is bound by writing 8.8 GB (the page cache holds
the files afterwards).
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import torch

QK_NORM_SCALE = 0.25
POOL = 1 << 25  # draws per pool (one pool per distinct mean/std)
CHUNK = 1 << 23  # elements written per piece of a large tensor (a quarter of a pool)

E2B_TEXT = dict(
    activation_sparsity_pattern=[0.95] * 10 + [0.0] * 20, altup_active_idx=0, altup_coef_clip=120.0,
    altup_correct_scale=True, altup_lr_multiplier=1.0, altup_num_inputs=4, attention_bias=False,
    attention_dropout=0.0, final_logit_softcapping=30.0, head_dim=256, hidden_activation="gelu_pytorch_tanh",
    hidden_size=2048, hidden_size_per_layer_input=256, initializer_range=0.02, intermediate_size=[8192] * 30,
    laurel_rank=64, layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 6,
    max_position_embeddings=32768, model_type="gemma3n_text", num_attention_heads=8, num_hidden_layers=30,
    num_key_value_heads=2, num_kv_shared_layers=10, query_pre_attn_scalar=256, rms_norm_eps=1e-06,
    rope_local_base_freq=10000.0, rope_scaling=None, rope_theta=1000000.0, sliding_window=512,
    torch_dtype="bfloat16", use_cache=True, vocab_size=262400, vocab_size_per_layer_input=262144,
)
E4B_TEXT = dict(E2B_TEXT, num_hidden_layers=35, intermediate_size=[16384] * 35,
                layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7, num_kv_shared_layers=15,
                activation_sparsity_pattern=[0.95] * 10 + [0.0] * 25)

#: Stand-ins for the towers: present in the files like the real ones, never read by the text decoder.
TOWERS = {
    "model.vision_tower.timm_model.conv_stem.conv.weight": (64, 3, 3, 3),
    "model.vision_tower.timm_model.msfa.ffn.pw_proj.conv.weight": (2048, 1920, 1, 1),
    "model.audio_tower.subsample_conv_projection.conv_0.conv.weight": (128, 1, 3, 3),
    "model.audio_tower.conformer.0.attention.attn.q_proj.weight": (1536, 1536),
    "model.embed_vision.embedding.weight": (128, 2048),
    "model.embed_audio.embedding.weight": (128, 2048),
    "model.embed_audio.embedding_projection.weight": (2048, 1536),
}


def full_config(text: dict) -> dict:
    """The released config.json style around ``text``."""
    return {
        "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n", "torch_dtype": "bfloat16",
        "audio_soft_tokens_per_image": 188, "audio_token_id": 262273, "boa_token_id": 256000, "boi_token_id": 255999,
        "eoa_token_id": 262272, "eoi_token_id": 262144, "eos_token_id": [1, 106], "image_token_id": 262145,
        "initializer_range": 0.02, "vision_soft_tokens_per_image": 256, "transformers_version": "4.53.0.dev0",
        "text_config": dict(text),
        "audio_config": {"model_type": "gemma3n_audio", "hidden_size": 1536, "vocab_size": 128},
        "vision_config": {"model_type": "gemma3n_vision", "architecture": "mobilenetv5_300m_enc", "hidden_size": 2048,
                          "vocab_size": 128},
    }


def text_tensors(text: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every text-decoder tensor of the released files (names and shapes), in checkpoint order, including
    the K/V projections and k norms of the KV-sharing layers that transformers does not create."""
    from yoco_rs.models.gemma3n.config import Gemma3nTextArgs
    from yoco_rs.models.gemma3n.model import Gemma3nModel

    args = Gemma3nTextArgs.from_dict(dict(text))
    model = Gemma3nModel(args, dtype=torch.bfloat16, device="meta")  # names and shapes only, no memory
    out = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    kv = args.num_key_value_heads * args.head_dim
    for i in range(args.first_shared, args.num_hidden_layers):
        pre = f"layers.{i}.self_attn."
        out += [(pre + "k_proj.weight", (kv, args.hidden_size)), (pre + "v_proj.weight", (kv, args.hidden_size)),
                (pre + "k_norm.weight", (args.head_dim,))]
    return sorted(out, key=lambda t: _layer_order(t[0]))


def _layer_order(name: str) -> tuple:
    parts = name.split(".")
    return (1, int(parts[1]), name) if parts[0] == "layers" else (0 if "embed" in name else 2, 0, name)


class _Draws:
    """Deterministic normal values in bf16: one pool of ``POOL`` draws per (mean, std) in use (a dozen),
    tensors are slices at random offsets, written in pieces of at most ``CHUNK``. Two slices of a pool are
    shifted copies of each other only where they overlap (unrelated as vectors unless the shift is a
    multiple of the row length); a full draw of 4.4B values would take minutes on 2 cores."""

    def __init__(self, seed: int):
        self.seed = seed
        self.pools: dict[tuple[float, float], torch.Tensor] = {}
        self.rng = np.random.default_rng(seed)

    def take(self, n: int, std: float, mean: float = 0.0) -> torch.Tensor:
        key = (mean, std)
        pool = self.pools.get(key)
        if pool is None:
            g = torch.Generator().manual_seed(self.seed * 1000 + len(self.pools))
            pool = self.pools[key] = torch.randn(POOL, generator=g).mul_(std).add_(mean).to(torch.bfloat16)
        start = int(self.rng.integers(0, POOL - n + 1))
        return pool[start:start + n]


def _values(name: str, shape: tuple[int, ...], draws: _Draws, numel: int, chunk: int):
    """Yields bf16 pieces of the tensor ``name`` (flattened), ``chunk`` elements at a time."""
    last = name.split(".")[-2] if "." in name else ""
    mean, std = 0.0, (shape[-1] ** -0.5 if len(shape) > 1 else 0.5)
    if name.endswith("norm.weight") or "norm" in last:
        mean, std = 1.0, 0.1
        if last in ("q_norm", "k_norm"):
            mean, std = QK_NORM_SCALE, 0.1 * QK_NORM_SCALE
    elif "correct_output_scale" in name:
        mean, std = 0.0, 0.5
    for s in range(0, numel, chunk):
        yield draws.take(min(chunk, numel - s), std, mean)


def _write_shard(path: str, tensors: list[tuple[str, tuple[int, ...], str]], draws: _Draws) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for key, shape, _ in tensors:
        n = int(np.prod(shape)) if shape else 1
        header[key] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for key, shape, src in tensors:
            n = int(np.prod(shape)) if shape else 1
            for piece in _values(src, shape, draws, n, CHUNK):
                f.write(memoryview(piece.view(torch.int16).numpy()))


def checkpoint_bytes(text: dict = E2B_TEXT) -> int:
    """Bytes :func:`build` writes for ``text`` (the bf16 tensors; the JSON and tokenizer files add < 1 MB)."""
    entries = [s for _, s in text_tensors(text)] + list(TOWERS.values())
    return 2 * sum(int(np.prod(s)) for s in entries)


def build(out_dir: str, *, text: dict = E2B_TEXT, seed: int = 0, shards: int = 3) -> str:
    """Writes the checkpoint into ``out_dir`` (created); returns it."""
    from yoco_rs import bundled

    os.makedirs(out_dir, exist_ok=True)
    cfg = full_config(text)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    src = bundled.default_model_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(out_dir, name))
    entries = [("model.language_model." + n, s, n) for n, s in text_tensors(text)]
    entries += [(k, s, k) for k, s in TOWERS.items()]
    sizes = [int(np.prod(s)) for _, s, _ in entries]
    target = sum(sizes) / shards
    groups, acc = [[]], 0
    for e, n in zip(entries, sizes):
        if acc >= target and len(groups) < shards:
            groups.append([])
            acc = 0
        groups[-1].append(e)
        acc += n
    draws = _Draws(seed)
    weight_map = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        _write_shard(os.path.join(out_dir, fname), group, draws)
        weight_map.update({k: fname for k, _, _ in group})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 2 * sum(sizes)}, "weight_map": weight_map}, f, indent=2)
    return out_dir


def hf_text_state_dict(model_dir: str) -> dict[str, torch.Tensor]:
    """The text decoder's tensors from ``model_dir`` under transformers' ``Gemma3nForCausalLM`` names
    (``model.*``), memory-mapped (no copy), without the KV-sharing layers' K/V (transformers has none)."""
    from safetensors import safe_open

    idx = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))["weight_map"]
    text = json.load(open(os.path.join(model_dir, "config.json")))["text_config"]
    first_shared = text["num_hidden_layers"] - text["num_kv_shared_layers"]
    out = {}
    for fname in dict.fromkeys(idx.values()):
        with safe_open(os.path.join(model_dir, fname), framework="pt") as f:
            for k in f.keys():
                if not k.startswith("model.language_model."):
                    continue
                name = k[len("model.language_model."):]
                parts = name.split(".")
                if parts[0] == "layers" and int(parts[1]) >= first_shared and parts[3] in ("k_proj", "v_proj", "k_norm"):
                    continue
                out["model." + name] = (os.path.join(model_dir, fname), k)
    return out
