"""The one-launch Triton forms of a Gemma 3n layer's elementwise chains (``kernels/layer_elementwise.py``)
against the torch ops they replace, under Triton's interpreter on the CPU and for real on a GPU.

The kernels round where the torch ops do. Bits are required where they were seen:
- everything in float32 under the interpreter (plain IEEE, no contraction);
- the residual in bf16 and float32 on an H200.

Elsewhere a few ulps of the row's scale are allowed:
- On a GPU the compiler fuses predict's and correct's products into the following adds (an ulp, seen on
  the H200).
- The interpreter truncates when it stores bf16."""

from __future__ import annotations

import pytest
import torch
from paged_cases import DEV  # sets TRITON_INTERPRET before the kernels are imported

from yoco_rs.kernels.layer_elementwise import (
    INV_SQRT2_F32, altup_correct, altup_predict, norm_rope, residual_mean,
)
from yoco_rs.models.gemma3n.ops import SQRT2, apply_rope, rms_norm


def _rand(shape, seed, dtype, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g)).to(dtype).to(DEV)


def _exact_here(dtype) -> bool:
    """Where the residual's bits were seen to match: float32 anywhere, bf16 on a GPU."""
    return dtype == torch.float32 or DEV == "cuda"


def _interpreted_f32(dtype) -> bool:
    """Where predict's and correct's bits match: plain IEEE float32, no fused multiply-add."""
    return dtype == torch.float32 and DEV == "cpu"


def _close(got, want, dtype, ulps=4, exact=None):
    """Bits where ``exact`` (default: ``_exact_here``), else within ``ulps`` of each row's scale."""
    if _exact_here(dtype) if exact is None else exact:
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    else:
        scale = want.float().abs().amax(-1, keepdim=True).clamp(min=1e-3)
        assert ((got.float() - want.float()).abs() <= ulps * torch.finfo(dtype).eps * scale).all()


def torch_predict(h, coefs):  # AltUp.predict's torch ops off the CPU FMA path
    a = h.shape[1]
    o = torch.mul(h[:, None, 0], coefs[:, :, 0, None])
    for k in range(1, a):
        o.add_(h[:, None, k] * coefs[:, :, k, None])
    return o.add_(h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,hid", [(1, 2048), (3, 100)])
def test_altup_predict_rounds_like_the_torch_ops(dtype, t, hid):
    h = _rand((t, 4, hid), 0, dtype)
    coefs = _rand((t, 4, 4), 1, dtype, 0.5)
    got = altup_predict(h, coefs)
    assert got.shape == h.shape and got.dtype == dtype
    _close(got, torch_predict(h, coefs), dtype, exact=_interpreted_f32(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,hid", [(1, 2048), (3, 100)])
def test_altup_correct_rounds_like_the_torch_ops(dtype, t, hid):
    pred = _rand((t, 4, hid), 2, dtype)
    act = _rand((t, hid), 3, dtype)
    raw = _rand((t, 4), 4, dtype, 0.3)
    want = ((act - pred[:, 0])[:, None, :] * (raw + 1.0)[:, :, None]).add_(pred)
    _close(altup_correct(pred, act, raw), want, dtype, exact=_interpreted_f32(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_mean_reads_a_strided_active_stream_and_rounds_like_the_torch_ops(dtype):
    pred = _rand((3, 4, 2048), 5, dtype)
    active = pred[:, 0]  # rows 4 x 2048 apart
    attn, laurel = _rand((3, 2048), 6, dtype), _rand((3, 2048), 7, dtype)
    got = residual_mean(active, attn, laurel)
    if DEV == "cuda":  # torch's CUDA division by a scalar multiplies by its float32 reciprocal
        want = (active + attn).add_(laurel).div_(SQRT2)
    else:
        want = ((active + attn).add_(laurel).float() * INV_SQRT2_F32).to(dtype)
    _close(got, want, dtype)
    # and within an ulp of a true division, where the sums round as torch's do
    true = (active + attn).add_(laurel).div_(SQRT2)
    if _exact_here(dtype):
        assert ((got.float() - true.float()).abs() <= torch.finfo(dtype).eps * true.float().abs() + 1e-30).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,heads,d", [(1, 8, 256), (5, 2, 64)])
def test_norm_rope_matches_norm_then_rope(dtype, t, heads, d):
    wide = _rand((t, heads * d + 32), 8, dtype, 3.0)
    x = wide[:, :heads * d].view(t, heads, d)  # a projection's output viewed as heads (rows strided)
    w = _rand((d,), 9, dtype)
    pos = torch.arange(7, 7 + t, device=DEV, dtype=torch.float32)
    freqs = pos[:, None] / (10000.0 ** (torch.arange(0, d, 2, device=DEV, dtype=torch.float32) / d))
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]
    got = norm_rope(x, w, 1e-6, cos, sin)
    want = apply_rope(rms_norm(x, w, 1e-6), cos, sin)
    assert got.shape == (t, heads, d) and got.is_contiguous()
    scale = want.float().abs().amax(-1, keepdim=True)
    ulps = 8 if dtype == torch.float32 else 2  # one rounding for the rotation where torch has three
    assert ((got.float() - want.float()).abs() <= ulps * torch.finfo(dtype).eps * scale).all()


def test_the_kernels_reject_shapes_they_cannot_read():
    with pytest.raises(ValueError, match="power-of-two head dim"):
        norm_rope(torch.zeros((1, 2, 12), device=DEV), torch.ones(12, device=DEV), 1e-6,
                  torch.ones((1, 12), device=DEV), torch.zeros((1, 12), device=DEV))
    with pytest.raises(ValueError, match="coefs \\[T, A, A\\]"):
        altup_predict(torch.zeros((2, 4, 8), device=DEV), torch.zeros((2, 4, 3), device=DEV))
    with pytest.raises(ValueError, match="activated \\[T, H\\]"):
        altup_correct(torch.zeros((2, 4, 8), device=DEV), torch.zeros((2, 9), device=DEV), torch.zeros((2, 4), device=DEV))
    with pytest.raises(ValueError, match="three \\[T, H\\]"):
        residual_mean(torch.zeros((2, 8), device=DEV), torch.zeros((2, 8), device=DEV), torch.zeros((3, 8), device=DEV))


def test_a_model_step_with_every_fusion_gives_the_logits_of_the_torch_forms(monkeypatch):
    """The wiring in ``models/gemma3n``: with the fused kernels forced on for float32 (the interpreter on the
    CPU) and the GPU's separate q/k/v projections, a prefill and a decode step of the tiny 10-layer model
    call each kernel where expected and give the torch forms' logits to a few float32 ulps (the q/k norms
    sum in another order; everything else rounds alike) and the same argmax."""
    import random

    from gemma_random import TINY_10L, random_executor
    from step_plans import MiniPlanner, Req

    from yoco_rs.models.gemma3n import layer, ops

    ex = random_executor(TINY_10L, device=DEV, seed=11)
    ex.allocate_kv(32, 16)
    windows = [s.window for s in ex.kv_group_specs()]
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (9, 21)]

    def run(fused: bool):
        on = (lambda x, name: name in ops.GPU_FUSIONS) if fused else (lambda x, name: False)
        monkeypatch.setattr(ops, "gpu_fused", on)
        monkeypatch.setattr(layer, "gpu_fused", on)
        monkeypatch.setattr(layer, "_fuse", lambda x: False)  # the GPU's separate q/k/v projections
        planner = MiniPlanner(windows=windows, block_size=16, num_blocks=32, max_blocks_per_seq=8, seed=0, device=DEV)
        reqs = [Req(list(p), len(p), max_new=4) for p in prompts]
        outs = []
        for counts in ([len(p) for p in prompts], [1, 1]):
            b = planner.batch(reqs, counts)
            logits = ex.execute(b)
            outs.append(logits.cpu())
            MiniPlanner.advance(reqs, counts, b, logits.argmax(-1).cpu())
        return outs

    from yoco_rs.kernels import layer_elementwise, rms_norm as rms_norm_kernel

    calls = {}
    for mod, name in ((layer_elementwise, "norm_rope"), (layer_elementwise, "altup_predict"),
                      (layer_elementwise, "altup_correct"), (layer_elementwise, "residual_mean"),
                      (rms_norm_kernel, "rms_norm")):
        def counted(*a, _f=getattr(mod, name), _n=name, **kw):
            calls[_n] = calls.get(_n, 0) + 1
            return _f(*a, **kw)
        monkeypatch.setattr(mod, name, counted)
    with torch.no_grad():
        plain = run(False)
        assert calls == {}
        fused = run(True)
    # 10 layers x 2 steps: q of every layer, k of the 5 that write KV; predict, correct, residual per layer
    assert calls["norm_rope"] == 2 * (10 + 5)
    assert calls["altup_predict"] == calls["altup_correct"] == calls["residual_mean"] == 2 * 10
    assert "rms_norm" not in calls  # float32 norms keep the torch form by design (the kernel: test_kernels_rms_norm)
    for a, b in zip(plain, fused):
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        assert (a - b).abs().max() <= 1e-4 * a.abs().max()
