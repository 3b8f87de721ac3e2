"""The bundled default model: a trained, standard HF-layout Gemma 3n checkpoint shipped as package files
(weights included), that transformers loads, with a working tokenizer and chat template, and whose
greedy completion of a fixed prompt through the engine is pinned (and equals transformers')."""

import json
import os

import pytest
import torch

from yoco_rs import Engine, SamplingParams, bundled
from yoco_rs.tokenizer import Tokenizer

PROMPT = "The list"
# Greedy, 16 tokens, from the committed weights (scripts/train_default_model.py: 250 warm-up + 1000 steps).
PINNED = " of the current directory, the current directory, the current directory, the current directory"


@pytest.fixture(scope="module")
def model_dir():
    return bundled.default_model_dir()


def test_weights_and_configs_are_package_files_not_generated_on_first_use(model_dir):
    names = set(os.listdir(model_dir))
    assert set(bundled.FILES) <= names
    assert os.path.getsize(os.path.join(model_dir, "model.safetensors")) <= 20 << 20
    assert bundled.is_bundled(model_dir)
    assert os.path.dirname(bundled.__file__) == os.path.dirname(model_dir)  # inside the package


def test_every_gemma3n_feature_is_on(model_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "gemma3n_text"
    assert {"sliding_attention", "full_attention"} == set(cfg.layer_types) and cfg.sliding_window == 64
    assert 0 < cfg.num_kv_shared_layers < cfg.num_hidden_layers  # KV sharing
    assert cfg.hidden_size_per_layer_input > 0  # per-layer embeddings
    assert cfg.altup_num_inputs > 1 and cfg.laurel_rank > 0
    assert any(s > 0 for s in cfg.activation_sparsity_pattern)


def test_greedy_completion_is_pinned_and_equals_transformers(model_dir):
    from transformers import Gemma3nForCausalLM

    eng = Engine(device="cpu", seed=0)
    try:
        out = eng.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)[0]
    finally:
        eng.close()
    assert out.outputs[0].text == PINNED
    hf = Gemma3nForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([out.prompt_token_ids])
    with torch.no_grad():
        ref = hf.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None)[0, ids.shape[1]:].tolist()
    assert out.outputs[0].token_ids == ref


def test_generation_config_holds_sampling_defaults(model_dir):
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        g = json.load(f)
    assert (g["temperature"], g["top_k"], g["top_p"]) == (0.7, 40, 0.95)
    assert g["eos_token_id"] == [1, 5]


def test_tokenizer_round_trips_text_and_has_gemma_special_tokens(model_dir):
    tok = Tokenizer(model_dir)
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert tok.eos_token_ids == [1, 5]  # <eos> and <end_of_turn>
    assert tok.vocab_size == 4096
    text = "The quick brown fox, 12345 café 日本 🙂!"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids) == text
    assert {0, 1, 2, 4, 5} <= set(tok.all_special_ids)


def test_chat_template_renders_gemma_turns(model_dir):
    tok = Tokenizer(model_dir)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "Again"}]},
    ]
    text = tok.apply_chat_template(msgs)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nAgain<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = tok.apply_chat_template(msgs, tokenize=True)
    assert ids[:2] == [2, tok.hf.token_to_id("<start_of_turn>")] and ids.count(2) == 1
    with pytest.raises(ValueError, match="alternate"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


@pytest.mark.heavy
def test_tokenizer_and_configs_are_what_the_training_script_writes(tmp_path):
    """Provenance: the committed tokenizer and configs are reproducible from the script (the weights
    take the full training run: see the model card)."""
    import importlib.util
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts"))
    spec = importlib.util.spec_from_file_location("tdm", root / "scripts" / "train_default_model.py")
    tdm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tdm)
    tok = tdm.train_tokenizer(tdm.data.documents("train"))
    tdm.write_configs(str(tmp_path), tok)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (bundled._SRC / name).read_bytes(), name
