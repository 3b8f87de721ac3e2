"""The equivalence matrix (float32, CPU, greedy, tiny Gemma 3n with a 16-token sliding window): the
generated tokens are identical across fast prefill on/off; prefix caching off / full-block / sub-block
(two sizes); a token budget that forces chunked prefill or not; a KV pool that forces preemption or not;
requests submitted together or one per step. Each run also proves its feature was exercised (chunks,
preemptions, prefix hits, sub-block copies) and that the pool drains. Every run covers the full
product of the dimensions (64 combinations, ~35 s)."""

import itertools

import numpy as np
import pytest

from engine_util import assert_pool_drained, greedy, tiny_model_dir
from yoco_rs import Engine, SamplingParams

CACHING = {
    "off": dict(enable_prefix_caching=False, block_size=16),
    "full": dict(enable_prefix_caching=True, block_size=16, sub_block_size=16),
    "sub4": dict(enable_prefix_caching=True, block_size=16, sub_block_size=4),
    "sub8": dict(enable_prefix_caching=True, block_size=16, sub_block_size=8),
}
BUDGET = {"chunked": 16, "large": 1024}
POOL = {"small": 6, "large": 400}
FAST = {"fast": True, "slow": False}
SUBMIT = ("together", "staggered")
COMBOS = list(itertools.product(FAST, CACHING, BUDGET, POOL, SUBMIT))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny16")), seed=3, sliding_window=16)


def workload(seed: int = 0):
    """(key, prompt, max_tokens) of phase 1, and the follow-up turns of phase 2 as functions of phase-1
    outputs. Shared prefixes end before, at and after sub-block (4, 8) and block (16) boundaries."""
    rng = np.random.default_rng(seed)
    shared = [2] + rng.integers(10, 2048, size=60).tolist()
    reqs = []
    for L in (7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 47):
        suffix = rng.integers(10, 2048, size=int(rng.integers(1, 12))).tolist()
        reqs.append((f"pfx{L}", shared[:L] + suffix, int(rng.integers(4, 16))))
    for i in range(4):
        reqs.append((f"rand{i}", [2] + rng.integers(10, 2048, size=int(rng.integers(3, 50))).tolist(), 16))
    burst = shared[:40] + [77, 78]
    for i in range(4):
        reqs.append((f"burst{i}", burst, 6))
    turns = {}
    for key in ("pfx16", "pfx33", "rand1"):
        new_turn = [5, 4] + rng.integers(10, 2048, size=int(rng.integers(3, 10))).tolist()
        turns[f"{key}-turn2"] = (key, new_turn, 5)
    return reqs, turns


def run(model_dir, fast, caching, budget, pool, submit):
    eng = Engine(model_dir, kv_sharing_fast_prefill=FAST[fast], max_num_batched_tokens=BUDGET[budget],
                 num_gpu_blocks_override=POOL[pool], max_num_seqs=8, max_model_len=96, **CACHING[caching])
    reqs, turns = workload()
    results = {}

    def drive(items):
        finals = {}
        pending = list(items)
        while pending or eng.has_unfinished_requests():
            if pending:
                batch = pending if submit == "together" else pending[:1]
                for key, prompt, mt in batch:
                    eng.add_request(key, prompt, greedy(mt))
                pending = [] if submit == "together" else pending[1:]
            for out in eng.step():
                if out.finished:
                    finals[out.request_id] = out
        return finals

    finals = drive(reqs)
    results.update({k: (o.outputs[0].token_ids, o.num_cached_tokens) for k, o in finals.items()})
    follow = []
    for key, (src, new_turn, mt) in turns.items():
        prompt = finals[src].prompt_token_ids + finals[src].outputs[0].token_ids + new_turn
        follow.append((key, prompt, mt))
    finals2 = drive(follow)
    results.update({k: (o.outputs[0].token_ids, o.num_cached_tokens) for k, o in finals2.items()})
    m = eng.get_metrics()
    assert_pool_drained(eng)
    eng.close()
    return {k: v[0] for k, v in results.items()}, m


@pytest.fixture(scope="module")
def baseline(model_dir):
    tokens, m = run(model_dir, "slow", "off", "large", "large", "together")
    assert m.num_preemptions == 0 and m.prefix_cache_hits == 0
    assert len(tokens) == 20 + 3
    return tokens


@pytest.mark.parametrize("fast,caching,budget,pool,submit", COMBOS)
def test_greedy_tokens_are_identical_across_configurations(model_dir, baseline, fast, caching, budget, pool, submit):
    tokens, m = run(model_dir, fast, caching, budget, pool, submit)
    for key, ref in baseline.items():
        assert tokens[key] == ref, f"{key} differs under {fast}/{caching}/{budget}/{pool}/{submit}"
    # The features under test were exercised.
    if budget == "chunked":  # prompts up to ~70 tokens ran in steps of at most 16 tokens
        h = m.iteration_tokens
        assert all(c == 0 for le, c in zip(h.buckets + (float("inf"),), h.counts) if le > 20)
    if pool == "small" and submit == "together":
        assert m.num_preemptions > 0
    if caching != "off":
        assert m.prefix_cache_hits > 0
    if caching.startswith("sub"):
        assert m.kv_copies + m.kv_adoptions > 0
    if fast == "fast":
        assert m.cross_rows < m.scheduled_tokens


def test_seeded_sampling_is_the_same_whatever_else_runs(model_dir):
    p = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=12, ignore_eos=True)
    prompt = [2] + list(range(300, 330))
    alone = Engine(model_dir, num_gpu_blocks_override=200, max_model_len=128)
    ref = alone.generate([prompt], p, use_tqdm=False)[0].outputs[0]
    crowd = Engine(model_dir, num_gpu_blocks_override=200, max_model_len=128, max_num_batched_tokens=24)
    rng = np.random.default_rng(5)
    for i in range(5):
        crowd.add_request(f"other{i}", [2] + rng.integers(10, 2048, size=20).tolist(),
                          SamplingParams(temperature=1.0, seed=i, max_tokens=15, ignore_eos=True))
    crowd.step()
    crowd.add_request("target", prompt, p)
    got = None
    while crowd.has_unfinished_requests():
        for o in crowd.step():
            if o.request_id == "target" and o.finished:
                got = o.outputs[0]
    assert got.token_ids == ref.token_ids and got.text == ref.text


def test_n_siblings_share_the_prompt_blocks(model_dir):
    eng = Engine(model_dir, num_gpu_blocks_override=200, max_model_len=128, block_size=16, sub_block_size=16)
    prompt = [2] + list(range(500, 563))  # 64 tokens: 3 full blocks reusable (the last token is recomputed)
    out = eng.generate([prompt], SamplingParams(n=4, temperature=0.0, max_tokens=4, ignore_eos=True),
                       use_tqdm=False)[0]
    m = eng.get_metrics()
    assert len({tuple(o.token_ids) for o in out.outputs}) == 1  # greedy siblings agree
    assert m.prefix_cache_hits == 3 * 48
    # Each completion is its own sequence and counts its prompt (the server's figure); only the first
    # computes it: the siblings wait for it (``after``) and recompute only its last partial block.
    assert m.prompt_tokens == 4 * 64 and m.scheduled_tokens == 64 + 3 * 16 + 4 * 3
    assert_pool_drained(eng)


def test_prompt_logprobs_are_exact_with_fast_prefill_and_prefix_caching(model_dir):
    prompt = [2] + list(range(700, 760))
    res = []
    for fast in (True, False):
        eng = Engine(model_dir, kv_sharing_fast_prefill=fast, num_gpu_blocks_override=200, max_model_len=128,
                     max_num_batched_tokens=24)
        eng.generate([prompt], greedy(3), use_tqdm=False)  # caches the prompt
        out = eng.generate([prompt], greedy(3, prompt_logprobs=2), use_tqdm=False)[0]
        res.append([None] + [{t: round(lp.logprob, 4) for t, lp in d.items()} for d in out.prompt_logprobs[1:]])
        assert_pool_drained(eng)
    assert res[0] == res[1]
