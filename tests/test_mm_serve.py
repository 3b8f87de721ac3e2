"""Image and audio inputs over HTTP (black box, a live server on the tiny multimodal checkpoint): chat
content parts (data URLs, input_audio, several items, file:// under --allowed-local-media-path), the
openai client round trip with greedy tokens equal to the Engine's, /v1/audio/transcriptions (json,
text, streaming), and a clear 400 for each kind of bad media.

The server is ``yoco-serve`` as a subprocess with the settings as flags (its media seam is
``serve/rust_media.py``); the reference Engine is a separate in-process engine on the same checkpoint, and
the media items still registered are what the server prints when it stops (the last test stops it)."""

from __future__ import annotations

import base64
import json
import signal
import time

import httpx
import pytest

from mm_tiny import image_bytes, random_audio, random_image, wav_bytes
from serve_helpers import CliServer

ENGINE = dict(max_model_len=512, kv_cache_memory=32 << 20, max_num_seqs=8, block_size=16, sub_block_size=4,
              max_num_batched_tokens=64, limit_mm_per_prompt={"image": 2, "audio": 1}, seed=0)


def data_url(img, fmt="PNG") -> str:
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(image_bytes(img, fmt)).decode()


def b64_wav(wave) -> str:
    return base64.b64encode(wav_bytes(wave)).decode()


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    (d / "pic.png").write_bytes(image_bytes(random_image(31)))
    return d


class RustMm(CliServer):
    """``yoco-serve`` with ENGINE's settings as flags."""

    def __init__(self, model_dir, media_dir):
        super().__init__(
            "--frontend", "rust", "--async-scheduling", model_dir, "--max-model-len", str(ENGINE["max_model_len"]),
            "--kv-cache-memory", "32MiB", "--max-num-seqs", str(ENGINE["max_num_seqs"]),
            "--block-size", str(ENGINE["block_size"]), "--sub-block-size", str(ENGINE["sub_block_size"]),
            "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
            "--limit-mm-per-prompt", json.dumps(ENGINE["limit_mm_per_prompt"]), "--seed", "0",
            "--allowed-local-media-path", str(media_dir), "--max-media-bytes", str(2 << 20))
        self.model_dir = model_dir
        self.model = httpx.get(self.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        self._ref = None

    def reference(self):
        """An in-process Engine on the same checkpoint and settings (greedy outputs must match)."""
        if self._ref is None:
            from yoco_rs import Engine

            self._ref = Engine(self.model_dir, **ENGINE)
        return self._ref

    def wait_idle(self, timeout: float = 30.0) -> dict:
        from prometheus_client.parser import text_string_to_metric_families

        deadline = time.monotonic() + timeout
        while True:
            m = {}
            for fam in text_string_to_metric_families(httpx.get(self.url + "/metrics", timeout=10).text):
                for smp in fam.samples:
                    m[smp.name] = m.get(smp.name, 0) + smp.value
            busy = [m.get(n, 0) for n in ("yoco:num_requests_running", "yoco:num_requests_waiting",
                                          "yoco:kv_blocks_used")]
            if not any(busy):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle after {timeout} s: running/waiting/blocks_used = {busy}")
            time.sleep(0.05)

    def media_requests_live(self) -> int:
        """Stops the server: the count of requests still holding items that it prints on the way out."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        for _ in range(100):  # the reader thread drains stderr after the exit
            hits = [ln for ln in self.lines if ln.startswith("yoco-serve: stopped (")]
            if hits:
                return int(hits[-1].split("(", 1)[1].split(" ", 1)[0])
            time.sleep(0.05)
        raise AssertionError("no stop line:\n" + self.log)

    def stop(self):
        self.kill()


@pytest.fixture(scope="module")
def srv(tiny_mm, media_dir):
    s = RustMm(tiny_mm[0], media_dir)
    yield s
    s.stop()


def chat(srv, content, **kw):
    body = {"model": srv.model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 4, "temperature": 0, **kw}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)


def parts(text, *media):
    return [*media, {"type": "text", "text": text}]


def img_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def audio_part(wave, fmt="wav"):
    return {"type": "input_audio", "input_audio": {"data": b64_wav(wave), "format": fmt}}


def test_openai_client_round_trip_equals_the_engine(srv):
    from openai import OpenAI

    from yoco_rs import SamplingParams

    img, wave = random_image(40), random_audio(41, 1.0)
    client = OpenAI(base_url=srv.url + "/v1", api_key="none")
    r = client.chat.completions.create(
        model=srv.model, max_tokens=5, temperature=0,
        messages=[{"role": "user", "content": [img_part(data_url(img)), audio_part(wave),
                                                {"type": "text", "text": "What do you see and hear?"}]}])
    got = r.choices[0].message.content
    # the same conversation through the Engine API: the template renders one placeholder per part
    eng = srv.reference()
    text = eng.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "audio"},
                                                                 {"type": "text", "text": "What do you see and hear?"}]}])
    out = eng.generate({"prompt": text, "multi_modal_data": {"image": img, "audio": (wave, 16000)}},
                       SamplingParams(max_tokens=5, temperature=0), use_tqdm=False)[0]
    assert got == out.outputs[0].text
    assert r.usage.prompt_tokens == len(out.prompt_token_ids)
    # the same image again: served from the prefix cache
    r2 = client.chat.completions.create(
        model=srv.model, max_tokens=5, temperature=0,
        messages=[{"role": "user", "content": [img_part(data_url(img)), audio_part(wave),
                                                {"type": "text", "text": "What do you see and hear?"}]}])
    assert r2.choices[0].message.content == got
    assert r2.usage.prompt_tokens_details.cached_tokens > 0


def test_two_images_in_one_message_and_a_local_file(srv, media_dir):
    r = chat(srv, parts("compare", img_part(data_url(random_image(42))), img_part((media_dir / "pic.png").as_uri())))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 2 * 16


def test_streaming_chat_with_an_image_equals_non_streaming(srv):
    content = parts("describe", img_part(data_url(random_image(43), "JPEG")))
    full = chat(srv, content).json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=120,
                      json={"model": srv.model, "messages": [{"role": "user", "content": content}],
                            "max_tokens": 4, "temperature": 0, "stream": True}) as resp:
        text = ""
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    text += c["delta"].get("content") or ""
    assert text == full


def test_transcriptions_json_text_and_stream(srv):
    wave = random_audio(44, 1.2)
    files = {"file": ("clip.wav", wav_bytes(wave), "audio/wav")}
    data = {"model": srv.model, "max_completion_tokens": "5"}
    r = httpx.post(srv.url + "/v1/audio/transcriptions", files=files, data=data, timeout=120)
    assert r.status_code == 200, r.text
    text = r.json()["text"]
    r2 = httpx.post(srv.url + "/v1/audio/transcriptions", files=files, data={**data, "response_format": "text"},
                    timeout=120)
    assert r2.status_code == 200 and r2.text == text
    with httpx.stream("POST", srv.url + "/v1/audio/transcriptions", files=files, timeout=120,
                      data={**data, "stream": "true", "stream_include_usage": "true"}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert all(c["object"] == "transcription.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]) == text
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    # the openai client's non-streaming call
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="none")
    t = client.audio.transcriptions.create(model=srv.model, file=("clip.wav", wav_bytes(wave)),
                                           extra_body={"max_completion_tokens": 5})
    assert t.text == text


BAD = [
    ("corrupt base64", lambda: parts("x", img_part("data:image/png;base64,@@not-base64@@")), "not valid base64"),
    ("undecodable image", lambda: parts("x", img_part("data:image/png;base64," + base64.b64encode(b"garbage" * 9)
                                                     .decode())), "not a decodable image"),
    ("unsupported image format", lambda: parts("x", img_part(data_url(random_image(1), "TIFF"))), "not supported"),
    ("undecodable audio", lambda: parts("x", {"type": "input_audio", "input_audio": {
        "data": base64.b64encode(b"RIFF....nonsense" * 10).decode(), "format": "wav"}}), "cannot be decoded"),
    ("unsupported audio format", lambda: parts("x", {"type": "input_audio", "input_audio": {
        "data": b64_wav(random_audio(1, 0.5)), "format": "aiff"}}), "not supported"),
    ("too many images", lambda: parts("x", *[img_part(data_url(random_image(i))) for i in range(3)]), "at most 2"),
    ("too long audio", lambda: parts("x", audio_part(random_audio(1, 4.0))), "at most"),
    ("too large image bytes", lambda: parts("x", img_part("data:image/png;base64," + base64.b64encode(
        image_bytes(random_image(2, size=(1200, 1000)))).decode())), "bytes"),
    ("scheme not allowed", lambda: parts("x", img_part("ftp://example.com/a.png")), "scheme ftp: is not allowed"),
    ("file outside the allowed path", lambda: parts("x", img_part("file:///etc/passwd")), "outside"),
    ("unknown part", lambda: parts("x", {"type": "video_url", "video_url": {"url": "x"}}), "video_url"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_media_is_a_clear_400(srv, case):
    _, content, want = case
    r = chat(srv, content())
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert want in msg, msg
    assert "messages[0].content" in msg or "at most" in msg or "unsupported" in msg


def test_bad_transcription_uploads_are_400s(srv):
    url = srv.url + "/v1/audio/transcriptions"
    m = {"model": srv.model}
    r = httpx.post(url, files={"file": ("a.wav", b"not audio at all", "audio/wav")}, data=m, timeout=60)
    assert r.status_code == 400 and "cannot be decoded" in r.json()["error"]["message"]
    r = httpx.post(url, files={"file": ("a.aiff", wav_bytes(random_audio(1)), "audio/aiff")}, data=m, timeout=60)
    assert r.status_code == 400 and "not supported" in r.json()["error"]["message"]
    r = httpx.post(url, data=m, files={"other": ("x", b"1")}, timeout=60)
    assert r.status_code == 400
    r = httpx.post(url, json=m, timeout=60)
    assert r.status_code == 415
    r = httpx.post(url, files={"file": ("a.wav", wav_bytes(random_audio(1, 3.0)), "audio/wav")}, data=m, timeout=60)
    assert r.status_code == 400 and "at most" in r.json()["error"]["message"]


def test_disconnects_mid_stream_leak_nothing(srv):
    # streaming image requests whose clients go away after the first chunk: aborted, blocks and items freed
    for i in range(6):
        body = {"model": srv.model, "stream": True, "max_tokens": 64, "temperature": 0,
                "messages": [{"role": "user", "content": parts(f"story {i}", img_part(data_url(random_image(60 + i))))}]}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=120) as resp:
            assert resp.status_code == 200
            next(resp.iter_lines())
    m = srv.wait_idle()
    assert m  # the media count is read when the server stops (the last test)


def test_nothing_leaks_after_bad_and_good_media(srv):
    # Last in the module: this stops the server to read its count.
    m = srv.wait_idle()
    assert m
    assert srv.media_requests_live() == 0
