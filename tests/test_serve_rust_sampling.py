"""Logprobs, penalties and structured outputs through the Rust front end (``yoco-serve --frontend rust``) on a
random tiny model: the Rust step loop drives ``StepExecutor`` over the executor seam (logprob arrays out,
grammar masks in). References: the Python ``Engine`` on the same checkpoint, its outputs formatted by
``tests/logprobs_reference.py`` (the retired Python server's formatting, OpenAI's and vLLM's shapes), and
``jsonschema``.

One server for the module, with a 24-block KV pool so that concurrent requests are preempted (the
penalty counts and random streams must be restored from the resumed outputs)."""

from __future__ import annotations

import json
import math
import re
import threading

import httpx
import jsonschema
import pytest

from engine_util import tiny_model_dir
from serve_helpers import CliServer
from structured_cases import CHOICES, LARK, REGEXES, SCHEMAS
from yoco_rs import Engine, SamplingParams, StructuredOutputsParams
from logprobs_reference import CompletionLogprobs, TokenText, merge_blocks, prompt_logprobs_json

CONFIG = dict(max_model_len=256, max_num_seqs=8, seed=0, block_size=16)
# --async-scheduling: on the CPU it is off by default; forced here so the real executor runs on placeholders.
FLAGS = ("--frontend", "rust", "--async-scheduling", "--max-model-len", "256", "--max-num-seqs", "8", "--seed", "0", "--block-size", "16",
         "--num-gpu-blocks-override", "24", "--structured-outputs-config", json.dumps({"disable_any_whitespace": True}))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("rust-sampling-tiny")), seed=0)


@pytest.fixture(scope="module")
def server(model_dir):
    s = CliServer(model_dir, *FLAGS)
    yield s
    s.kill()


@pytest.fixture(scope="module")
def engine(model_dir):
    e = Engine(model_dir, **CONFIG)
    yield e
    e.close()


def _post(server, body: dict) -> dict:
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(server, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def _close(a, b, path="") -> None:
    """Equal JSON, floats within 1e-5."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), (path, a, b)
        assert math.isclose(a, b, abs_tol=1e-5), (path, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, a, b)
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("as_ids", [False, True])
def test_completion_logprobs_equal_the_reference_formatting_of_the_engines_streamed_and_not(server, engine, as_ids):
    prompt = engine.encode("The weather today is")
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 3, "echo": True,
            "prompt_logprobs": 2, "return_tokens_as_token_ids": as_ids}
    got = _post(server, body)["choices"][0]
    # The reference: echo with logprobs asks max(prompt_logprobs, logprobs) prompt alternatives, then
    # formats the engine's outputs with tests/logprobs_reference.py.
    out = engine.generate({"prompt_token_ids": prompt}, SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True, logprobs=3, prompt_logprobs=3), use_tqdm=False)[0]
    co = out.outputs[0]
    lp = CompletionLogprobs(TokenText(engine.tokenizer, as_ids))
    want = merge_blocks(lp.block(prompt, out.prompt_logprobs), lp.block(co.token_ids, co.logprobs))
    assert got["text"] == engine.decode(prompt, skip_special_tokens=False) + co.text
    _close(got["logprobs"], want)
    _close(got["prompt_logprobs"], prompt_logprobs_json(out.prompt_logprobs))
    # Streamed: the first chunk carries the prompt's block and prompt_logprobs, the blocks concatenate.
    chunks = _stream(server, body)
    cat = {k: [] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    for c in chunks:
        for k in cat:
            cat[k] += c["choices"][0]["logprobs"][k]
    _close(cat, want)
    _close(chunks[0]["choices"][0]["prompt_logprobs"], got["prompt_logprobs"])
    assert all("prompt_logprobs" not in c["choices"][0] for c in chunks[1:])


def test_seeded_penalised_outputs_equal_the_python_engines_under_preemption(server, engine):
    # Six concurrent requests of ~8 + 60 tokens (5 blocks each) in a 24-block pool: some are preempted
    # and resumed; their penalty counts and random streams come back from the resumed outputs.
    # A low temperature: the random model's near-uniform logits otherwise drown the penalties in noise.
    pen = dict(temperature=0.2, presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3,
               max_tokens=60, ignore_eos=True)
    prompts = [engine.encode(f"Story {i}: once upon a time") for i in range(6)]
    before = _preemptions(server)
    results: dict[int, dict] = {}

    def run(i):
        results[i] = _post(server, {"prompt": prompts[i], "seed": 100 + i, "n": 2, **pen})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _preemptions(server) > before, "the pool was meant to run out"
    outs = engine.generate([{"prompt_token_ids": p} for p in prompts],
                           [SamplingParams(seed=100 + i, n=2, **pen) for i in range(6)], use_tqdm=False)
    for i, out in enumerate(outs):
        assert [c["text"] for c in results[i]["choices"]] == [c.text for c in out.outputs], i
    # The penalties do something: without them the seeded text differs.
    plain = _post(server, {"prompt": prompts[0], "seed": 100, "temperature": 0.2, "max_tokens": 60,
                           "ignore_eos": True})
    assert plain["choices"][0]["text"] != results[0]["choices"][0]["text"]


def _preemptions(server) -> float:
    m = httpx.get(server.url + "/metrics", timeout=30).text
    return float(next(l for l in m.splitlines() if l.startswith("yoco:num_preemptions_total")).rsplit(" ", 1)[1])


def _cases():
    cases = [("schema", {"structured_outputs": {"json": s}}, s) for s in SCHEMAS[::10]]
    cases += [("regex", {"guided_regex": rx}, rx) for rx in REGEXES[:2]]
    cases += [("choice", {"structured_outputs": {"choice": CHOICES[0]}}, CHOICES[0])]
    cases += [("lark", {"guided_grammar": LARK[0]}, LARK[0])]
    cases += [("schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMAS[32]}}},
               SCHEMAS[32])]
    return cases


def _valid(what: str, spec, text: str) -> None:
    if what == "schema":
        jsonschema.validate(json.loads(text), spec)
    elif what == "regex":
        assert re.fullmatch(spec, text), (spec, text)
    elif what == "choice":
        assert text in spec, (spec, text)
    else:
        assert re.fullmatch(r"[0-9]{1,3}([+-][0-9]{1,3})*", text), text


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_structured_outputs_through_the_rust_server_validate_streamed_and_not(server, temperature):
    cases = _cases()
    stopped = 0
    for i, (what, field, spec) in enumerate(cases):
        body = {"prompt": f"Item {i}: answer.", "max_tokens": 80, "temperature": temperature, "seed": i, **field}
        c = _post(server, body)["choices"][0]
        if i % 2 == int(temperature > 0):
            text = "".join(ch["choices"][0]["text"] for ch in _stream(server, body))
            assert text == c["text"], (what, spec)  # seeded: streamed and not are the same sequence
        if c["finish_reason"] != "stop":
            assert c["finish_reason"] in ("length", "abort"), c
            continue
        stopped += 1
        _valid(what, spec, c["text"])
    assert stopped >= 0.8 * len(cases), f"only {stopped} of {len(cases)} finished"


def test_greedy_constrained_text_equals_the_python_engines(server, engine):
    every = _cases()
    cases = [every[i] for i in (0, 3, 7, 9, 10)]  # two schemas, a regex, a choice, a Lark grammar
    key = {"schema": "json", "regex": "regex", "choice": "choice", "lark": "grammar"}
    outs = engine.generate(
        [f"Item {i}: answer." for i in range(len(cases))],
        [SamplingParams(temperature=0, max_tokens=100, structured_outputs=StructuredOutputsParams(
            disable_any_whitespace=True, **{key[what]: spec})) for what, _, spec in cases], use_tqdm=False)
    for i, ((what, field, spec), out) in enumerate(zip(cases, outs)):
        c = _post(server, {"prompt": f"Item {i}: answer.", "max_tokens": 100, "temperature": 0, **field})["choices"][0]
        assert (c["text"], c["finish_reason"]) == (out.outputs[0].text, out.outputs[0].finish_reason), (what, spec)


def test_logprobs_of_a_constrained_row_are_the_masked_distributions(server):
    c = _post(server, {"prompt": "Pick:", "max_tokens": 4, "temperature": 0, "logprobs": 8,
                       "return_tokens_as_token_ids": True,  # keys by id: no two tokens share a key
                       "structured_outputs": {"choice": ["yes", "no"]}})["choices"][0]
    assert c["text"] in ("yes", "no")
    # Renormalized over the allowed tokens (at most five prefixes of "yes"/"no", all among the top 8):
    # their probabilities sum to one, and disallowed alternatives show as -9999.0 (JSON has no -inf).
    first = c["logprobs"]["top_logprobs"][0]
    assert sum(math.exp(v) for v in first.values()) == pytest.approx(1.0, abs=1e-4)
    assert any(v == -9999.0 for v in first.values()), first


@pytest.mark.parametrize("body,param,needle", [
    ({"guided_json": {"type": "nosuchtype"}}, "guided_json", "nosuchtype"),
    ({"guided_regex": "(unclosed"}, "guided_regex", "regex"),
    ({"response_format": {"type": "yaml"}}, "response_format", "'yaml'"),
    ({"logprobs": 21}, "logprobs", "max_logprobs"),
    ({"presence_penalty": 3}, "presence_penalty", "[-2, 2]"),
])
def test_bad_values_are_400s_naming_the_field(server, body, param, needle):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err
