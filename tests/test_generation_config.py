"""The checkpoint's generation_config.json gives the defaults of the sampling fields a request leaves
unset, as vLLM's ``--generation-config auto|vllm|PATH`` does; a field the request sets always wins."""

import json
import os

import pytest

from yoco_rs import Engine, SamplingParams
from yoco_rs.generation_config import sampling_defaults
from yoco_rs.serve.args import build_parser, engine_settings


def _write(d, cfg):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(cfg, f)
    return str(d)


def test_auto_reads_the_sampling_fields_vllm_reads_and_vllm_ignores_the_file(tmp_path):
    d = _write(tmp_path / "m", {"temperature": 0.6, "top_k": 64, "top_p": 0.95, "min_p": 0.01,
                                "repetition_penalty": 1.1, "max_new_tokens": 7, "do_sample": True, "bos_token_id": 2})
    assert sampling_defaults("auto", d) == {"temperature": 0.6, "top_k": 64, "top_p": 0.95, "min_p": 0.01,
                                            "repetition_penalty": 1.1, "max_tokens": 7}
    assert sampling_defaults("vllm", d) == {}
    other = _write(tmp_path / "other", {"temperature": 0.2})
    assert sampling_defaults(other, d) == {"temperature": 0.2}
    assert sampling_defaults(os.path.join(other, "generation_config.json"), d) == {"temperature": 0.2}
    assert sampling_defaults("auto", str(tmp_path / "none")) == {}  # no file: no defaults


def test_bad_sources_and_values_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        sampling_defaults(str(tmp_path / "missing"), str(tmp_path))
    d = _write(tmp_path / "m", {"top_p": 0})
    with pytest.raises(ValueError, match="top_p must be in"):
        sampling_defaults("auto", d)


def test_the_flag_is_vllms_and_reaches_the_engine_config():
    args = build_parser().parse_args([])
    assert engine_settings(args)["generation_config"] == "auto"
    args = build_parser().parse_args(["--generation-config", "vllm"])
    assert engine_settings(args)["generation_config"] == "vllm"


def test_engine_generate_without_params_uses_the_checkpoint_defaults(tmp_path):
    from engine_util import tiny_model_dir

    d = tiny_model_dir(str(tmp_path / "tiny"), seed=1)
    _write(d, {"temperature": 0.0, "max_new_tokens": 5, "eos_token_id": [1, 5]})
    eng = Engine(d, device="cpu", seed=0)
    try:
        assert eng.get_default_sampling_params() == SamplingParams(temperature=0.0, max_tokens=5)
        prompt = [2, 100, 200, 300]
        got = eng.generate({"prompt_token_ids": prompt}, use_tqdm=False)[0].outputs[0].token_ids
        ref = eng.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=5),
                           use_tqdm=False)[0].outputs[0].token_ids
        assert got == ref and len(got) <= 5
    finally:
        eng.close()
    eng = Engine(d, device="cpu", seed=0, generation_config="vllm")
    try:
        assert eng.get_default_sampling_params() == SamplingParams()
    finally:
        eng.close()


def test_the_rust_server_takes_the_checkpoint_defaults_only_for_fields_a_request_leaves_unset(tmp_path):
    import httpx

    from engine_util import tiny_model_dir
    from serve_helpers import RustServer

    d = tiny_model_dir(str(tmp_path / "tiny"), seed=1)
    _write(d, {"temperature": 0.6, "top_k": 64, "top_p": 0.5, "min_p": 0.01, "repetition_penalty": 1.25,
               "eos_token_id": [1]})
    srv = RustServer(d, "--max-model-len", "128", "--kv-cache-memory", str(16 << 20), api_key=None)
    try:
        def render(keys=("temperature", "top_k", "top_p", "min_p", "repetition_penalty"), **kw):
            r = httpx.post(srv.url + "/v1/completions/render", json={"prompt": [5, 6], "max_tokens": 2, **kw},
                           timeout=60)
            assert r.status_code == 200, r.text
            sp = r.json()[0]["sampling_params"]
            return tuple(sp[k] for k in keys)

        assert render() == (0.6, 64, 0.5, 0.01, 1.25)
        assert render(temperature=0, top_k=-1, top_p=1.0, min_p=0.0, repetition_penalty=1.0) == (0, -1, 1.0, 0.0, 1.0)
        # The rendered parameters are the request's own where it sets them (penalties and logprobs too).
        assert render(("presence_penalty", "frequency_penalty", "logprobs", "prompt_logprobs", "temperature"),
                      presence_penalty=0.5, frequency_penalty=-0.25, logprobs=2, prompt_logprobs=1) == \
            (0.5, -0.25, 2, 1, 0.6)
    finally:
        srv.stop()
    srv = RustServer(d, "--max-model-len", "128", "--kv-cache-memory", str(16 << 20), "--generation-config", "vllm",
                     api_key=None)
    try:
        r = httpx.post(srv.url + "/v1/completions/render", json={"prompt": [5, 6], "max_tokens": 2}, timeout=60)
        sp = r.json()[0]["sampling_params"]
        assert (sp["temperature"], sp["top_k"], sp["top_p"], sp["min_p"], sp["repetition_penalty"]) == \
            (1.0, 0, 1.0, 0.0, 1.0)
    finally:
        srv.stop()
