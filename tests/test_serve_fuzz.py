"""Property-based fuzzing of request bodies (hypothesis) against a live yoco-serve: random subsets of every
field each endpoint takes (``tests/data/request_fields.json``: the fields of the retired Python server's
request models, which the Rust server's ``body_fields.rs`` checks; add new fields there), with
values drawn from hostile shapes (integer boundaries, NaN, lone surrogates, wrong kinds, nesting).
Whatever comes in: never a 5xx, never a 5xx error event inside a stream, and the server stays healthy.
Bounded for CI: 80 examples per endpoint (500 with ``YOCO_HEAVY=1``; ``YOCO_FUZZ_EXAMPLES`` overrides,
``YOCO_FUZZ_SEED`` picks another reproducible run)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from serve_helpers import API_KEY, FRONTENDS, each_frontend

srv = pytest.fixture(scope="session", params=FRONTENDS)(each_frontend)

from conftest import heavy

EXAMPLES = int(os.environ.get("YOCO_FUZZ_EXAMPLES", "500" if heavy() else "80"))
BOUNDS = [2**63, 2**64, 2**70, -(2**70), -(2**63) - 1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 2**32, 2**53,
          2**31 - 1, 0, 1, -1, 2, 3, 127, 128, 129, 255, 256, 257]
LONE = ["\ud800", "a\udc00b", "\udbff\udbff", "\ud83d"]

leaf = st.one_of(
    st.sampled_from(BOUNDS), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.none(), st.text(max_size=20), st.sampled_from(LONE), st.sampled_from(["", "text", "json_object", "none",
                                                                            "auto", "required", "user"]))
value = st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                  st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                     max_leaves=12)
hostile = st.one_of(st.sampled_from(BOUNDS), st.sampled_from(BOUNDS), value)  # boundaries half the time
small = st.one_of(st.integers(1, 3), hostile)  # generation lengths: mostly cheap, sometimes hostile


FIELDS = json.loads((Path(__file__).parent / "data" / "request_fields.json").read_text())


def bodies(path: str, base: dict, cheap: dict):
    names = FIELDS[path]

    @st.composite
    def body(draw):
        b = dict(base)
        for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
            b[name] = draw(cheap.get(name, hostile))
        if draw(st.booleans()):  # keep most requests cheap when they are valid
            b.setdefault("max_tokens", 2)
        return b

    return body()


PROMPT = st.one_of(st.just("hello"), st.lists(st.integers(0, 3000), min_size=1, max_size=5), value)
MESSAGES = st.one_of(st.just([{"role": "user", "content": "hi"}]),
                     st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                                     "content": value}), max_size=3), value)
CHEAP = {"max_tokens": small, "max_completion_tokens": small, "n": st.one_of(st.integers(1, 3), hostile),
         "prompt": PROMPT, "messages": MESSAGES, "stream": st.booleans()}

ENDPOINTS = {
    "/v1/completions": bodies("/v1/completions", {"prompt": "hi"}, CHEAP),
    "/v1/chat/completions": bodies("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                                   CHEAP),
    "/tokenize": bodies("/tokenize", {"prompt": "hi"}, CHEAP),
    "/detokenize": bodies("/detokenize", {"tokens": [1, 2]},
                          {"tokens": st.one_of(st.lists(st.sampled_from(BOUNDS), max_size=3), value)}),
}


def _check(url: str, path: str, body: dict) -> None:
    data = json.dumps(body, allow_nan=True, ensure_ascii=True).encode()  # surrogates as \\u escapes
    r = httpx.post(url + path, content=data, timeout=60,
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.status_code, r.text[:500])
    if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
        for line in r.text.splitlines():
            if line.startswith("data: {"):
                err = json.loads(line[6:]).get("error")
                assert err is None or err["code"] < 500, (body, err)
    else:
        json.loads(r.text)  # always a JSON body


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_fuzzed_bodies_never_get_a_5xx_and_the_server_stays_alive(srv, path):
    @seed(int(os.environ.get("YOCO_FUZZ_SEED", "13")))  # reproducible; another seed explores elsewhere
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(ENDPOINTS[path])
    def run(body):
        _check(srv.url, path, body)

    run()
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
    assert srv.alive()
    srv.wait_idle()
