"""Fast prefill (YOCO): the cross-decoder runs on the selected rows only, with the same logits and the same
KV as the full path."""

from __future__ import annotations

import pytest
import torch
from model_harness import PagedSim, Row, executor_from_hf
from tiny import E2B_DEPTH, tiny_hf_model

CONFIGS = {"tiny10": {}, "e2b30": E2B_DEPTH}


@pytest.fixture(scope="module", params=list(CONFIGS))
def hf(request):
    return tiny_hf_model(seed=1, **CONFIGS[request.param])


def _tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _schedule(sim: PagedSim):
    """A fixed sequence of steps: prefill chunks, decodes, a prompt-logprob row, a copy op, padding."""
    sim.add("a", _tokens(1, 60))
    sim.add("b", _tokens(2, 50))
    sim.add("c", _tokens(3, 30))
    sim.add("d", sim.reqs["a"].tokens[:11] + _tokens(4, 20))
    yield sim.step([Row("a", 37, 1), Row("b", 20, 0)], pad_tokens=5, pad_cross=3)
    yield sim.step([Row("a", 1, 1), Row("b", 25, 25), Row("c", 9, 0)])
    copies = sim.share_prefix("d", "a", 11)
    yield sim.step([Row("a", 1, 1), Row("b", 1, 1), Row("c", 21, 1), Row("d", 15, 2)], copies=copies,
                   null_out_of_window=True)
    yield sim.step([Row("d", 3, 0)])  # a step where nothing samples
    yield sim.step([Row("a", 1, 1), Row("d", 2, 1)], pad_tokens=2, pad_cross=1, null_out_of_window=True)


def test_fast_prefill_gives_the_full_path_logits_and_kv(hf):
    fast = executor_from_hf(hf, kv_sharing_fast_prefill=True)
    full = executor_from_hf(hf, kv_sharing_fast_prefill=False)
    sim_fast, sim_full = PagedSim(fast, 8, 64, seed=3), PagedSim(full, 8, 64, seed=3)
    for (b1, _, cross1), (b2, _, _) in zip(_schedule(sim_fast), _schedule(sim_full)):
        l1, l2 = fast.execute(b1), full.execute(b2)
        assert l1.shape == l2.shape == (len(cross1), hf.config.vocab_size)
        if len(cross1):
            assert (l1 - l2).abs().max().item() <= 1e-5
        for k1, k2 in zip(fast.kv_caches, full.kv_caches):
            assert torch.equal(k1, k2), "the self-decoder must write the same KV with fast prefill on or off"


def test_cross_decoder_sees_only_the_selected_rows(hf):
    """The feature itself: in fast mode the shared layers run on X_pad rows, not on all T tokens."""
    first_shared = hf.config.num_hidden_layers - hf.config.num_kv_shared_layers
    rows_seen: dict[bool, list[int]] = {}
    for fast_on in (True, False):
        ex = executor_from_hf(hf, kv_sharing_fast_prefill=fast_on)
        seen = rows_seen.setdefault(fast_on, [])
        ex.model.layers[first_shared].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))
        ex.model.layers[first_shared - 1].register_forward_pre_hook(lambda _m, args: seen.append(-args[0].shape[0]))
        sim = PagedSim(ex, 8, 64)
        sim.add("a", _tokens(5, 48))
        sim.add("b", _tokens(6, 20))
        batch, _, _ = sim.step([Row("a", 48, 1), Row("b", 20, 2)])
        ex.execute(batch)
    # self-decoder: all 68 tokens both ways; cross-decoder: the 3 selected rows vs 68
    assert rows_seen[True] == [-68, 3]
    assert rows_seen[False] == [-68, 68]


def test_step_without_sampling_rows_writes_kv_and_returns_no_logits(hf):
    ex = executor_from_hf(hf)
    sim = PagedSim(ex, 8, 32)
    sim.add("a", _tokens(7, 40))
    batch, _, _ = sim.step([Row("a", 24, 0)])
    before = [k.clone() for k in ex.kv_caches]
    logits = ex.execute(batch)
    assert logits.shape == (0, hf.config.vocab_size)
    assert all(not torch.equal(a, b) for a, b in zip(before, ex.kv_caches))
