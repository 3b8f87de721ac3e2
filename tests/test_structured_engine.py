"""Structured outputs through the Engine on the bundled random-weight model: unconstrained it emits
garbage, so every output that validates proves the mask did the work.

Every finished (``finish_reason == "stop"``) output of the corpus (tests/structured_cases.py: >= 60
JSON Schemas, regexes, choices, Lark grammars) validates, with greedy and temperature-1.5 sampling,
with fast prefill and prefix caching on and off; interactions (n > 1, preemption mid-JSON, max_tokens
mid-JSON, logprobs, abort) have defined answers."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from engine_util import assert_pool_drained, run_until_done, tiny_model_dir
from structured_cases import CHOICES, LARK, REGEXES, SCHEMAS
from yoco_rs import Engine, SamplingParams, StructuredOutputsParams

_ENGINES: dict = {}
# A random tiny model (the bundled tokenizer): unconstrained it emits garbage, which makes it a strong
# test of the grammar, and it does not settle into the loops a small trained model repeats under greedy.
_MODEL: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _random_model(tmp_path_factory):
    _MODEL["dir"] = tiny_model_dir(str(tmp_path_factory.mktemp("random-tiny")), seed=0)
    yield


def _engine(fast: bool, cache: bool, **kw) -> Engine:
    key = (fast, cache, tuple(sorted(kw.items())))
    if key not in _ENGINES:
        _ENGINES[key] = Engine(_MODEL["dir"], max_model_len=512, num_gpu_blocks_override=kw.pop("blocks", 256), max_num_seqs=64,
                               max_num_batched_tokens=256, kv_sharing_fast_prefill=fast,
                               enable_prefix_caching=cache, **kw)
    return _ENGINES[key]


@pytest.fixture(scope="module", autouse=True)
def _close_engines():
    yield
    for e in _ENGINES.values():
        e.close()
    _ENGINES.clear()


def _json(schema) -> StructuredOutputsParams:
    """Compact JSON (no optional whitespace): a random model otherwise spends its budget on blanks."""
    return StructuredOutputsParams(json=schema, disable_any_whitespace=True)


def _params(so, temperature: float, seed: int, max_tokens: int = 120, **kw) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens,
                          structured_outputs=so, **kw)


def _check_corpus(engine: Engine, temperature: float, schemas=SCHEMAS) -> None:
    prompts, params, checks = [], [], []
    for i, s in enumerate(schemas):
        prompts.append(f"Item {i}: answer in JSON.")
        params.append(_params(_json(s), temperature, seed=i))
        checks.append(("schema", s))
    for i, rx in enumerate(REGEXES):
        prompts.append(f"regex {i}")
        params.append(_params(StructuredOutputsParams(regex=rx), temperature, seed=100 + i))
        checks.append(("regex", rx))
    for i, ch in enumerate(CHOICES):
        prompts.append(f"choose {i}")
        params.append(_params(StructuredOutputsParams(choice=ch), temperature, seed=200 + i))
        checks.append(("choice", ch))
    for i, g in enumerate(LARK):
        prompts.append(f"grammar {i}")
        params.append(_params(StructuredOutputsParams(grammar=g), temperature, seed=300 + i))
        checks.append(("lark", g))
    outs = engine.generate(prompts, params, use_tqdm=False)
    stopped = 0
    for out, (what, spec) in zip(outs, checks):
        c = out.outputs[0]
        if c.finish_reason != "stop":
            assert c.finish_reason in ("length", "abort"), (what, spec, c.finish_reason)
            continue
        stopped += 1
        text = c.text
        if what == "schema":
            jsonschema.validate(json.loads(text), spec)
        elif what == "regex":
            assert re.fullmatch(spec, text), (spec, text)
        elif what == "choice":
            assert text in spec, (spec, text)
        else:
            assert text, spec
    # Random weights under a grammar still end: most outputs finish inside the token budget.
    assert stopped >= 0.8 * len(outs), f"only {stopped} of {len(outs)} finished"
    assert_pool_drained(engine)


@pytest.mark.parametrize("temperature", [0.0, 1.5])
@pytest.mark.parametrize("fast,cache", [(True, True), (False, True), (True, False), (False, False)])
def test_every_finished_output_of_the_corpus_validates(fast, cache, temperature):
    assert len(SCHEMAS) >= 60
    _check_corpus(_engine(fast, cache), temperature)


def test_unconstrained_output_of_the_random_model_is_not_json():
    # The premise of the corpus test: without the mask the model does not produce these documents.
    e = _engine(True, True)
    outs = e.generate([f"Item {i}: answer in JSON." for i in range(8)],
                      [SamplingParams(temperature=1.5, seed=i, max_tokens=40) for i in range(8)], use_tqdm=False)
    ok = 0
    for o in outs:
        try:
            json.loads(o.outputs[0].text)
            ok += 1
        except ValueError:
            pass
    assert ok <= 1


def test_greedy_constrained_output_is_reproducible_and_independent_of_the_batch():
    e = _engine(True, True)
    so = _json(SCHEMAS[32])
    alone = e.generate("Item: answer in JSON.", _params(so, 0.0, 0), use_tqdm=False)[0].outputs[0].text
    batch = e.generate(["Item: answer in JSON.", "other", "x y z"],
                       [_params(so, 0.0, 0), SamplingParams(max_tokens=30, seed=1), _params(so, 1.5, 3)],
                       use_tqdm=False)
    assert batch[0].outputs[0].text == alone
    jsonschema.validate(json.loads(alone), SCHEMAS[32])


def test_n4_gives_four_valid_different_outputs_at_temperature_1():
    e = _engine(True, True)
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1000000},
                                               "b": {"type": "string", "maxLength": 6}},
              "required": ["a", "b"], "additionalProperties": False}
    out = e.generate("Give JSON", SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=60,
                                                 structured_outputs=_json(schema)),
                     use_tqdm=False)[0]
    texts = [c.text for c in out.outputs]
    assert len(texts) == 4 and len(set(texts)) == 4, texts
    for c in out.outputs:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), schema)
    assert_pool_drained(e)


def test_preemption_mid_json_still_yields_valid_json():
    # A tiny KV pool: many constrained requests preempt each other mid-document (recompute keeps the
    # output tokens, so each matcher stays where it was).
    e = Engine(_MODEL["dir"], max_model_len=128, num_gpu_blocks_override=10, block_size=16, max_num_seqs=16,
               max_num_batched_tokens=64)
    try:
        schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 20,
                  "maxItems": 24}
        params = [_params(_json(schema), 1.0, seed=i, max_tokens=100) for i in range(8)]
        outs = e.generate([f"list {i} " * 4 for i in range(8)], params, use_tqdm=False)
        assert sum(o.metrics.num_preemptions for o in outs) > 0, "the pool was meant to force preemption"
        for o in outs:
            c = o.outputs[0]
            assert c.finish_reason == "stop", c
            jsonschema.validate(json.loads(c.text), schema)
        assert_pool_drained(e)
    finally:
        e.close()


def test_max_tokens_mid_json_finishes_length_with_a_truncated_prefix():
    e = _engine(True, True)
    schema = {"type": "array", "items": {"type": "integer", "minimum": 100, "maximum": 999}, "minItems": 30}
    c = e.generate("x", _params(_json(schema), 1.0, seed=3, max_tokens=8),
                   use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 8
    assert re.fullmatch(r"\[[0-9,]*", c.text), c.text  # a prefix of an array of integers


def test_logprobs_come_from_the_masked_distribution():
    e = _engine(True, True)
    choices = ["alpha", "beta", "gamma"]
    c = e.generate("pick", _params(StructuredOutputsParams(choice=choices), 1.0, seed=5, logprobs=5),
                   use_tqdm=False)[0].outputs[0]
    assert c.text in choices
    for pos in c.logprobs:
        # Every reported alternative is finite only if the grammar allowed it; the masked
        # distribution's probabilities sum to 1 over the allowed tokens.
        finite = [lp.logprob for lp in pos.values() if lp.logprob > float("-inf")]
        assert finite and sum(np.exp(finite)) <= 1.0 + 1e-4
    first = c.logprobs[0]
    allowed_texts = {lp.decoded_token for lp in first.values() if lp.logprob > float("-inf")}
    assert all(any(ch.startswith(t) for ch in choices) for t in allowed_texts if t), allowed_texts


def test_stop_string_inside_the_constrained_output_ends_it_with_stop():
    e = _engine(True, True)
    c = e.generate("x", _params(StructuredOutputsParams(regex=r"abc,def,ghi"), 0.0, 0, stop=[","]),
                   use_tqdm=False)[0].outputs[0]
    assert c.text == "abc" and c.finish_reason == "stop"


def test_abort_mid_constrained_generation_frees_everything():
    e = _engine(True, True)
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 50}
    e.add_request("ab", "x", _params(StructuredOutputsParams(json=schema), 1.0, seed=1, max_tokens=100))
    for _ in range(3):
        e.step()
    e.abort_request("ab")
    finals = run_until_done(e)
    assert finals["ab"].outputs[0].finish_reason == "abort"
    assert e.get_num_unfinished_requests() == 0 and e._core.num_unfinished() == 0
    e.check_invariants()  # the loop's grammar matchers, text and logprob tables hold no ended request
    assert_pool_drained(e)


@pytest.mark.parametrize("so,needle", [
    (StructuredOutputsParams(json='{"type": "object", "properties": {"a": {"type": "nosuchtype"}}}'), "nosuchtype"),
    (StructuredOutputsParams(json="{not json"), "not valid JSON"),
    (StructuredOutputsParams(regex="(unclosed"), "regex"),
    (StructuredOutputsParams(grammar="start: undefined_rule"), "undefined_rule"),
])
def test_bad_constraints_are_value_errors_naming_the_problem(so, needle):
    e = _engine(True, True)
    with pytest.raises(ValueError, match=re.escape(needle)):
        e.generate("x", SamplingParams(structured_outputs=so), use_tqdm=False)
    assert not e.has_unfinished_requests()


def test_structured_outputs_params_needs_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice=[])
    sp = SamplingParams(structured_outputs={"json": {"type": "integer"}})
    assert sp.structured_outputs.kind_and_text() == ("json", '{"type": "integer"}')


def test_flexible_whitespace_json_object_validates_when_it_finishes():
    e = _engine(True, True)
    outs = e.generate([f"obj {i}" for i in range(6)],
                      [_params(StructuredOutputsParams(json_object=True), 0.7, seed=i, max_tokens=100) for i in range(6)],
                      use_tqdm=False)
    for o in outs:
        c = o.outputs[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict), c.text
