"""CPU decode steps are not padded: the row-invariant linear (``executor/cpu_linear.py``) gives a 1-row
step the values of a 4-row GEMM, so the executor runs 1-3-token steps as they are, and greedy output is
transformers' with ``batch_invariant`` on (the row-invariant kernel) and off (plain ``F.linear``)."""

from __future__ import annotations

import json
import os

import torch
from tiny import tiny_hf_model

from yoco_rs import Engine, SamplingParams, bundled
from yoco_rs.executor.cpu_linear import RowInvariantLinear

PROMPTS = [[2, 17, 300, 41, 5], [2] + list(range(100, 140))]


def test_cpu_decode_steps_run_unpadded_and_give_transformers_greedy_tokens(tmp_path):
    hf = tiny_hf_model(seed=6)
    hf.save_pretrained(tmp_path)
    assert json.load(open(os.path.join(tmp_path, "config.json"))).get("dtype") == "float32"
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    tok = bundled.default_model_dir()
    runs = {}
    for inv in (True, False):
        eng = Engine(str(tmp_path), tokenizer=tok, kv_cache_memory=8 << 20, batch_invariant=inv)
        ex = eng._exec
        assert ex.min_rows == 1
        assert isinstance(ex.linear, RowInvariantLinear) and ex.linear.enabled == inv
        assert ex.model.layers[0].mlp.lin is ex.linear  # every projection goes through it
        rows: list[int] = []
        ex.model.layers[0].register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[0]))
        runs[inv] = [list(o.outputs[0].token_ids) for o in eng.generate(PROMPTS, params, use_tqdm=False)]
        assert min(rows) < 4  # decode steps of fewer than 4 tokens ran as they are
    with torch.no_grad():
        ref = [hf.generate(torch.tensor([p]), max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, len(p):].tolist()
               for p in PROMPTS]
    assert runs[True] == ref
    assert runs[False] == ref
