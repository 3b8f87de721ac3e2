"""The bundled default model: a standard HF-layout Gemma 3n checkpoint that transformers loads, with
weights identical to tests/tiny.py's randomize(), a working tokenizer and chat template."""

import os

import pytest
import torch

from yoco_rs import bundled
from yoco_rs.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    os.environ["YOCO_RS_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    try:
        yield bundled.default_model_dir()
    finally:
        del os.environ["YOCO_RS_CACHE"]


def test_materializes_once_in_hf_layout(model_dir):
    assert sorted(os.listdir(model_dir)) == sorted(bundled._FILES + ("model.safetensors",))
    mtime = os.path.getmtime(os.path.join(model_dir, "model.safetensors"))
    assert bundled.default_model_dir() == model_dir
    assert os.path.getmtime(os.path.join(model_dir, "model.safetensors")) == mtime


def test_transformers_loads_it_and_weights_equal_randomize(model_dir):
    from tiny import randomize
    from transformers import AutoConfig, Gemma3nForCausalLM

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "gemma3n_text" and cfg.num_kv_shared_layers == 5
    loaded = Gemma3nForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    ref = randomize(Gemma3nForCausalLM(cfg).eval(), seed=0)
    ref_params = dict(ref.named_parameters())
    for name, p in loaded.named_parameters():
        assert torch.equal(p, ref_params[name]), name
    ids = torch.tensor([[2, 100, 200, 300, 400]])
    with torch.no_grad():
        assert torch.isfinite(loaded(ids).logits).all()


def test_tokenizer_round_trips_text_and_has_gemma_special_tokens(model_dir):
    tok = Tokenizer(model_dir)
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert tok.eos_token_ids == [1, 5]  # <eos> and <end_of_turn>
    assert tok.vocab_size == 2048
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


def test_package_files_are_what_the_script_generates(tmp_path, monkeypatch):
    """Provenance: the committed tokenizer and configs are reproducible from the script."""
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("mdm", root / "scripts" / "make_default_model.py")
    mdm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mdm)
    monkeypatch.setattr(mdm, "OUT", str(tmp_path))
    mdm.main()
    for name in bundled._FILES:
        assert (tmp_path / name).read_bytes() == (bundled._SRC / name).read_bytes(), name
