"""Throughput of ``Engine.generate`` vs Hugging Face transformers' batched ``generate`` on the CPU.

Same model (the bundled ``yoco-tiny``, a Gemma 3n-architecture checkpoint in HF layout, float32), same
prompts (64 prompts of 64-512 random tokens), 64 new tokens each, greedy, one thread. transformers gets
the prompts as one left-padded batch (its fastest offline mode) with its KV cache; yoco-rs gets them as
a list (continuous batching, paged KV, fast prefill). Both are forced to produce exactly 64 tokens
(``min_new_tokens`` / ``min_tokens``). Target: >= 3x tokens/s. The greedy tokens are compared too.

    OMP_NUM_THREADS=1 .venv/bin/python benches/engine_throughput.py [--prompts 64] [--new 64] [--reps 3]

Repetitions alternate the two engines (noise on a shared machine hits both); times are medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from yoco_rs import Engine, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--hf-batch", type=int, default=64, help="transformers batch size (64: all at once)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    prompts = [[2] + rng.integers(10, 2048, size=int(rng.integers(63, 512))).tolist() for _ in range(args.prompts)]
    n_new = args.new

    eng = Engine(max_model_len=1024, max_num_seqs=64, max_num_batched_tokens=8192,
                 kv_cache_memory=256 << 20, enable_prefix_caching=False)  # repeated runs must not hit the cache
    params = SamplingParams(temperature=0.0, max_tokens=n_new, min_tokens=n_new)
    eng.generate([[2, 3, 4], [2, 5, 6]], params, use_tqdm=False)  # warm-up

    from transformers import Gemma3nForCausalLM

    hf = Gemma3nForCausalLM.from_pretrained(eng.config.model, dtype=torch.float32).eval()
    hf.generation_config.pad_token_id = 0

    def run_hf():
        out = []
        for i in range(0, len(prompts), args.hf_batch):
            chunk = prompts[i:i + args.hf_batch]
            width = max(map(len, chunk))
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for j, p in enumerate(chunk):
                ids[j, width - len(p):] = torch.tensor(p)
                mask[j, width - len(p):] = 1
            with torch.no_grad():
                gen = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n_new,
                                  min_new_tokens=n_new)
            out += gen[:, width:].tolist()
        return out

    # Alternate the two so machine noise hits both; report medians.
    t_yoco, t_hf = [], []
    for _ in range(args.reps):
        t = time.perf_counter()
        outs = eng.generate(prompts, params, use_tqdm=False)
        t_yoco.append(time.perf_counter() - t)
        t = time.perf_counter()
        hf_out = run_hf()
        t_hf.append(time.perf_counter() - t)
    t_yoco, t_hf = statistics.median(t_yoco), statistics.median(t_hf)
    yoco_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    hf_tokens = sum(len(x) for x in hf_out)
    same = sum(o.outputs[0].token_ids == h for o, h in zip(outs, hf_out))
    print(f"prompts {len(prompts)} (mean {np.mean([len(p) for p in prompts]):.0f} tokens), {n_new} new tokens each")
    print(f"yoco-rs Engine.generate : {t_yoco:7.2f} s  {yoco_tokens / t_yoco:8.1f} tok/s")
    print(f"transformers generate   : {t_hf:7.2f} s  {hf_tokens / t_hf:8.1f} tok/s")
    print(f"speedup {t_hf / t_yoco:.2f}x; identical greedy outputs {same}/{len(prompts)} "
          "(left padding changes transformers' numerics slightly)")


if __name__ == "__main__":
    main()
