"""The batched sampler: each feature against an independent expectation, and seeded sampling that does
not depend on the batch."""

import numpy as np
import pytest
import torch

from yoco_rs.executor.sampler import RowParams, Sampler, row_keys, uniform_noise

V = 50


def run(sampler, logits, rows, cross_pos=None):
    logits = torch.as_tensor(logits, dtype=torch.float32)
    cp = np.arange(len(rows)) if cross_pos is None else np.asarray(cross_pos)
    return sampler.sample(logits, cp, np.asarray(rows))


def setup(params, outputs=None, prompts=None, rows=None, n=16):
    s = Sampler(n, V)
    rows = list(range(len(params))) if rows is None else rows
    outputs = outputs or [np.zeros(0, np.int64)] * len(params)
    prompts = prompts or [np.array([1], np.int64)] * len(params)
    s.set_rows(rows, params, prompts, outputs)
    return s


def test_greedy_takes_the_argmax_and_ignores_top_k_top_p():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, V, generator=g)
    s = setup([RowParams(temperature=0.0, top_k=3, top_p=0.1)] * 4)
    assert run(s, logits, [0, 1, 2, 3]).sampled.tolist() == logits.argmax(-1).tolist()


def test_cross_pos_selects_the_sampling_rows_among_the_cross_rows():
    logits = torch.zeros(5, V)
    for i in range(5):
        logits[i, 10 + i] = 5.0
    s = setup([RowParams(temperature=0.0)] * 2)
    assert run(s, logits, [0, 1], cross_pos=[4, 1]).sampled.tolist() == [14, 11]


def test_seeded_sampling_is_the_same_whatever_the_batch_and_row():
    g = torch.Generator().manual_seed(1)
    target = torch.randn(V, generator=g)
    others = torch.randn(6, V, generator=g)
    alone = setup([RowParams(seed=1234)])
    seq_alone = [run(alone, target[None], [0]).sampled.item() for _ in range(20)]
    # Same request in row 5, among other random requests with other seeds, in a different order.
    params = [RowParams(seed=7 + i, temperature=0.8) for i in range(5)] + [RowParams(seed=1234)]
    crowd = setup(params, rows=[3, 9, 0, 1, 2, 5])
    seq_crowd = []
    for _ in range(20):
        logits = torch.cat([others[:3], target[None], others[3:5]])
        out = run(crowd, logits, [3, 9, 0, 5, 1, 2])
        seq_crowd.append(out.sampled[3].item())
    assert seq_alone == seq_crowd
    assert len(set(seq_alone)) > 3  # it does sample


def test_a_resumed_request_continues_its_random_stream():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(2))
    s = setup([RowParams(seed=99)])
    full = [run(s, logits, [0]).sampled.item() for _ in range(10)]
    resumed = setup([RowParams(seed=99)], outputs=[np.array(full[:6])], rows=[7])
    assert [run(resumed, logits, [7]).sampled.item() for _ in range(4)] == full[6:]


def test_samples_follow_the_softmax_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0] + [-30.0] * (V - 4)])
    probs = torch.softmax(logits[0, :4] / 0.7, -1).numpy()
    n = 4000
    s = setup([RowParams(seed=5, temperature=0.7)])
    draws = np.array([run(s, logits, [0]).sampled.item() for _ in range(n)])
    freq = np.bincount(draws, minlength=V)[:4] / n
    assert np.abs(freq - probs).max() < 0.025, (freq, probs)


def test_top_k_top_p_min_p_restrict_the_candidates():
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.5] + [0.0] * (V - 5)])
    p = torch.softmax(logits[0], -1)
    cases = [
        (RowParams(seed=1, top_k=2), {0, 1}),
        # nucleus: smallest prefix with mass >= top_p
        (RowParams(seed=1, top_p=float(p[:3].sum()) - 1e-4), {0, 1, 2}),
        (RowParams(seed=1, min_p=float(p[2] / p[0]) - 1e-4), {0, 1, 2}),
        (RowParams(seed=1, top_k=1), {0}),
    ]
    for params, allowed in cases:
        s = setup([params])
        got = {run(s, logits, [0]).sampled.item() for _ in range(300)}
        assert got == allowed, (params, got)


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = torch.zeros(1, V)
    logits[0, 1] = 10.0  # EOS would win
    logits[0, 7] = 9.0  # a stop id
    s = setup([RowParams(temperature=0.0, min_tokens=2, min_tokens_ids=[1, 7])])
    first, second, third = (run(s, logits, [0]).sampled.item() for _ in range(3))
    assert first not in (1, 7) and second not in (1, 7) and third == 1


def _greedy(params, logits_row, outputs=(), prompt=(1,)):
    s = setup([params], outputs=[np.array(outputs, np.int64)], prompts=[np.array(prompt, np.int64)])
    return run(s, torch.tensor([logits_row]), [0]).sampled.item()


def test_presence_frequency_and_repetition_penalties():
    row = [2.0, 1.9] + [-5.0] * (V - 2)
    assert _greedy(RowParams(temperature=0.0), row, outputs=[0]) == 0
    assert _greedy(RowParams(temperature=0.0, presence_penalty=0.2), row, outputs=[0]) == 1
    assert _greedy(RowParams(temperature=0.0, frequency_penalty=0.06), row, outputs=[0]) == 0  # 1.94
    assert _greedy(RowParams(temperature=0.0, frequency_penalty=0.06), row, outputs=[0, 0]) == 1  # 1.88
    # repetition applies to prompt tokens too, dividing positive logits
    assert _greedy(RowParams(temperature=0.0, repetition_penalty=1.1), row, prompt=[0]) == 1
    # ... and multiplying negative ones
    neg = [-1.0, -1.05] + [-9.0] * (V - 2)
    assert _greedy(RowParams(temperature=0.0, repetition_penalty=1.1), neg, prompt=[0]) == 1


def test_penalty_counts_follow_the_sampled_tokens():
    row = torch.tensor([[2.0, 1.9, 1.8] + [-5.0] * (V - 3)])
    s = setup([RowParams(temperature=0.0, presence_penalty=0.25)])
    assert [run(s, row, [0]).sampled.item() for _ in range(4)] == [0, 1, 2, 0]


def test_logprobs_are_raw_top_k_plus_the_sampled_token_with_rank():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, V, generator=g)
    s = setup([RowParams(temperature=0.0, logprobs=3), RowParams(seed=2), RowParams(seed=3, logprobs=0,
                                                                                      temperature=1.5)])
    out = run(s, logits, [0, 1, 2])
    assert out.lp_idx.tolist() == [0, 2]
    ref = torch.log_softmax(logits, -1)
    top = ref[0].topk(3)
    assert out.topk_ids[0].tolist() == top.indices.tolist()
    np.testing.assert_allclose(out.topk_logprobs[0], top.values.numpy(), rtol=1e-6)
    for i, r in zip(out.lp_idx, range(2)):
        tok = out.sampled[i].item()
        np.testing.assert_allclose(out.sampled_logprobs[r], ref[i, tok].item(), rtol=1e-6)
        assert out.sampled_ranks[r] == int((ref[i] > ref[i, tok]).sum()) + 1
    assert out.sampled_ranks[0] == 1  # greedy


def test_noise_is_uniform_and_differs_across_keys():
    keys = torch.from_numpy(row_keys(np.array([1, 1, 2]), np.array([0, 1, 0])))
    u = uniform_noise(keys, 20000)
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert abs(torch.corrcoef(u)[0, 1].item()) < 0.03
