"""The hostile-input suite, black-box over HTTP against a real yoco-serve on a loopback port: every integer
field at 2**31, 2**63, 2**64 and 2**70 (values that would overflow an array), lone surrogates, content
types a web page can send without a CORS preflight, unsupported features, the server's caps, chat-template
bombs. Each case asserts the status, the OpenAI error envelope and the message, then that a normal request
still succeeds (nothing a client sends takes the server down)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from serve_helpers import API_KEY, FRONTENDS, RustServer, each_frontend

srv = pytest.fixture(scope="session", params=FRONTENDS)(each_frontend)

C, CHAT, TOK, DETOK = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
USER = [{"role": "user", "content": "hi"}]
BIG = (2**31, 2**63, 2**64, 2**70)
ANY = ...  # param not checked
OK = 200


def _name(v: int) -> str:
    return {2**31: "2e31", 2**63: "2e63", 2**64: "2e64", 2**70: "2e70"}.get(abs(v), str(v)) + ("neg" if v < 0 else "")


def _int_cases():
    """(id, path, body, status, param, needles) for every integer field at every boundary."""
    cases = []
    over64 = ["64-bit range"]
    comp = {  # field -> (body builder, what 2**31 gives: (status, param, needles))
        "n": (lambda v: {"prompt": "x", "max_tokens": 1, "n": v}, (400, "n", ["n must be <= 128"])),
        "best_of": (lambda v: {"prompt": "x", "max_tokens": 1, "best_of": v}, (400, "best_of", ["must equal n"])),
        "top_k": (lambda v: {"prompt": "x", "max_tokens": 1, "top_k": v}, (400, "top_k", ["2**31 - 1"])),
        "seed": (lambda v: {"prompt": "x", "max_tokens": 1, "seed": v}, (OK, None, [])),  # int64 seeds are valid
        "max_tokens": (lambda v: {"prompt": "x", "max_tokens": v}, (400, "max_tokens", ["maximum context length"])),
        "min_tokens": (lambda v: {"prompt": "x", "max_tokens": 1, "min_tokens": v},
                       (400, "min_tokens", ["<= max_tokens"])),
        "logprobs": (lambda v: {"prompt": "x", "max_tokens": 1, "logprobs": v}, (400, "logprobs", ["max_logprobs"])),
        "prompt_logprobs": (lambda v: {"prompt": "x", "max_tokens": 1, "prompt_logprobs": v},
                            (400, "prompt_logprobs", ["max_logprobs"])),
        "priority": (lambda v: {"prompt": "x", "max_tokens": 1, "priority": v},
                     (400, "priority", ["--scheduling-policy priority"])),
        "truncate_prompt_tokens": (lambda v: {"prompt": "x", "max_tokens": 1, "truncate_prompt_tokens": v},
                                   (400, "truncate_prompt_tokens", ["<= max_model_len (256)"])),
        "stop_token_ids": (lambda v: {"prompt": "x", "max_tokens": 1, "stop_token_ids": [v]},
                           (400, "stop_token_ids", ["outside the vocabulary"])),
        "prompt_token_id": (lambda v: {"prompt": [2, v], "max_tokens": 1},
                            (400, "prompt", ["outside the vocabulary"])),
    }
    for field, (body, at31) in comp.items():
        for v in BIG:
            # prompt ids are checked against the vocabulary whatever their size
            want = at31 if v == 2**31 or field == "prompt_token_id" else (400, ANY, over64)
            cases.append((f"completions_{field}_{_name(v)}", C, body(v), *want))
    chat = {
        "max_completion_tokens": (lambda v: {"messages": USER, "max_completion_tokens": v},
                                  (400, "max_tokens", ["maximum context length"])),
        "max_tokens": (lambda v: {"messages": USER, "max_tokens": v}, (400, "max_tokens", ["maximum context length"])),
        "top_logprobs": (lambda v: {"messages": USER, "max_tokens": 1, "logprobs": True, "top_logprobs": v},
                         (400, "top_logprobs", ["max_logprobs"])),
        "n": (lambda v: {"messages": USER, "max_tokens": 1, "n": v}, (400, "n", ["n must be <= 128"])),
        "seed": (lambda v: {"messages": USER, "max_tokens": 1, "seed": v}, (OK, None, [])),
    }
    for field, (body, at31) in chat.items():
        for v in BIG:
            want = at31 if v == 2**31 else (400, ANY, over64)
            cases.append((f"chat_{field}_{_name(v)}", CHAT, body(v), *want))
    for v in BIG:
        want = (400, "tokens", ["outside the vocabulary"]) if v == 2**31 else (400, ANY, over64)
        cases.append((f"detokenize_tokens_{_name(v)}", DETOK, {"tokens": [1, v]}, *want))
    # the negative ends
    cases += [
        ("completions_seed_min_int64", C, {"prompt": "x", "max_tokens": 1, "seed": -(2**63)}, OK, None, []),
        ("completions_seed_below_int64", C, {"prompt": "x", "max_tokens": 1, "seed": -(2**63) - 1}, 400, "seed",
         over64),
        ("completions_top_k_neg2e70", C, {"prompt": "x", "max_tokens": 1, "top_k": -(2**70)}, 400, "top_k", over64),
        ("completions_n_neg2e31", C, {"prompt": "x", "max_tokens": 1, "n": -(2**31)}, 400, "n", [">= 1"]),
        ("completions_priority_neg2e31", C, {"prompt": "x", "max_tokens": 1, "priority": -(2**31)}, 400, "priority",
         ["--scheduling-policy priority"]),
        ("completions_max_tokens_float_2e70", C, {"prompt": "x", "max_tokens": float(2**70)}, 400, "max_tokens",
         over64),
    ]
    return cases


def raw(b: bytes, ct: str | None = "application/json"):
    return ("raw", b, ct)


SURROGATES = [
    ("surrogate_in_prompt", C, raw(b'{"prompt": "A\\ud800B", "max_tokens": 1}'), 400, "prompt",
     ["lone UTF-16 surrogate", "\\ud800"]),
    ("surrogate_low_alone", C, raw(b'{"prompt": "x\\udc00", "max_tokens": 1}'), 400, "prompt", ["surrogate"]),
    ("surrogate_in_chat_content", CHAT, raw(b'{"messages": [{"role": "user", "content": "\\udbff"}]}'), 400,
     "messages", ["surrogate"]),
    ("surrogate_in_stop", C, raw(b'{"prompt": "x", "max_tokens": 1, "stop": ["\\ud834"]}'), 400, "stop",
     ["surrogate"]),
    ("surrogate_in_key", C, raw(b'{"prompt": "x", "max_tokens": 1, "\\ud800": 1}'), 400, ANY, ["surrogate"]),
    ("surrogate_in_tokenize", TOK, raw(b'{"prompt": "\\ud800"}'), 400, "prompt", ["surrogate"]),
    ("surrogate_pair_is_fine", C, raw(b'{"prompt": "smile \\ud83d\\ude00", "max_tokens": 1}'), OK, None, []),
]

BODY = b'{"prompt": "x", "max_tokens": 1}'
CONTENT_TYPES = [
    ("content_type_text_plain", C, raw(BODY, "text/plain"), 415, None, ["'text/plain'", "application/json"]),
    ("content_type_form", C, raw(BODY, "application/x-www-form-urlencoded"), 415, None, ["not supported"]),
    ("content_type_multipart", C, raw(BODY, "multipart/form-data; boundary=x"), 415, None, ["not supported"]),
    ("content_type_html", CHAT, raw(BODY, "text/html"), 415, None, ["not supported"]),
    ("content_type_text_plain_tokenize", TOK, raw(b'{"prompt": "x"}', "text/plain;charset=UTF-8"), 415, None,
     ["not supported"]),
    ("content_type_json_charset", C, raw(BODY, "application/json; charset=utf-8"), OK, None, []),
    ("content_type_json_suffix", C, raw(BODY, "application/vnd.api+json"), OK, None, []),
    ("content_type_missing", C, raw(BODY, None), OK, None, []),
]

LIMITS = [
    ("n_over_cap", C, {"prompt": "x", "max_tokens": 1, "n": 129}, 400, "n", ["n must be <= 128", "--max-n"]),
    ("n_at_cap", C, {"prompt": "x", "max_tokens": 1, "n": 128}, OK, None, []),
    ("prompts_over_cap", C, {"prompt": ["x"] * 257, "max_tokens": 1}, 400, "prompt",
     ["257 prompts", "at most 256"]),
    ("priority_under_fcfs", C, {"prompt": "x", "max_tokens": 1, "priority": 1}, 400, "priority",
     ["--scheduling-policy priority"]),
    ("chat_priority_under_fcfs", CHAT, {"messages": USER, "max_tokens": 1, "priority": -5}, 400, "priority",
     ["first come, first served"]),
    ("text_over_context_refused_untokenized", C, {"prompt": "word " * 150000, "max_tokens": 1}, 400, "prompt",
     ["750000 characters", "maximum context length"]),
    ("tokenize_text_over_context", TOK, {"prompt": "a" * 700000}, 400, "prompt", ["characters"]),
]

UNSUPPORTED = [
    ("tools_without_tool_choice_means_auto", CHAT, {"messages": USER, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {}}}]}, 400, "tool_choice",
     ["--enable-auto-tool-choice"]),
    ("tools_with_auto_not_enabled", CHAT, {"messages": USER, "tool_choice": "auto", "tools": [
        {"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice", ["--enable-auto-tool-choice"]),
    ("tool_choice_required_alone", CHAT, {"messages": USER, "tool_choice": "required"}, 400, "tool_choice",
     ["needs tools"]),
    ("tool_choice_names_an_unknown_function", CHAT, {"messages": USER, "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {
            "name": "g"}}}, 400, "tool_choice", ["'g'"]),
    ("tools_with_choice_none_ok", CHAT, {"messages": USER, "max_tokens": 1, "tool_choice": "none", "tools": [
        {"type": "function", "function": {"name": "f"}}]}, OK, None, []),
    ("functions_legacy", CHAT, {"messages": USER, "functions": [{"name": "f"}]}, 400, "functions", ["tool calling"]),
    ("function_call_legacy", CHAT, {"messages": USER, "function_call": "auto"}, 400, "function_call",
     ["tool calling"]),
    ("response_format_json_schema_without_schema", CHAT, {"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x"}}}, 400, "response_format", ["schema is required"]),
    ("response_format_unknown_type", C, {"prompt": "x", "response_format": {"type": "yaml"}}, 400,
     "response_format", ["'yaml'"]),
    ("response_format_json_object_on_completions_ok", C, {"prompt": "x", "max_tokens": 8,
                                                          "response_format": {"type": "json_object"}}, OK, None, []),
    ("response_format_text_ok", CHAT, {"messages": USER, "max_tokens": 1, "response_format": {"type": "text"}}, OK,
     None, []),
    ("guided_json_ok", C, {"prompt": "x", "max_tokens": 8, "guided_json": {"type": "object"}}, OK, None, []),
    ("guided_choice_ok", CHAT, {"messages": USER, "guided_choice": ["a", "b"]}, OK, None, []),
    ("two_structured_constraints", C, {"prompt": "x", "guided_regex": "a+", "guided_choice": ["a"]}, 400,
     ANY, ["only one structured output constraint"]),
    ("structured_outputs_not_an_object", CHAT, {"messages": USER, "structured_outputs": 5}, 400,
     "structured_outputs", []),
    ("audio_output", CHAT, {"messages": USER, "audio": {"voice": "alloy"}}, 400, "audio", ["not supported"]),
    ("modalities_audio", CHAT, {"messages": USER, "modalities": ["text", "audio"]}, 400, "modalities",
     ["not supported"]),
    ("prediction", CHAT, {"messages": USER, "prediction": {"type": "content", "content": "x"}}, 400, "prediction",
     ["not supported"]),
    ("allowed_token_ids", C, {"prompt": "x", "allowed_token_ids": [1, 2]}, 400, "allowed_token_ids",
     ["not supported"]),
    ("bad_words", C, {"prompt": "x", "bad_words": ["a"]}, 400, "bad_words", ["not supported"]),
    ("request_chat_template_refused", CHAT, {"messages": USER, "chat_template": "{{ 'x' }}"}, 400,
     "chat_template", ["--trust-request-chat-template"]),
    ("request_chat_template_refused_on_tokenize", TOK, {"messages": USER, "chat_template": "{{ 'x' }}"}, 400,
     "chat_template", ["--trust-request-chat-template"]),
    ("chat_template_in_kwargs_refused", CHAT, {"messages": USER, "chat_template_kwargs": {"chat_template": "x"}},
     400, "chat_template_kwargs", ["refused"]),
]

CASES = _int_cases() + SURROGATES + CONTENT_TYPES + LIMITS + UNSUPPORTED


def test_the_suite_has_at_least_100_cases():
    assert len(CASES) >= 100 and len({c[0] for c in CASES}) == len(CASES)


def post(url: str, path: str, body, key: str | None = API_KEY, timeout: float = 60):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, tuple) and body[0] == "raw":
        if body[2] is not None:
            h["Content-Type"] = body[2]
        return httpx.post(url + path, content=body[1], headers=h, timeout=timeout)
    return httpx.post(url + path, json=body, headers=h, timeout=timeout)


def assert_answer(r, status, param=ANY, needles=()):
    """``status`` with the OpenAI error envelope naming the problem (or a well-formed 200)."""
    if status == OK:
        assert r.status_code == 200, r.text
        body = r.json()
        assert "choices" in body or "tokens" in body or "prompt" in body, body
        return
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert isinstance(err["type"], str) and err["type"]
    if param is not ANY:
        assert err["param"] == param, err
    for n in needles:
        assert n in err["message"], (n, err["message"])


def assert_still_serving(url: str, key: str | None = API_KEY):
    r = post(url, C, {"prompt": "still alive?", "max_tokens": 1}, key)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1
    assert httpx.get(url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_gets_its_answer_and_the_server_keeps_serving(srv, case):
    _, path, body, status, param, needles = case
    assert_answer(post(srv.url, path, body), status, param, needles)
    assert_still_serving(srv.url)


def test_cors_is_off_by_default(srv):
    r = httpx.options(srv.url + C, headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers
    r = post(srv.url, C, {"prompt": "x", "max_tokens": 1})
    assert "access-control-allow-origin" not in r.headers


# ---- a server that trusts request templates, with CORS and no docs -----------------------------------------

@pytest.fixture(scope="module", params=FRONTENDS)
def trusting(request):
    # --disable-fastapi-docs is accepted for vLLM compatibility: the Rust server has no docs to turn off.
    s = RustServer("--max-model-len", "256", "--kv-cache-memory", str(32 << 20), "--max-num-seqs", "8",
                   "--served-model-name", "m", "--trust-request-chat-template", "--chat-template-timeout", "0.5",
                   "--allowed-origins", "http://ui.local", "--disable-fastapi-docs", api_key=None)
    yield s
    s.stop()


BOMBS = [
    ("nested_range_loops", "{% for a in range(100000) %}{% for b in range(100000) %}{{ b }}{% endfor %}{% endfor %}"),
    ("silent_nested_loops", "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                            "{% endfor %}{% endfor %}{% endfor %}"),
    ("string_repeat", "{{ 'x' * 1000000000 }}"),
    ("center_filter", "{{ 'x' | center(1000000000) }}"),
    ("doubling_namespace", "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                           "{% endfor %}{{ ns.s }}"),
    ("power", "{{ 7 ** 99999999 }}"),
    ("power_of_variables", "{% set n = 99999999 %}{{ 7 ** n }}"),
]


@pytest.mark.parametrize("path", [CHAT, TOK])
@pytest.mark.parametrize("bomb", BOMBS, ids=[b[0] for b in BOMBS])
def test_template_bombs_get_a_400_within_the_budget_and_health_stays_fast(trusting, bomb, path):
    _, template = bomb
    lat, stop = [], threading.Event()

    def probe():
        while not stop.is_set():
            t = time.monotonic()
            httpx.get(trusting.url + "/health", timeout=10)
            lat.append(time.monotonic() - t)
            time.sleep(0.01)

    th = threading.Thread(target=probe)
    th.start()
    t0 = time.monotonic()
    try:
        r = post(trusting.url, path, {"messages": USER, "max_tokens": 1, "chat_template": template}, key=None)
    finally:
        stop.set()
        th.join()
    took = time.monotonic() - t0
    assert_answer(r, 400, "messages", ["chat template"])
    assert took < 5, took
    assert lat and max(lat) < 1.0, max(lat)
    assert_still_serving(trusting.url, key=None)


def test_a_trusted_request_template_is_used(trusting):
    r = post(trusting.url, TOK, {"messages": USER, "chat_template": "X{{ messages[0].content }}Y",
                                 "add_special_tokens": False}, key=None)
    want = post(trusting.url, TOK, {"prompt": "XhiY", "add_special_tokens": False}, key=None)
    assert r.status_code == 200 and want.status_code == 200, r.text
    assert r.json()["tokens"] == want.json()["tokens"]


def test_cors_answers_only_the_allowed_origin_and_docs_can_be_off(trusting):
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    ok = httpx.options(trusting.url + C, headers={"Origin": "http://ui.local", **pre})
    assert ok.headers.get("access-control-allow-origin") == "http://ui.local"
    bad = httpx.options(trusting.url + C, headers={"Origin": "http://evil.example", **pre})
    assert "access-control-allow-origin" not in bad.headers
    assert httpx.get(trusting.url + "/docs").status_code == 404
    assert httpx.get(trusting.url + "/openapi.json").status_code == 404


def test_health_answers_fast_while_a_20mb_prompt_is_refused(trusting):
    body = json.dumps({"prompt": "word " * (4 << 20), "max_tokens": 1}).encode()  # 20 MiB of text
    assert len(body) > 20 << 20
    lat, stop = [], threading.Event()
    result = {}

    def send():
        result["r"] = post(trusting.url, C, raw(body), key=None, timeout=120)
        stop.set()

    th = threading.Thread(target=send)
    th.start()
    with httpx.Client() as c:
        while not stop.is_set():
            t = time.monotonic()
            assert c.get(trusting.url + "/health", timeout=10).status_code == 200
            lat.append(time.monotonic() - t)
            time.sleep(0.005)
    th.join()
    assert_answer(result["r"], 400, "prompt", ["too long", "characters"])
    lat.sort()
    # 50 ms is the goal on an idle machine; the median must meet it, the worst gets slack for a shared CI box
    assert lat[len(lat) // 2] < 0.05 and lat[-1] < 0.5, lat[-5:]
    assert_still_serving(trusting.url, key=None)
