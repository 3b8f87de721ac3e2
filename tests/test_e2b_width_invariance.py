"""Batch invariance at E2B's real width (hidden 2048, MLP 8192, per-layer inputs 256, 8 query heads and 2
KV heads of 256), on a 3-layer model (two producers, one KV-sharing layer): every projection sums 2048 or
8192 terms in MKL's blocks, which is where 1-row steps used to round differently (``executor/cpu_linear``).

Without padding, a token's logits are bit-identical whether it is decoded alone, decoded next to other
rows, prefilled as part of a chunk, or computed with fast prefill off; and they match transformers'
whole-sequence forward (the same GEMM order: 0.0 under the locked build). Both with the kernel and as on a
CPU without it (GEMMs under 4 rows padded in torch: the same guarantees). ~1.5 GB, ~20 s each."""

from __future__ import annotations

import pytest
import torch
from model_harness import CoreWithoutKernel, PagedSim, Row, executor_from_hf
from numerics import hf_tol
from tiny import tiny_hf_model

pytestmark = pytest.mark.locked_rounding

E2B_WIDTH = dict(
    hidden_size=2048, intermediate_size=8192, hidden_size_per_layer_input=256, laurel_rank=64,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256, num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "full_attention"], num_kv_shared_layers=1,
    activation_sparsity_pattern=[0.95, 0.0, 0.0], sliding_window=32,
)


@pytest.fixture(scope="module")
def hf():
    return tiny_hf_model(seed=11, **E2B_WIDTH)


@pytest.fixture(params=["kernel", "no-kernel"])
def kernel(request, monkeypatch):
    """The row-invariant linear with its kernel (where the CPU has it) and as on a CPU without AVX2/FMA
    (every GEMM under 4 rows padded in torch): the guarantees are the same either way."""
    from yoco_rs.executor import cpu_linear

    if request.param == "no-kernel":
        monkeypatch.setattr(cpu_linear, "_core", lambda: CoreWithoutKernel)
    elif not cpu_linear._core().cpu_linear_available():
        pytest.skip("the CPU linear kernel needs AVX2 and FMA (the no-kernel case runs)")
    return request.param


def _tokens(seed: int, n: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _logits(ex, steps) -> dict:
    """Runs ``steps`` (lists of ``(rid, tokens, num_tokens, num_cross)``); ``{(rid, position): logits}``."""
    sim = PagedSim(ex, 16, 64, seed=3)
    out = {}
    for rows in steps:
        for rid, toks, _, _ in rows:
            if rid not in sim.reqs:
                sim.add(rid, toks)
        batch, _, cross = sim.step([Row(rid, n, x) for rid, _, n, x in rows])
        with torch.inference_mode():
            logits = ex.execute(batch)
        out.update({key: logits[i] for i, key in enumerate(cross)})
    return out


def test_a_token_rounds_the_same_decoded_alone_batched_prefilled_and_with_fast_prefill_off(hf, kernel):
    a, b = _tokens(1, 50), _tokens(2, 45)
    fast = executor_from_hf(hf, kv_sharing_fast_prefill=True)
    assert fast.linear.kernel == (kernel == "kernel")
    # a: 40-token prefill, then 10 one-row decode steps
    alone = _logits(fast, [[("a", a, 40, 1)]] + [[("a", a, 1, 1)]] * 10)
    # a decoded next to b (2-row steps), then the same positions as one prefill chunk sampling every token
    batched = _logits(fast, [[("a", a, 40, 1), ("b", b, 30, 1)]] + [[("a", a, 1, 1), ("b", b, 1, 1)]] * 10)
    chunked = _logits(fast, [[("a", a, 39, 0)], [("a", a, 11, 11)]])
    full = _logits(executor_from_hf(hf, kv_sharing_fast_prefill=False), [[("a", a, 50, 11)]])
    for p in range(39, 50):
        key = ("a", p)
        assert torch.equal(alone[key], batched[key]), p
        assert torch.equal(alone[key], chunked[key]), p
        assert torch.equal(alone[key], full[key]), p
    with torch.no_grad():
        ref = hf(torch.tensor([a])).logits[0].float()
    diff = max((alone[("a", p)] - ref[p]).abs().max().item() for p in range(39, 50))
    assert diff <= hf_tol(3, 2048, 30.0), diff
