"""SIGTERM drain: the server stops accepting, lets in-flight requests finish within ``--shutdown-timeout``
(aborting the rest, whose streams still end properly), then exits 0. (Readiness: the port is bound only
once the model has loaded, so the first connection already gets a 200 from ``/health``; engine death,
exit 1 after ``--max-consecutive-step-failures`` failing steps, is in ``test_serve_rust_faults.py``.)"""

import json
import signal
import threading
import time

import httpx
import pytest

from serve_helpers import FRONTENDS, CliServer


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
