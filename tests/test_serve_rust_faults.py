"""A failing PyTorch executor behind the Rust front end, black-box over HTTP: a step whose forward raises
fails the requests it ran (500 with the exception, an error event on a stream) and the server keeps
serving with nothing leaked; ``--max-consecutive-step-failures`` failed steps in a row stop the engine,
and the process exits 1 saying why (as the Python server does, so a supervisor restarts it). The fault
comes from outside the server: ``tests/fault_serve.py`` wraps ``StepExecutor.launch``."""

from __future__ import annotations

import json
import os
import sys
import threading

import httpx

from serve_helpers import RustServer

FLAGS = ("--max-model-len", "256", "--kv-cache-memory", str(16 << 20), "--max-num-seqs", "4",
         "--served-model-name", "m", "--seed", "0")
INJECTED = "DeviceLost: device lost (injected)"


def _server(tmp_path, *flags) -> tuple[RustServer, str]:
    switch = str(tmp_path / "fault")
    open(switch, "w").close()
    launcher = os.path.join(os.path.dirname(__file__), "fault_serve.py")
    return RustServer(*FLAGS, *flags, api_key=None, command=[sys.executable, launcher, switch]), switch


def test_a_failing_step_fails_its_requests_and_the_rust_server_keeps_serving(tmp_path):
    srv, switch = _server(tmp_path)
    try:
        body = {"prompt": "one step fails", "max_tokens": 200, "ignore_eos": True}
        plain: dict = {}
        t = threading.Thread(target=lambda: plain.setdefault(
            "r", httpx.post(srv.url + "/v1/completions", json=body, timeout=60)))
        with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(ln for ln in lines if ln.startswith("data: "))
            t.start()
            while srv.metric("yoco:num_requests_running") < 2:
                pass
            with open(switch, "w") as f:  # both run: the next step raises
                f.write("once")
            rest = [ln for ln in lines if ln.startswith("data: ")]
        t.join(60)
        assert json.loads(first[6:])["choices"]
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][6:])["error"]
        assert err["code"] == 500 and INJECTED in err["message"], err
        r = plain["r"]
        assert r.status_code == 500 and INJECTED in r.json()["error"]["message"], r.text
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "after", "max_tokens": 3}, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        srv.wait_idle()  # nothing leaked: no request left, no block referenced
        assert srv.metric("yoco:engine_failed_steps_total") >= 1
    finally:
        srv.stop()


def test_failing_steps_in_a_row_stop_the_rust_server_with_exit_status_1(tmp_path):
    srv, switch = _server(tmp_path, "--max-consecutive-step-failures", "2")
    try:
        with open(switch, "w") as f:
            f.write("always")
        r1 = httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=60)
        assert r1.status_code == 500 and INJECTED in r1.text  # the first failure is contained
        assert httpx.get(srv.url + "/health").status_code == 200
        r2 = httpx.post(srv.url + "/v1/completions", json={"prompt": "b", "max_tokens": 2}, timeout=60)
        # This failure stops the engine: its request gets the dead engine's 503 (as on the Python server).
        assert r2.status_code == 503 and r2.json()["error"]["type"] == "EngineDeadError" and INJECTED in r2.text
        assert srv.proc.wait(30) == 1
        assert f"yoco-serve: error: the engine failed: {INJECTED}" in srv.log, srv.log
    finally:
        srv.stop()
