//! Naive f32 attention, written out by hand.
//!
//! Plain loops rather than candle matmuls on purpose: every query's result is a fixed-order function
//! of its own q and the keys it sees, independent of how many other queries share the batch. GEMM
//! kernels pick tiles (and summation orders) by shape, so a batched matmul can differ from an
//! unbatched one by an ulp; here paged and contiguous evaluation of the same query are bit-identical,
//! which is what lets the mock executor demand *equal* token streams.

/// Head layout (GQA: query head h reads kv head `h / (num_heads / kv_heads)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub num_heads: usize,
    /// K/V heads; divides `num_heads` (each serves `num_heads / kv_heads` query heads).
    pub kv_heads: usize,
    /// Floats per head, for queries and K/V alike.
    pub head_dim: usize,
}

impl Heads {
    /// Floats in one token's query, all heads (`num_heads * head_dim`).
    pub fn q_len(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Floats in one token's K (or V), all kv heads: a row of paged memory.
    pub fn kv_len(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// Keys visible from a query at position `q_pos` (HF's convention: with window W, key k is visible
/// iff `q_pos - W < k <= q_pos`): the half-open range `lo..q_pos + 1`.
pub fn visible(q_pos: usize, window: Option<u32>) -> std::ops::Range<usize> {
    let lo = match window {
        Some(w) => (q_pos + 1).saturating_sub(w as usize),
        None => 0,
    };
    lo..q_pos + 1
}

/// Bottom-right aligned positions of a row's queries: with `n_q` queries against `seq_len` keys,
/// query i sits at `seq_len - n_q + i` (how paged-attention kernels read `query_start_loc` and
/// `seq_lens`). `None` when `n_q > seq_len`.
pub fn bottom_right(n_q: usize, seq_len: usize) -> Option<std::ops::Range<usize>> {
    (n_q <= seq_len).then(|| seq_len - n_q..seq_len)
}

/// One query (`[num_heads * head_dim]`) against keys/values of positions `key_start..key_start + n`
/// (`[n * kv_heads * head_dim]` each), masked to [`visible`]`(q_pos, window)`. Writes
/// `[num_heads * head_dim]` into `out`. Panics if a visible key lies outside the given range.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    h: Heads,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    key_start: usize,
    q_pos: usize,
    window: Option<u32>,
    scale: f32,
    out: &mut [f32],
) {
    let d = h.head_dim;
    let kvl = h.kv_len();
    let n = keys.len() / kvl;
    assert_eq!(keys.len(), values.len());
    assert_eq!(q.len(), h.q_len());
    assert_eq!(out.len(), h.q_len());
    let vis = visible(q_pos, window);
    assert!(
        vis.start >= key_start && vis.end <= key_start + n,
        "query at {q_pos} sees keys {vis:?} but only {key_start}..{} were given",
        key_start + n
    );
    let group = h.num_heads / h.kv_heads;
    let mut scores = vec![0f32; vis.len()];
    for head in 0..h.num_heads {
        let kvh = head / group;
        let qh = &q[head * d..(head + 1) * d];
        let mut m = f32::NEG_INFINITY;
        for (j, p) in vis.clone().enumerate() {
            let k = &keys[(p - key_start) * kvl + kvh * d..][..d];
            let mut s = 0f32;
            for i in 0..d {
                s += qh[i] * k[i];
            }
            s *= scale;
            scores[j] = s;
            if s > m || m.is_nan() {
                m = s;
            }
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - m).exp();
            sum += *s;
        }
        let o = &mut out[head * d..(head + 1) * d];
        o.fill(0.0);
        for (j, p) in vis.clone().enumerate() {
            let v = &values[(p - key_start) * kvl + kvh * d..][..d];
            for i in 0..d {
                o[i] += scores[j] * v[i];
            }
        }
        for x in o.iter_mut() {
            *x /= sum;
        }
    }
}

/// Largest |a - b|, with NaN anywhere counting as infinitely far.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (x - y).abs();
            if d.is_nan() {
                f32::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_follows_hf_convention() {
        assert_eq!(visible(5, None), 0..6);
        assert_eq!(visible(5, Some(3)), 3..6);
        assert_eq!(visible(1, Some(3)), 0..2);
        assert_eq!(visible(5, Some(1)), 5..6);
        assert_eq!(bottom_right(2, 7), Some(5..7));
        assert_eq!(bottom_right(3, 2), None);
    }

    #[test]
    fn single_visible_key_returns_its_value_and_gqa_shares_kv_heads() {
        let h = Heads {
            num_heads: 4,
            kv_heads: 2,
            head_dim: 2,
        };
        let q = [1.0; 8];
        // Two positions; kv head 0 values (1,2)/(3,4), kv head 1 values (5,6)/(7,8).
        let keys = [0.0, 0.0, 0.0, 0.0, 9.0, 9.0, 9.0, 9.0];
        let values = [1.0, 2.0, 5.0, 6.0, 3.0, 4.0, 7.0, 8.0];
        let mut out = [0.0; 8];
        attend(h, &q, &keys, &values, 0, 1, Some(1), 1.0, &mut out);
        assert_eq!(out, [3.0, 4.0, 3.0, 4.0, 7.0, 8.0, 7.0, 8.0]);
        attend(h, &q, &keys, &values, 0, 0, None, 1.0, &mut out);
        assert_eq!(out, [1.0, 2.0, 1.0, 2.0, 5.0, 6.0, 5.0, 6.0]);
        // Both visible, scores 0 and 18: softmax weights 1/(1+e^18) and e^18/(1+e^18).
        attend(h, &q, &keys, &values, 0, 1, None, 1.0, &mut out);
        let w = 1.0 / (1.0 + 18f32.exp());
        assert!((out[0] - (w * 1.0 + (1.0 - w) * 3.0)).abs() < 1e-6);
        // Scale multiplies the scores.
        attend(h, &q, &keys, &values, 0, 1, None, 0.0, &mut out);
        assert_eq!(out[..2], [2.0, 3.0]);
    }

    #[test]
    #[should_panic(expected = "only 1..2 were given")]
    fn missing_visible_keys_are_a_bug() {
        let h = Heads {
            num_heads: 1,
            kv_heads: 1,
            head_dim: 1,
        };
        let mut out = [0.0];
        attend(h, &[1.0], &[1.0], &[1.0], 1, 1, None, 1.0, &mut out);
    }
}
