"""``yoco-serve --frontend rust``: the Rust front end and step loop (``crates/yoco-server``) driving the real
PyTorch executor of the bundled model. Black-box HTTP against a real subprocess; the reference is the
Python ``Engine`` on the same checkpoint (greedy, token-identical text)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from serve_helpers import CliServer, shared_server
from yoco_rs import Engine, SamplingParams
from yoco_rs.serve.rust_frontend import async_scheduling_on

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "1, 2, 3, 4,"]
# --chat-template is a template text here (chat itself is checked in test_serve_rust_chat.py).
# --async-scheduling: off by default on the CPU (its forward runs inside launch), forced here so every
# greedy comparison runs the real executor on placeholder tokens.
FLAGS = ("--frontend", "rust", "--async-scheduling", "--max-model-len", "256", "--max-num-seqs", "8", "--seed", "0",
         "--chat-template", "X{{ messages[0]['content'] }}Y")


@pytest.fixture(scope="module")
def server():
    s = CliServer(*FLAGS)
    yield s
    s.kill()


@pytest.fixture(scope="module")
def reference():
    eng = Engine(max_model_len=256, max_num_seqs=8, seed=0)
    outs = eng.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    eng.close()
    return [o.outputs[0].text for o in outs]


def test_rust_frontend_greedy_text_equals_the_python_engine(server, reference):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPTS, "max_tokens": 24, "temperature": 0,
                                                         "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["text"] for c in body["choices"]] == reference
    assert body["usage"]["completion_tokens"] == 24 * len(PROMPTS)


def test_rust_frontend_schedules_async_when_asked(server):
    # Every greedy comparison in this file then runs with decodes planned on placeholder tokens.
    assert "async scheduling" in server.log


def test_rust_frontend_schedules_synchronously_on_the_cpu_by_default():
    # The CPU forward runs inside launch: a step planned ahead would hold each token back one forward.
    s = shared_server("rust")
    assert "synchronous scheduling" in s.log, s.log
    assert async_scheduling_on(None, torch.device("cpu")) is False
    assert async_scheduling_on(None, torch.device("cuda")) is True
    assert async_scheduling_on(True, torch.device("cpu")) is True
    assert async_scheduling_on(False, torch.device("cuda")) is False


def test_rust_frontend_stop_string_text_is_the_reference_cut_at_the_match(server, reference):
    # Async scheduling finds the match one step late (the extra token is computed, not emitted).
    ref = reference[1]
    stop = ref[len(ref) // 2:len(ref) // 2 + 3]
    r = httpx.post(server.url + "/v1/completions", timeout=120,
                   json={"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                         "stop": [stop]})
    c = r.json()["choices"][0]
    assert c["text"] == ref[:ref.find(stop)]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == stop


def test_rust_frontend_without_async_scheduling_gives_the_same_text(server, reference):
    s = CliServer(*FLAGS, "--no-async-scheduling")
    try:
        assert "synchronous scheduling" in s.log
        body = {"prompt": PROMPTS, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=120)
        assert [c["text"] for c in r.json()["choices"]] == reference
        body = {"prompt": PROMPTS[2], "max_tokens": 16, "temperature": 0.8, "seed": 7, "stop": [" 7"]}
        a = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
        b = httpx.post(s.url + "/v1/completions", json=body, timeout=120).json()
        assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
        # A shared prefix longer than the model's sliding window (64) is cached the same way.
        first = list(range(500, 700))
        cached = []
        for srv in (server, s):
            for prompt in (first, first[:160] + list(range(900, 920))):
                r = httpx.post(srv.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=120)
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached[0] == cached[1] and cached[0] >= 144, cached
    finally:
        s.kill()


def test_the_python_frontend_is_gone_with_a_clear_usage_error():
    with pytest.raises(RuntimeError, match="invalid choice: 'python'"):
        CliServer("--frontend", "python", timeout=60)


def test_rust_frontend_stream_concatenates_to_the_same_text(server, reference):
    chunks, done = [], False
    with httpx.stream("POST", server.url + "/v1/completions", timeout=120,
                      json={"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                            "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunks.append(json.loads(line[6:]))
    assert done
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == reference[1]
    assert chunks[-1]["usage"]["completion_tokens"] == 24


def test_rust_frontend_seeded_sampling_is_reproducible(server):
    body = {"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 1.0, "seed": 1234}
    a = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
    b = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_rust_frontend_refuses_what_it_does_not_serve_yet_by_name(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "logit_bias": {"5": 1.0}}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    # Tools are served (tests/test_tools_serve.py); without --enable-auto-tool-choice, tools without
    # tool_choice mean "auto", which is refused naming tool_choice, as the Python server does.
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                              "tools": [{"type": "function", "function": {"name": "f"}}]},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in r.json()["error"]["message"]
    # Transcriptions are served (tests/test_mm_serve.py): JSON is a 415, multipart on a text-only
    # model a 400 naming model, as the Python server answers them.
    r = httpx.post(server.url + "/v1/audio/transcriptions", json={}, timeout=30)
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF")}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    m = httpx.get(server.url + "/metrics", timeout=30).text
    assert "yoco:num_requests_running" in m and "yoco:engine_step_period_seconds_bucket" in m


def test_rust_frontend_takes_the_tool_flags_and_refuses_auto_without_a_parser_at_start():
    # The tool flags reach the Rust server (tests/test_tools_serve.py serves with them); the
    # flag check is the same as the Python server's.
    with pytest.raises(RuntimeError, match="--enable-auto-tool-choice needs --tool-call-parser"):
        CliServer("--frontend", "rust", "--enable-auto-tool-choice", timeout=60)


def test_the_chat_template_flag_is_the_template_and_request_templates_need_trust(server):
    r = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    want = httpx.post(server.url + "/tokenize", json={"prompt": "XhiY", "add_special_tokens": False}, timeout=30)
    assert r.status_code == 200 and r.json()["tokens"] == want.json()["tokens"]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 'x' }}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"


def test_data_parallel_loops_give_the_same_text_and_keep_a_prefix_on_one_loop(reference):
    s = CliServer(*FLAGS, "--data-parallel-size", "2")
    try:
        assert "2 step loops" in s.log
        prefix = list(range(300, 364))  # four 16-token blocks
        cached = []
        for q in range(3):
            r = httpx.post(s.url + "/v1/completions", timeout=120,
                           json={"prompt": prefix + [1000 + q], "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached[0] == 0 and cached[1] > 0 and cached[2] > 0, cached  # the same loop's cache each time
        r = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPTS, "max_tokens": 24, "temperature": 0,
                                                        "ignore_eos": True}, timeout=120)
        assert [c["text"] for c in r.json()["choices"]] == reference
        m = httpx.get(s.url + "/metrics", timeout=30).text
        assert 'engine="0"' in m and 'engine="1"' in m
    finally:
        s.kill()
