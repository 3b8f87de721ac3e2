"""``yoco-serve``: an OpenAI-compatible HTTP server shaped like vLLM's. The server itself is Rust
(``crates/yoco-server``); this package holds what Python keeps: the flags (``args``), the console script
(``cli``), the settings, the executor the Rust step loop drives (``rust_frontend``), the media seam
(``rust_media``, ``chat_media``, ``media_fetch``), a child-process runner (``child_server``) and the Ray
Serve application (``ray``)."""

from yoco_rs.serve.settings import ServerSettings

__all__ = ["ServerSettings"]
