"""The executor reproduces transformers 5.24 (eager, float32, randomized tiny models) layer by layer.

Every scenario runs through ``Executor.execute`` on hand-built paged batches (``model_harness.PagedSim``:
shuffled, non-contiguous block ids) and compares each layer's AltUp state and the logits with a
whole-sequence transformers forward, at max abs difference <= 1e-5 under the locked torch build on either
CPU measured (observed: 0.0 on the AMD EPYC and on the Intel Xeon with AVX-512, since the CPU reference
keeps every GEMM at >= ``MIN_GEMM_ROWS`` rows, see ``attention_torch``, and AltUp's predict sums its four
terms as this CPU's batched GEMM does, ``invariance.SMALL_GEMM_FMA``), and within a float32 re-association
bound when torch drifts from ``uv.lock`` (``numerics.hf_tol``); greedy tokens always equal. Fast prefill
on and off.
The 30-layer model runs shorter prompts by default; YOCO_HEAVY=1 gives it the tiny-10L sizes.
"""

from __future__ import annotations

import pytest
import torch
from model_harness import PagedSim, Row, executor_from_hf, hf_reference, max_diff_step
from numerics import assert_same_greedy, hf_tol
from tiny import E2B_DEPTH, tiny_hf_model

CONFIGS = {"tiny10": {}, "e2b30": E2B_DEPTH}


@pytest.fixture(scope="module", params=list(CONFIGS))
def hf(request):
    return tiny_hf_model(seed=0, **CONFIGS[request.param])


def _tokens(seed: int, n: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Checker:
    def __init__(self, hf, fast: bool, block_size: int = 8, num_blocks: int = 160):
        self.hf = hf
        self.ex = executor_from_hf(hf, kv_sharing_fast_prefill=fast)
        self.fast = fast
        self.sim = PagedSim(self.ex, block_size, num_blocks, seed=7)
        self.refs = {}
        self.steps = 0
        cfg = hf.config
        self.tol = hf_tol(cfg.num_hidden_layers, cfg.hidden_size, any_cpu=True)

    def add(self, rid: str, tokens: list[int]) -> None:
        self.sim.add(rid, tokens)
        self.refs[rid] = hf_reference(self.hf, tokens)

    def step(self, rows: list[Row], **kw) -> torch.Tensor:
        batch, tok_info, cross_info = self.sim.step(rows, **kw)
        hidden: list[torch.Tensor] = []
        logits = self.ex.execute(batch, hidden_states=hidden)
        assert logits.shape == (len(cross_info), self.hf.config.vocab_size) and logits.dtype == torch.float32
        assert len(hidden) == self.hf.config.num_hidden_layers
        hd, ld = max_diff_step(self.refs, logits, hidden, tok_info, cross_info, self.ex.args.first_shared, self.fast)
        assert hd <= self.tol, f"step {self.steps}: per-layer hidden states differ by {hd}"
        assert ld <= self.tol, f"step {self.steps}: logits differ by {ld}"
        want = torch.stack([self.refs[rid].logits[p] for rid, p in cross_info])
        assert_same_greedy(logits, want, self.tol)
        self.steps += 1
        return logits


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_full_prefill_matches_transformers_at_every_layer(hf, fast):
    n = 64
    c = Checker(hf, fast)
    c.add("a", _tokens(1, n))
    c.step([Row("a", n, num_cross=n)])  # every position through the cross-decoder: all logits compared
    c.add("b", _tokens(2, n))
    c.step([Row("b", n, num_cross=1)])  # the usual case: only the last token's logits


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_chunked_prefill_across_the_sliding_window_matches_transformers(hf, fast):
    # window 16, block 8: chunks start mid-block and each one sees keys leave the window
    chunks = [20, 13, 17, 30]  # chunk boundaries cross the 16-token sliding window
    c = Checker(hf, fast)
    c.add("a", _tokens(3, sum(chunks)))
    for i, n in enumerate(chunks):
        last = i == len(chunks) - 1
        c.step([Row("a", n, num_cross=1 if last else 2)])  # middle chunks: a couple of rows anyway


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_incremental_decode_matches_transformers(hf, fast):
    prompt, new = 100, 28
    c = Checker(hf, fast)
    c.add("a", _tokens(4, prompt + new))
    c.step([Row("a", prompt, num_cross=1)])
    for _ in range(new):  # the context crosses the 16-token window several times over
        c.step([Row("a", 1, num_cross=1)])


@pytest.mark.parametrize("block_size", [8, 4])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_mixed_batch_of_requests_at_different_stages_matches_transformers(hf, fast, block_size):
    scale = 2
    c = Checker(hf, fast, block_size=block_size, num_blocks=400)
    c.add("dec", _tokens(5, 30 * scale))
    c.add("mid", _tokens(6, 40 * scale))
    c.add("last", _tokens(7, 26 * scale + 4))
    c.add("new", _tokens(8, 20 * scale))
    c.add("logprobs", _tokens(9, 18 * scale))
    shared = c.sim.reqs["dec"].tokens[: 13 * scale]
    c.add("copy", shared + _tokens(10, 9 * scale + 4))
    # earlier steps bring requests to different stages
    c.step([Row("dec", 24 * scale, 1), Row("mid", 10 * scale, 0), Row("last", 14 * scale, 0)])
    c.step([Row("dec", 1, 1)])
    # "copy" reuses dec's first 13*scale tokens: whole blocks shared by id, the partial block copied
    copies = c.sim.share_prefix("copy", "dec", 13 * scale)
    assert copies, "the prefix must end inside a block so that a copy op is exercised"
    rows = [
        Row("dec", 1, 1),                        # decode
        Row("mid", 12 * scale, 0),               # middle prefill chunk: no sampling
        Row("last", 12 * scale, 1),              # last prefill chunk
        Row("new", 20 * scale, 1),               # whole prompt in one chunk
        Row("logprobs", 18 * scale, 18 * scale),  # prompt logprobs: every row selected
        Row("copy", 9 * scale, 1),               # rest of a prompt after a copied prefix
    ]
    c.step(rows, copies=copies, pad_tokens=3, pad_cross=2, null_out_of_window=True)
    c.step([Row("mid", 2, 1), Row("dec", 1, 1), Row("copy", 1, 1), Row("last", 1, 1)], null_out_of_window=True)
