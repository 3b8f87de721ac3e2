"""Hostile input against ``yoco-serve --frontend rust``, black-box over HTTP on a real port: integer fields at
the edges of 32/64-bit and beyond, non-finite and huge floats, lone surrogates, malformed and deeply nested
JSON, wrong content types, oversized bodies, a flood of concurrent bad requests. Every case must get a 4xx in
the OpenAI error envelope (never a 5xx, never a hang), and a normal request must still succeed afterwards."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from serve_helpers import CliServer

C = "/v1/completions"
BIG = (2**31, 2**63, 2**64, 2**70, -(2**63) - 1)
INT_FIELDS = {
    "max_tokens": lambda v: {"prompt": "x", "max_tokens": v},
    "n": lambda v: {"prompt": "x", "max_tokens": 1, "n": v},
    "top_k": lambda v: {"prompt": "x", "max_tokens": 1, "top_k": v},
    "min_tokens": lambda v: {"prompt": "x", "max_tokens": 1, "min_tokens": v},
    "priority": lambda v: {"prompt": "x", "max_tokens": 1, "priority": v},
    "stop_token_ids": lambda v: {"prompt": "x", "max_tokens": 1, "stop_token_ids": [v]},
    "prompt_token_id": lambda v: {"prompt": [2, v], "max_tokens": 1},
    "logprobs": lambda v: {"prompt": "x", "max_tokens": 1, "logprobs": v},
    "prompt_logprobs": lambda v: {"prompt": "x", "max_tokens": 1, "prompt_logprobs": v},
}
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def _cases():
    out = []
    for f, body in INT_FIELDS.items():
        for v in BIG:
            out.append((f"{f}={v}", json.dumps(body(v)), "application/json"))
    for f in FLOAT_FIELDS:
        for v in ("1e308", "-1e308", "1e400", "NaN", "Infinity", "-0.0001", "\"0.5\""):
            out.append((f"{f}={v}", '{"prompt": "x", "max_tokens": 1, "%s": %s}' % (f, v), "application/json"))
    raw = {
        "lone_surrogate": '{"prompt": "\\ud800", "max_tokens": 1}',
        "truncated": '{"prompt": "x", ',
        "not_an_object": '[1, 2, 3]',
        "null_prompt": '{"prompt": null}',
        "nested_prompt": '{"prompt": [[[1]]]}',
        "deep_nesting": '{"prompt": "x", "stop": ' + "[" * 5000 + "]" * 5000 + "}",
        "huge_stop_list": json.dumps({"prompt": "x", "max_tokens": 1, "stop": ["a"] * 100000}),
        "empty_body": "",
        "model_not_served": '{"model": "gpt-4", "prompt": "x"}',
        "too_many_prompts": json.dumps({"prompt": ["x"] * 100000, "max_tokens": 1}),
        "bad_utf8_bytes": b'{"prompt": "\xff\xfe", "max_tokens": 1}'.decode("latin-1"),
    }
    out += [(k, v, "application/json") for k, v in raw.items()]
    out += [(f"content_type_{ct}", '{"prompt": "x", "max_tokens": 1}', ct)
            for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")]
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def server():
    s = CliServer("--frontend", "rust", "--max-model-len", "256", "--max-num-seqs", "8",
                  "--max-request-body-bytes", str(4 << 20))
    yield s
    s.kill()


def _ok(url: str) -> None:
    r = httpx.post(url + C, json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("name,body,ctype", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_gets_a_4xx_envelope_and_the_server_keeps_serving(server, name, body, ctype):
    data = body.encode("latin-1") if name == "bad_utf8_bytes" else body.encode()
    r = httpx.post(server.url + C, content=data, headers={"content-type": ctype}, timeout=60)
    if r.status_code != 200:
        assert 400 <= r.status_code < 500, f"{name}: {r.status_code} {r.text[:300]}"
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"] and err["type"], err
    _ok(server.url)


def test_a_flood_of_concurrent_bad_requests_leaves_the_server_serving(server):
    def bad():
        for body, _ in zip([c[1] for c in CASES], range(40)):
            httpx.post(server.url + C, content=body.encode("utf-8", "surrogatepass"),
                       headers={"content-type": "application/json"}, timeout=60)

    threads = [threading.Thread(target=bad) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    _ok(server.url)
    m = httpx.get(server.url + "/metrics", timeout=30).text
    running = [l for l in m.splitlines() if l.startswith("yoco:num_requests_running{")]
    assert running and all(l.endswith(" 0") for l in running), running
