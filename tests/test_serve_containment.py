"""Failure containment seen over HTTP: a failing engine step (injected through the executor) fails only
the requests it ran, each with a 500 naming the cause (an error event for a stream, a JSON error
otherwise), and the server keeps serving; K failing steps in a row declare the engine dead (503, and
``on_fatal``: the CLI exits for the orchestrator). Plus the flags and defaults of this hardening."""

from __future__ import annotations

import json
import threading
import time

import httpx

from serve_helpers import LiveServer
from yoco_rs.serve.args import build_parser

ENGINE = dict(max_model_len=128, kv_cache_memory=16 << 20, max_num_seqs=4)


class DeviceLost(RuntimeError):
    pass


def _fail_when(srv: LiveServer, should_fail) -> list:
    runner = srv.engine._engine._runner
    real = runner.execute
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if should_fail(len(calls)):
            raise DeviceLost("device lost (injected)")
        return real(*a, **k)

    runner.execute = flaky
    return calls


def _stream(url, body, out):
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        out.append((r.status_code, [ln for ln in r.iter_lines() if ln.startswith("data: ")]))


def test_a_failing_step_fails_its_requests_with_500_and_the_server_keeps_serving():
    srv = LiveServer(ENGINE, served_model_names=["m"])
    try:
        fail_at = {"step": None}
        calls = _fail_when(srv, lambda n: n == fail_at["step"])
        body = {"prompt": "one step fails", "max_tokens": 60, "ignore_eos": True}
        streamed: list = []
        t = threading.Thread(target=_stream, args=(srv.url, body, streamed))
        t.start()
        plain = {}
        t2 = threading.Thread(target=lambda: plain.setdefault(
            "r", httpx.post(srv.url + "/v1/completions", json=body, timeout=60)))
        t2.start()
        time.sleep(0.3)  # both are running
        fail_at["step"] = len(calls) + 1  # the next step raises
        t.join(60)
        t2.join(60)
        status, lines = streamed[0]
        assert status == 200 and lines[-1] == "data: [DONE]"
        err = json.loads(lines[-2][6:])["error"]
        assert err["code"] == 500 and "DeviceLost: device lost (injected)" in err["message"]
        r = plain["r"]
        assert r.status_code == 500, r.text
        assert "DeviceLost: device lost (injected)" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/health").status_code == 200 and not srv.engine.is_dead
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "after", "max_tokens": 3}, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        srv.wait_idle()  # nothing leaked: no request left, no block referenced
    finally:
        srv.stop()


def test_k_failing_steps_in_a_row_kill_the_engine_and_call_on_fatal():
    fatal = threading.Event()
    srv = LiveServer({**ENGINE, "max_consecutive_step_failures": 2}, app_kwargs={"on_fatal": lambda e: fatal.set()},
                     served_model_names=["m"])
    try:
        _fail_when(srv, lambda n: True)
        r1 = httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=60)
        assert r1.status_code == 500  # the first failure is contained
        assert httpx.get(srv.url + "/health").status_code == 200
        r2 = httpx.post(srv.url + "/v1/completions", json={"prompt": "b", "max_tokens": 2}, timeout=60)
        assert r2.status_code == 503 and r2.json()["error"]["type"] == "EngineDeadError"
        assert "device lost" in r2.json()["error"]["message"]
        h = httpx.get(srv.url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "dead"
        assert fatal.wait(10), "on_fatal (the CLI's exit) was not called"
    finally:
        srv.stop()


def test_hardening_flags_and_a_shutdown_default_inside_the_kubernetes_grace_period():
    a = build_parser().parse_args([])
    assert a.shutdown_timeout + 5 < 30  # drain + uvicorn's connection close fit the default 30 s grace
    assert (a.max_n, a.max_prompts_per_request, a.max_consecutive_step_failures) == (128, 256, 3)
    assert not a.trust_request_chat_template and not a.disable_fastapi_docs and a.allowed_origins is None
    a = build_parser().parse_args(["--max-n", "4", "--allowed-origins", "http://a", "http://b",
                                   "--trust-request-chat-template", "--disable-fastapi-docs",
                                   "--max-consecutive-step-failures", "5", "--chat-template-timeout", "0.5"])
    assert (a.max_n, a.allowed_origins, a.max_consecutive_step_failures) == (4, ["http://a", "http://b"], 5)
    assert a.trust_request_chat_template and a.disable_fastapi_docs and a.chat_template_timeout == 0.5
