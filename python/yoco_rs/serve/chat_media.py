"""Chat content parts that carry media (OpenAI / vLLM shapes), for a multimodal checkpoint:

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

MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "audio_url": "audio"}


@dataclass(frozen=True)
class MediaContext:
    """What resolving a request's media needs: the checkpoint's processor, the fetch policy, the limits."""

    processor: Any
    policy: MediaPolicy
    limits: Optional[dict] = None


@dataclass(frozen=True)
class MediaRef:
    modality: str
    where: str  # "messages[i].content[j]"
    url: Optional[str] = None
    data: Optional[str] = None
    fmt: Optional[str] = None


def has_media(messages) -> bool:
    for m in messages:
        c = m.content
        if isinstance(c, list) and any(isinstance(p, dict) and p.get("type") in MEDIA_PARTS for p in c):
            return True
    return False


def _url(part: dict, key: str, where: str) -> str:
    v = part.get(key)
    url = v.get("url") if isinstance(v, dict) else v
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}: {key} needs a url ({{'{key}': {{'url': ...}}}})", "messages")
    return url


def split_messages(messages: Sequence) -> tuple[list[dict], list[MediaRef]]:
    """Template messages (media parts as ``{"type": "image"|"audio"}``) and the media, in order."""
    out, refs = [], []
    for i, m in enumerate(messages):
        c = m.content
        if not isinstance(c, list):
            d = {"role": m.role, "content": c if isinstance(c, str) else ""}
            if c is not None and not isinstance(c, str):
                raise bad_request(f"messages[{i}].content must be a string or a list of content parts", "messages")
        else:
            parts = []
            for j, p in enumerate(c):
                where = f"messages[{i}].content[{j}]"
                kind = p.get("type") if isinstance(p, dict) else None
                if kind == "text" and isinstance(p.get("text"), str):
                    parts.append({"type": "text", "text": p["text"]})
                elif kind == "image_url":
                    refs.append(MediaRef("image", where, url=_url(p, "image_url", where)))
                    parts.append({"type": "image"})
                elif kind == "audio_url":
                    refs.append(MediaRef("audio", where, url=_url(p, "audio_url", where)))
                    parts.append({"type": "audio"})
                elif kind == "input_audio":
                    a = p.get("input_audio")
                    if not isinstance(a, dict) or not isinstance(a.get("data"), str):
                        raise bad_request(f"{where}: input_audio needs {{'data': <base64>, 'format': 'wav'|'mp3'}}",
                                          "messages")
                    refs.append(MediaRef("audio", where, data=a["data"], fmt=a.get("format")))
                    parts.append({"type": "audio"})
                else:
                    raise bad_request(f"{where}: unsupported content part {kind!r}; use text, image_url, input_audio "
                                      "or audio_url", "messages")
            d = {"role": m.role, "content": parts}
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out, refs


def check_limits(refs: Sequence[MediaRef], limits: Optional[dict]) -> None:
    if not limits:
        return
    for modality in ("image", "audio"):
        n = sum(1 for r in refs if r.modality == modality)
        cap = limits.get(modality)
        if cap is not None and n > cap:
            raise bad_request(f"the request has {n} {modality} item(s); at most {cap} per prompt are allowed "
                              "(--limit-mm-per-prompt)", "messages")


def resolve(refs: Sequence[MediaRef], ctx: MediaContext) -> list:
    """Fetch, decode and process every ref (blocking: a worker thread) -> processed items, in order."""
    check_limits(refs, ctx.limits)
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


__all__ = ["MediaContext", "MediaRef", "has_media", "split_messages", "resolve", "check_limits", "MEDIA_PARTS"]
