"""``dtype="auto"`` takes the checkpoint's dtype, and Gemma 3n's per-layer embedding table stays in host
memory, memory-mapped from the checkpoint, with exactly the values an on-device table gives (tiny model;
the real size is ``test_e2b_real_size.py``)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from model_harness import PagedSim, Row
from tiny import tiny_hf_model

from yoco_rs import Engine, SamplingParams, bundled
from yoco_rs.executor.executor import Executor, auto_dtype
from yoco_rs.models.gemma3n.ple_host import HostPerLayerEmbedding, mmap_safetensors

PROMPT = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(5)).tolist()


def _save(hf, d, dtype: torch.dtype):
    hf.to(dtype).save_pretrained(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg.get("dtype", cfg.get("torch_dtype")) == str(dtype).removeprefix("torch.")
    hf.to(torch.float32)
    return d


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    hf = tiny_hf_model(seed=4)
    return {dt: _save(hf, tmp_path_factory.mktemp(str(dt).removeprefix("torch.")), dt)
            for dt in (torch.float32, torch.bfloat16)}


def _logits(ex: Executor) -> torch.Tensor:
    sim = PagedSim(ex, 8, 16)
    sim.add("a", PROMPT)
    batch, _, _ = sim.step([Row("a", len(PROMPT), num_cross=len(PROMPT))])
    return ex.execute(batch)


def test_auto_dtype_is_the_checkpoints_torch_dtype(dirs):
    assert Executor.from_pretrained(dirs[torch.bfloat16], device="cpu", progress=False).dtype == torch.bfloat16
    assert Executor.from_pretrained(dirs[torch.float32], device="cpu", progress=False).dtype == torch.float32
    assert Executor.from_pretrained(dirs[torch.bfloat16], device="cpu", dtype="float32",
                                    progress=False).dtype == torch.float32  # an explicit dtype wins


def test_auto_dtype_rule_per_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert auto_dtype("bfloat16", cpu) == torch.bfloat16
    assert auto_dtype("float16", cpu) == torch.bfloat16  # no float16 path on the CPU
    assert auto_dtype("float32", cpu) == torch.float32
    assert auto_dtype(None, cpu) == torch.float32  # undeclared: transformers' default, float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert auto_dtype("float32", cuda) == torch.bfloat16  # vLLM: float32 checkpoints run in bf16 on GPUs
    assert auto_dtype("float16", cuda) == torch.float16
    assert auto_dtype("bfloat16", cuda) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert auto_dtype("float32", cuda) == torch.float16


def _mapped_file(ptr: int) -> str | None:
    """The file whose memory map holds address ``ptr`` (from /proc/self/maps), None for anonymous memory."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi:
                return parts[5] if len(parts) > 5 else None
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_layer_table_is_memory_mapped_from_the_checkpoint_not_copied(dirs, dtype):
    d = dirs[dtype]
    ex = Executor.from_pretrained(d, device="cpu", dtype="float32", progress=False)
    ple = ex.model.embed_tokens_per_layer
    assert isinstance(ple, HostPerLayerEmbedding)
    assert "embed_tokens_per_layer.weight" not in dict(ex.model.named_parameters())
    assert ple.table.dtype == dtype  # stored as in the file; rows are cast when gathered
    assert _mapped_file(ple.table.data_ptr()) == str(d / "model.safetensors")
    dev, host = ex.model.weight_bytes()
    assert host == ple.table.numel() * dtype.itemsize
    on_device = Executor.from_pretrained(d, device="cpu", dtype="float32", progress=False,
                                         per_layer_embeddings_on_host=False)
    assert on_device.model.weight_bytes() == (dev + ple.table.numel() * 4, 0)


@pytest.mark.parametrize("ckpt,model", [(torch.float32, "float32"), (torch.bfloat16, "float32"),
                                        (torch.bfloat16, "bfloat16"), (torch.float32, "bfloat16")])
def test_host_table_gives_bit_identical_logits_to_the_device_table(dirs, ckpt, model):
    host = Executor.from_pretrained(dirs[ckpt], device="cpu", dtype=model, progress=False)
    dev = Executor.from_pretrained(dirs[ckpt], device="cpu", dtype=model, progress=False,
                                   per_layer_embeddings_on_host=False)
    assert isinstance(host.model.embed_tokens_per_layer, HostPerLayerEmbedding)
    assert not isinstance(dev.model.embed_tokens_per_layer, HostPerLayerEmbedding)
    assert torch.equal(_logits(host), _logits(dev))


def test_out_of_table_ids_read_row_zero_like_the_device_table():
    table = torch.randn(6, 4)
    ple = HostPerLayerEmbedding(6, 4, 2.0, dtype=torch.float32, device="cpu")
    ple.attach(table)
    ids = torch.tensor([5, 6, 9, 0])  # ids >= the per-layer vocab (text-only ids beyond it) read row 0
    assert torch.equal(ple(ids), torch.stack([table[5], table[0], table[0], table[0]]) * 2.0)


def test_mmap_rejects_a_truncated_tensor(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "t.safetensors"
    table = torch.randn(100, 8)
    save_file({"t": table}, str(path))
    assert torch.equal(mmap_safetensors(str(path), "t"), table)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 64])
    with pytest.raises(ValueError, match="truncated"):
        mmap_safetensors(str(path), "t")
    with pytest.raises(KeyError):
        mmap_safetensors(str(path), "u")


def test_engine_flag_keeps_the_table_on_the_device_and_the_startup_line_states_the_split(dirs, caplog):
    caplog.set_level(logging.INFO, logger="yoco_rs.engine")
    tok = bundled.default_model_dir()
    eng = Engine(str(dirs[torch.bfloat16]), tokenizer=tok, kv_cache_memory=8 << 20)
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("yoco-rs memory:")][-1]
    split = eng._exec.memory_split()
    assert "dtype bfloat16 (auto from the checkpoint's bfloat16)" in line
    assert "weights in host memory" in line and "per-layer embeddings, memory-mapped" in line
    assert split["weights_host"] > 0 and split["kv_cache"] > 0
    caplog.clear()
    eng2 = Engine(str(dirs[torch.bfloat16]), tokenizer=tok, kv_cache_memory=8 << 20, per_layer_embeddings_on_device=True,
                  dtype="float32")
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("yoco-rs memory:")][-1]
    assert "dtype float32 (requested)" in line and "host memory" not in line
    assert eng2._exec.memory_split()["weights_host"] == 0
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    out = [e.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids for e in (eng, eng2)]
    assert all(len(o) == 4 for o in out)


def test_serve_flag_keeps_the_table_on_the_device(monkeypatch):
    from yoco_rs.config import EngineConfig
    from yoco_rs.serve.args import build_parser, engine_settings

    for k in [k for k in os.environ if k.startswith("YOCO_SERVE_")]:
        monkeypatch.delenv(k)
    default = EngineConfig.from_kwargs("/ckpt", **engine_settings(build_parser().parse_args(["/ckpt"])))
    flagged = EngineConfig.from_kwargs("/ckpt", **engine_settings(
        build_parser().parse_args(["/ckpt", "--per-layer-embeddings-on-device"])))
    assert default.per_layer_embeddings_on_device is False and default.dtype == "auto"
    assert flagged.per_layer_embeddings_on_device is True
    with pytest.raises(ValueError, match="per_layer_embeddings_on_device"):
        EngineConfig(per_layer_embeddings_on_device="yes")
