"""``POST /v1/audio/transcriptions`` (OpenAI's shape, as vLLM serves Gemma 3n): a multipart upload of one
audio file (wav / flac / mp3 / ogg) with ``model``, optional ``language`` (ISO 639-1), ``prompt``,
``temperature``, ``response_format`` (``json`` or ``text``), ``max_completion_tokens`` and ``stream``.
The clip becomes one ``<audio_soft_token>`` in Gemma 3n's transcription prompt (vLLM's wording); a clip
longer than the model's window (30 s for E2B) is a 400 (split it). Streaming sends vLLM's
``transcription.chunk`` objects (``choices[0].delta.content``), a final usage chunk when asked
(``stream_include_usage``), then ``[DONE]``."""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from yoco_rs.multimodal.media import AUDIO_FORMATS, MediaError, decode_audio
from yoco_rs.sampling_params import RequestOutputKind, SamplingParams
from yoco_rs.serve.errors import APIError, bad_request
from yoco_rs.serve.generation import final_outputs, new_id, now, stream_error_body, submit, usage
from yoco_rs.serve.sse import DONE, EventStream, cancel_on_disconnect, merge, sse
from yoco_rs.serve.validation import Prompt

LANGUAGES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "pt": "Portuguese",
             "nl": "Dutch", "ja": "Japanese", "ko": "Korean", "zh": "Chinese", "ru": "Russian", "ar": "Arabic",
             "hi": "Hindi", "pl": "Polish", "tr": "Turkish", "sv": "Swedish", "uk": "Ukrainian", "id": "Indonesian"}
_FIELDS = {"file", "model", "language", "prompt", "temperature", "response_format", "max_completion_tokens",
           "stream", "stream_include_usage", "seed", "top_p", "top_k"}


def transcription_prompt(language: str | None, prompt: str | None) -> str:
    """Gemma 3n's transcription request, one audio placeholder (what vLLM sends the model)."""
    into = f" into {LANGUAGES[language]}" if language else ""
    extra = f" {prompt.strip()}" if prompt and prompt.strip() else ""
    return (f"<start_of_turn>user\nTranscribe this audio{into}: <audio_soft_token>{extra}<end_of_turn>\n"
            "<start_of_turn>model\n")


def _bool(v, name: str) -> bool:
    s = str(v).strip().lower()
    if s in ("true", "1"):
        return True
    if s in ("false", "0", ""):
        return False
    raise bad_request(f"{name} must be true or false, got {v!r}", name)


def _num(v, name: str, kind=float, lo=None, hi=None):
    try:
        x = kind(v)
    except (TypeError, ValueError):
        raise bad_request(f"{name} must be a number, got {v!r}", name) from None
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise bad_request(f"{name} must be in [{lo}, {hi}], got {v!r}", name)
    return x


async def create_transcription(state, request: Request):
    ct = request.headers.get("content-type", "")
    if not ct.lower().startswith("multipart/form-data"):
        raise APIError(415, "send the audio as multipart/form-data (a 'file' field and the options)",
                       type="UnsupportedMediaTypeError")
    try:
        form = await request.form(max_files=1, max_fields=32)
    except Exception as e:  # malformed multipart, too many parts
        raise bad_request(f"the multipart body cannot be parsed: {e}") from None
    unknown = sorted(set(form.keys()) - _FIELDS)
    if unknown:
        raise bad_request(f"unsupported field(s) {unknown}; supported: {sorted(_FIELDS)}", unknown[0])
    model = state.check_model(form.get("model"))
    state.ensure_serving()
    media = state.media()
    if media is None:
        raise bad_request("this model takes no audio: serve a multimodal Gemma 3n checkpoint for transcriptions",
                          "model")
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise bad_request("the 'file' field with the audio is missing", "file")
    data = await upload.read(media.policy.max_bytes + 1)
    name = (upload.filename or "").lower()
    fmt = name.rsplit(".", 1)[-1] if "." in name else None
    if fmt is not None and fmt not in AUDIO_FORMATS:
        raise bad_request(f"audio format {fmt!r} is not supported; use one of {', '.join(AUDIO_FORMATS)}", "file")
    language = form.get("language") or None
    if language is not None and language not in LANGUAGES:
        raise bad_request(f"language {language!r} is not supported; use an ISO 639-1 code among "
                          f"{sorted(LANGUAGES)}", "language")
    fmt_out = form.get("response_format") or "json"
    if fmt_out not in ("json", "text"):
        raise bad_request(f"response_format {fmt_out!r} is not supported; use json or text", "response_format")
    stream = _bool(form.get("stream", "false"), "stream")
    include_usage = _bool(form.get("stream_include_usage", "false"), "stream_include_usage")
    temperature = _num(form.get("temperature", 0.0), "temperature", float, 0.0, 2.0)
    limits = state.limits()

    def prepare():
        try:
            if len(data) > media.policy.max_bytes:
                raise MediaError(f"audio is over {media.policy.max_bytes:,} bytes")
            wave, sr = decode_audio(data, fmt)
            item = media.processor.process_audio((wave, sr))
        except MediaError as e:
            raise bad_request(f"file: {e}", "file") from None
        text = transcription_prompt(language, form.get("prompt"))
        ids = state.engine.tokenizer.encode(media.processor.expand_text(text, [item]))
        media.processor.locate(ids, [item])
        return Prompt(ids, text, [item])

    prompt = await state.offload(prepare)
    left = limits.max_model_len - len(prompt.token_ids)
    max_tokens = form.get("max_completion_tokens")
    max_tokens = left if max_tokens is None else int(_num(max_tokens, "max_completion_tokens", int, 1, left))
    kw = {}
    if form.get("seed") is not None:
        kw["seed"] = int(_num(form.get("seed"), "seed", int, 0, 2**63 - 1))
    sp = SamplingParams(temperature=temperature, max_tokens=max_tokens, skip_special_tokens=True,
                        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY, **kw)
    rid = new_id("trsc")
    streams = await submit(state, [prompt], [sp], rid)
    n_prompt = len(prompt.token_ids)
    if stream:
        return EventStream(_chunks(state, streams, rid, model, n_prompt, include_usage))
    (out,) = await cancel_on_disconnect(request, final_outputs(state, streams))
    text = out.outputs[0].text
    if fmt_out == "text":
        return PlainTextResponse(text)
    return {"text": text, "usage": {"type": "tokens", "input_tokens": n_prompt,
                                    "output_tokens": len(out.outputs[0].token_ids),
                                    "total_tokens": n_prompt + len(out.outputs[0].token_ids)}}


async def _chunks(state, streams, rid: str, model: str, n_prompt: int, include_usage: bool):
    created = now()
    gen = 0
    merged = merge(streams)
    try:
        async for _, out in merged:
            co = out.outputs[0]
            gen += len(co.delta_token_ids)
            if not co.delta_text and co.finish_reason is None:
                continue
            yield sse({"id": rid, "object": "transcription.chunk", "created": created, "model": model,
                       "choices": [{"delta": {"content": co.delta_text}, "finish_reason": co.finish_reason,
                                    "stop_reason": co.stop_reason}]})
        if include_usage:
            yield sse({"id": rid, "object": "transcription.chunk", "created": created, "model": model,
                       "choices": [], "usage": usage(n_prompt, gen, 0)})
    except Exception as e:
        yield sse(stream_error_body(state, e))
    finally:
        await merged.aclose()
    yield DONE


__all__ = ["create_transcription", "transcription_prompt"]
