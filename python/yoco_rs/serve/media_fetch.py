"""Where a content part's media comes from: a data URL always; ``file://`` only inside
``--allowed-local-media-path``; ``http(s)://`` fetched with a timeout and a size cap. Any other scheme,
a path outside the allowed directory, a fetch that fails, and anything over the cap is a
:class:`~yoco_rs.multimodal.media.MediaError` (a 400 at the server). Blocking: runs in the server's
worker threads, never on the event loop."""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Optional

from yoco_rs.multimodal.media import MediaError, parse_data_url

DEFAULT_MAX_MEDIA_BYTES = 20 << 20
DEFAULT_FETCH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class MediaPolicy:
    allowed_local_media_path: Optional[str] = None
    """Directory ``file://`` URLs may read from (its real path); None: ``file://`` is refused."""
    max_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    """Largest media payload (decoded bytes) one item may have."""
    fetch_timeout: float = DEFAULT_FETCH_TIMEOUT_S
    """Seconds an http(s) fetch may take, connection and body together."""


def fetch(url: str, policy: MediaPolicy, what: str = "media") -> bytes:
    """The bytes ``url`` names, under ``policy``."""
    if not isinstance(url, str) or not url:
        raise MediaError(f"{what} url must be a non-empty string")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        _, data = parse_data_url(url)
        _cap(len(data), policy, what)
        return data
    if scheme == "file":
        return _read_local(url, policy, what)
    if scheme in ("http", "https"):
        return _download(url, policy, what)
    raise MediaError(f"{what} url scheme {scheme + ':' if scheme else '(none)'} is not allowed; use a data: URL, "
                     "http(s)://, or file:// under the server's --allowed-local-media-path")


def _cap(n: int, policy: MediaPolicy, what: str) -> None:
    if n > policy.max_bytes:
        raise MediaError(f"{what} is {n:,} bytes; at most {policy.max_bytes:,} are accepted")


def _read_local(url: str, policy: MediaPolicy, what: str) -> bytes:
    root = policy.allowed_local_media_path
    if not root:
        raise MediaError(f"{what} url scheme file: is not allowed (the server was not started with "
                         "--allowed-local-media-path)")
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise MediaError(f"{what} file:// url must name a local path, got host {parsed.netloc!r}")
    path = os.path.realpath(urllib.parse.unquote(parsed.path))
    base = os.path.realpath(root)
    if os.path.commonpath([path, base]) != base:
        raise MediaError(f"{what} file {parsed.path!r} is outside --allowed-local-media-path")
    if not os.path.isfile(path):
        raise MediaError(f"{what} file {parsed.path!r} does not exist")
    size = os.path.getsize(path)
    _cap(size, policy, what)
    with open(path, "rb") as f:
        return f.read(policy.max_bytes + 1)


def _download(url: str, policy: MediaPolicy, what: str) -> bytes:
    req = urllib.request.Request(url, headers={"User-Agent": "yoco-serve"})
    try:
        with urllib.request.urlopen(req, timeout=policy.fetch_timeout) as r:
            n = r.headers.get("Content-Length")
            if n is not None and n.isdigit():
                _cap(int(n), policy, what)
            data = r.read(policy.max_bytes + 1)
    except MediaError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise MediaError(f"{what} url could not be fetched: {e}") from None
    _cap(len(data), policy, what)
    return data


__all__ = ["MediaPolicy", "fetch", "DEFAULT_MAX_MEDIA_BYTES", "DEFAULT_FETCH_TIMEOUT_S"]
