"""Hostile input against ``yoco-serve --frontend rust``, black-box over HTTP on a real port: integer fields at
the edges of 32/64-bit and beyond, non-finite and huge floats, lone surrogates, malformed and deeply nested
JSON, wrong content types, oversized bodies, a flood of concurrent bad requests. Every case must get a 4xx in
the OpenAI error envelope (never a 5xx, never a hang), and a normal request must still succeed afterwards."""

from __future__ import annotations

import json
import threading
import time

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
    # Request templates are trusted here so the template bombs below reach the renderer.
    s = CliServer("--frontend", "rust", "--max-model-len", "256", "--max-num-seqs", "8",
                  "--max-request-body-bytes", str(4 << 20), "--trust-request-chat-template",
                  "--chat-template-timeout", "0.5")
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


# ---- chat: hostile conversations and template bombs (under a trusted request template) ------------------------

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
CHAT_CASES = {
    "huge_message": json.dumps({"messages": [{"role": "user", "content": "word " * 400000}]}),
    "many_messages": json.dumps({"messages": [{"role": "user", "content": "x"},
                                              {"role": "assistant", "content": "y"}] * 20000}),
    "many_parts": json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 100000}]}),
    "deep_content": '{"messages": [{"role": "user", "content": ' + "[" * 5000 + "]" * 5000 + "}]}",
    "deep_kwargs": '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": '
                   + "{\"a\": " * 3000 + "1" + "}" * 3000 + "}}",
    "bad_role": json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
    "role_number": json.dumps({"messages": [{"role": 7, "content": "x"}]}),
    "role_null": json.dumps({"messages": [{"role": None, "content": "x"}]}),
    "missing_role": json.dumps({"messages": [{"content": "x"}]}),
    "message_not_object": json.dumps({"messages": ["x", 1, None]}),
    "messages_not_list": json.dumps({"messages": "hi"}),
    "lone_surrogate_content": '{"messages": [{"role": "user", "content": "\\ud800"}]}',
    "lone_surrogate_role": '{"messages": [{"role": "\\udfff", "content": "x"}]}',
    "image_part": json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                          "image_url": {"url": "http://x"}}]}]}),
    "bad_tool_call_arguments": json.dumps({"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{no"}}]}]}),
    "huge_template_source": json.dumps({"messages": USER, "chat_template": "{{" * 500000}),
    "template_syntax_error": json.dumps({"messages": USER, "chat_template": "{% for x in %}"}),
    "raise_exception": json.dumps({"messages": USER, "chat_template": "{{ raise_exception('no') }}"}),
    "huge_n": json.dumps({"messages": USER, "n": 2**40}),
    "max_completion_tokens_2_70": '{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": '
                                  + str(2**70) + "}",
}


@pytest.mark.parametrize("name", list(CHAT_CASES), ids=list(CHAT_CASES))
def test_hostile_chat_body_gets_a_4xx_envelope_and_the_server_keeps_serving(server, name):
    data = CHAT_CASES[name].encode("utf-8", "surrogatepass")
    r = httpx.post(server.url + CHAT, content=data, headers={"content-type": "application/json"}, timeout=60)
    assert 400 <= r.status_code < 500, f"{name}: {r.status_code} {r.text[:300]}"
    err = r.json()["error"]
    assert err["code"] == r.status_code and err["message"] and err["type"], err
    r = httpx.post(server.url + CHAT, json={"messages": USER, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


BOMBS = [
    ("nested_range_loops", "{% for a in range(100000) %}{% for b in range(100000) %}{{ b }}{% endfor %}{% endfor %}"),
    ("silent_nested_loops", "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                            "{% endfor %}{% endfor %}{% endfor %}"),
    ("string_repeat", "{{ 'x' * 1000000000 }}"),
    ("center_filter", "{{ 'x' | center(1000000000) }}"),
    ("doubling_namespace", "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                           "{% endfor %}{{ ns.s }}"),
    ("doubling_macro", "{% macro f(s, n) %}{{ f(s ~ s, n - 1) if n else s }}{% endmacro %}{{ f('ab', 60) }}"),
    ("power", "{{ 7 ** 99999999 }}"),
    ("power_of_variables", "{% set n = 99999999 %}{{ 7 ** n }}"),
]


@pytest.mark.parametrize("path", [CHAT, "/tokenize"])
@pytest.mark.parametrize("bomb", BOMBS, ids=[b[0] for b in BOMBS])
def test_template_bombs_get_a_400_within_the_budget_and_health_stays_fast(server, bomb, path):
    lat, stop = [], threading.Event()

    def probe():
        while not stop.is_set():
            t = time.monotonic()
            httpx.get(server.url + "/health", timeout=10)
            lat.append(time.monotonic() - t)
            time.sleep(0.01)

    th = threading.Thread(target=probe)
    th.start()
    t0 = time.monotonic()
    try:
        r = httpx.post(server.url + path, json={"messages": USER, "max_tokens": 1, "chat_template": bomb[1]},
                       timeout=60)
    finally:
        stop.set()
        th.join()
    took = time.monotonic() - t0
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "chat template" in err["message"], err
    assert took < 5, took
    assert lat and max(lat) < 1.0, max(lat)
    r = httpx.post(server.url + CHAT, json={"messages": USER, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text
