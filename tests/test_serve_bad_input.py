"""Every client mistake gets the right 4xx in the OpenAI envelope with a message that names the
problem, and the server answers a valid request right afterwards (one bad request never hurts it)."""

import json

import httpx
import pytest

from serve_helpers import API_KEY, SHARED_LIMIT, FRONTENDS, each_frontend

srv = pytest.fixture(scope="session", params=FRONTENDS)(each_frontend)

C, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def raw(b: bytes):
    return ("raw", b)


# (id, path, body, expected status, expected param (or ...: don't care), substrings of the message)
CASES = [
    ("malformed_json", C, raw(b'{"prompt": "x", '), 400, None, ["not valid JSON", "line 1"]),
    ("json_array_body", C, raw(b"[1, 2]"), 400, None, ["must be a JSON object", "array"]),
    ("empty_body", C, raw(b""), 400, None, ["empty"]),
    ("invalid_utf8", C, raw(b'{"prompt": "\xff\xfe"}'), 400, None, ["not valid UTF-8", "0xff", "offset 12"]),
    ("nested_too_deep", C, raw(b"[" * 100000), 400, None, ["not valid JSON"]),
    ("nan_temperature", C, raw(b'{"prompt": "x", "temperature": NaN}'), 400, "temperature", ["finite"]),
    ("missing_prompt", C, {"max_tokens": 5}, 400, "prompt", ["missing required field 'prompt'"]),
    ("missing_messages", CHAT, {"max_tokens": 5}, 400, "messages", ["missing required field 'messages'"]),
    ("prompt_wrong_type", C, {"prompt": 42}, 400, "prompt", ["prompt must be a string"]),
    ("prompt_mixed_list", C, {"prompt": [1, "a"]}, 400, "prompt", ["prompt must be"]),
    ("max_tokens_string", C, {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens", ["must be an integer", "'ten'"]),
    ("max_tokens_fraction", C, {"prompt": "x", "max_tokens": 5.5}, 400, "max_tokens", ["must be an integer"]),
    ("max_tokens_negative", C, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens", [">= 1", "-1"]),
    ("max_tokens_zero", C, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", [">= 1", "got 0"]),
    ("max_tokens_huge", C, {"prompt": [5, 6, 7], "max_tokens": 10 ** 9}, 400, "max_tokens",
     ["maximum context length is 256 tokens", "1000000000 output tokens", "3 input tokens", "max_tokens <= 253"]),
    ("chat_max_completion_tokens_huge", CHAT, {"messages": USER, "max_completion_tokens": 1000}, 400,
     "max_tokens", ["maximum context length is 256", "1000 output tokens"]),
    ("temperature_negative", C, {"prompt": "x", "temperature": -0.5}, 400, "temperature", [">= 0", "-0.5"]),
    ("temperature_string", C, {"prompt": "x", "temperature": "hot"}, 400, "temperature", ["must be a number"]),
    ("top_p_zero", C, {"prompt": "x", "top_p": 0}, 400, "top_p", ["(0, 1]", "got 0"]),
    ("top_p_above_one", C, {"prompt": "x", "top_p": 1.5}, 400, "top_p", ["(0, 1]", "1.5"]),
    ("top_k_negative", C, {"prompt": "x", "top_k": -5}, 400, "top_k", ["-5"]),
    ("min_p_above_one", C, {"prompt": "x", "min_p": 2}, 400, "min_p", ["[0, 1]"]),
    ("presence_penalty_range", C, {"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty", ["[-2, 2]"]),
    ("frequency_penalty_range", C, {"prompt": "x", "frequency_penalty": -3}, 400, "frequency_penalty", ["[-2, 2]"]),
    ("repetition_penalty_zero", C, {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty", ["> 0"]),
    ("n_zero", C, {"prompt": "x", "n": 0}, 400, "n", [">= 1"]),
    ("n_bool", C, {"prompt": "x", "n": True}, 400, "n", ["must be an integer", "true"]),
    ("seed_string", C, {"prompt": "x", "seed": "abc"}, 400, "seed", ["must be an integer"]),
    ("stream_not_bool", C, {"prompt": "x", "stream": "yes"}, 400, "stream", ["boolean"]),
    ("stop_wrong_type", C, {"prompt": "x", "stop": 5}, 400, "stop", ["stop must be a string"]),
    ("min_tokens_over_max", C, {"prompt": "x", "max_tokens": 2, "min_tokens": 5}, 400, "min_tokens", ["<= max_tokens"]),
    ("logprobs_over_max", C, {"prompt": "x", "logprobs": 21}, 400, "logprobs", ["max_logprobs (20", "21"]),
    ("prompt_logprobs_over_max", C, {"prompt": "x", "prompt_logprobs": 50}, 400, "prompt_logprobs", ["20"]),
    ("chat_top_logprobs_without_logprobs", CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs",
     ["logprobs set to true"]),
    ("chat_top_logprobs_over_max", CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 50}, 400,
     "top_logprobs", ["max_logprobs (20"]),
    ("prompt_too_long", C, {"prompt": [7] * 300, "max_tokens": 1}, 400, "prompt",
     ["maximum context length is 256", "300 input tokens", "1 output tokens", "301 tokens", "at most 255"]),
    ("prompt_fills_context", C, {"prompt": [7] * 256}, 400, "prompt",
     ["maximum context length is 256", "256 input tokens", "at most 255 tokens"]),
    ("chat_conversation_too_long", CHAT, {"messages": [{"role": "user", "content": "word " * 400}]}, 400,
     "messages", ["maximum context length is 256"]),
    ("empty_prompt", C, {"prompt": ""}, 400, "prompt", ["empty"]),
    ("empty_prompt_list", C, {"prompt": []}, 400, "prompt", ["empty"]),
    ("empty_token_list_in_batch", C, {"prompt": [[1, 2], []]}, 400, "prompt", ["prompt[1]", "empty"]),
    ("token_id_outside_vocab", C, {"prompt": [2, 999999]}, 400, "prompt", ["999999", "outside the vocabulary"]),
    ("token_id_negative", C, {"prompt": [[2, -1]]}, 400, "prompt", ["-1", "vocabulary"]),
    ("stop_token_id_outside_vocab", C, {"prompt": "x", "stop_token_ids": [10 ** 7]}, 400, "stop_token_ids",
     ["outside the vocabulary"]),
    ("chat_empty_messages", CHAT, {"messages": []}, 400, "messages", ["at least one"]),
    ("chat_image_part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "messages", ["only text parts", "image_url"]),
    ("chat_roles_must_alternate", CHAT, {"messages": USER + USER}, 400, "messages", ["alternate"]),
    ("chat_message_without_role", CHAT, {"messages": [{"content": "hi"}]}, 400, "messages.0.role",
     ["missing required field 'messages.0.role'"]),
    ("logit_bias_unsupported", C, {"prompt": "x", "logit_bias": {"5": 10}}, 400, "logit_bias", ["not supported"]),
    ("response_format_unknown_type", CHAT, {"messages": USER, "response_format": {"type": "yaml"}}, 400,
     "response_format", ["'yaml'", "json_schema"]),
    ("best_of_unsupported", C, {"prompt": "x", "best_of": 3}, 400, "best_of", ["best_of"]),
    ("stream_options_without_stream", C, {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options", ["only allowed when stream is true"]),
    ("truncate_prompt_tokens_zero", C, {"prompt": "x", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens",
     [">= 1"]),
    ("unknown_model", C, {"model": "gpt-4", "prompt": "x"}, 404, "model", ["`gpt-4` does not exist", "yoco-tiny"]),
    ("unknown_route", "/v1/embeddings", {"input": "x"}, 404, None, ["no route"]),
    ("detokenize_outside_vocab", "/detokenize", {"tokens": [1, 123456789]}, 400, "tokens", ["outside the vocabulary"]),
    ("tokenize_nothing", "/tokenize", {"text": "x"}, 400, "prompt", ["'prompt'", "'messages'"]),
]


def _post(srv, path, body, headers=None):
    h = {"Authorization": f"Bearer {API_KEY}", **(headers or {})}
    if isinstance(body, tuple) and body[0] == "raw":
        h["Content-Type"] = "application/json"
        return httpx.post(srv.url + path, content=body[1], headers=h, timeout=60)
    return httpx.post(srv.url + path, json=body, headers=h, timeout=60)


def assert_envelope(r, status, param=..., needles=()):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and isinstance(err["type"], str) and err["type"]
    if param is not ...:
        assert err["param"] == param, err
    for n in needles:
        assert n in err["message"], (n, err["message"])


def assert_still_serving(srv):
    r = _post(srv, C, {"prompt": "still alive?", "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_a_helpful_4xx(srv, case):
    _, path, body, status, param, needles = case
    assert_envelope(_post(srv, path, body), status, param, needles)
    assert_still_serving(srv)


def test_streaming_bad_request_fails_before_the_stream_starts(srv):
    r = _post(srv, C, {"prompt": "x", "stream": True, "top_p": 0})
    assert_envelope(r, 400, "top_p")
    assert r.headers["content-type"].startswith("application/json")


def test_missing_and_wrong_api_key_get_401_but_probes_stay_open(srv):
    r = httpx.post(srv.url + C, json={"prompt": "x"})
    assert_envelope(r, 401, None, ["Missing API key"])
    r = httpx.post(srv.url + C, json={"prompt": "x"}, headers={"Authorization": "Bearer nope"})
    assert_envelope(r, 401, None, ["Invalid API key"])
    assert httpx.get(srv.url + "/v1/models").status_code == 401
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.get(srv.url + "/metrics").status_code == 200
    assert_still_serving(srv)


def test_oversized_body_gets_413_by_content_length(srv):
    body = json.dumps({"prompt": "x" * (SHARED_LIMIT + 10)}).encode()
    r = _post(srv, C, raw(body))
    assert_envelope(r, 413, None, ["too large", f"limit is {SHARED_LIMIT} bytes"])
    assert_still_serving(srv)


def test_oversized_chunked_body_gets_413_while_reading(srv):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(SHARED_LIMIT // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    r = httpx.post(srv.url + C, content=chunks(), timeout=60,
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert_envelope(r, 413, None, ["too large"])
    assert_still_serving(srv)


def test_wrong_method_gets_405_in_the_envelope(srv):
    r = httpx.get(srv.url + C, headers={"Authorization": f"Bearer {API_KEY}"})
    assert_envelope(r, 405, None, ["not allowed"])


def test_bad_input_never_hurts_the_engine(srv):
    for case in CASES[:10]:
        _post(srv, case[1], case[2])
    assert httpx.get(srv.url + "/health").status_code == 200
    assert srv.alive()
    assert_still_serving(srv)
