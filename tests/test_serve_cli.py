"""``yoco-serve`` flags: vLLM names, every flag readable from ``YOCO_SERVE_<FLAG>``, the command line
wins, bad values name the variable, and engine flags map 1:1 onto ``EngineConfig``."""

import os
import subprocess
import sys

import pytest

from serve_helpers import FRONTENDS
from yoco_rs.config import EngineConfig
from yoco_rs.serve.args import build_parser, engine_settings, env_name, model_dir

VLLM_FLAGS = ["--host", "--port", "--served-model-name", "--api-key", "--dtype", "--seed", "--max-model-len",
              "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--sub-block-size",
              "--enable-prefix-caching", "--no-enable-prefix-caching", "--kv-sharing-fast-prefill",
              "--no-kv-sharing-fast-prefill", "--enforce-eager", "--shutdown-timeout", "--max-logprobs",
              "--compat-metric-names", "--gpu-memory-utilization"]


def parse(argv, env=None, monkeypatch=None):
    for k in [k for k in os.environ if k.startswith("YOCO_SERVE_")]:
        monkeypatch.delenv(k)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    return build_parser().parse_args(argv)


def test_help_names_every_vllm_flag_and_its_environment_variable():
    text = build_parser().format_help()
    for flag in VLLM_FLAGS:
        assert flag in text, flag
    for action in build_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert f"[env: {env_name(action.dest)}]" in " ".join(text.split()), action.dest


def test_defaults_serve_the_bundled_model_on_localhost_8000_from_the_rust_front_end(monkeypatch):
    a = parse([], monkeypatch=monkeypatch)
    assert (a.host, a.port, model_dir(a)) == ("127.0.0.1", 8000, None)
    assert a.enable_prefix_caching is True and a.kv_sharing_fast_prefill is True
    assert engine_settings(a)["seed"] == 0
    assert a.frontend == "rust"  # the only front end (the FastAPI server is retired)


def test_environment_sets_flags_and_the_command_line_wins(monkeypatch):
    env = {"YOCO_SERVE_PORT": "9001", "YOCO_SERVE_MAX_MODEL_LEN": "512", "YOCO_SERVE_ENABLE_PREFIX_CACHING": "0",
           "YOCO_SERVE_KV_SHARING_FAST_PREFILL": "false", "YOCO_SERVE_API_KEY": "k1 k2",
           "YOCO_SERVE_SERVED_MODEL_NAME": "a b", "YOCO_SERVE_ENFORCE_EAGER": "yes", "YOCO_SERVE_MODEL": "/m"}
    a = parse(["--port", "9002"], env, monkeypatch)
    assert a.port == 9002 and a.max_model_len == 512
    assert a.enable_prefix_caching is False and a.kv_sharing_fast_prefill is False and a.enforce_eager is True
    assert a.api_key == ["k1", "k2"] and a.served_model_name == ["a", "b"] and model_dir(a) == "/m"
    b = parse(["--enable-prefix-caching"], env, monkeypatch)
    assert b.enable_prefix_caching is True


@pytest.mark.parametrize("var,value", [("YOCO_SERVE_PORT", "eighty"), ("YOCO_SERVE_MAX_MODEL_LEN", "0"),
                                       ("YOCO_SERVE_ENABLE_PREFIX_CACHING", "maybe"),
                                       ("YOCO_SERVE_METRICS_PREFIX", "sglang")])
def test_bad_environment_value_names_the_variable(monkeypatch, capsys, var, value):
    with pytest.raises(SystemExit) as e:
        parse([], {var: value}, monkeypatch)
    assert e.value.code == 2
    assert var in capsys.readouterr().err


def test_engine_flags_map_onto_engine_config(monkeypatch):
    a = parse(["/ckpt", "--dtype", "float32", "--max-num-seqs", "8", "--max-num-batched-tokens", "256",
               "--block-size", "32", "--sub-block-size", "8", "--no-enable-prefix-caching",
               "--no-kv-sharing-fast-prefill", "--gpu-memory-utilization", "0.5", "--max-logprobs", "5",
               "--seed", "3", "--scheduling-policy", "priority"], monkeypatch=monkeypatch)
    s = engine_settings(a)
    cfg = EngineConfig.from_kwargs(model_dir(a), **s)
    assert (cfg.model, cfg.dtype, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.block_size,
            cfg.sub_block_size) == ("/ckpt", "float32", 8, 256, 32, 8)
    assert not cfg.enable_prefix_caching and not cfg.kv_sharing_fast_prefill
    assert (cfg.kv_cache_memory, cfg.max_logprobs, cfg.seed, cfg.scheduling_policy) == (0.5, 5, 3, "priority")
    assert parse(["--kv-cache-memory", "64MiB"], monkeypatch=monkeypatch).kv_cache_memory == 64 << 20


def test_console_script_help_and_bad_model_dir_exit_cleanly(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "yoco-serve")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "YOCO_SERVE_MAX_MODEL_LEN" in r.stdout
    r = subprocess.run([exe, str(tmp_path / "nope"), "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "is not a directory" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_model_that_fails_to_load_exits_1_with_the_cause(tmp_path, frontend):
    import shutil

    from yoco_rs.bundled import default_model_dir

    src = default_model_dir()
    for name in os.listdir(src):
        if name.endswith(".json"):
            shutil.copy(os.path.join(src, name), tmp_path / name)  # no weights
    exe = os.path.join(os.path.dirname(sys.executable), "yoco-serve")
    r = subprocess.run([exe, str(tmp_path), "--port", "0", "--disable-progress", "--frontend", frontend],
                       capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1
    assert "the engine failed" in r.stderr and "no weights" in r.stderr
