"""The media seam of ``yoco-serve --frontend rust``: the Python half of ``crates/yoco-server/src/media.rs``.

The Rust front end parses a chat request's content parts, checks ``--limit-mm-per-prompt``, renders the
template with ``{"type": "image"}`` / ``{"type": "audio"}`` parts, and then calls :meth:`MediaSeam.prepare`
on its blocking pool with the rendered prompt and the media refs in order. Here the media are fetched
(``media_fetch.py``'s policy), decoded and processed (``chat_media.resolve``, as the Python server does),
the placeholders expanded and located, and the items encoded ahead (``MultimodalInputs.encode_ahead``, as
``Engine._prepare`` does), so a step only gathers rows. The items go back to Rust as one opaque object;
the step loop hands them to ``StepExecutor.add_request(mm_items=...)``, which registers them under the
core request id (and ``remove_request`` drops them).

Every client mistake is returned as a message string (Rust answers it as a 400, naming the part, in the
Python server's words); anything else raised is a server error (a 500).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from yoco_rs.multimodal.media import MediaError, decode_audio
from yoco_rs.multimodal.processor import placeholders
from yoco_rs.serve.chat_media import MediaContext, MediaRef, resolve
from yoco_rs.serve.errors import APIError
from yoco_rs.serve.media_fetch import MediaPolicy

Prepared = tuple  # (token ids int32 [P], [(offset, length, identifier)], items)


class MediaSeam:
    """Resolves a rendered prompt's media for the Rust front end (thread-safe; called off the step loop)."""

    def __init__(self, rt, policy: MediaPolicy):
        self._proc = rt.mm_processor
        self._mm = rt.executor.mm
        self._tok = rt.tokenizer
        self.policy = policy

    def prepare(self, rendered: str, add_special_tokens: bool,
                refs: Sequence[tuple]) -> Union[Prepared, str]:
        """``refs``: ``(modality, location, url, data, format)`` per media part, in order."""
        mrefs = [MediaRef(m, where, url=url, data=data, fmt=fmt) for m, where, url, data, fmt in refs]
        try:
            items = resolve(mrefs, MediaContext(self._proc, self.policy))
        except APIError as e:
            return e.message
        try:
            expanded = self._proc.expand_text(rendered, items)
        except ValueError as e:
            return f"{e} (does the chat template render image/audio parts?)"
        ids = self._tok.encode(expanded, add_special_tokens=bool(add_special_tokens))
        return self._finish(ids, items)

    def transcription(self, data: bytes, fmt: Optional[str], language: Optional[str],
                      prompt: Optional[str]) -> Union[Prepared, str]:
        """One uploaded clip as Gemma 3n's transcription prompt (``transcriptions.py``'s wording)."""
        try:
            if len(data) > self.policy.max_bytes:
                raise MediaError(f"audio is over {self.policy.max_bytes:,} bytes")
            item = self._proc.process_audio(decode_audio(bytes(data), fmt))
        except MediaError as e:
            return f"file: {e}"
        ids = self._tok.encode(self._proc.expand_text(transcription_prompt(language, prompt), [item]))
        return self._finish(ids, [item])

    def _finish(self, ids: list, items: list) -> Union[Prepared, str]:
        try:
            self._proc.locate(ids, items)
        except ValueError as e:
            return str(e)
        if self._mm is not None:
            self._mm.encode_ahead(items)
        return np.asarray(ids, dtype=np.int32), placeholders(items), items


#: ISO 639-1 codes of ``/v1/audio/transcriptions``' ``language`` and the names the prompt gives them.
LANGUAGES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "pt": "Portuguese",
             "nl": "Dutch", "ja": "Japanese", "ko": "Korean", "zh": "Chinese", "ru": "Russian", "ar": "Arabic",
             "hi": "Hindi", "pl": "Polish", "tr": "Turkish", "sv": "Swedish", "uk": "Ukrainian", "id": "Indonesian"}


def transcription_prompt(language: str | None, prompt: str | None) -> str:
    """Gemma 3n's transcription request, one audio placeholder (what vLLM sends the model)."""
    into = f" into {LANGUAGES[language]}" if language else ""
    extra = f" {prompt.strip()}" if prompt and prompt.strip() else ""
    return (f"<start_of_turn>user\nTranscribe this audio{into}: <audio_soft_token>{extra}<end_of_turn>\n"
            "<start_of_turn>model\n")


__all__ = ["LANGUAGES", "MediaSeam", "transcription_prompt"]
