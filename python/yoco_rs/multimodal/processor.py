"""Turning images and audio into model inputs, and prompts into placeholder runs (``Gemma3nProcessor``).

* Images: RGB, resized to the processor's size (768 x 768 for E2B, bilinear), rescaled by 1/255,
  normalized only when the checkpoint's ``preprocessor_config.json`` says so (Gemma 3n's does not):
  ``pixel_values [1, 3, H, W]`` float32, as transformers' ``SiglipImageProcessor``.
* Audio: mono float32 at 16 kHz (resampled if needed), at most the model's window (30 s for E2B),
  log-mel features by transformers' ``Gemma3nAudioFeatureExtractor`` with the checkpoint's settings.
* Prompts: each ``<image_soft_token>`` (``<audio_soft_token>``) of the prompt, as the chat template
  renders one per item, becomes ``"\\n\\n<start_of_image>" + N x <image_soft_token> + "<end_of_image>\\n\\n"``
  with N the model's soft tokens per item (256 for images, 188 for audio: every clip fills the fixed
  window, the encoder's padding carries the padding embedding), then the text is tokenized. The k-th
  run of placeholder ids is item k of its modality.

Every item gets an identifier, the BLAKE2b-256 hex digest of its modality and processed inputs: equal
identifiers mean equal encoder outputs (the encoder cache's key, and the prefix cache's extra key).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from yoco_rs.models.gemma3n.towers import MultimodalArgs
from yoco_rs.multimodal.media import MediaError, as_audio, as_image

AUDIO_SAMPLE_RATE = 16_000


@dataclass
class MmItem:
    """One image or audio clip of a prompt, processed: what the encoder reads and where its run is."""

    modality: str  # "image" | "audio"
    identifier: str
    num_tokens: int
    inputs: dict[str, torch.Tensor]
    offset: int = -1
    """First placeholder token of the item's run in the prompt (set by :meth:`MmProcessor.locate`)."""
    embeddings: Optional[torch.Tensor] = None
    """``[num_tokens, H]`` encoder output once computed (``MultimodalInputs.encode_ahead``): held by the
    item, so a live request never needs its items encoded again."""

    def placeholder(self) -> tuple[int, int, str]:
        """``(offset, length, identifier)``: what the core's ``add_request(mm_placeholders=...)`` takes."""
        return (self.offset, self.num_tokens, self.identifier)


def _read(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    return d if isinstance(d, dict) else {}


def _digest(modality: str, *tensors: torch.Tensor) -> str:
    h = hashlib.blake2b(digest_size=32)
    h.update(modality.encode())
    for t in tensors:
        t = t.contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


@dataclass
class ImageSettings:
    height: int = 768
    width: int = 768
    resample: int = 2  # PIL.Image.BILINEAR
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = False
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)

    @classmethod
    def from_dict(cls, d: dict) -> "ImageSettings":
        s = cls()
        size = d.get("size") or {}
        if isinstance(size, dict) and "height" in size and "width" in size:
            s.height, s.width = int(size["height"]), int(size["width"])
        for k in ("resample", "do_rescale", "rescale_factor", "do_normalize"):
            if k in d and d[k] is not None:
                setattr(s, k, type(getattr(s, k))(d[k]))
        for k in ("image_mean", "image_std"):
            if isinstance(d.get(k), (list, tuple)):
                setattr(s, k, tuple(float(x) for x in d[k]))
        return s


_FE_KEYS = ("feature_size", "sampling_rate", "padding_value", "frame_length_ms", "hop_length_ms", "min_frequency",
            "max_frequency", "preemphasis", "preemphasis_htk_flavor", "fft_overdrive", "dither",
            "input_scale_factor", "mel_floor", "per_bin_mean", "per_bin_stddev")


class MmProcessor:
    """A checkpoint's image / audio preprocessing and placeholder expansion (thread-safe, no state)."""

    def __init__(self, args: MultimodalArgs, tokenizer, model_dir: Optional[str] = None,
                 *, max_image_pixels: int = 64_000_000):
        from transformers.models.gemma3n.feature_extraction_gemma3n import Gemma3nAudioFeatureExtractor

        self.args = args
        self.tokenizer = tokenizer
        pre = _read(os.path.join(model_dir, "preprocessor_config.json")) if model_dir else {}
        self.image = ImageSettings.from_dict(pre)
        fe_kw = {k: pre[k] for k in _FE_KEYS if k in pre}
        self.feature_extractor = Gemma3nAudioFeatureExtractor(**fe_kw)
        self.sample_rate = int(self.feature_extractor.sampling_rate)
        self.max_audio_samples = self._max_audio_samples()
        self.max_image_pixels = max_image_pixels
        tok = tokenizer.hf
        self.image_token = tok.id_to_token(args.image_token_id)
        self.audio_token = tok.id_to_token(args.audio_token_id)
        if self.image_token is None or self.audio_token is None:
            raise ValueError(f"the tokenizer lacks the image/audio placeholder tokens (ids {args.image_token_id}, "
                             f"{args.audio_token_id}) that config.json names")
        boi, eoi = tok.id_to_token(args.boi_token_id), tok.id_to_token(args.eoi_token_id)
        boa, eoa = tok.id_to_token(args.boa_token_id), tok.id_to_token(args.eoa_token_id)
        self.full_image = f"\n\n{boi}{self.image_token * args.vision_soft_tokens}{eoi}\n\n"
        self.full_audio = f"\n\n{boa}{self.audio_token * args.audio_soft_tokens}{eoa}\n\n"

    # ---- limits ---------------------------------------------------------------------------------------
    def _audio_tokens(self, num_samples: int) -> int:
        """Encoder output tokens of a clip of ``num_samples`` (16 kHz): mel frames after the extractor's
        padding to a multiple of 128 samples, halved by each of the two stride-2 convolutions, then the
        conformer's reduction by 4 (upper bound; the encoder gives this many or fewer)."""
        fe = self.feature_extractor
        n = -(-num_samples // 128) * 128
        frames = max(0, (n - (fe.frame_length + 1)) // fe.hop_length + 1)
        t = math.ceil(math.ceil(frames / 2) / 2)
        return math.ceil(t / 4)

    def _max_audio_samples(self) -> int:
        cap = 480_000  # the feature extractor's window (30 s)
        lo, hi = 0, cap
        while lo < hi:  # the longest clip whose encoder output fits the fixed soft-token count
            mid = (lo + hi + 1) // 2
            if self._audio_tokens(mid) <= self.args.audio_soft_tokens:
                lo = mid
            else:
                hi = mid - 1
        return lo

    @property
    def max_audio_seconds(self) -> float:
        return self.max_audio_samples / self.sample_rate

    # ---- items ------------------------------------------------------------------------------------------
    def process_image(self, image: Any) -> MmItem:
        """A PIL image, an ``[H, W, 3]`` uint8 array or an ``[3, H, W]``/``[H, W, 3]`` float array in [0, 1]."""
        from PIL import Image

        img = as_image(image, max_pixels=self.max_image_pixels)
        s = self.image
        img = img.convert("RGB").resize((s.width, s.height), resample=Image.Resampling(s.resample))
        arr = np.asarray(img, dtype=np.float32)
        if s.do_rescale:
            arr = arr * np.float32(s.rescale_factor)
        if s.do_normalize:
            arr = (arr - np.asarray(s.image_mean, np.float32)) / np.asarray(s.image_std, np.float32)
        pixel_values = torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))[None]
        return MmItem("image", _digest("image", pixel_values), self.args.vision_soft_tokens,
                      {"pixel_values": pixel_values})

    def process_audio(self, audio: Any) -> MmItem:
        """``(waveform, sample_rate)`` (mono or ``[samples, channels]``) or a waveform at 16 kHz."""
        wave = as_audio(audio, self.sample_rate)
        if len(wave) > self.max_audio_samples:
            raise MediaError(f"audio is {len(wave) / self.sample_rate:.2f} s long; this model takes at most "
                             f"{self.max_audio_seconds:.2f} s per clip (split longer audio)")
        if len(wave) < self.feature_extractor.frame_length + 1:
            raise MediaError(f"audio is {len(wave) / self.sample_rate * 1000:.1f} ms long; at least "
                             f"{(self.feature_extractor.frame_length + 1) / self.sample_rate * 1000:.0f} ms is needed")
        fe = self.feature_extractor(wave, return_tensors="pt")
        feats = fe["input_features"].to(torch.float32)
        mask = fe["input_features_mask"].to(torch.bool)
        return MmItem("audio", _digest("audio", feats, mask), self.args.audio_soft_tokens,
                      {"input_features": feats, "input_features_mask": mask})

    def process(self, data: dict) -> list[MmItem]:
        """``multi_modal_data`` (``{"image": x | [x, ...], "audio": a | [a, ...]}``) -> items, images first."""
        if not isinstance(data, dict):
            raise ValueError(f"multi_modal_data must be a dict, got {type(data).__name__}")
        unknown = set(data) - {"image", "audio"}
        if unknown:
            raise ValueError(f"multi_modal_data has unknown modality {sorted(unknown)}; this model takes "
                             "'image' and 'audio'")
        items: list[MmItem] = []
        img = data.get("image")
        if img is not None:
            imgs = img if isinstance(img, (list, tuple)) else [img]
            items += [self.process_image(x) for x in imgs]
        aud = data.get("audio")
        if aud is not None:
            # a list of clips, unless it is one (waveform, sample_rate) pair
            one = isinstance(aud, tuple) and len(aud) == 2 and np.isscalar(aud[1])
            clips = [aud] if one or not isinstance(aud, (list, tuple)) else list(aud)
            items += [self.process_audio(x) for x in clips]
        return items

    # ---- prompts ----------------------------------------------------------------------------------------
    def expand_text(self, text: str, items: Sequence[MmItem]) -> str:
        """Replaces each item's placeholder token in ``text`` by its full sequence (count checked)."""
        for modality, tok, full in (("image", self.image_token, self.full_image),
                                    ("audio", self.audio_token, self.full_audio)):
            n = sum(1 for it in items if it.modality == modality)
            have = text.count(tok)
            if have != n:
                raise ValueError(f"the prompt has {have} {modality} placeholder(s) {tok!r} for {n} {modality} item(s); "
                                 f"put one {tok} where each {modality} goes (the chat template does this for "
                                 f"{modality} content parts)")
            if n:
                text = text.replace(tok, full)
        return text

    def expand_ids(self, ids: Sequence[int], items: Sequence[MmItem]) -> list[int]:
        """``expand_text`` for a pre-tokenized prompt: each single placeholder id becomes the full run."""
        out: list[int] = []
        seqs = {}
        for modality, tid, full in (("image", self.args.image_token_id, self.full_image),
                                    ("audio", self.args.audio_token_id, self.full_audio)):
            n = sum(1 for it in items if it.modality == modality)
            have = sum(1 for t in ids if t == tid)
            if have != n:
                raise ValueError(f"prompt_token_ids has {have} {modality} placeholder id(s) {tid} for {n} {modality} "
                                 "item(s); put one where each goes")
            seqs[tid] = self.tokenizer.hf.encode(full, add_special_tokens=False).ids
        for t in ids:
            out.extend(seqs[t] if t in seqs else (t,))
        return out

    def locate(self, ids: Sequence[int], items: Sequence[MmItem]) -> None:
        """Sets each item's ``offset``: the k-th run of its modality's placeholder id (runs of exactly the
        item's length; anything else is an error naming the run)."""
        arr = np.asarray(ids, dtype=np.int64)
        for modality, tid in (("image", self.args.image_token_id), ("audio", self.args.audio_token_id)):
            mine = [it for it in items if it.modality == modality]
            hit = np.flatnonzero(arr == tid)
            if not len(hit):
                if mine:
                    raise ValueError(f"no {modality} placeholder run in the prompt for {len(mine)} item(s)")
                continue
            breaks = np.flatnonzero(np.diff(hit) != 1)
            starts = np.concatenate([[hit[0]], hit[breaks + 1]])
            ends = np.concatenate([hit[breaks] + 1, [hit[-1] + 1]])
            if len(starts) != len(mine):
                raise ValueError(f"the prompt has {len(starts)} {modality} placeholder run(s) for {len(mine)} item(s)")
            for it, s, e in zip(mine, starts.tolist(), ends.tolist()):
                if e - s != it.num_tokens:
                    raise ValueError(f"a {modality} placeholder run at token {s} has {e - s} tokens; the item needs "
                                     f"{it.num_tokens}")
                it.offset = int(s)


def placeholders(items: Sequence[MmItem]) -> list[tuple[int, int, str]]:
    """The core's ``mm_placeholders`` for ``items``, sorted by offset."""
    return sorted(it.placeholder() for it in items)


__all__ = ["MmItem", "MmProcessor", "ImageSettings", "placeholders", "AUDIO_SAMPLE_RATE"]
