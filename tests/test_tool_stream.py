"""Streamed tool calls (``serve/tool_stream.py``) alone: whatever the chunking of the reply, a call's first
delta names it (``id``, ``type``, ``function.name``), the later ones carry argument fragments that
concatenate to the same JSON the non-streamed parse gives, and text that is not a call is content."""

from __future__ import annotations

import json
import random

import pytest

from yoco_rs.serve.tool_stream import ToolCallStream
from yoco_rs.serve.tools import ToolPlan, parse_tool_calls

FNS = [{"name": "get_weather", "parameters": {"type": "object"}}, {"name": "get_time"}]


def _chunks(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8])
        out.append(text[i:i + n])
        i += n
    return out


def _stream(plan: ToolPlan, chunks: list[str]):
    """(content, calls as [(id, name, arguments)], the deltas in order, number of deltas that carried calls)."""
    ts = ToolCallStream(plan)
    content, deltas = "", []
    for c in chunks:
        text, tcs = ts.feed(c)
        content += text
        deltas.extend(tcs)
    text, tcs = ts.end()
    content += text
    deltas.extend(tcs)
    calls: dict[int, dict] = {}
    for d in deltas:
        if d["index"] not in calls:
            # The first delta of a call carries its id, type and name.
            assert d["id"].startswith("call_") and d["type"] == "function" and d["function"]["name"], d
            calls[d["index"]] = {"id": d["id"], "name": d["function"]["name"], "arguments": ""}
        else:
            assert "id" not in d and "name" not in d["function"], d
        calls[d["index"]]["arguments"] += d["function"].get("arguments", "")
    assert sorted(calls) == list(range(len(calls)))
    return content, [calls[i] for i in sorted(calls)], deltas


CASES = [
    (ToolPlan("required", FNS),
     '[{"name": "get_weather", "parameters": {"city": "Pa\\"ris, [x]", "unit": "c"}}, '
     '{"name":"get_time","parameters":{}}]'),
    (ToolPlan("required", FNS), '[{"name":"get_weather","parameters":{"n":[1,2,{"a":"}"}],"b":null}}]'),
    (ToolPlan("named", FNS, name="get_weather"), '{"city": "Paris", "unit": "f"}'),
    (ToolPlan("auto", FNS, parser="pythonic"), '[get_weather(city="Par, (is)", unit=\'c\'), get_time()]'),
    (ToolPlan("auto", FNS, parser="pythonic"), '[get_weather(city="Oslo", days=[1, 2], opts={"a": None})]'),
    (ToolPlan("auto", FNS, parser="json"),
     'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'),
]


@pytest.mark.parametrize("plan,text", CASES)
def test_streamed_calls_concatenate_to_the_non_streamed_calls_under_any_chunking(plan, text):
    want_content, want_calls = parse_tool_calls(text, plan)
    assert want_calls
    for seed in range(25):
        content, calls, deltas = _stream(plan, _chunks(text, random.Random(seed)))
        assert [c["name"] for c in calls] == [c["function"]["name"] for c in want_calls]
        assert [json.loads(c["arguments"]) for c in calls] == \
               [json.loads(c["function"]["arguments"]) for c in want_calls]
        assert content.strip() == (want_content or "")


def test_required_calls_arrive_incrementally_name_first_then_argument_fragments():
    text = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}]'
    plan = ToolPlan("required", FNS)
    ts = ToolCallStream(plan)
    seen = []
    for k in range(len(text)):
        _, tcs = ts.feed(text[k])
        seen.extend((k, d) for d in tcs)
    first_k, first = seen[0]
    assert first["function"]["name"] == "get_weather"
    assert text[:first_k + 1].endswith('"get_weather"')  # sent as soon as the name was complete
    frags = [d["function"]["arguments"] for _, d in seen if d["function"].get("arguments")]
    assert len(frags) > 5  # the arguments streamed, not sent whole at the end
    assert "".join(frags) == '{"city": "Paris", "unit": "c"}'


def test_pythonic_arguments_stream_one_keyword_at_a_time():
    text = '[get_weather(city="Paris", unit="c")]'
    ts = ToolCallStream(ToolPlan("auto", FNS, parser="pythonic"))
    frags = []
    for ch in text:
        for d in ts.feed(ch)[1]:
            frags.append(d["function"].get("arguments", ""))
    assert [f for f in frags if f] == ['{"city": "Paris"', ', "unit": "c"}']


def test_auto_text_that_is_not_a_call_streams_as_content():
    for parser, text in (("pythonic", "It is sunny, [really]."), ("json", "No <tool_ call here>, see <b>.")):
        content, calls, _ = _stream(ToolPlan("auto", FNS, parser=parser), _chunks(text, random.Random(0)))
        assert calls == [] and content == text
    # A pythonic-looking list that is not a call list is held, then sent as content at the end.
    content, calls, _ = _stream(ToolPlan("auto", FNS, parser="pythonic"), ["[1, ", "2]"])
    assert calls == [] and content == "[1, 2]"


def test_named_call_sends_nothing_for_an_empty_reply():
    ts = ToolCallStream(ToolPlan("named", FNS, name="get_time"))
    assert ts.feed("") == ("", [])
    assert ts.end() == ("", [])
