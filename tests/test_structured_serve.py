"""Structured outputs over HTTP with the official ``openai`` client: ``beta.chat.completions.parse``
with a Pydantic model, ``response_format`` json_object / json_schema, vLLM's ``structured_outputs``
object and the older ``guided_*`` fields; bad constraints are 400s naming the problem; a hostile schema
is answered within the budget while another request keeps streaming. Both front ends."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from structured_server import PARAMS, structured_fixture

srv = pytest.fixture(scope="module", params=PARAMS)(structured_fixture)
MODEL = "yoco-tiny"
USER = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user"]
    active: bool


def test_beta_parse_with_a_pydantic_model_returns_a_parsed_instance(client):
    r = client.beta.chat.completions.parse(model=MODEL, messages=USER, response_format=Person, max_tokens=80,
                                           temperature=0.0)
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    assert isinstance(c.message.parsed, Person)
    assert c.message.parsed == Person.model_validate_json(c.message.content)


def test_response_format_json_object_gives_a_json_object(client):
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=USER, response_format={"type": "json_object"},
                                           max_tokens=120, temperature=1.0, seed=seed)
        c = r.choices[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)


def test_response_format_json_schema_streamed_validates(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                                "maximum": 99}},
              "required": ["ok", "n"], "additionalProperties": False}
    stream = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=60, temperature=1.0, seed=3, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}})
    text, reason = "", None
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.delta.content or ""
            reason = ch.finish_reason or reason
    assert reason == "stop"
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("extra,check", [
    ({"structured_outputs": {"regex": r"[a-z]{2,5}-[0-9]{2}"}}, lambda t: re.fullmatch(r"[a-z]{2,5}-[0-9]{2}", t)),
    ({"guided_regex": r"(red|green|blue)!"}, lambda t: t in ("red!", "green!", "blue!")),
    ({"structured_outputs": {"choice": ["north", "south"]}}, lambda t: t in ("north", "south")),
    ({"guided_choice": ["up", "down"]}, lambda t: t in ("up", "down")),
    ({"structured_outputs": {"json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                                      "maxItems": 3}}},
     lambda t: isinstance(json.loads(t), list) and len(json.loads(t)) <= 3),
    ({"guided_json": {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"],
                      "additionalProperties": False}}, lambda t: json.loads(t)["k"] in (1, 2)),
    ({"structured_outputs": {"grammar": 'start: "x" NUM\nNUM: /[0-9]{1,3}/'}}, lambda t: re.fullmatch(r"x[0-9]{1,3}", t)),
    ({"guided_grammar": 'start: "go " DIR\nDIR: "left" | "right"'}, lambda t: t in ("go left", "go right")),
])
def test_structured_outputs_and_guided_spellings_constrain_completions(client, extra, check):
    r = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=60, temperature=1.0, seed=1,
                                  extra_body=extra)
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    assert check(c.text), c.text


def _post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=120)


@pytest.mark.parametrize("body,param,needle", [
    ({"prompt": "x", "structured_outputs": {"json": {"type": "nosuchtype"}}}, None, "nosuchtype"),
    ({"prompt": "x", "guided_json": "{not json"}, None, "not valid JSON"),
    ({"prompt": "x", "guided_regex": "(unclosed"}, None, "regex"),
    ({"prompt": "x", "guided_grammar": "start: undefined_rule"}, None, "undefined_rule"),
    ({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"prompt": "x", "structured_outputs": {"jsn": {}}}, "structured_outputs", "jsn"),
    ({"prompt": "x", "guided_choice": []}, "guided_choice", "choice"),
    ({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one"),
    ({"prompt": "x", "response_format": {"type": "yaml"}}, "response_format", "'yaml'"),
    ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "response_format",
     "schema is required"),
])
def test_bad_constraints_are_400s_naming_the_problem(srv, body, param, needle):
    r = _post(srv, "/v1/completions", {"model": MODEL, "max_tokens": 5, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"], err
    if param is not None:
        assert err["param"] == param, err


def test_hostile_schema_is_answered_within_the_budget_while_another_request_streams(srv):
    done = {}

    def stream():
        t0 = time.monotonic()
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=120,
                          json={"model": MODEL, "prompt": "a", "max_tokens": 40, "ignore_eos": True,
                                "stream": True}) as r:
            done["chunks"] = sum(1 for line in r.iter_lines() if line.startswith("data: {"))
        done["time"] = time.monotonic() - t0

    th = threading.Thread(target=stream)
    th.start()
    hostile = {"enum": [f"value-{i}" for i in range(100_000)]}
    deep = {"type": "integer"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    for schema in (hostile, deep):
        t0 = time.monotonic()
        r = _post(srv, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 3, "guided_json": schema})
        assert time.monotonic() - t0 < 30
        assert r.status_code in (200, 400), r.text
    th.join(timeout=120)
    assert done.get("chunks", 0) >= 40
