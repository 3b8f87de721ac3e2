"""Too many grammar compilations at once is a transient overload, not a server error: over HTTP it is a
503 in the OpenAI error envelope with ``Retry-After``, and the same request succeeds once the slot is
free. A server with ``max_in_flight: 1`` keeps one slot busy with a huge enum (its compilation takes a
good fraction of a second before llguidance refuses it) while small constrained requests arrive. Both
front ends."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from serve_helpers import FRONTENDS, RustServer

MODEL = "yoco-tiny"
ENGINE = dict(max_model_len=512, kv_cache_memory=64 << 20, max_num_seqs=8, seed=0,
              structured_outputs_config={"max_in_flight": 1, "time_budget_ms": 30_000})


@pytest.fixture(scope="module", params=FRONTENDS)
def srv(request):
    s = RustServer("--max-model-len", "512", "--kv-cache-memory", str(ENGINE["kv_cache_memory"]),
                   "--max-num-seqs", "8", "--seed", "0",
                   "--structured-outputs-config", json.dumps(ENGINE["structured_outputs_config"]),
                   api_key=None)
    yield s
    s.stop()


def _small(i: int) -> dict:
    return {"model": MODEL, "prompt": "x", "max_tokens": 2,
            "guided_json": {"type": "object", "properties": {f"k{i}": {"type": "integer"}}}}


def test_too_many_compiles_at_once_is_a_503_with_retry_after_then_the_retry_succeeds(srv):
    big = {"model": MODEL, "prompt": "x", "max_tokens": 2,
           "guided_json": {"enum": [f"value-{i}" for i in range(100_000)]}}
    done = {}
    # Build the compiler (its token trie) first: otherwise the big and the first small request wait
    # for it together and the small one may take the only slot, leaving the big one the 503.
    warm = httpx.post(srv.url + "/v1/completions", json=_small(0), timeout=120)
    assert warm.status_code == 200, warm.text

    def hold_the_slot():
        # A small request can still hold the slot at the moment the big one arrives: retry on 503
        # so that the big one ends up compiling (and holding the slot) rather than refused.
        for _ in range(50):
            done["big"] = httpx.post(srv.url + "/v1/completions", json=big, timeout=120)
            if done["big"].status_code != 503:
                return

    th = threading.Thread(target=hold_the_slot)
    th.start()
    busy = None
    i = 0
    with httpx.Client(timeout=60) as c:
        while th.is_alive() and busy is None:
            i += 1
            r = c.post(srv.url + "/v1/completions", json=_small(i))
            if r.status_code == 503:
                busy = r
            else:
                assert r.status_code == 200, r.text
    th.join(timeout=120)
    assert busy is not None, "no request met the busy compiler"
    assert busy.headers["retry-after"] == "1"
    err = busy.json()["error"]
    assert err["code"] == 503 and err["type"] == "ServiceUnavailableError"
    assert "too many grammars are compiling at once" in err["message"]
    assert done["big"].status_code in (200, 400), done["big"].text  # refused or compiled, never a 500
    # The slot is free again: the same request now goes through, also for the openai client.
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    body = _small(i)
    out = client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                    extra_body={"guided_json": body["guided_json"]})
    assert out.choices[0].finish_reason in ("stop", "length")
    # The server is healthy, nothing was counted as an internal error.
    assert httpx.get(srv.url + "/health").status_code == 200
