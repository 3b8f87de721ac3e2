"""The official ``openai`` client against a live yoco-serve (real engine, bundled tiny model):
completions and chat, streaming and not, stop strings, logprobs, seeds, ``n``, exact usage."""

import httpx
import openai
import pytest

from serve_helpers import API_KEY, FRONTENDS, each_frontend

srv = pytest.fixture(scope="session", params=FRONTENDS)(each_frontend)


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def tokenize(srv, text, add_special_tokens=True):
    r = httpx.post(srv.url + "/tokenize", json={"prompt": text, "add_special_tokens": add_special_tokens})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_models_lists_served_names_with_context_length(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == ["yoco-tiny", "tiny-alias"]
    assert models.data[0].model_extra["max_model_len"] == 256


def test_model_cards_do_not_expose_host_paths(srv):
    cards = httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()["data"]
    assert [c["root"] for c in cards] == ["yoco-tiny", "tiny-alias"]
    assert not any("/" in str(v) for c in cards for v in c.values()), cards


def test_completion_usage_is_exact(srv, client):
    prompt = "The quick brown fox jumps over the lazy dog"
    r = client.completions.create(model="yoco-tiny", prompt=prompt, max_tokens=7, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(tokenize(srv, prompt))
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_alias_model_name_is_accepted_and_echoed(client):
    r = client.completions.create(model="tiny-alias", prompt="Hello", max_tokens=2)
    assert r.model == "tiny-alias"


def test_streamed_completion_equals_non_streamed_greedy(client):
    kw = dict(model="yoco-tiny", prompt="Once upon a time", max_tokens=12, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 12
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_completion_non_streaming_and_streaming_agree(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something"}]
    full = client.chat.completions.create(model="yoco-tiny", messages=msgs, max_completion_tokens=10,
                                          temperature=0, extra_body={"ignore_eos": True})
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.usage.completion_tokens == 10
    stream = client.chat.completions.create(model="yoco-tiny", messages=msgs, max_completion_tokens=10,
                                            temperature=0, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_prompt_tokens_match_tokenize_of_the_conversation(srv, client):
    msgs = [{"role": "user", "content": "How many tokens is this?"}]
    r = httpx.post(srv.url + "/tokenize", json={"messages": msgs})
    assert r.status_code == 200
    out = client.chat.completions.create(model="yoco-tiny", messages=msgs, max_tokens=1)
    assert out.usage.prompt_tokens == r.json()["count"]


def test_continuous_usage_stats_count_up_to_the_final_usage(client):
    chunks = list(client.completions.create(
        model="yoco-tiny", prompt="Count with me", max_tokens=5, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 5
    assert chunks[-1].usage.completion_tokens == 5


def test_stop_string_truncates_and_is_reported(client):
    kw = dict(model="yoco-tiny", prompt="Tell me a story", max_tokens=40, temperature=0,
              extra_body={"ignore_eos": True})
    ref = client.completions.create(**kw).choices[0].text
    stop = next(ref[i:i + 2] for i in range(4, len(ref) - 2) if ref[i:i + 2].strip() == ref[i:i + 2]
                and ref.find(ref[i:i + 2]) == i)
    cut = ref.find(stop)
    r = client.completions.create(stop=[stop], **kw)
    assert r.choices[0].text == ref[:cut]
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop
    kept = client.completions.create(stop=stop, extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
                                     **{k: v for k, v in kw.items() if k != "extra_body"})
    assert kept.choices[0].text == ref[:cut + len(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **kw)
                       if c.choices)
    assert streamed == ref[:cut]


def test_completion_logprobs_have_top_k_plus_sampled(client):
    r = client.completions.create(model="yoco-tiny", prompt="Hello world", max_tokens=4, logprobs=3,
                                  temperature=0, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, tlp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tlp <= 0 and 3 <= len(top) <= 4
        assert tok in top and top[tok] == pytest.approx(tlp)
        # greedy: the sampled token is the most likely one
        assert tlp == pytest.approx(max(top.values()))
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_chat_logprobs_in_chat_form(client):
    r = client.chat.completions.create(model="yoco-tiny", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=3, logprobs=True, top_logprobs=2, temperature=0,
                                       extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert "".join(c.token for c in content) == r.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 2
        assert c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob
        assert c.logprob == pytest.approx(c.top_logprobs[0].logprob)  # greedy
        assert bytes(c.bytes) == c.token.encode()
    stream = client.chat.completions.create(model="yoco-tiny", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=3, logprobs=True, top_logprobs=2, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    streamed = [c for ch in stream if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content]


def test_prompt_logprobs_succeed_with_fast_prefill_on(client):
    r = client.completions.create(model="yoco-tiny", prompt="Exact prompt logprobs", max_tokens=1,
                                  extra_body={"prompt_logprobs": 1})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == r.usage.prompt_tokens
    assert all(isinstance(p, dict) and 1 <= len(p) <= 2 for p in plp[1:])


def test_seed_makes_sampling_reproducible(client):
    kw = dict(model="yoco-tiny", prompt="Random words:", max_tokens=16, temperature=1.0,
              extra_body={"ignore_eos": True})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    c = client.completions.create(seed=4321, **kw).choices[0].text
    assert a == b
    assert a != c


def test_n_returns_n_choices_and_sums_usage(client):
    r = client.completions.create(model="yoco-tiny", prompt="Three ways:", max_tokens=5, n=3, seed=7,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 15
    assert len({c.text for c in r.choices}) > 1
    chat = client.chat.completions.create(model="yoco-tiny", messages=[{"role": "user", "content": "x"}],
                                          max_tokens=4, n=2, stream=True, stream_options={"include_usage": True},
                                          extra_body={"ignore_eos": True})
    chunks = list(chat)
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}
    assert chunks[-1].usage.completion_tokens == 8


def test_batch_of_prompts_and_token_id_prompts(srv, client):
    ids = tokenize(srv, "Token ids work too")
    r = client.completions.create(model="yoco-tiny", prompt=["First prompt", "Second one"], max_tokens=3, n=2,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 12
    t = client.completions.create(model="yoco-tiny", prompt=ids, max_tokens=2, extra_body={"ignore_eos": True})
    assert t.usage.prompt_tokens == len(ids)


def test_repeated_prompt_reports_cached_tokens(client):
    prompt = "A long shared system prompt that is reused across many requests " * 4
    first = client.completions.create(model="yoco-tiny", prompt=prompt + "one", max_tokens=1)
    second = client.completions.create(model="yoco-tiny", prompt=prompt + "two", max_tokens=1)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens > 32
    assert 16 <= cached < second.usage.prompt_tokens
    assert cached % 16 == 0  # sub-block grain of the bundled model on CPU


def test_request_id_header_is_echoed(srv):
    r = httpx.post(srv.url + "/v1/completions", headers={**srv.headers(), "X-Request-Id": "my-req-42"},
                   json={"prompt": "hi", "max_tokens": 1})
    assert r.status_code == 200 and r.headers["x-request-id"] == "my-req-42"
    assert httpx.get(srv.url + "/health").headers.get("x-request-id")


def test_tokenize_detokenize_round_trip_and_version(srv):
    r = httpx.post(srv.url + "/tokenize", json={"prompt": "Round trip", "return_token_strs": True}).json()
    assert r["count"] == len(r["tokens"]) == len(r["token_strs"]) and r["max_model_len"] == 256
    d = httpx.post(srv.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert d["prompt"].endswith("Round trip")
    import yoco_rs
    assert httpx.get(srv.url + "/version").json() == {"version": yoco_rs.__version__}


def test_load_generator_request_shape_is_accepted(srv):
    """What GuideLLM 0.8 sends: ignore_eos, stop: null, max_completion_tokens, continuous usage."""
    body = {"model": "yoco-tiny", "messages": [{"role": "user", "content": "bench"}], "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "ignore_eos": True,
            "stop": None, "max_completion_tokens": 6, "top_k": 5, "min_p": 0.0, "repetition_penalty": 1.1,
            "min_tokens": 2}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, headers=srv.headers(), timeout=60) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    import json
    last = json.loads(lines[-2][6:])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6


def test_echo_prepends_the_prompt_and_its_logprobs(srv, client):
    prompt = "Echo this prompt"
    n_prompt = len(tokenize(srv, prompt))
    r = client.completions.create(model="yoco-tiny", prompt=prompt, max_tokens=3, echo=True, logprobs=1,
                                  temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(model="yoco-tiny", prompt=prompt, max_tokens=3, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert r.choices[0].text == prompt + plain.choices[0].text
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == n_prompt + 3
    assert lp.token_logprobs[0] is None and all(x is not None for x in lp.token_logprobs[1:])
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="yoco-tiny", prompt=prompt, max_tokens=3, echo=True, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) if c.choices)
    assert streamed == r.choices[0].text


def test_model_card_lookup_and_ping(srv, client):
    assert client.models.retrieve("tiny-alias").id == "tiny-alias"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    assert httpx.get(srv.url + "/ping").status_code == 200
