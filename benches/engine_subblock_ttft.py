"""Sub-block prefix caching, the worked example of DESIGN.md section 1: 4096-token blocks, 128-token
sub-blocks, a cached 3000-token prefix, then prompts of that prefix + 100 new tokens. Time to first
token of the new prompts with sub-block caching vs full-block-only caching vs no caching, in one run,
with the prompt tokens each had to recompute (prompt length minus ``num_cached_tokens``).

Expected: sub-block caching reuses 23 x 128 = 2944 tokens and computes 156 (56 of the prefix + the 100
new); a 4096-token block never fills with 3000 tokens, so full-block-only caching and no caching both
compute all 3100.

    OMP_NUM_THREADS=1 .venv/bin/python benches/engine_subblock_ttft.py [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from yoco_rs import Engine, SamplingParams

MODES = {
    "sub-block 128": dict(enable_prefix_caching=True, sub_block_size=128),
    "full-block only": dict(enable_prefix_caching=True, sub_block_size=4096),
    "no caching": dict(enable_prefix_caching=False),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    prefix = [2] + rng.integers(10, 2048, size=2999).tolist()
    one = SamplingParams(temperature=0.0, max_tokens=1)
    engines = {name: Engine(block_size=4096, max_model_len=8192, max_num_batched_tokens=4096,
                            num_gpu_blocks_override=8, **kw) for name, kw in MODES.items()}
    for e in engines.values():
        e.generate([prefix], one, use_tqdm=False)  # cache the prefix (and warm up)
    ttft = {n: [] for n in MODES}
    computed = {}
    for rep in range(args.reps):
        suffix = rng.integers(10, 2048, size=100).tolist()
        for name, e in engines.items():  # same prompt in every mode, modes interleaved
            t = time.perf_counter()
            out = e.generate([prefix + suffix], one, use_tqdm=False)[0]
            ttft[name].append(time.perf_counter() - t)
            computed[name] = len(out.prompt_token_ids) - out.num_cached_tokens
    base = statistics.median(ttft["no caching"])
    print("| caching | tokens recomputed of 3100 | TTFT median (s) | min .. max (s) | vs no caching |")
    print("|---|---|---|---|---|")
    for name in MODES:
        med = statistics.median(ttft[name])
        print(f"| {name} | {computed[name]} | {med:.3f} | {min(ttft[name]):.3f} .. {max(ttft[name]):.3f} | "
              f"{med / base:.2f}x |")
    m = engines["sub-block 128"].get_metrics()
    print(f"sub-block engine: {m.kv_copies} copies / {m.kv_adoptions} adoptions, {m.kv_copied_tokens} tokens copied")


if __name__ == "__main__":
    main()
