"""The Triton paged-attention kernels (mixed varlen and decode) match a naive float64 reference, run
under Triton's interpreter on the CPU (real kernels on a GPU when one is present)."""

from __future__ import annotations

import random

import pytest
import torch
from paged_cases import make_case  # also sets TRITON_INTERPRET before the kernels are imported
from paged_ref import ref_attention

from yoco_rs.kernels.decode_attention import decode_attention
from yoco_rs.kernels.paged_attention import paged_attention

TOL = dict(atol=2e-5, rtol=2e-5)


def _check(case, fn=paged_attention, **kw):
    out = torch.full_like(case.q, 7.0)  # padding rows must stay untouched
    fn(case.q, case.kv_layer, case.block_table, case.query_start_loc, case.seq_lens,
       window=case.window, out=out, **kw)
    ref = ref_attention(case.q.cpu(), case.kv_layer.cpu(), case.block_table.cpu(), case.query_start_loc.cpu(),
                        case.seq_lens.cpu(), case.window)
    t = case.num_tokens
    assert torch.isfinite(out[:t]).all()
    torch.testing.assert_close(out[:t].cpu().double(), ref[:t], **TOL)
    assert (out[t:] == 7.0).all(), "padding rows outside every row's span were written"


def test_prefill_rows_of_different_lengths_match_reference():
    _check(make_case([(0, 7), (0, 1), (0, 13), (0, 4)], block_size=4))


def test_chunked_prefill_attends_to_earlier_context():
    _check(make_case([(9, 6), (17, 3), (4, 11)], block_size=8, seed=1))


def test_mixed_prefill_and_decode_rows_in_one_batch():
    _check(make_case([(30, 1), (0, 9), (5, 1), (12, 5), (1, 1)], block_size=4, seed=2))


@pytest.mark.parametrize("window,block_size", [(3, 8), (5, 4), (13, 4), (16, 16)])
def test_sliding_window_shorter_and_longer_than_a_block(window, block_size):
    # freed out-of-window blocks are 0 in the table and NaN in the cache: never read
    _check(make_case([(25, 7), (40, 1), (0, 19), (6, 3)], block_size=block_size, window=window, seed=3))


@pytest.mark.parametrize("gqa", [1, 3, 4])
def test_gqa_groups_including_non_power_of_two(gqa):
    _check(make_case([(10, 5), (3, 1), (0, 6)], gqa=gqa, num_kv_heads=2, seed=4))


def test_padding_tokens_beyond_the_last_row_are_ignored():
    _check(make_case([(5, 3), (2, 2)], pad_tokens=9, seed=5))


def test_rows_with_no_queries_are_skipped():
    _check(make_case([(6, 0), (4, 3), (9, 0), (0, 2)], seed=6))


def test_head_dim_not_a_power_of_two():
    _check(make_case([(7, 4), (0, 5)], head_dim=24, seed=7))


def test_long_rows_span_many_query_tiles_and_blocks():
    _check(make_case([(20, 37), (0, 50)], block_size=16, num_kv_heads=1, seed=8))


@pytest.mark.parametrize("window", [0, 6])
def test_decode_kernel_matches_reference(window):
    _check(make_case([(30, 1), (0, 1), (5, 1), (17, 1)], block_size=4, window=window, seed=9), decode_attention)


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_kernel_split_counts_agree(splits):
    case = make_case([(41, 1), (2, 1), (19, 1)], block_size=8, gqa=4, seed=10)
    _check(case, decode_attention, num_splits=splits)


def test_decode_kernel_skips_rows_without_a_query():
    # the cross-decoder's shape: a middle prefill chunk samples nothing and has no cross row
    _check(make_case([(8, 1), (12, 0), (3, 1)], seed=11), decode_attention)


def test_decode_kernel_with_more_splits_than_keys():
    _check(make_case([(0, 1), (2, 1)], seed=12), decode_attention, num_splits=4)


def test_bf16_inputs_accumulate_in_fp32():
    case = make_case([(9, 4), (20, 1)], dtype=torch.bfloat16, seed=13, block_size=8)
    out = paged_attention(case.q, case.kv_layer, case.block_table, case.query_start_loc, case.seq_lens)
    ref = ref_attention(case.q.cpu(), case.kv_layer.cpu(), case.block_table.cpu(), case.query_start_loc.cpu(),
                        case.seq_lens.cpu())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().double(), ref, atol=3e-2, rtol=3e-2)


def test_random_batches_match_reference():
    rng = random.Random(14)
    for i in range(4):
        rows = [(rng.choice([0, rng.randrange(0, 30)]), rng.choice([1, rng.randrange(0, 12)]))
                for _ in range(rng.randrange(1, 6))]
        case = make_case(rows, block_size=rng.choice([2, 4, 8]), gqa=rng.choice([1, 2]),
                         window=rng.choice([0, 0, 5, 11]), pad_tokens=rng.randrange(0, 3), seed=100 + i)
        _check(case)


def test_bad_shapes_raise_errors_naming_the_problem():
    case = make_case([(2, 2)])
    with pytest.raises(ValueError, match="query_start_loc must be"):
        paged_attention(case.q, case.kv_layer, case.block_table, case.query_start_loc[:1], case.seq_lens)
    with pytest.raises(ValueError, match="num_kv_heads"):
        paged_attention(case.q[:, :3], case.kv_layer, case.block_table, case.query_start_loc, case.seq_lens)
