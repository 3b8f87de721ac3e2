"""Gemma 3n's vision and audio towers and their embedders, loaded from the checkpoint's safetensors.

The towers are the reference implementations, reused as vLLM does: the vision tower is timm's
MobileNetV5 (``mobilenetv5_300m_enc``) wrapped as transformers builds it (``TimmWrapperModel``, so the
checkpoint's ``model.vision_tower.timm_model.*`` names load as they are), the audio tower transformers'
``Gemma3nAudioEncoder`` (a USM-style conformer), the embedders transformers'
``Gemma3nMultimodalEmbedder``. Only the text decoder is ours (``model.py``).

What the executor calls:

* :meth:`MultimodalTowers.encode_image` ``(pixel_values [1, 3, H, W])`` -> ``[vision_soft_tokens, H_text]``;
* :meth:`MultimodalTowers.encode_audio` ``(features [1, F, mel], mask [1, F])`` -> ``[audio_soft_tokens,
  H_text]``: frames the encoder marks as padding, and the tail up to the fixed soft-token count, carry
  the embedding of the last audio hard token (what ``Gemma3nModel.forward`` does);
* :meth:`MultimodalTowers.embed_hard` ``(ids [M])`` -> ``[M, H_text]``: the embedding of ids at or past
  the vision vocabulary offset (``<end_of_image>``, ``<end_of_audio>``, placeholder ids), which do not
  come from ``embed_tokens`` in the multimodal model.

Each item is encoded alone, so its embeddings depend only on its content (what the encoder cache,
keyed by content hash, relies on), and equal transformers' for a batch of one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch import nn

log = logging.getLogger(__name__)

TOWER_PREFIXES = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


@dataclass(frozen=True)
class MultimodalArgs:
    """What placeholder expansion and the executor need from a ``Gemma3nForConditionalGeneration`` config."""

    image_token_id: int
    audio_token_id: int
    boi_token_id: int
    eoi_token_id: int
    boa_token_id: int
    eoa_token_id: int
    vision_soft_tokens: int
    audio_soft_tokens: int
    vision_vocab_offset: int
    audio_vocab_offset: int
    vocab_size: int

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> "MultimodalArgs":
        from transformers import Gemma3nConfig

        cfg = Gemma3nConfig.from_dict(dict(raw))
        return cls(
            image_token_id=int(cfg.image_token_id), audio_token_id=int(cfg.audio_token_id),
            boi_token_id=int(cfg.boi_token_id), eoi_token_id=int(cfg.eoi_token_id),
            boa_token_id=int(cfg.boa_token_id), eoa_token_id=int(cfg.eoa_token_id),
            vision_soft_tokens=int(cfg.vision_soft_tokens_per_image),
            audio_soft_tokens=int(cfg.audio_soft_tokens_per_image),
            vision_vocab_offset=int(cfg.vision_config.vocab_offset),
            audio_vocab_offset=int(cfg.audio_config.vocab_offset),
            vocab_size=int(cfg.text_config.vocab_size),
        )


class MultimodalTowers(nn.Module):
    """``vision_tower``, ``audio_tower``, ``embed_vision``, ``embed_audio`` named as in the checkpoint
    (``model.`` stripped)."""

    def __init__(self, raw_config: dict[str, Any], *, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        from transformers import AutoModel, Gemma3nConfig
        from transformers.models.gemma3n.modeling_gemma3n import Gemma3nMultimodalEmbedder

        cfg = Gemma3nConfig.from_dict(dict(raw_config))
        self.config = cfg
        self.args = MultimodalArgs.from_config(raw_config)
        self.vision_tower = AutoModel.from_config(cfg.vision_config)
        self.audio_tower = AutoModel.from_config(cfg.audio_config)
        self.embed_vision = Gemma3nMultimodalEmbedder(cfg.vision_config, cfg.text_config)
        self.embed_audio = Gemma3nMultimodalEmbedder(cfg.audio_config, cfg.text_config)
        self.to(device=device, dtype=dtype)
        self.eval()
        self.dtype = dtype
        self.device = torch.device(device)
        self.vision_hidden = int(cfg.vision_config.hidden_size)

    @torch.inference_mode()
    def encode_image(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.vision_tower(pixel_values=pixel_values.to(self.device, self.dtype), do_pooling=False,
                                return_dict=True).last_hidden_state
        n = self.args.vision_soft_tokens
        if out.shape[2] * out.shape[3] != n:
            raise ValueError(f"the vision tower gave a {out.shape[2]}x{out.shape[3]} feature map for an image of "
                             f"{list(pixel_values.shape[2:])}; the model expects {n} soft tokens")
        soft = out.reshape(out.shape[0], self.vision_hidden, n).permute(0, 2, 1) * self.vision_hidden**0.5
        return self.embed_vision(inputs_embeds=soft)[0]

    @torch.inference_mode()
    def encode_audio(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``mask``: True for real frames (the feature extractor's ``input_features_mask``)."""
        out = self.audio_tower(features.to(self.device, self.dtype), ~mask.to(self.device), return_dict=True)
        emb = self.embed_audio(inputs_embeds=out.last_hidden_state)[0]
        pad = self.embed_audio(input_ids=torch.tensor([[self.args.vocab_size - 1]], device=self.device))[0]
        emb = torch.where(out.audio_mel_mask[0].unsqueeze(-1), pad, emb)
        n = self.args.audio_soft_tokens
        if emb.shape[0] > n:
            raise ValueError(f"the audio encoder gave {emb.shape[0]} tokens; the model takes at most {n}")
        return torch.cat([emb, pad.expand(n - emb.shape[0], -1)])

    @torch.inference_mode()
    def embed_hard(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of ids ``>= vision_vocab_offset``: the vision embedder below the audio offset, the
        audio embedder from it on."""
        ids = ids.to(self.device, torch.int64)
        n = ids.shape[0]
        if n < 4:  # CPU BLAS rounds GEMMs of < 4 rows another way: pad, so a row's value never depends on M
            ids = torch.cat([ids, ids.new_full((4 - n,), self.args.vision_vocab_offset)])
        a = self.args
        audio = ids >= a.audio_vocab_offset
        v_ids = torch.where(audio, a.vision_vocab_offset, ids)
        a_ids = torch.where(audio, ids, a.audio_vocab_offset)
        v = self.embed_vision(input_ids=v_ids)
        au = self.embed_audio(input_ids=a_ids)
        return torch.where(audio.unsqueeze(-1), au, v)[:n]

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def has_towers(keys: Iterable[str]) -> bool:
    """Whether a checkpoint's tensor names include the towers (a multimodal checkpoint may ship without)."""
    return any(k.startswith(("model.vision_tower.", "model.audio_tower.")) for k in keys)


def load_towers(towers: MultimodalTowers, tensors) -> None:
    """Copies the tower tensors of ``tensors`` (``(file, key, load)`` triples, ``loader.iter_safetensors``)
    into ``towers``; errors name the file and tensor (shape mismatch, missing tensors)."""
    from yoco_rs.models.loader import CheckpointError

    params = dict(towers.named_parameters())
    params.update(dict(towers.named_buffers()))
    loaded: set[str] = set()
    for path, key, load in tensors:
        if not key.startswith(TOWER_PREFIXES):
            continue
        name = key[len("model."):]
        p = params.get(name)
        if p is None:
            log.warning("ignored unexpected tower tensor %s in %s", key, path)
            continue
        t = load()
        if tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(f"{path}: tensor {key!r} has shape {list(t.shape)}, but config.json implies "
                                  f"{list(p.shape)} for {name!r}")
        with torch.no_grad():
            p.copy_(t.to(p.dtype) if t.is_floating_point() else t)
        loaded.add(name)
    missing = [n for n in dict(towers.named_parameters()) if n not in loaded]
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} tower tensor(s): "
                              + ", ".join("model." + n for n in missing[:8]) + (" ..." if len(missing) > 8 else ""))


PROCESSOR_CONFIG = "preprocessor_config.json"


def build_towers(raw_config: dict[str, Any], model_dir: str | os.PathLike, *, dtype: torch.dtype,
                 device: torch.device | str) -> MultimodalTowers | None:
    """The towers of a multimodal checkpoint directory, or None (text only, logged) when its safetensors
    hold none or it has no ``preprocessor_config.json`` (how images and audio are prepared: the released
    checkpoints ship one; a directory without it is served as the text model it then is)."""
    from yoco_rs.models.loader import iter_safetensors, weight_files

    if not os.path.isfile(os.path.join(os.fspath(model_dir), PROCESSOR_CONFIG)):
        log.info("%s has no %s: the vision and audio towers are not loaded (text only)", model_dir, PROCESSOR_CONFIG)
        return None

    files = weight_files(model_dir)
    from safetensors import safe_open

    keys = []
    for f in files:
        with safe_open(f, framework="pt", device="cpu") as h:
            keys.extend(h.keys())
    if not has_towers(keys):
        return None
    with torch.device("cpu"):
        towers = MultimodalTowers(raw_config, dtype=dtype, device=device)
    load_towers(towers, iter_safetensors(files))
    return towers


__all__ = ["MultimodalArgs", "MultimodalTowers", "TOWER_PREFIXES", "build_towers", "load_towers", "has_towers"]
