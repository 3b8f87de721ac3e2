"""The executor's engine-facing API: input checks, the core's flat arrays, the halves called by hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_harness import PagedSim, Row, executor_from_hf
from tiny import tiny_hf_model


@pytest.fixture(scope="module")
def hf():
    return tiny_hf_model(seed=2)


def _batch(ex, **kw):
    sim = PagedSim(ex, 8, 32)
    g = torch.Generator().manual_seed(0)
    sim.add("a", torch.randint(0, 512, (30,), generator=g).tolist())
    sim.add("b", torch.randint(0, 512, (12,), generator=g).tolist())
    batch, _, _ = sim.step([Row("a", 30, 1), Row("b", 12, 2)], **kw)
    return sim, batch


@pytest.mark.locked_rounding  # bit-identity across two call paths rests on the locked build
def test_halves_called_by_hand_as_documented_give_execute_logits(hf):
    """The recipe in executor.py's docstring (what CUDA-graph capture wraps) equals ``execute``."""
    ex = executor_from_hf(hf)
    sim, batch = _batch(ex, pad_tokens=2, pad_cross=1)
    expected = ex.execute(batch)
    ex.allocate_kv(32, 8)  # fresh cache: the same writes happen again
    with torch.inference_mode():
        step = ex.prepare(batch)
        assert step.cross_meta is not None and step.cross_indices.shape[0] == 4  # 3 real + 1 padding
        hidden, ple = ex.model.self_decoder(step.input_ids, step.positions, ex.kv_caches, ex.backend, step.self_meta)
        assert hidden.shape == (44, 4, 128) and ple.shape == (44, 10, 32)
        h = ex.model.cross_decoder(hidden[step.cross_indices], ple[step.cross_indices], step.cross_positions,
                                   ex.kv_caches, ex.backend, step.cross_meta)
        logits = ex.model.compute_logits(h)[: step.num_cross]
    assert torch.equal(logits, expected)


def test_flat_group_major_slot_mapping_from_the_core_is_accepted(hf):
    ex = executor_from_hf(hf)
    _, batch = _batch(ex)
    expected = ex.execute(batch)
    ex.allocate_kv(32, 8)
    flat = dataclasses.replace(batch, slot_mapping=batch.slot_mapping.reshape(-1).clone(),
                               cross_indices=batch.cross_indices.to(torch.int32),
                               input_ids=batch.input_ids.to(torch.int32))
    assert torch.equal(ex.execute(flat), expected)


def test_malformed_batches_are_refused_with_the_field_named(hf):
    ex = executor_from_hf(hf)
    _, batch = _batch(ex)
    with pytest.raises(ValueError, match=r"slot_mapping has shape \[1, 42\]; expected \[2, 42\]"):
        ex.execute(dataclasses.replace(batch, slot_mapping=batch.slot_mapping[:1]))
    with pytest.raises(ValueError, match="block_tables has 1 groups; the model has 2"):
        ex.execute(dataclasses.replace(batch, block_tables=batch.block_tables[:1]))
    with pytest.raises(ValueError, match="positions has 41 entries; input_ids has 42"):
        ex.execute(dataclasses.replace(batch, positions=batch.positions[:-1]))
    with pytest.raises(ValueError, match=r"num_cross=9 not in \[0, len\(cross_indices\)=3\]"):
        ex.execute(dataclasses.replace(batch, num_cross=9))
    ex.kv_caches = []
    with pytest.raises(RuntimeError, match="call allocate_kv"):
        ex.execute(batch)
