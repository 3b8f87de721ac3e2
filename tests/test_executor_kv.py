"""Layer description, KV groups, copy ops and pool sizing."""

from __future__ import annotations

import pytest
import torch
from tiny import E2B_DEPTH, tiny_config

from yoco_rs.executor.kv_cache import KVGroupSpec, allocate_kv, apply_kv_copies, kv_group_specs, plan_kv_pools
from yoco_rs.models.gemma3n.config import ConfigError, Gemma3nTextArgs, kv_slices


def _args(**over) -> Gemma3nTextArgs:
    return Gemma3nTextArgs.from_dict(tiny_config(**over).to_dict())


def test_e2b_depth_layer_kinds_resolve_donors_from_the_config():
    args = _args(**E2B_DEPTH)
    kinds = args.layer_kinds()
    assert kinds[:5] == ["sliding:16"] * 4 + ["full"]
    assert kinds[18:20] == ["sliding:16", "full"]
    assert kinds[20:] == (["shared:18"] * 4 + ["shared:19"]) * 2
    groups = kv_group_specs(args, torch.float32)
    assert [g.kind for g in groups] == ["sliding", "full"]  # group 0 = the type of layer 0
    assert groups[0].layers == tuple(i for i in range(20) if (i + 1) % 5)
    assert groups[1].layers == (4, 9, 14, 19)
    assert groups[0].readers == tuple((i, 18) for i in range(20, 30) if (i + 1) % 5)
    assert groups[1].readers == ((24, 19), (29, 19))
    sl = kv_slices(args)
    assert sl[18] == (0, 15) and sl[19] == (1, 3) and sl[20] == (0, 15) and sl[29] == (1, 3)


def test_donor_is_the_last_layer_of_its_type_before_the_shared_range():
    # full layers at 1 and 3, sliding elsewhere; layers 4..5 share: 4 (sliding) <- 2, 5 (full) <- 3
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
             "sliding_attention", "full_attention"]
    args = _args(num_hidden_layers=6, layer_types=types, num_kv_shared_layers=2,
                 activation_sparsity_pattern=[0.0] * 6)
    assert args.layer_kinds() == ["sliding:16", "full", "sliding:16", "full", "shared:2", "shared:3"]


def test_shared_layer_without_a_donor_of_its_type_is_rejected():
    with pytest.raises(ConfigError, match=r"layer 4 \(full_attention\) shares KV .* no layer before layer 4"):
        Gemma3nTextArgs.from_dict({**tiny_config().to_dict(), "num_kv_shared_layers": 6})


@pytest.mark.parametrize("field,value,match", [
    ("layer_types", ["sliding_attention"] * 9 + ["local"], r"layer_types\[9\]='local'"),
    ("activation_sparsity_pattern", [0.0] * 3, "activation_sparsity_pattern has 3 values"),
    ("altup_active_idx", 1, "altup_active_idx=1"),
    ("num_kv_shared_layers", 10, "num_kv_shared_layers=10"),
    ("intermediate_size", [256] * 3, "intermediate_size has 3 values"),
    ("rope_parameters", {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_type='yarn'"),
])
def test_bad_config_fields_are_named(field, value, match):
    with pytest.raises(ConfigError, match=match):
        Gemma3nTextArgs.from_dict({**tiny_config().to_dict(), field: value})


def test_legacy_rope_keys_and_defaults_are_converted():
    d = {"num_hidden_layers": 10, "num_kv_shared_layers": 5, "rope_theta": 5e5, "rope_local_base_freq": 2e4,
         "intermediate_size": 64}
    args = Gemma3nTextArgs.from_dict(d)
    assert args.rope_theta == {"full_attention": 5e5, "sliding_attention": 2e4}
    assert args.intermediate_size == (64,) * 10
    assert args.layer_types[4] == "full_attention" and args.layer_types[3] == "sliding_attention"
    assert args.activation_sparsity_pattern == (0.0,) * 10  # sparsity only when there are more than 10 layers


def test_kv_copies_copy_the_leading_tokens_of_a_block_in_every_layer_of_the_group():
    spec = KVGroupSpec("full", None, (0, 1, 2), (), 2, 4, torch.float32)
    other = KVGroupSpec("sliding", 8, (3,), (), 2, 4, torch.float32)
    caches = allocate_kv([other, spec], 6, 4, "cpu")
    for c in caches:
        c.copy_(torch.randn(c.shape))
    before = [c.clone() for c in caches]
    apply_kv_copies(caches, torch.tensor([[1, 2, 5, 3], [1, 4, 1, 4]], dtype=torch.int32))
    g = caches[1]
    assert torch.equal(g[:, :, 5, :3], before[1][:, :, 2, :3])
    assert torch.equal(g[:, :, 5, 3:], before[1][:, :, 5, 3:])  # beyond num_tokens: untouched
    assert torch.equal(g[:, :, 1], before[1][:, :, 4])
    untouched = [0, 2, 3, 4]
    assert torch.equal(g[:, :, untouched], before[1][:, :, untouched])
    assert torch.equal(caches[0], before[0])  # the other group: untouched


def test_kv_copy_with_an_out_of_range_block_is_refused():
    caches = allocate_kv([KVGroupSpec("full", None, (0,), (), 1, 2, torch.float32)], 4, 2, "cpu")
    with pytest.raises(ValueError, match=r"dst block ids \[9\] out of range \[0, 4\)"):
        apply_kv_copies(caches, torch.tensor([[0, 1, 9, 2]]))
    with pytest.raises(ValueError, match="group 3"):
        apply_kv_copies(caches, torch.tensor([[3, 1, 2, 2]]))


def test_pool_plan_fits_the_budget_and_says_how_many_tokens_fit():
    args = _args(**E2B_DEPTH)
    specs = kv_group_specs(args, torch.float32)
    bs = 16
    per_block = [s.bytes_per_block(bs) for s in specs]
    assert per_block == [16 * 2 * bs * 2 * 32 * 4, 4 * 2 * bs * 2 * 32 * 4]
    budget = 100 * sum(per_block) + 123
    plan = plan_kv_pools(specs, bs, budget)
    assert plan.num_blocks == [100, 100] and plan.max_tokens == 99 * bs
    assert plan.total_bytes <= budget
    assert "1,584 tokens fit" in plan.summary(specs)
    # with the scheduler limits known, the sliding group is capped at what its windows reach
    capped = plan_kv_pools(specs, bs, budget, max_num_seqs=2, max_num_batched_tokens=32)
    cap = 2 * (-(-(16 - 1 + 32) // bs) + 1) + 1
    assert capped.num_blocks[0] == cap and capped.num_blocks[1] > 100 and capped.total_bytes <= budget
    with pytest.raises(ValueError, match="fewer than 2 blocks"):
        plan_kv_pools(specs, bs, sum(per_block))
