//! Fixed-bucket histograms with atomic counts, observed from any thread and read by `/metrics`,
//! with vLLM's bucket sets (the same as the Python engine's `yoco_rs/metrics.py`, so dashboards
//! built for vLLM read both servers alike).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Time to first token, seconds.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Inter-token latency, seconds.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// Request latencies (e2e, queue, prefill, decode), seconds.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// Token counts.
pub const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0, 100000.0,
];
/// The `n` request parameter.
pub const N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];

/// One histogram: a count per bucket (`le` upper bounds, then +Inf) and the sum.
#[derive(Debug)]
pub struct Hist {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// f64 bits of the sum.
    sum: AtomicU64,
}

impl Hist {
    /// Empty, over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Counts `v` in the first bucket whose bound is >= v (Prometheus' `le`).
    pub fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i].fetch_add(1, Relaxed);
        let _ = self.sum.fetch_update(Relaxed, Relaxed, |s| {
            Some((f64::from_bits(s) + v).to_bits())
        });
    }

    /// The bucket bounds, the count per bucket (not cumulative; the last is +Inf's) and the sum: the
    /// layout of the Python engine's `HistogramSnapshot`.
    pub fn snapshot(&self) -> (&'static [f64], Vec<u64>, f64) {
        let counts = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        (self.bounds, counts, f64::from_bits(self.sum.load(Relaxed)))
    }

    /// Cumulative `(le, count)` pairs ending with `(+Inf, total)`, and the sum.
    pub fn cumulative(&self) -> (Vec<(f64, u64)>, f64) {
        let mut acc = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c.load(Relaxed);
            out.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        (out, f64::from_bits(self.sum.load(Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket() {
        let h = Hist::new(N_BUCKETS);
        for v in [1.0, 2.0, 3.0, 50.0] {
            h.observe(v);
        }
        let (c, sum) = h.cumulative();
        assert_eq!(
            c.iter().map(|x| x.1).collect::<Vec<_>>(),
            vec![1, 2, 3, 3, 3, 4]
        );
        assert_eq!(c.last().unwrap().0, f64::INFINITY);
        assert_eq!(sum, 56.0);
    }
}
