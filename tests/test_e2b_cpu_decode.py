"""``batch_invariant=False``: CPU steps of 1-3 tokens run unpadded (BLAS GEMV), the fp32 decode fast path
at real size; greedy output stays transformers' (checked on the tiny model; at E2B's size the saving is
in ``benches/RESULTS.md``)."""

from __future__ import annotations

import json
import os

import torch
from tiny import tiny_hf_model

from yoco_rs import Engine, SamplingParams, bundled

PROMPTS = [[2, 17, 300, 41, 5], [2] + list(range(100, 140))]


def test_unpadded_cpu_decode_gives_the_padded_greedy_tokens(tmp_path):
    hf = tiny_hf_model(seed=6)
    hf.save_pretrained(tmp_path)
    assert json.load(open(os.path.join(tmp_path, "config.json"))).get("dtype") == "float32"
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    tok = bundled.default_model_dir()
    runs = {}
    for inv in (True, False):
        eng = Engine(str(tmp_path), tokenizer=tok, kv_cache_memory=8 << 20, batch_invariant=inv)
        assert eng._exec.min_rows == (4 if inv else 1)
        runs[inv] = [list(o.outputs[0].token_ids) for o in eng.generate(PROMPTS, params, use_tqdm=False)]
    with torch.no_grad():
        ref = [hf.generate(torch.tensor([p]), max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, len(p):].tolist()
               for p in PROMPTS]
    assert runs[True] == ref
    assert runs[False] == ref
