"""Checkpoints: transformers' ``save_pretrained`` output (text-only, sharded) and the released multimodal
layout load and reproduce transformers' logits; broken directories and files give errors that say what
is wrong.

The multimodal checkpoint here is written by hand, as the released files are laid out (the towers
themselves, loaded and compared with transformers, are tests/test_mm_model_vs_hf.py): the text model's
tensors renamed to ``model.language_model.*``, K/V weights for the KV-sharing layers (Google ships them),
a real tiny audio tower and multimodal embedders from transformers' own classes, dummy vision-tower
tensors, and ``Gemma3nConfig`` with tiny vision/audio configs as ``config.json``.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from model_harness import PagedSim, Row
from numerics import assert_same_greedy, hf_tol
from safetensors.torch import save_file
from tiny import tiny_config, tiny_hf_model

from yoco_rs.executor.executor import Executor
from yoco_rs.models.gemma3n.config import ConfigError
from yoco_rs.models.loader import CheckpointError

PROMPT = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(11)).tolist()


@pytest.fixture(scope="module")
def hf():
    return tiny_hf_model(seed=3)


@pytest.fixture(scope="module")
def hf_logits(hf):
    with torch.no_grad():
        return hf(torch.tensor([PROMPT]), use_cache=False).logits[0]


@pytest.fixture(scope="module")
def text_dir(hf, tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    hf.save_pretrained(d)
    return d


def _assert_matches_hf(ex: Executor, hf_logits: torch.Tensor) -> None:
    """Logits within the transformers tolerance (``numerics.hf_tol``), greedy tokens equal."""
    args = ex.model_config.text
    tol = hf_tol(args.num_hidden_layers, args.hidden_size, any_cpu=True)
    got = _prefill_logits(ex)
    assert (got - hf_logits).abs().max().item() <= tol
    assert_same_greedy(got, hf_logits, tol)


def _prefill_logits(ex: Executor) -> torch.Tensor:
    sim = PagedSim(ex, 8, 16)
    sim.add("a", PROMPT)
    batch, _, _ = sim.step([Row("a", len(PROMPT), num_cross=len(PROMPT))])
    return ex.execute(batch)


def test_text_only_save_pretrained_checkpoint_reproduces_transformers_logits(text_dir, hf_logits):
    assert not os.path.exists(text_dir / "pytorch_model.bin")
    ex = Executor.from_pretrained(text_dir, device="cpu", progress=False)
    assert ex.dtype == torch.float32  # the CPU default
    assert ex.model_config.architecture == "Gemma3nForCausalLM"
    _assert_matches_hf(ex, hf_logits)


def test_sharded_checkpoint_loads_through_its_index(hf, hf_logits, tmp_path):
    hf.save_pretrained(tmp_path, max_shard_size="300KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]) > 1
    ex = Executor.from_pretrained(tmp_path, device="cpu", progress=False)
    _assert_matches_hf(ex, hf_logits)


def _write_multimodal(hf, d, *, with_shared_kv: bool = True) -> None:
    from transformers import Gemma3nAudioConfig, Gemma3nConfig, Gemma3nVisionConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nAudioEncoder, Gemma3nMultimodalEmbedder

    text_cfg = hf.config
    vision = Gemma3nVisionConfig(hidden_size=64, model_args={"channel_multiplier": 0.125, "msfa_output_resolution": 2})
    audio = Gemma3nAudioConfig(hidden_size=32, conf_num_hidden_layers=1, conf_num_attention_heads=2,
                               input_feat_size=16, sscp_conv_channel_size=[8, 4])
    cfg = Gemma3nConfig(text_config=text_cfg.to_dict(), vision_config=vision.to_dict(), audio_config=audio.to_dict())
    cfg_dict = cfg.to_dict()
    cfg_dict["architectures"] = ["Gemma3nForConditionalGeneration"]
    (d / "config.json").write_text(json.dumps(cfg_dict))

    tensors = {"model.language_model." + k[len("model."):]: v.clone()
               for k, v in hf.state_dict().items() if k.startswith("model.")}
    g = torch.Generator().manual_seed(0)
    kv = text_cfg.num_key_value_heads * text_cfg.head_dim
    first_shared = text_cfg.num_hidden_layers - text_cfg.num_kv_shared_layers
    if with_shared_kv:  # as in Google's files: unused K/V weights for the KV-sharing layers
        for i in range(first_shared, text_cfg.num_hidden_layers):
            p = f"model.language_model.layers.{i}.self_attn."
            tensors[p + "k_proj.weight"] = torch.randn(kv, text_cfg.hidden_size, generator=g)
            tensors[p + "v_proj.weight"] = torch.randn(kv, text_cfg.hidden_size, generator=g)
            tensors[p + "k_norm.weight"] = torch.ones(text_cfg.head_dim)
    torch.manual_seed(0)
    for k, v in Gemma3nAudioEncoder(audio).state_dict().items():
        tensors["model.audio_tower." + k] = v.clone()
    for name, sub in (("embed_audio", audio), ("embed_vision", vision)):
        for k, v in Gemma3nMultimodalEmbedder(sub, cfg.text_config).state_dict().items():
            tensors[f"model.{name}.{k}"] = v.clone()
    tensors["model.vision_tower.timm_model.conv_stem.conv.weight"] = torch.randn(8, 3, 3, 3, generator=g)
    tensors["model.vision_tower.timm_model.msfa.norm.weight"] = torch.randn(64, generator=g)
    # two shards and an index, like the released files
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for fname, ks in shards.items():
        save_file({k: tensors[k].contiguous() for k in ks}, str(d / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in ks})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("with_shared_kv", [True, False], ids=["with-shared-kv", "without-shared-kv"])
def test_multimodal_layout_loads_the_text_decoder_without_the_towers(hf, hf_logits, tmp_path, with_shared_kv):
    _write_multimodal(hf, tmp_path, with_shared_kv=with_shared_kv)
    ex = Executor.from_pretrained(tmp_path, device="cpu", progress=False, multimodal=False)
    assert ex.model_config.architecture == "Gemma3nForConditionalGeneration"
    assert ex.mm is None
    _assert_matches_hf(ex, hf_logits)
    # without a preprocessor_config.json (how to prepare images / audio) the towers are not loaded either
    ex = Executor.from_pretrained(tmp_path, device="cpu", progress=False)
    assert ex.mm is None


def test_multimodal_layout_with_broken_tower_tensors_names_them(hf, tmp_path):
    # The towers load by default (tests/test_mm_model_vs_hf.py); this file's vision tensors are dummies.
    _write_multimodal(hf, tmp_path, with_shared_kv=False)
    (tmp_path / "preprocessor_config.json").write_text("{}")  # towers are loaded where one ships
    with pytest.raises(CheckpointError, match=r"tensor .model\.vision_tower\.timm_model\.\S+. has shape"):
        Executor.from_pretrained(tmp_path, device="cpu", progress=False)


def test_bfloat16_is_converted_on_load_and_stays_close(text_dir, hf_logits):
    ex = Executor.from_pretrained(text_dir, device="cpu", dtype="bfloat16", progress=False)
    assert all(p.dtype == torch.bfloat16 for p in ex.model.parameters())
    assert ex.kv_group_specs()[0].dtype == torch.bfloat16
    logits = _prefill_logits(ex)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    # bf16 rounding compounds through the layers; the distribution stays recognisably the same
    assert (logits.argmax(-1) == hf_logits.argmax(-1)).float().mean() >= 0.8


# ---- errors ------------------------------------------------------------------------------------------------


def _copy_dir(src, dst, skip=()):
    for name in os.listdir(src):
        if name not in skip:
            (dst / name).write_bytes((src / name).read_bytes())


def test_missing_directory_config_or_weights_are_named(text_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Executor.from_pretrained(tmp_path / "nope", device="cpu")
    with pytest.raises(FileNotFoundError, match="config.json"):
        Executor.from_pretrained(tmp_path, device="cpu")
    _copy_dir(text_dir, tmp_path, skip=("model.safetensors",))
    with pytest.raises(FileNotFoundError, match="expected model.safetensors or model.safetensors.index.json"):
        Executor.from_pretrained(tmp_path, device="cpu")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(FileNotFoundError, match=r"pickle checkpoints \['pytorch_model.bin'\].*safetensors"):
        Executor.from_pretrained(tmp_path, device="cpu")


def test_unknown_architecture_is_refused_with_the_supported_ones(text_dir, tmp_path):
    _copy_dir(text_dir, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["LlamaForCausalLM"], "llama"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"unknown architecture 'LlamaForCausalLM'.*Gemma3nForCausalLM"):
        Executor.from_pretrained(tmp_path, device="cpu")


def test_shape_mismatch_names_the_tensor(text_dir, tmp_path):
    _copy_dir(text_dir, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"][3] = 320
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"tensor 'model\.layers\.3\.mlp\.down_proj\.weight' has shape "
                                              r"\[128, 256\].*implies \[128, 320\]"):
        Executor.from_pretrained(tmp_path, device="cpu", progress=False)


def test_missing_tensor_is_named(hf, tmp_path):
    cfg = hf.config.to_dict()
    cfg["architectures"] = ["Gemma3nForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sd = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "model.norm.weight" and k != "lm_head.weight"}
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"lacks 1 tensor\(s\) the model needs: model\.norm\.weight"):
        Executor.from_pretrained(tmp_path, device="cpu", progress=False)


@pytest.mark.parametrize("damage", ["truncated", "corrupted-header"])
def test_damaged_safetensors_file_gives_a_clear_error(text_dir, tmp_path, damage):
    _copy_dir(text_dir, tmp_path)
    f = tmp_path / "model.safetensors"
    data = bytearray(f.read_bytes())
    if damage == "truncated":
        data = data[: len(data) * 2 // 3]
    else:
        data[8:40] = b"\x00garbage garbage garbage garbage"
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors .* is not a readable safetensors file; it is "
                                              r"truncated or corrupted"):
        Executor.from_pretrained(tmp_path, device="cpu", progress=False)


def test_index_naming_a_missing_shard_is_refused(hf, tmp_path):
    hf.save_pretrained(tmp_path, max_shard_size="300KB")
    shard = sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors"))[-1]
    os.remove(tmp_path / shard)
    with pytest.raises(FileNotFoundError, match=f"shard.*{shard}"):
        Executor.from_pretrained(tmp_path, device="cpu")


def test_config_only_fields_and_tiny_config_round_trip():
    """The config parser accepts what transformers writes (rope_parameters, lists) for both layouts."""
    from yoco_rs.models.gemma3n.config import parse_config

    d = tiny_config().to_dict()
    d["architectures"] = ["Gemma3nForCausalLM"]
    mc = parse_config(d)
    assert mc.weight_prefix == "model." and mc.text.rope_theta == {"full_attention": 1e6, "sliding_attention": 1e4}
    mm = parse_config({"architectures": ["Gemma3nForConditionalGeneration"], "text_config": tiny_config().to_dict()})
    assert mm.weight_prefix == "model.language_model." and mm.text == mc.text
