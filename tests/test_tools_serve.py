"""Tool calling over HTTP with the official ``openai`` client: ``tool_choice`` required / named (enforced
by a grammar over the tools' parameter schemas), auto (the pythonic parser), none; ``tool_calls`` in
responses and in streamed deltas, ``finish_reason: "tool_calls"``, and a round trip with the tool's
result in the conversation; the flags auto needs; the Gemma 3n tool template alone. The server is
``crates/yoco-server`` (tools.rs, tool_parse.rs, tool_stream.rs; its parsers' unit cases are in
``crates/yoco-server/tests/suite/tool_parsers.rs``)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from serve_helpers import API_KEY, shared_server
from structured_server import PARAMS, structured_fixture
from yoco_rs.serve.rust_frontend import tool_template
from yoco_rs.tokenizer import Tokenizer

srv = pytest.fixture(scope="module", params=PARAMS)(structured_fixture)
MODEL = "yoco-tiny"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)


def _check_calls(calls):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def _stream_calls(stream):
    calls, content, reason = {}, "", None
    for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                cur = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                cur["name"] += tc.function.name or ""
                cur["arguments"] += tc.function.arguments or ""
            reason = ch.finish_reason or reason
    return [calls[i] for i in sorted(calls)], content, reason


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_tool_choice_returns_valid_tool_calls(client, temperature):
    # parallel_tool_calls=False bounds the call list (a greedy small model may otherwise repeat calls
    # until max_tokens); the parallel form is test_streamed_tool_calls_arrive_as_deltas's.
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="required",
                                       max_tokens=150, temperature=temperature, seed=4, parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content is None
    assert len(c.message.tool_calls) == 1
    _check_calls(c.message.tool_calls)


def test_named_tool_choice_calls_that_function(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=60, temperature=1.0,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    c = r.choices[0]
    assert c.finish_reason == "stop"  # as OpenAI answers a forced function
    assert [t.function.name for t in c.message.tool_calls] == ["get_time"]
    _check_calls(c.message.tool_calls)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_calls_arrive_as_deltas(client, choice):
    stream = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice=choice,
                                            max_tokens=150, temperature=1.0, seed=2, stream=True)
    calls, content, reason = _stream_calls(stream)
    assert content == ""
    assert reason == ("tool_calls" if choice == "required" else "stop")
    assert calls and all(c["id"].startswith("call_") for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def _stream_deltas(stream):
    """Every tool-call delta of a stream, in order, as ``(index, id, type, name, arguments)``."""
    out = []
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                out.append((tc.index, tc.id, tc.type, tc.function.name if tc.function else None,
                            tc.function.arguments if tc.function else None))
    return out


@pytest.mark.parametrize("choice,extra", [
    ("required", {"parallel_tool_calls": False}),
    ({"type": "function", "function": {"name": "get_weather"}}, {}),
    ("auto", {"extra_body": {"structured_outputs": {
        "regex": r'\[get_weather\(city="[A-Z][a-z]{2,6}", unit="[cf]"\), get_time\(zone="utc"\)\]'}}}),
])
def test_streamed_tool_calls_arrive_incrementally_and_equal_the_non_streamed_ones(client, choice, extra):
    kw = dict(model=MODEL, messages=USER, tools=TOOLS, tool_choice=choice, max_tokens=150, temperature=0.0, **extra)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    deltas = _stream_deltas(client.chat.completions.create(stream=True, **kw))
    assert whole
    calls = {}
    for idx, cid, typ, name, args in deltas:
        if idx not in calls:  # a call's first delta: id, type and name
            assert cid.startswith("call_") and typ == "function" and name, (idx, cid, typ, name)
            calls[idx] = {"name": name, "arguments": args or "", "deltas": 1}
        else:  # then argument fragments only
            assert cid is None and not name
            calls[idx]["arguments"] += args or ""
            calls[idx]["deltas"] += 1
    assert [calls[i]["name"] for i in sorted(calls)] == [t.function.name for t in whole]
    assert [json.loads(calls[i]["arguments"]) for i in sorted(calls)] == \
           [json.loads(t.function.arguments) for t in whole]
    # Incremental: the arguments came in several deltas, not whole in the last one.
    assert all(c["deltas"] >= 2 for c in calls.values()), calls


# auto: the model decides. A random-weight model never writes a call by itself, so these requests pin
# the reply to the pythonic call format with a regex: what is tested is the parser path.
PYTHONIC = {"structured_outputs": {"regex": r'\[get_weather\(city="[A-Z][a-z]{2,6}", unit="[cf]"\)\]'}}


def test_auto_tool_choice_parses_a_pythonic_call(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="auto",
                                       max_tokens=60, temperature=1.0, seed=1, extra_body=PYTHONIC)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    _check_calls(c.message.tool_calls)
    stream = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=60,
                                            temperature=1.0, seed=1, extra_body=PYTHONIC, stream=True)
    calls, content, reason = _stream_calls(stream)
    assert reason == "tool_calls" and content == ""
    assert [(x["name"], json.loads(x["arguments"])) for x in calls] == \
           [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls]


def test_auto_reply_that_is_not_a_call_is_content(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=30, temperature=1.0,
                                       extra_body={"structured_outputs": {"choice": ["It is sunny."]}})
    c = r.choices[0]
    assert c.message.content == "It is sunny." and not c.message.tool_calls and c.finish_reason == "stop"


def test_tool_choice_none_gives_plain_content(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="none", max_tokens=5,
                                       temperature=0.0)
    c = r.choices[0]
    assert not c.message.tool_calls and c.message.content is not None


def test_round_trip_with_the_tool_result_in_the_conversation(client):
    first = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="required",
                                           max_tokens=150, temperature=0.0, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    convo = USER + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21})},
    ]
    r = client.chat.completions.create(model=MODEL, messages=convo, tools=TOOLS, tool_choice="none", max_tokens=5,
                                       temperature=0.0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > first.usage.prompt_tokens


def test_tool_request_errors_are_400s(srv):
    def post(body):
        return httpx.post(srv.url + "/v1/chat/completions", json={"model": MODEL, "messages": USER, **body},
                          timeout=60)
    cases = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0]"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "only one"),
    ]
    for body, needle in cases:
        r = post(body)
        assert r.status_code == 400, (body, r.text)
        assert needle in r.json()["error"]["message"], r.text


def test_auto_needs_the_server_flags_and_is_what_tools_without_tool_choice_mean():
    # The shared server runs without --enable-auto-tool-choice (and a 256-token context: one small tool).
    plain = shared_server()
    auth = {"Authorization": f"Bearer {API_KEY}"}

    def post(**kw):
        return httpx.post(plain.url + "/v1/chat/completions", headers=auth, timeout=120,
                          json={"model": MODEL, "messages": USER, "max_tokens": 2, "tools": TOOLS[1:], **kw})

    for kw in ({"tool_choice": "auto"}, {}):  # never silently ignored (vLLM: 400)
        r = post(**kw)
        assert r.status_code == 400 and "--enable-auto-tool-choice" in r.json()["error"]["message"], r.text
    r = post(tool_choice="none")
    assert r.status_code == 200 and not r.json()["choices"][0]["message"].get("tool_calls"), r.text


def test_tool_template_renders_tools_calls_and_results():
    from yoco_rs import bundled

    tok = Tokenizer(str(bundled._SRC))
    msgs = [{"role": "system", "content": "Be brief."}, *USER,
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": {"city": "Paris", "unit": "c"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'}]
    text = tok.apply_chat_template(msgs, chat_template=tool_template(), tools=TOOLS, add_generation_prompt=True)
    assert '"name": "get_weather"' in text and "Be brief." in text
    assert '[get_weather(city="Paris", unit="c")]<end_of_turn>' in text
    assert '<start_of_turn>user\n<tool_response>\n{"temp": 21}\n</tool_response><end_of_turn>' in text
    assert text.endswith("<start_of_turn>model\n")
