"""The graph runner with the Triton backend, in replay mode under Triton's interpreter: metadata objects
are built once per (half, size) over the static buffers and reused on every later step, exactly as a
captured graph reuses them, so this checks that everything a step changes flows through the buffers.
The oracle is the executor's eager path on the torch reference backend."""

from __future__ import annotations

import random

import pytest
import torch
from paged_cases import DEV  # sets TRITON_INTERPRET before the kernels are imported
from graph_fakes import Pair
from step_plans import Req

from yoco_rs.executor.cuda_graphs import GraphConfig
from yoco_rs.kernels.backend import TritonAttentionBackend


def _pair(fast_prefill=True, mode="replay"):
    cfg = GraphConfig(token_sizes=(4, 16), decode_sizes=(2, 4), cross_sizes=(2, 4), max_num_seqs=4,
                      max_blocks_per_seq=8, fast_prefill=fast_prefill)
    return Pair(cfg, backend=TritonAttentionBackend(), device=DEV, mode=mode)


def _req(rng, n, **kw):
    return Req(tokens=[rng.randrange(1, 61) for _ in range(n)], prompt_len=n, max_new=8, **kw)


@pytest.mark.parametrize("mode", ["replay", pytest.param("graphs", marks=pytest.mark.skipif(
    DEV != "cuda", reason="CUDA graph capture needs a GPU"))])
def test_static_metadata_is_reused_across_steps_of_every_kind(mode):
    rng = random.Random(0)
    p = _pair(mode=mode)
    a, b, c = _req(rng, 7, prompt_logprobs=2), _req(rng, 3), _req(rng, 14)
    p.step([a, b], [7, 3])  # mixed, 10 -> 16; cross 3 + 1 rows -> 4 (prompt-logprob trailing rows)
    assert p.runner.stats.history[-1] == ("mixed", 16, 4)
    p.step([a, b], [1, 1])  # decode 2
    p.step([a, b, c], [1, 1, 12])  # mixed with a middle chunk: self 16, cross 2
    assert p.runner.stats.history[-1] == ("mixed", 16, 2)
    p.step([a, b], [1, 1])  # decode 2 again: the cached metadata sees the new contexts
    p.step([a, b, c], [1, 1, 2])  # mixed 4, with c's prompt completing
    assert p.runner.stats.history[-1] == ("mixed", 4, 4)
    p.step([a, b, c], [1, 1, 1])  # decode 3 -> 4 with one padding row
    assert p.runner.stats.history[-1] == ("decode", 4, 4)
    metas = {k: id(g.meta) for k, g in p.runner._self_graphs.items()}
    p.step([a, b, c], [1, 1, 1])
    assert {k: id(g.meta) for k, g in p.runner._self_graphs.items()} == metas  # reused, not rebuilt
    if mode == "graphs":
        assert p.runner.capture_seconds > 0 and all(g.graph is not None for g in p.runner._self_graphs.values())


@pytest.mark.parametrize("mode", ["replay", pytest.param("graphs", marks=pytest.mark.skipif(
    DEV != "cuda", reason="CUDA graph capture needs a GPU"))])
def test_fast_prefill_off_with_static_metadata(mode):
    rng = random.Random(1)
    p = _pair(fast_prefill=False, mode=mode)
    a, b = _req(rng, 9), _req(rng, 2)
    p.step([a, b], [9, 2])
    p.step([a, b], [1, 1])
    p.step([a, b], [1, 1])
    assert p.runner.stats.history[-1] == ("decode", 2, 2)
    assert torch.isfinite(p.runner.stats.padded_hidden).all()


def test_capture_rehearsal_with_the_triton_kernels():
    """Every half at every size, on its capture layout, through the real kernels (interpreter on a CPU)."""
    p = _pair()
    p.runner.capture(progress=False)
    rng = random.Random(2)
    a = _req(rng, 5)
    p.step([a], [5])
    p.step([a], [1])
