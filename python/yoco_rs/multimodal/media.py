"""Media in: bytes, data URLs, arrays and PIL images to checked images and 16 kHz waveforms.

What the serving path's media seam (``serve/rust_media.py``, called by the Rust front end) and the engine
use: bytes in, a PIL image or a float32 waveform out, or a
:class:`MediaError` (a ``ValueError``) whose message names what is wrong, which servers return as a
400. Nothing here touches the network or the file system: fetching URLs is the server's business
(``serve/media_fetch.py``).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import Any

import numpy as np

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
"""Image container formats accepted (Pillow's names)."""
AUDIO_FORMATS = ("wav", "flac", "mp3", "ogg")
"""Audio formats accepted (libsndfile's)."""
DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
"""Decoded images larger than this are refused before Pillow allocates them (decompression bombs)."""


class MediaError(ValueError):
    """Media that cannot be used: corrupt, undecodable, unsupported, or too large (a 400 at the server)."""


_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)


def decode_base64(data: str, what: str = "data") -> bytes:
    """Strict base64 (whitespace allowed); a clear error for anything else."""
    if not isinstance(data, str):
        raise MediaError(f"{what} must be a base64 string, got {type(data).__name__}")
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaError(f"{what} is not valid base64: {e}") from None


def parse_data_url(url: str) -> tuple[str, bytes]:
    """``data:<mime>;base64,<payload>`` -> ``(mime, bytes)``."""
    m = _DATA_URL.match(url)
    if not m:
        raise MediaError("malformed data URL: expected data:<mime type>;base64,<data>")
    mime = (m.group("mime") or "text/plain").lower()
    payload = url[m.end():]
    if not m.group("b64"):
        raise MediaError("data URLs must be base64-encoded (data:<mime type>;base64,...)")
    return mime, decode_base64(payload, "the data URL's payload")


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, max_bytes: int | None = None):
    """Image bytes -> a loaded PIL image (RGB or RGBA/L kept as decoded; the processor converts)."""
    from PIL import Image, UnidentifiedImageError

    if max_bytes is not None and len(data) > max_bytes:
        raise MediaError(f"image is {len(data):,} bytes; at most {max_bytes:,} are accepted")
    if not data:
        raise MediaError("image data is empty")
    try:
        img = Image.open(io.BytesIO(data), formats=None)
    except UnidentifiedImageError:
        raise MediaError("image data is not a decodable image (supported formats: "
                         + ", ".join(f.lower() for f in IMAGE_FORMATS) + ")") from None
    except Exception as e:  # Pillow raises many types for broken headers
        raise MediaError(f"image data cannot be decoded: {e}") from None
    if img.format not in IMAGE_FORMATS:
        raise MediaError(f"image format {img.format} is not supported; use one of "
                         + ", ".join(f.lower() for f in IMAGE_FORMATS))
    w, h = img.size
    if w < 1 or h < 1 or w * h > max_pixels:
        raise MediaError(f"image is {w}x{h} = {w * h:,} pixels; at most {max_pixels:,} are accepted")
    try:
        img.load()
    except Exception as e:
        raise MediaError(f"image data is truncated or corrupt ({img.format}): {e}") from None
    return img


def decode_audio(data: bytes, fmt: str | None = None, *, max_bytes: int | None = None) -> tuple[np.ndarray, int]:
    """Audio bytes (wav / flac / mp3 / ogg) -> ``(float32 waveform [samples] or [samples, channels], rate)``."""
    import soundfile as sf

    if max_bytes is not None and len(data) > max_bytes:
        raise MediaError(f"audio is {len(data):,} bytes; at most {max_bytes:,} are accepted")
    if fmt is not None:
        f = str(fmt).lower()
        if f not in AUDIO_FORMATS:
            raise MediaError(f"audio format {fmt!r} is not supported; use one of {', '.join(AUDIO_FORMATS)}")
    if not data:
        raise MediaError("audio data is empty")
    try:
        wave, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    except Exception as e:  # soundfile.LibsndfileError, RuntimeError, TypeError for unknown containers
        raise MediaError(f"audio data cannot be decoded as {fmt or 'wav/flac/mp3/ogg'}: {e}") from None
    if wave.size == 0:
        raise MediaError("audio has no samples")
    return wave, int(sr)


def as_image(x: Any, *, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS):
    """A PIL image from a PIL image or an array (``[H, W, 3]`` uint8, or floats in [0, 1], HWC or CHW)."""
    from PIL import Image

    if isinstance(x, Image.Image):
        w, h = x.size
        if w * h > max_pixels:
            raise MediaError(f"image is {w}x{h} = {w * h:,} pixels; at most {max_pixels:,} are accepted")
        return x
    if isinstance(x, (bytes, bytearray)):
        return decode_image(bytes(x), max_pixels=max_pixels)
    try:
        import torch

        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, np.ndarray):
        a = x
        if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
            a = a.transpose(1, 2, 0)
        if a.ndim == 2:
            a = a[:, :, None]
        if a.ndim != 3 or a.shape[-1] not in (1, 3):
            raise MediaError(f"an image array must be [H, W, 3] (or [3, H, W]), got shape {list(x.shape)}")
        if a.shape[0] * a.shape[1] > max_pixels:
            raise MediaError(f"image is {a.shape[1]}x{a.shape[0]} pixels; at most {max_pixels:,} are accepted")
        if a.dtype != np.uint8:
            f = np.asarray(a, dtype=np.float64)
            if not np.isfinite(f).all() or f.min() < 0 or f.max() > 1:
                raise MediaError("a float image array must hold finite values in [0, 1]")
            a = np.round(f * 255).astype(np.uint8)
        if a.shape[-1] == 1:
            a = np.repeat(a, 3, axis=-1)
        return Image.fromarray(np.ascontiguousarray(a), mode="RGB")
    raise MediaError(f"an image must be a PIL.Image, an array or bytes, got {type(x).__name__}")


def resample(wave: np.ndarray, sr: int, target: int) -> np.ndarray:
    """Band-limited resampling by the FFT (a mono float32 waveform)."""
    if sr == target:
        return wave
    n = len(wave)
    m = max(1, int(round(n * target / sr)))
    spec = np.fft.rfft(wave.astype(np.float64))
    k = m // 2 + 1
    out = np.zeros(k, dtype=np.complex128)
    keep = min(k, len(spec))
    out[:keep] = spec[:keep]
    return (np.fft.irfft(out, n=m) * (m / n)).astype(np.float32)


def as_audio(x: Any, target_rate: int, *, max_seconds: float = 600.0) -> np.ndarray:
    """A mono float32 waveform at ``target_rate`` from ``(array, sample_rate)`` or an array at that rate."""
    if isinstance(x, (tuple, list)) and len(x) == 2 and np.isscalar(x[1]):
        arr, sr = x
    else:
        arr, sr = x, target_rate
    if isinstance(sr, bool) or not isinstance(sr, (int, np.integer, float)) or not 1000 <= sr <= 384_000:
        raise MediaError(f"audio sample_rate must be a number of Hz in [1000, 384000], got {sr!r}")
    try:
        import torch

        if isinstance(arr, torch.Tensor):
            arr = arr.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    a = np.asarray(arr)
    if a.dtype.kind not in "fiu" or a.size == 0:
        raise MediaError("audio must be a non-empty numeric array (samples, or [samples, channels])")
    if a.ndim == 2:
        a = a.mean(axis=1) if a.shape[1] <= 8 else a.mean(axis=0)
    if a.ndim != 1:
        raise MediaError(f"audio must be [samples] or [samples, channels], got shape {list(np.shape(arr))}")
    if len(a) > max_seconds * sr:
        raise MediaError(f"audio is {len(a) / sr:.1f} s long; at most {max_seconds:.0f} s are accepted")
    if a.dtype.kind in "iu":
        a = a.astype(np.float32) / float(np.iinfo(a.dtype).max)
    a = a.astype(np.float32)
    if not np.isfinite(a).all():
        raise MediaError("audio holds NaN or infinite samples")
    return resample(a, int(sr), target_rate)


__all__ = ["MediaError", "decode_base64", "parse_data_url", "decode_image", "decode_audio", "as_image", "as_audio",
           "resample", "IMAGE_FORMATS", "AUDIO_FORMATS", "DEFAULT_MAX_IMAGE_PIXELS"]
