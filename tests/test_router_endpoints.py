"""What prefix-aware routers ask a replica before routing: vLLM's render endpoints (template applied,
``token_ids`` returned), consistent with ``/tokenize`` and with the ids generation actually runs."""

from __future__ import annotations

import httpx
import pytest

from serve_helpers import FRONTENDS, each_frontend

srv = pytest.fixture(scope="session", params=FRONTENDS)(each_frontend)

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}]


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, headers=srv.headers(), timeout=60)


def test_chat_render_returns_the_templated_ids_tokenize_returns(srv):
    r = post(srv, "/v1/chat/completions/render", {"model": "yoco-tiny", "messages": MESSAGES, "max_tokens": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    tok = post(srv, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert body["token_ids"] == tok and len(tok) > 5
    assert body["model"] == "yoco-tiny" and body["request_id"].startswith("chatcmpl-")
    assert body["sampling_params"]["max_tokens"] == 5 and body["stream"] is False


def test_chat_render_ids_are_what_generation_runs(srv):
    ids = post(srv, "/v1/chat/completions/render", {"model": "yoco-tiny", "messages": MESSAGES}).json()["token_ids"]
    out = post(srv, "/v1/chat/completions", {"model": "yoco-tiny", "messages": MESSAGES, "max_tokens": 1}).json()
    assert out["usage"]["prompt_tokens"] == len(ids)


def test_completions_render_answers_one_request_per_prompt(srv):
    prompts = ["The cat sat", "on the mat"]
    r = post(srv, "/v1/completions/render", {"model": "yoco-tiny", "prompt": prompts, "max_tokens": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list) and len(body) == 2
    for item, p in zip(body, prompts):
        assert item["token_ids"] == post(srv, "/tokenize", {"prompt": p}).json()["tokens"]
    ids = [5, 6, 7]
    assert post(srv, "/v1/completions/render", {"model": "yoco-tiny", "prompt": ids}).json()[0]["token_ids"] == ids


def test_render_rejects_what_generation_rejects_with_a_400(srv):
    r = post(srv, "/v1/completions/render", {"model": "yoco-tiny", "prompt": "x " * 400, "max_tokens": 4})
    assert r.status_code == 400 and ("max_model_len" in r.text or "context" in r.text), r.text
    r = post(srv, "/v1/chat/completions/render", {"model": "yoco-tiny"})
    assert r.status_code == 400 and "messages" in r.text
    r = post(srv, "/v1/completions/render", {"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    assert httpx.post(srv.url + "/v1/completions/render", json={"prompt": "x"}).status_code == 401, "auth as /v1/*"
