"""The Triton attention backend equals the executor's torch reference backend through the
``AttentionBackend`` interface (metadata, KV write, attend), and the backend choice is automatic."""

from __future__ import annotations

import pytest
import torch
from paged_cases import DEV, make_case  # sets TRITON_INTERPRET before the kernels are imported

from yoco_rs.attention import get_backend
from yoco_rs.kernels.backend import TritonAttentionBackend, select_backend

TOL = dict(atol=2e-5, rtol=2e-5)


def _meta(backend, case, window, slot_mapping=None):
    t = case.q.shape[0]
    qsl, sl = case.query_start_loc, case.seq_lens
    # positions: bottom-right aligned within each row; padding queries sit at 0 as in the plan
    pos = torch.zeros(t, dtype=torch.int64)
    for r in range(sl.shape[0]):
        s, e = int(qsl[r]), int(qsl[r + 1])
        pos[s:e] = torch.arange(int(sl[r]) - (e - s), int(sl[r]))
    pos = pos.to(qsl.device)
    return backend.build_metadata(
        query_start_loc_cpu=qsl.cpu(), seq_lens_cpu=sl.cpu(), query_start_loc=qsl, seq_lens=sl, positions=pos,
        block_tables=[case.block_table], slot_mapping=slot_mapping, windows=[window or None],
        block_size=case.kv_layer.shape[2], dtype=case.q.dtype,
    )


@pytest.mark.parametrize("rows,window", [
    ([(0, 9), (14, 1), (3, 5), (30, 1)], 0),  # mixed prefill/decode, varlen kernel
    ([(0, 9), (14, 1), (3, 5), (30, 1)], 6),
    ([(7, 1), (0, 1), (21, 1)], 0),  # pure decode: decode kernel
    ([(7, 1), (12, 0), (21, 1)], 5),  # cross-decoder shape: a row without queries
])
def test_attend_matches_the_torch_reference_backend(rows, window):
    case = make_case(rows, block_size=4, window=window, pad_tokens=3, seed=len(rows) + window)
    case.kv_layer.nan_to_num_(0.0)  # the executor's cache is zeroed; the torch backend multiplies masked keys
    ref, tri = get_backend("torch"), TritonAttentionBackend()
    want = ref.attend(case.q, case.kv_layer, _meta(ref, case, window), 0, 1.0)
    got = tri.attend(case.q, case.kv_layer, _meta(tri, case, window), 0, 1.0)
    torch.testing.assert_close(got, want, **TOL)
    assert (got[case.num_tokens:] == 0).all(), "queries outside every row get zeros, like the reference"


def test_write_kv_matches_the_torch_reference_backend():
    case = make_case([(3, 4), (0, 2)], block_size=4, seed=1)
    case.kv_layer.nan_to_num_(0.0)
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn((2, 6, 2, 16), generator=g).to(DEV)
    slots = torch.tensor([[5, 6, 7, 9, 13, 14]], dtype=torch.int64, device=DEV)
    out = {}
    for be in (get_backend("torch"), TritonAttentionBackend()):
        kv = case.kv_layer.clone()
        be.write_kv(kv, k, v, _meta(be, case, 0, slot_mapping=slots), 0)
        out[be.name] = kv
    assert torch.equal(out["torch"], out["triton"])


def test_copy_kv_applies_every_groups_ops():
    kvs = [torch.randn((2, 2, 6, 4, 2, 8), device=DEV) for _ in range(2)]
    ops = torch.tensor([[0, 1, 4, 3], [1, 2, 5, 4], [1, 3, 1, 2]], dtype=torch.int32, device=DEV)
    want = [k.clone() for k in kvs]
    for g, s, d, n in ops.tolist():
        want[g][:, :, d, :n] = kvs[g][:, :, s, :n]
    TritonAttentionBackend().copy_kv(kvs, ops)
    assert all(torch.equal(a, b) for a, b in zip(kvs, want))


def test_backend_selection_is_automatic_and_explicit_names_work():
    assert select_backend("cpu").name == "torch"
    assert select_backend("cpu", "torch").name == "torch"
    if DEV == "cpu":
        assert select_backend("cpu", "triton").name == "triton"  # allowed here: TRITON_INTERPRET is set
    if torch.cuda.is_available():
        assert select_backend("cuda").name == "triton"
    with pytest.raises(ValueError, match="unknown attention backend"):
        select_backend("cpu", "flash")
