"""The Triton KV write (through slot_mapping) and sub-block copy kernels match a naive reference, under
Triton's interpreter on the CPU (real kernels on a GPU when one is present)."""

from __future__ import annotations

import pytest
import torch
from paged_cases import DEV  # sets TRITON_INTERPRET before the kernels are imported
from paged_ref import ref_copy_kv, ref_write_kv

from yoco_rs.kernels.kv_copy import copy_kv
from yoco_rs.kernels.kv_write import write_kv



def _cache(num_blocks=6, block_size=4, hkv=2, d=8, layers=None, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shape = ((layers,) if layers else ()) + (2, num_blocks, block_size, hkv, d)
    return torch.randn(shape, generator=g).to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_stores_each_token_at_its_slot(dtype):
    kv = _cache(dtype=dtype)
    g = torch.Generator().manual_seed(1)
    # non-contiguous blocks, a slot in the middle of a block, padding tokens writing into block 0
    slots = torch.tensor([13, 14, 5, 22, 8, 0, 1], dtype=torch.int64)
    k = torch.randn((7, 2, 8), generator=g).to(dtype)
    v = torch.randn((7, 2, 8), generator=g).to(dtype)
    want = ref_write_kv(kv.cpu(), k, v, slots)
    write_kv(kv, k.to(DEV), v.to(DEV), slots.to(DEV))
    assert torch.equal(kv.cpu(), want)


def test_write_kv_uses_only_the_first_t_slots_and_skips_negative_ones():
    kv = _cache(seed=2)
    before = kv.clone()
    k = torch.ones((2, 2, 8), device=DEV)
    slots = torch.tensor([-1, 9, 3, 3], dtype=torch.int64, device=DEV)  # [T_pad] longer than T
    write_kv(kv, k, 2 * k, slots)
    changed = (kv != before).flatten(3).any(-1)  # [2, NB, BS]
    assert changed.nonzero().tolist() == [[0, 2, 1], [1, 2, 1]]  # slot 9 = block 2, offset 1 (K and V)
    assert (kv[1, 2, 1] == 2).all()


def test_write_kv_accepts_strided_k_and_v_from_a_fused_projection():
    kv = _cache(seed=3)
    qkv = torch.randn((3, 3, 2, 8), device=DEV)  # [T, (q,k,v), Hkv, D]
    slots = torch.tensor([4, 5, 17], dtype=torch.int64, device=DEV)
    want = ref_write_kv(kv.cpu(), qkv[:, 1].cpu(), qkv[:, 2].cpu(), slots.cpu())
    write_kv(kv, qkv[:, 1], qkv[:, 2], slots)
    assert torch.equal(kv.cpu(), want)


def test_copy_kv_copies_the_first_n_slots_in_every_layer_of_its_group():
    kv = _cache(num_blocks=8, layers=3, seed=4)
    ops = torch.tensor([[0, 5, 2, 3], [1, 6, 3, 4], [0, 1, 7, 4], [0, 4, 6, 1]], dtype=torch.int32)
    want = ref_copy_kv(kv.cpu(), ops, group=0)
    copy_kv(kv, ops.to(DEV), group=0)
    assert torch.equal(kv.cpu(), want)
    # slot 3 of block 2 was not copied (n = 3), and group 1's op was not applied to group 0
    assert not torch.equal(kv[:, :, 2, 3], kv[:, :, 5, 3])
    assert not torch.equal(kv[:, :, 3], kv[:, :, 6])


def test_copy_kv_with_no_ops_is_a_no_op():
    kv = _cache(layers=2, seed=5)
    before = kv.clone()
    copy_kv(kv, torch.zeros((0, 4), dtype=torch.int32, device=DEV), group=0)
    assert torch.equal(kv, before)


def test_copy_kv_rejects_ops_of_the_wrong_shape():
    kv = _cache(layers=1)
    with pytest.raises(ValueError, match=r"copies must be \[C, 4\]"):
        copy_kv(kv, torch.zeros((2, 3), dtype=torch.int32, device=DEV), group=0)
