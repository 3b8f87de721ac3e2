"""Recomputes every expected array of the golden fixtures with numpy alone, as an independent check
of the Rust reference and as an executable description of the format (see README.md).

    python crates/yoco-ref/golden/check_golden.py
"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, qsl, scale, window):
    """q [N, H, D] with rows r owning q[qsl[r]:qsl[r+1]], bottom-right aligned against seq_lens."""
    out = np.zeros_like(q)
    bs = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    for r in range(len(seq_lens)):
        n, s = qsl[r + 1] - qsl[r], seq_lens[r]
        pos = np.arange(s)
        slots = block_tables[r][pos // bs] * bs + pos % bs
        k = k_cache.reshape(-1, *k_cache.shape[2:])[slots]  # [s, KVH, D]
        v = v_cache.reshape(-1, *v_cache.shape[2:])[slots]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # GQA: head h -> kv h // group
        for i in range(n):
            p = s - n + i
            visible = (pos <= p) & ((pos > p - window) if window > 0 else True)
            scores = np.einsum("hd,khd->hk", q[qsl[r] + i].astype(np.float64), k.astype(np.float64)) * scale
            scores[:, ~visible] = -np.inf
            w = np.exp(scores - scores.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
            out[qsl[r] + i] = np.einsum("hk,khd->hd", w, v.astype(np.float64))
    return out


def main():
    a = np.load(HERE / "paged_attention.npz")
    t, x = int(a["num_tokens"]), int(a["num_cross"])
    # k_cache already holds this step's K/V: key[i] sits at slot_mapping[i] (padding in block 0).
    kc = a["k_cache"].reshape(-1, *a["k_cache"].shape[2:])
    assert np.array_equal(kc[a["slot_mapping"][:t]], a["key"][:t])
    assert (a["slot_mapping"][t:] < a["k_cache"].shape[1]).all()
    for w in a["sliding_windows"]:
        for q, loc, n, name in [
            (a["query"], a["query_start_loc"], t, f"out_window{w}"),
            (a["cross_query"], a["cross_query_start_loc"], x, f"cross_out_window{w}"),
        ]:
            got = paged_attention(q, a["k_cache"], a["v_cache"], a["block_tables"], a["seq_lens"], loc, float(a["scale"]), int(w))
            err = np.abs(got[:n] - a[name][:n]).max()
            assert err < 1e-5, (name, err)
            print(f"{name}: max |numpy - reference| = {err:.2e}")
    assert (a["cross_indices"][x:] == a["cross_indices"][x - 1]).all()

    b = np.load(HERE / "write_and_copy.npz")
    k, v = b["k_cache_before"].copy(), b["v_cache_before"].copy()
    for _group, src, dst, n in b["kv_copies"]:
        k[dst, :n], v[dst, :n] = k[src, :n], v[src, :n]
    assert np.array_equal(k, b["k_cache_after_copy"]) and np.array_equal(v, b["v_cache_after_copy"])
    bs = k.shape[1]
    for i, s in enumerate(b["slot_mapping"]):
        k[s // bs, s % bs], v[s // bs, s % bs] = b["key"][i], b["value"][i]
    assert np.array_equal(k, b["k_cache_after_write"]) and np.array_equal(v, b["v_cache_after_write"])
    print("write_and_copy: exact")


if __name__ == "__main__":
    main()
