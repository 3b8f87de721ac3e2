"""The media of chat content parts, fetched, decoded and processed for a multimodal checkpoint (the Rust
front end parses the parts, ``crates/yoco-server/src/chat_media.rs``, and hands the references to
``rust_media.MediaSeam``). The parts (OpenAI / vLLM shapes):

* ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (or the url as a string):
  a data URL always, ``file://`` under ``--allowed-local-media-path``, ``http(s)://`` fetched
  (``media_fetch.py``);
* ``{"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav" | "mp3" | "flac"}}``;
* ``{"type": "audio_url", "audio_url": {"url": ...}}`` (vLLM's), like ``image_url``.

A message's parts reach the chat template as ``{"type": "text", "text": ...}``, ``{"type": "image"}`` and
``{"type": "audio"}`` (what Gemma 3n's template renders as one placeholder token each); the media are
fetched, decoded and processed in the order they appear, then the rendered prompt's placeholders are
expanded (``multimodal/processor.py``). Every problem is a 400 naming the part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from yoco_rs.multimodal.media import MediaError, decode_audio, decode_base64, decode_image
from yoco_rs.serve.errors import bad_request
from yoco_rs.serve.media_fetch import MediaPolicy, fetch

@dataclass(frozen=True)
class MediaContext:
    """What resolving a request's media needs: the checkpoint's processor and the fetch policy."""

    processor: Any
    policy: MediaPolicy


@dataclass(frozen=True)
class MediaRef:
    modality: str
    where: str  # "messages[i].content[j]"
    url: Optional[str] = None
    data: Optional[str] = None
    fmt: Optional[str] = None


def resolve(refs: Sequence[MediaRef], ctx: MediaContext) -> list:
    """Fetch, decode and process every ref (blocking: the Rust front end's blocking pool) -> processed
    items, in order. (The Rust front end has parsed the parts and checked ``--limit-mm-per-prompt``.)"""
    items = []
    for r in refs:
        try:
            if r.modality == "image":
                data = fetch(r.url, ctx.policy, "image")
                img = decode_image(data, max_bytes=ctx.policy.max_bytes, max_pixels=ctx.processor.max_image_pixels)
                items.append(ctx.processor.process_image(img))
            else:
                if r.url is not None:
                    raw, fmt = fetch(r.url, ctx.policy, "audio"), None
                else:
                    raw, fmt = decode_base64(r.data, "input_audio.data"), r.fmt
                wave, sr = decode_audio(raw, fmt, max_bytes=ctx.policy.max_bytes)
                items.append(ctx.processor.process_audio((wave, sr)))
        except MediaError as e:
            raise bad_request(f"{r.where}: {e}", "messages") from None
    return items


__all__ = ["MediaContext", "MediaRef", "resolve"]
