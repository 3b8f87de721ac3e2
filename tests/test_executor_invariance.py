"""Batch invariance of the CPU executor beyond the short contexts the transformers comparisons use, and the
measured BLAS/softmax properties it rests on (``yoco_rs.executor.invariance``).

A token's logits must be bit-identical whatever else is in the batch, however its prompt was chunked and
whether it was computed by prefill or by decode, at any context length (values are summed in fixed
192-key pieces for that); and the fast-prefill shortcut in the last self-decoder layer must not change a
bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_harness import PagedSim, Row, executor_from_hf
from tiny import tiny_hf_model

from yoco_rs.executor.invariance import FMA_CHAIN_MAX, MIN_GEMM_ROWS, MIN_KEYS, VALUE_PIECE

# Bit-identity here rests on the locked torch build's BLAS and softmax rounding (docs/DESIGN.md, "Numerics").
pytestmark = pytest.mark.locked_rounding

# long contexts: a 300-token window and a full-attention group, prompts well past one value piece; heads
# as tiny-10L (all query heads in one score GEMM) and as E2B (8 query / 2 KV heads of 256: a GEMM per KV
# head, and score sums over more than FMA_CHAIN_MAX terms)
LONG = dict(sliding_window=300, max_position_embeddings=2048)
HEADS = {"tiny-heads": {}, "e2b-heads": dict(num_attention_heads=8, head_dim=256)}


@pytest.fixture(scope="module", params=list(HEADS))
def hf(request):
    return tiny_hf_model(seed=4, **LONG, **HEADS[request.param])


def _tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(hf, steps, *, block_size=16, fast=True):
    """Runs ``steps`` (lists of ``(rid, tokens, num_tokens, num_cross)``) on a fresh executor; returns the
    logits of every cross row as ``{(rid, position): logits}``."""
    ex = executor_from_hf(hf, kv_sharing_fast_prefill=fast)
    sim = PagedSim(ex, block_size, 400, seed=11)
    out = {}
    for rows in steps:
        for rid, toks, _, _ in rows:
            if rid not in sim.reqs:
                sim.add(rid, toks)
        batch, _, cross = sim.step([Row(rid, n, x) for rid, _, n, x in rows])
        logits = ex.execute(batch)
        out.update({key: logits[i] for i, key in enumerate(cross)})
    return out


def test_decode_equals_chunked_prefill_beyond_one_value_piece(hf):
    toks = _tokens(1, 460)
    # A: prefill 430 tokens in one step, then 30 decode steps
    a = _run(hf, [[("r", toks, 430, 1)]] + [[("r", toks, 1, 1)]] * 30)
    # B: the whole sequence as prefill chunks of odd sizes, every position sampled
    sizes = [97, 101, 50, 150, 62]
    b = _run(hf, [[("r", toks, n, n)] for n in sizes])
    positions = range(429, 460)
    assert all(torch.equal(a[("r", p)], b[("r", p)]) for p in positions), \
        "prefill and decode must give bit-identical logits past 192 keys"


def test_decode_row_is_independent_of_the_batch_at_long_context(hf):
    toks = _tokens(2, 250)  # 231..250 keys: BLAS would split a 250-key sum differently from a 620-key one
    others = {f"o{i}": _tokens(10 + i, n) for i, n in enumerate((40, 230, 600, 29))}
    alone = _run(hf, [[("r", toks, 230, 1)]] + [[("r", toks, 1, 1)]] * 20)
    # the same row decoded next to rows of other lengths (other buckets, other padding), and one prefilling
    steps = [[("r", toks, 230, 1)] + [(k, t, len(t) - 20, 1) for k, t in others.items()]]
    steps += [[("r", toks, 1, 1)] + [(k, t, 1, 1) for k, t in others.items()]] * 5
    steps += [[("r", toks, 1, 1), ("late", _tokens(3, 500), 500, 3)]]
    steps += [[("r", toks, 1, 1)] + [(k, t, 1, 1) for k, t in others.items()]] * 14
    together = _run(hf, steps)
    assert all(torch.equal(alone[("r", p)], together[("r", p)]) for p in range(229, 250))


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_last_self_decoder_layer_runs_past_kv_only_for_sampled_rows(fast):
    """Fast prefill skips the last self-decoder layer's work after its K/V for tokens nobody samples; the
    logits and the whole KV cache are bit-identical to running it on every token."""
    hf = tiny_hf_model(seed=5)
    last = hf.config.num_hidden_layers - hf.config.num_kv_shared_layers - 1
    results = []
    for collect in (False, True):  # collecting hidden states runs the self-decoder on every token
        ex = executor_from_hf(hf, kv_sharing_fast_prefill=fast)
        mlp_rows: list[int] = []
        ex.model.layers[last].mlp.register_forward_pre_hook(lambda _m, args: mlp_rows.append(args[0].shape[0]))
        sim = PagedSim(ex, 8, 64, seed=2)
        sim.add("a", _tokens(6, 40))
        sim.add("b", _tokens(7, 31))
        logits = []
        for rows in ([Row("a", 33, 1), Row("b", 30, 2)], [Row("a", 1, 1), Row("b", 1, 1)]):
            batch, _, _ = sim.step(rows)
            logits.append(ex.execute(batch, hidden_states=[] if collect else None))
        results.append((logits, [k.clone() for k in ex.kv_caches], mlp_rows))
    (l_skip, kv_skip, rows_skip), (l_all, kv_all, rows_all) = results
    assert all(torch.equal(x, y) for x, y in zip(l_skip, l_all))
    assert all(torch.equal(x, y) for x, y in zip(kv_skip, kv_all))
    assert rows_all == [63, 2]  # every token of the prefill step; the decode step's 2 rows (no padding)
    assert rows_skip == ([3, 2] if fast else [63, 2])  # only the 3 sampled rows when fast


def _chain(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``p @ v`` as sequential FMA chains (``embedding_bag``: one weighted sum per row of ``p``)."""
    m, k = p.shape
    return F.embedding_bag(torch.arange(k).repeat(m), v, torch.arange(0, m * k, k), mode="sum",
                           per_sample_weights=p.reshape(-1))


def test_blas_sums_at_most_fma_chain_max_terms_as_one_fma_chain():
    g = torch.Generator().manual_seed(0)
    for m in (MIN_GEMM_ROWS, 64):
        for k in (1, 17, 100, VALUE_PIECE, FMA_CHAIN_MAX):
            for n in (32, 64):
                p, v = torch.rand(m, k, generator=g), torch.randn(k, n, generator=g)
                assert torch.equal(p @ v, _chain(p, v)), (m, k, n)
                # zero terms before/after add nothing; strided operands do not matter
                pz = torch.cat([torch.zeros(m, 5), p, torch.zeros(m, 7)], 1)
                vz = torch.cat([torch.randn(5, n, generator=g), v, torch.randn(7, n, generator=g)])
                if k + 12 <= FMA_CHAIN_MAX:
                    assert torch.equal(pz @ vz, p @ v)
                wide = torch.randn(k, 2, n, generator=g)
                wide[:, 1] = v
                assert torch.equal(torch.bmm(p[None], wide[None, :, 1]), (p @ v)[None])


def test_softmax_ignores_masked_entries_around_rows_of_at_least_min_keys():
    g = torch.Generator().manual_seed(1)
    neg = torch.finfo(torch.float32).min
    for n in (1, 3, 15, 16, 40, 300):
        x = 3 * torch.randn(64, n, generator=g)
        outs = []
        for before, after in ((0, max(0, MIN_KEYS - n)), (5, 11), (13, 200), (100, 3)):
            row = torch.cat([torch.full((64, before), neg), x, torch.full((64, after), neg)], 1)
            if row.shape[1] >= MIN_KEYS:
                outs.append(torch.softmax(row, -1)[:, before:before + n])
        assert all(torch.equal(outs[0], o) for o in outs[1:]), n


def test_altup_predict_rounds_like_transformers_small_gemm():
    """transformers: ``h + matmul(h^T [H, A], c^T [A, A])`` per token; ours: elementwise, same bits, whether
    this CPU's BLAS fuses the 4 terms into one FMA chain or not."""
    from yoco_rs.models.gemma3n.layer import PREDICT_CHUNK

    altup = executor_from_hf(tiny_hf_model(seed=6)).model.layers[0].altup
    g = torch.Generator().manual_seed(2)
    for t in (4, 64, PREDICT_CHUNK + 300):
        h = torch.randn(t, 4, 128, generator=g)
        with torch.inference_mode():
            c = F.linear(altup.modalities(h[:, 0]), altup.prediction_coefs.weight).view(t, 4, 4)
            ref = torch.matmul(h.permute(0, 2, 1), c.permute(0, 2, 1)).permute(0, 2, 1) + h
            assert torch.equal(altup.predict(h), ref), t  # on either CPU (invariance.SMALL_GEMM_FMA)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_large_steps_run_as_row_sub_batches_with_identical_results(fast):
    """On the CPU a step over ``sub_batch_tokens`` runs as sub-batches of whole rows; logits and KV are
    bit-identical to one batch (rows of every kind: chunks, decodes, prompt logprobs, no sampling, a copy op,
    padding)."""
    hf = tiny_hf_model(seed=8)
    results = []
    for limit in (0, 30):
        ex = executor_from_hf(hf, kv_sharing_fast_prefill=fast)
        ex.sub_batch_tokens = limit
        calls: list[int] = []
        ex.model.layers[0].register_forward_pre_hook(lambda _m, args: calls.append(args[0].shape[0]))
        sim = PagedSim(ex, 8, 128, seed=5)
        for rid, seed, n in (("a", 11, 60), ("b", 12, 50), ("c", 13, 30)):
            sim.add(rid, _tokens(seed, n))
        sim.add("d", sim.reqs["a"].tokens[:11] + _tokens(14, 20))
        logits = []
        batch, _, _ = sim.step([Row("a", 37, 1), Row("b", 20, 0), Row("c", 9, 2)], pad_tokens=5, pad_cross=3)
        logits.append(ex.execute(batch))
        copies = sim.share_prefix("d", "a", 11)
        batch, _, _ = sim.step([Row("a", 1, 1), Row("b", 25, 25), Row("c", 21, 1), Row("d", 15, 2)],
                               copies=copies, null_out_of_window=True)
        logits.append(ex.execute(batch))
        results.append((logits, [k.clone() for k in ex.kv_caches], calls))
    (l_one, kv_one, calls_one), (l_split, kv_split, calls_split) = results
    assert all(torch.equal(x, y) for x, y in zip(l_one, l_split))
    # block 0 is the padding target (garbage by contract): padding tokens land there differently
    assert all(torch.equal(x[:, :, 1:], y[:, :, 1:]) for x, y in zip(kv_one, kv_split))
    assert calls_one == [71, 62]  # one forward per step (66 tokens + 5 padding; 62 tokens)
    assert calls_split == [37, 29, 26, 21, 15]  # rows a | b, c ; a, b | c | d
