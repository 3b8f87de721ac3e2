"""Readiness, engine death and SIGTERM drain: ``/health`` is 503 until the model is loaded and once the
engine is dead; a dead engine fails requests with 503 (streams with an error event) and the CLI exits;
SIGTERM stops accepting, lets in-flight requests finish within ``--shutdown-timeout`` (aborting the
rest, whose streams still end properly), then exits 0. The SIGTERM tests run against both front ends (the
Rust one's engine death is in ``test_serve_rust_faults.py``)."""

import asyncio
import json
import signal
import threading
import time

import httpx
import pytest

from serve_helpers import FRONTENDS, CliServer, LiveServer
from yoco_rs.serve import ServerSettings, create_app


class _StubEngine:
    """Only the lifecycle properties /health reads (the model never loads)."""

    def __init__(self):
        self.is_ready, self.is_dead, self.dead_error = False, False, None


def _health(app, post=True):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.get("/health")
            v = await c.post("/v1/completions", json={"prompt": "x"}) if post else None
            return r, v
    return asyncio.run(go())


def test_health_is_503_while_loading_and_after_death_200_in_between():
    eng = _StubEngine()
    app = create_app(eng, ServerSettings(served_model_names=["m"]))
    r, v = _health(app)
    assert (r.status_code, r.json()["status"]) == (503, "loading")
    assert v.status_code == 503 and "still loading" in v.json()["error"]["message"]
    eng.is_ready = True
    assert _health(app, post=False)[0].status_code == 200
    eng.is_ready, eng.is_dead, eng.dead_error = False, True, RuntimeError("CUDA error: device lost")
    r, v = _health(app)
    assert (r.status_code, r.json()["status"]) == (503, "dead") and "device lost" in r.json()["error"]
    assert v.status_code == 503 and v.json()["error"]["type"] == "EngineDeadError"


def test_engine_death_fails_requests_with_503_and_reports_fatal():
    fatal = threading.Event()
    srv = LiveServer(dict(max_model_len=128, kv_cache_memory=16 << 20, max_num_seqs=4),
                     app_kwargs={"on_fatal": lambda e: fatal.set()}, served_model_names=["m"])
    try:
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "ok", "max_tokens": 2}).status_code == 200

        step, calls = srv.engine._engine.step, []

        def boom():  # two good steps (the stream has started), then the loop thread's step raises
            calls.append(1)
            if len(calls) <= 2:
                return step()
            time.sleep(0.2)
            raise RuntimeError("injected step failure")

        srv.engine._engine.step = boom
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60,
                          json={"prompt": "dies", "max_tokens": 5, "stream": True}) as r:
            assert r.status_code == 200
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        err = json.loads(lines[-2][6:])["error"]
        assert err["code"] == 503 and "injected step failure" in err["message"]
        h = httpx.get(srv.url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "dead"
        v = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert v.status_code == 503 and v.json()["error"]["type"] == "EngineDeadError"
        assert fatal.wait(10), "on_fatal (the CLI's exit) was not called"
    finally:
        srv.stop()


def _stream(url, max_tokens, out, started):
    body = {"prompt": "drain me", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        started.release()
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    out.append(lines)


def _start_streams(url, n, max_tokens):
    out, started = [], threading.Semaphore(0)
    threads = [threading.Thread(target=_stream, args=(url, max_tokens, out, started)) for _ in range(n)]
    for t in threads:
        t.start()
    for _ in range(n):
        assert started.acquire(timeout=60)
    return out, threads


def _finish_reasons(lines):
    return [c["choices"][0]["finish_reason"] for c in (json.loads(ln[6:]) for ln in lines[:-1])
            if c.get("choices") and c["choices"][0]["finish_reason"]]


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_sigterm_drains_in_flight_requests_then_exits_0(frontend):
    srv = CliServer("--frontend", frontend, "--max-model-len", "256", "--max-num-seqs", "2",
                    "--shutdown-timeout", "60", "--kv-cache-memory", "32MiB")
    try:
        out, threads = _start_streams(srv.url, 6, 200)
        srv.proc.send_signal(signal.SIGTERM)
        refused = False
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not refused:
            try:
                r = httpx.post(srv.url + "/v1/completions", json={"prompt": "late", "max_tokens": 1}, timeout=5)
                refused = r.status_code == 503
            except httpx.TransportError:
                refused = True
            time.sleep(0.05)
        assert refused, "new requests were still accepted while draining"
        for t in threads:
            t.join(120)
        assert srv.proc.wait(60) == 0
        assert len(out) == 6
        for lines in out:
            assert lines[-1] == "data: [DONE]"
            assert _finish_reasons(lines) == ["length"]
            assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == 200
        assert "draining" in srv.log
    finally:
        srv.kill()


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_sigterm_aborts_what_outlives_the_shutdown_timeout(frontend):
    srv = CliServer("--frontend", frontend, "--max-model-len", "256", "--max-num-seqs", "1",
                    "--shutdown-timeout", "0.3", "--kv-cache-memory", "32MiB")
    try:
        out, threads = _start_streams(srv.url, 4, 240)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert srv.proc.wait(60) == 0
        assert time.monotonic() - t0 < 30
        reasons = [r for lines in out for r in _finish_reasons(lines)]
        assert all(lines[-1] == "data: [DONE]" for lines in out)
        assert len(reasons) == 4 and "abort" in reasons and set(reasons) <= {"length", "abort"}
    finally:
        srv.kill()
