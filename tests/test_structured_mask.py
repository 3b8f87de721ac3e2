"""The grammar bitmask applied to logits: the torch op (CPU) and the Triton kernel (GPU; checked under
Triton's interpreter on the CPU) set exactly the disallowed tokens of exactly the masked rows to -inf,
and agree bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from paged_cases import DEV  # sets TRITON_INTERPRET before the kernels are imported

from yoco_rs.executor.grammar_mask import apply_token_bitmask_, apply_token_bitmask_torch, unpack_bitmask
from yoco_rs.kernels.token_bitmask import apply_token_bitmask_triton


def _case(x: int, vocab: int, rows: list[int], seed: int):
    rng = np.random.default_rng(seed)
    words = -(-vocab // 32)
    bits = rng.random((len(rows), words * 32)) < 0.3
    bitmask = np.packbits(bits.reshape(len(rows), words, 32)[:, :, ::-1], axis=-1, bitorder="big")
    bitmask = bitmask.view(">u4").astype(np.uint32).view(np.int32).reshape(len(rows), words)
    logits = torch.from_numpy(rng.standard_normal((x, vocab)).astype(np.float32))
    return logits, bitmask, bits[:, :vocab], np.asarray(rows, dtype=np.int64)


def _reference(logits, bits, rows):
    want = logits.clone()
    for i, r in enumerate(rows):
        want[r][~torch.from_numpy(bits[i])] = float("-inf")
    return want


def test_unpack_reads_bit_t_mod_32_of_word_t_div_32():
    bm = torch.tensor([[1 - (1 << 31), 1 << 2]], dtype=torch.int32)  # bits 0 and 31; bit 2 of word 1
    allowed = unpack_bitmask(bm, 40)[0].nonzero().flatten().tolist()
    assert allowed == [0, 31, 34]
    assert unpack_bitmask(bm, 70).shape == (1, 70)  # tokens past the words are disallowed
    assert not unpack_bitmask(bm, 70)[0, 64:].any()


@pytest.mark.parametrize("x,vocab,rows", [(4, 100, [0, 2]), (3, 64, [1]), (6, 2050, [5, 0, 3])])
def test_torch_op_masks_exactly_the_disallowed_tokens_of_the_masked_rows(x, vocab, rows):
    logits, bitmask, bits, r = _case(x, vocab, rows, seed=vocab + x)
    want = _reference(logits, bits, r)
    got = logits.clone()
    apply_token_bitmask_torch(got, torch.from_numpy(bitmask), torch.from_numpy(r))
    assert torch.equal(got, want)
    got2 = logits.clone()
    apply_token_bitmask_(got2, bitmask, r)  # numpy inputs, as the core hands them
    assert torch.equal(got2, want)


@pytest.mark.parametrize("x,vocab,rows", [(4, 100, [0, 2]), (5, 1030, [4, 1]), (2, 2048, [1])])
def test_triton_kernel_matches_the_torch_op(x, vocab, rows):
    logits, bitmask, bits, r = _case(x, vocab, rows, seed=7 * vocab + x)
    want = _reference(logits, bits, r)
    got = logits.to(DEV)
    apply_token_bitmask_triton(got, torch.from_numpy(bitmask).to(DEV), torch.from_numpy(r).to(DEV))
    assert torch.equal(got.cpu(), want)


def test_no_rows_leaves_logits_untouched():
    logits = torch.randn(3, 50)
    before = logits.clone()
    apply_token_bitmask_(logits, np.zeros((0, 2), dtype=np.int32), np.zeros(0, dtype=np.int64))
    assert torch.equal(logits, before)


@pytest.mark.parametrize("x,vocab,rows", [(4, 100, [0, 2]), (6, 2050, [5, 0, 3]), (3, 262_144, [2, 0])])
def test_rust_cpu_mask_matches_the_torch_reference(x, vocab, rows):
    from yoco_rs import _core

    logits, bitmask, bits, r = _case(x, vocab, rows, seed=3 * vocab + x)
    want = logits.clone()
    apply_token_bitmask_torch(want, torch.from_numpy(bitmask), torch.from_numpy(r))
    got = logits.clone()
    _core.mask_logits(got.numpy(), r, bitmask)
    assert torch.equal(got, want)


def test_rust_cpu_mask_refuses_repeated_or_out_of_range_rows():
    from yoco_rs import _core

    logits, bitmask, _, _ = _case(3, 64, [0, 1], seed=1)
    with pytest.raises(ValueError, match="repeated"):
        _core.mask_logits(logits.numpy(), np.array([1, 1]), bitmask)
    with pytest.raises(ValueError, match="out of"):
        _core.mask_logits(logits.numpy(), np.array([0, 3]), bitmask)
