"""The one-launch Triton RMSNorm matches Gemma 3n's torch RMSNorm (``ops.rms_norm``'s float32 formula),
under Triton's interpreter on the CPU (the real kernel on a GPU when one is present)."""

from __future__ import annotations

import pytest
import torch
from paged_cases import DEV  # sets TRITON_INTERPRET before the kernels are imported

from yoco_rs.kernels.rms_norm import rms_norm


def torch_rms_norm(x, weight, eps):
    xf = x.float()
    y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def _rand(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=g)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 2048), (3, 4, 256), (7, 100)])
def test_rms_norm_matches_the_torch_formula_within_one_ulp(dtype, shape):
    x = _rand(shape, 0, dtype)
    w = _rand(shape[-1:], 1, dtype)
    want = torch_rms_norm(x, w, 1e-6)
    got = rms_norm(x.to(DEV), w.to(DEV), 1e-6).cpu()
    assert got.dtype == dtype and got.shape == x.shape
    # bf16: one ulp of the output (the interpreter truncates on store where a GPU rounds to nearest);
    # fp32: a few ulps (a different sum order and x / sqrt(.) for x * pow(., -0.5))
    ulps = 1 if dtype == torch.bfloat16 else 4
    tol = ulps * torch.finfo(dtype).eps * want.float().abs().clamp(min=torch.finfo(dtype).tiny)
    assert ((got.float() - want.float()).abs() <= tol).all()
    if dtype == torch.bfloat16 and DEV == "cuda":  # rounded to nearest: only boundary values may move
        assert (got == want).float().mean() > 0.95


def test_rms_norm_without_weight_normalizes_each_row_to_unit_rms():
    x = _rand((4, 3, 64), 2, torch.bfloat16)
    got = rms_norm(x.to(DEV), None, 1e-6).cpu()
    want = torch_rms_norm(x, None, 1e-6)
    assert ((got.float() - want.float()).abs() <= 2 ** -7 * want.float().abs()).all()
    assert torch.allclose(got.float().pow(2).mean(-1), torch.ones(4, 3), atol=2e-2)


def test_rms_norm_reads_strided_rows_and_leaves_the_input_alone():
    wide = _rand((6, 512), 3, torch.bfloat16)
    x = wide[:, 128:384]  # rows 512 apart, last dim contiguous
    before = wide.clone()
    w = _rand((256,), 4, torch.bfloat16)
    got = rms_norm(wide.to(DEV)[:, 128:384], w.to(DEV), 1e-6).cpu()
    assert torch.equal(wide, before)
    want = torch_rms_norm(x, w, 1e-6)
    assert ((got.float() - want.float()).abs() <= 2 ** -7 * want.float().abs()).all()


def test_rms_norm_of_zero_rows_returns_an_empty_tensor():
    got = rms_norm(torch.zeros((0, 256), dtype=torch.bfloat16, device=DEV), None, 1e-6)
    assert got.shape == (0, 256)


def test_rms_norm_rejects_a_weight_of_the_wrong_size():
    with pytest.raises(ValueError, match=r"weight must be \[256\]"):
        rms_norm(torch.zeros((2, 256), device=DEV), torch.ones(128, device=DEV), 1e-6)
