"""Helpers for engine tests: tiny checkpoints on disk and a workload driver."""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import numpy as np
import torch

from yoco_rs import Engine, SamplingParams, bundled


def tiny_model_dir(path: str, seed: int = 0, **over) -> str:
    """A randomized tiny Gemma 3n (tests/tiny.py, vocabulary 4096 like the bundled tokenizer's, sliding
    window 16 unless overridden) saved in HF layout, with the bundled tokenizer and chat template and a
    generation config without sampling defaults (requests get vLLM's own)."""
    from tiny import randomize, tiny_config
    from transformers import Gemma3nForCausalLM

    kw = dict(vocab_size=4096, vocab_size_per_layer_input=3840, max_position_embeddings=4096)
    kw.update(over)
    torch.manual_seed(seed)
    model = randomize(Gemma3nForCausalLM(tiny_config(**kw)).eval(), seed=seed)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(bundled._SRC / name, os.path.join(path, name))
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 5], "pad_token_id": 0}, f)
    return path


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def run_until_done(engine: Engine, max_steps: int = 100000) -> dict:
    """Steps until idle; returns request_id -> final RequestOutput."""
    finals = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return finals
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    raise AssertionError("engine did not drain")


def assert_pool_drained(engine: Engine) -> None:
    """After a workload: no referenced block, structural invariants hold."""
    engine.check_invariants()
    m = engine.get_metrics()
    assert m.kv_blocks_used == 0, m
    assert m.num_requests_running == 0 and m.num_requests_waiting == 0


def random_prompts(rng: np.random.Generator, n: int, lo: int, hi: int, vocab: int = 2048) -> list[list[int]]:
    return [[2] + rng.integers(10, vocab, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]
