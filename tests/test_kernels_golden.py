"""The Triton kernels (and the graph runner's cross-row layout) against the Rust reference's golden
fixtures (``crates/yoco-ref/golden/*.npz``, written by ``yoco-ref``'s candle reference; format in its
``golden/README.md``). Skipped until those files exist in the checkout."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch
from paged_cases import DEV  # sets TRITON_INTERPRET before the kernels are imported

from yoco_rs.executor.batch import ForwardBatch
from yoco_rs.executor.cuda_graphs import cross_attention_rows
from yoco_rs.kernels.decode_attention import decode_attention
from yoco_rs.kernels.kv_copy import copy_kv
from yoco_rs.kernels.kv_write import write_kv
from yoco_rs.kernels.paged_attention import paged_attention

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name: str) -> dict[str, torch.Tensor]:
    hits = sorted(ROOT.glob(f"crates/yoco-ref/**/{name}.npz"))
    if not hits:
        pytest.skip(f"golden fixture {name}.npz from yoco-ref (branch ref) is not in this checkout yet")
    with np.load(hits[0]) as z:
        return {k: torch.from_numpy(np.array(z[k])).to(DEV) for k in z.files}


def _kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.stack([k, v]).contiguous()  # [2, NB, BS, Hkv, D]


def test_kv_write_through_slot_mapping_matches_golden():
    g = _load("paged_attention")
    want = _kv(g["k_cache"], g["v_cache"])  # the reference's cache after this step's write
    kv = torch.full_like(want, float("nan"))
    slots = g["slot_mapping"].to(torch.int64)
    write_kv(kv, g["key"], g["value"], slots)
    bs = kv.shape[2]
    written = torch.zeros(kv.shape[1] * bs, dtype=torch.bool, device=kv.device)
    written[slots] = True
    written = written.view(kv.shape[1], bs)
    # every slot of slot_mapping (padding tokens included: block 0) holds what the reference wrote there,
    # and nothing else was touched
    assert torch.equal(kv[:, written], want[:, written])
    assert torch.isnan(kv[:, ~written]).all()


@pytest.mark.parametrize("window_idx", [0, 1, 2])
def test_paged_attention_matches_golden(window_idx):
    g = _load("paged_attention")
    w = int(g["sliding_windows"][window_idx])
    kv = _kv(g["k_cache"], g["v_cache"])
    t, x = int(g["num_tokens"]), int(g["num_cross"])
    out = paged_attention(g["query"], kv, g["block_tables"], g["query_start_loc"], g["seq_lens"], window=w,
                          scale=float(g["scale"]))
    torch.testing.assert_close(out[:t], g[f"out_window{w}"][:t], atol=1e-5, rtol=1e-5)
    # the cross-decoder's queries: trailing rows of each request (two for the prompt-logprob row)
    cross = paged_attention(g["cross_query"], kv, g["block_tables"], g["cross_query_start_loc"], g["seq_lens"],
                            window=w)
    torch.testing.assert_close(cross[:x], g[f"cross_out_window{w}"][:x], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window_idx", [0, 1, 2])
def test_graph_runner_cross_rows_with_the_decode_kernel_match_golden(window_idx):
    """The runner lays cross rows out as one 1-query row each (padded by repeating the last index)."""
    g = _load("paged_attention")
    w = int(g["sliding_windows"][window_idx])
    kv = _kv(g["k_cache"], g["v_cache"])
    x, xp = int(g["num_cross"]), int(g["cross_indices"].shape[0])
    tp = int(g["query"].shape[0])
    b = ForwardBatch(
        num_tokens=int(g["num_tokens"]), input_ids=torch.zeros(tp, dtype=torch.int64, device=DEV),
        positions=torch.zeros(tp, dtype=torch.int64, device=DEV), query_start_loc=g["query_start_loc"],
        seq_lens=g["seq_lens"], block_tables=[g["block_tables"]], slot_mapping=g["slot_mapping"][None],
        kv_copies=torch.zeros((0, 4), dtype=torch.int32, device=DEV), num_cross=x,
        cross_indices=g["cross_indices"].to(torch.int64), cross_query_start_loc=g["cross_query_start_loc"])
    idx, seq, tables = cross_attention_rows(b, xp)
    assert idx.tolist() == g["cross_indices"].tolist()  # the fixture pads by repeating the last index too
    qsl = torch.arange(xp + 1, dtype=torch.int32, device=DEV)
    out = decode_attention(g["cross_query"], kv, tables[0], qsl, seq, window=w)
    torch.testing.assert_close(out[:x], g[f"cross_out_window{w}"][:x], atol=1e-5, rtol=1e-5)


def test_sub_block_copy_then_write_matches_golden():
    g = _load("write_and_copy")
    kv = _kv(g["k_cache_before"], g["v_cache_before"])[None].contiguous()  # a one-layer group
    copy_kv(kv, g["kv_copies"].to(torch.int32), group=0)
    assert torch.equal(kv[0], _kv(g["k_cache_after_copy"], g["v_cache_after_copy"]))
    write_kv(kv[0], g["key"], g["value"], g["slot_mapping"].to(torch.int64))
    assert torch.equal(kv[0], _kv(g["k_cache_after_write"], g["v_cache_after_write"]))
