"""Sampled frequencies match the filtered softmax (chi-square, fixed seeds) for combinations of
temperature, top-k, top-p, min-p and penalties, against an independent float64 reference written from
vLLM V1's order: penalties -> temperature -> min-p -> top-k -> top-p -> softmax.

Each case samples once from N rows that differ only in their seed (so every draw sees the same
distribution, penalties included: the outputs that feed the penalties are given at admission)."""

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from yoco_rs.executor.sampler import RowParams, Sampler

V = 12
N = 6000
LOGITS = np.array([2.1, 1.7, 1.4, 1.0, 0.8, 0.5, 0.1, -0.2, -0.6, -1.0, -1.5, -2.3])
PROMPT = np.array([1, 4], np.int64)
OUTPUTS = np.array([0, 0, 2, 5], np.int64)


def reference(params: RowParams, logits=LOGITS, prompt=PROMPT, outputs=OUTPUTS) -> np.ndarray:
    """The distribution vLLM V1 samples from, in float64."""
    lg = logits.astype(np.float64).copy()
    counts = np.bincount(outputs, minlength=V).astype(np.float64)
    seen_out = counts > 0
    seen = seen_out.copy()
    seen[prompt] = True
    rep = params.repetition_penalty
    lg = np.where(seen, np.where(lg > 0, lg / rep, lg * rep), lg)
    lg = lg - params.frequency_penalty * counts - params.presence_penalty * seen_out
    lg = lg / params.temperature

    def softmax(x):
        e = np.exp(x - x[np.isfinite(x)].max())
        e[~np.isfinite(x)] = 0.0
        return e / e.sum()

    if params.min_p > 0:
        p = softmax(lg)
        lg[p < params.min_p * p.max()] = -np.inf
    order = np.argsort(-lg, kind="stable")
    if params.top_k > 0:
        lg[order[params.top_k:]] = -np.inf
    if params.top_p < 1:
        p = softmax(lg)[order]
        drop = (np.cumsum(p) - p) > params.top_p
        lg[order[drop]] = -np.inf
    return softmax(lg)


def sample_many(params: RowParams, seed0: int) -> np.ndarray:
    s = Sampler(N, V)
    rows = list(range(N))
    s.set_rows(rows, [RowParams(**{**params.__dict__, "seed": seed0 + i}) for i in rows],
               [PROMPT] * N, [OUTPUTS] * N)
    logits = torch.tensor(LOGITS, dtype=torch.float32).expand(N, V).contiguous()
    out = s.sample(logits, np.arange(N), np.arange(N))
    return np.bincount(out.sampled.numpy(), minlength=V)


CASES = [
    dict(temperature=0.8),
    dict(temperature=1.3, top_k=5),
    dict(temperature=0.7, top_p=0.8),
    dict(temperature=1.0, min_p=0.15),
    dict(temperature=1.5, top_k=6, top_p=0.9, min_p=0.1),
    dict(temperature=0.9, presence_penalty=0.5, frequency_penalty=0.3),
    dict(temperature=1.2, repetition_penalty=1.3, top_k=8, min_p=0.05),
    dict(temperature=0.6, repetition_penalty=0.8, presence_penalty=-0.4, frequency_penalty=0.2, top_p=0.85,
         min_p=0.02, top_k=7),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_sampled_frequencies_match_the_filtered_softmax(case):
    params = RowParams(**case)
    expected = reference(params)
    counts = sample_many(params, seed0=1000 * (CASES.index(case) + 1))
    support = expected > 0
    assert counts[~support].sum() == 0, (counts, expected)  # nothing outside the filtered support
    exp = expected[support] * N
    stat = float(((counts[support] - exp) ** 2 / exp).sum())
    dof = int(support.sum()) - 1
    if dof:
        assert stat < chi2.ppf(0.999, dof), (stat, dof, counts, np.round(exp))
    assert support.sum() >= 2 or case.get("top_k") == 1


def test_min_p_applies_before_top_p_as_in_vllm_v1():
    """min-p first renormalizes the survivors, which moves top-p's cut: with probabilities ~ .4/.3/.2
    plus a long tail, min-p then top-p=0.72 keeps 2 tokens; top-p first would keep 3."""
    logits = np.log(np.array([0.4, 0.3, 0.2] + [0.1 / (V - 3)] * (V - 3)))
    params = RowParams(temperature=1.0, top_p=0.72, min_p=0.2)
    assert (reference(params, logits=logits, outputs=np.zeros(0, np.int64)) > 0).sum() == 2
    s = Sampler(2000, V)
    s.set_rows(list(range(2000)), [RowParams(temperature=1.0, top_p=0.72, min_p=0.2, seed=i) for i in range(2000)],
               [PROMPT] * 2000, [np.zeros(0, np.int64)] * 2000)
    lg = torch.tensor(logits, dtype=torch.float32).expand(2000, V).contiguous()
    got = set(s.sample(lg, np.arange(2000), np.arange(2000)).sampled.tolist())
    assert got == {0, 1}
