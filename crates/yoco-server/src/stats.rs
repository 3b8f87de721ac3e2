//! Figures the step loop publishes and the front end reads (metrics, health), lock-free except for
//! the bounded step trace.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Upper bounds (seconds) of the step-period histogram: 50 µs to 1 s, ~19% apart, fine enough for
/// p50/p99 read off the buckets to within one bucket.
pub const STEP_BUCKETS: [f64; 58] = {
    let mut b = [0.0; 58];
    let mut v = 50e-6;
    let mut i = 0;
    while i < 58 {
        b[i] = v;
        v *= 1.19;
        i += 1;
    }
    b
};

/// Steps whose periods the trace keeps between two reads (a bench reads it; nobody else does).
const TRACE_CAP: usize = 1 << 20;

/// Live figures of one step loop.
#[derive(Debug)]
pub struct Stats {
    /// Requests holding a row now.
    pub running: AtomicU32,
    /// Requests queued (new and preempted).
    pub waiting: AtomicU32,
    /// Used fraction of the KV pool, in parts per million.
    pub kv_usage_ppm: AtomicU32,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicU64,
    /// Tokens sampled.
    pub generation_tokens: AtomicU64,
    /// Non-empty steps run.
    pub steps: AtomicU64,
    /// Steps whose executor call failed.
    pub failed_steps: AtomicU64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: AtomicU64,
    /// Prompt tokens the prefix cache served.
    pub prefix_hits: AtomicU64,
    /// Preemptions.
    pub preemptions: AtomicU64,
    /// Requests finished, by reason: stop, length, abort.
    pub finished: [AtomicU64; 3],
    /// The loop stopped (executor failed too often, or shut down): the server answers 503.
    pub dead: AtomicBool,
    step_hist: Vec<AtomicU64>,
    step_sum_ns: AtomicU64,
    trace: Mutex<Vec<u32>>,
    /// Per step, µs from the previous step's `collect` returning to this step's `launch` starting:
    /// what the device waits for the loop between two forwards.
    gaps: Mutex<Vec<u32>>,
    tracing: AtomicBool,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            running: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            kv_usage_ppm: AtomicU32::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            failed_steps: AtomicU64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            finished: Default::default(),
            dead: AtomicBool::new(false),
            step_hist: (0..=STEP_BUCKETS.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            step_sum_ns: AtomicU64::new(0),
            trace: Mutex::new(Vec::new()),
            gaps: Mutex::new(Vec::new()),
            tracing: AtomicBool::new(false),
        }
    }
}

impl Stats {
    /// Records one step period (start of step N to start of step N+1).
    pub(crate) fn observe_step(&self, period_ns: u64) {
        let s = period_ns as f64 * 1e-9;
        let i = STEP_BUCKETS.partition_point(|&b| b < s);
        self.step_hist[i].fetch_add(1, Relaxed);
        self.step_sum_ns.fetch_add(period_ns, Relaxed);
        if self.tracing.load(Relaxed) {
            let mut t = self.trace.lock().unwrap();
            if t.len() < TRACE_CAP {
                t.push((period_ns / 1000).min(u32::MAX as u64) as u32);
            }
        }
    }

    /// Cumulative step-period histogram: `(upper bound, count)` per bucket, then `(+Inf, count)`,
    /// and the sum in seconds.
    pub fn step_histogram(&self) -> (Vec<(f64, u64)>, f64) {
        let mut acc = 0;
        let mut out = Vec::with_capacity(STEP_BUCKETS.len() + 1);
        for (i, c) in self.step_hist.iter().enumerate() {
            acc += c.load(Relaxed);
            out.push((STEP_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        (out, self.step_sum_ns.load(Relaxed) as f64 * 1e-9)
    }

    /// Records the loop's time between a `collect` returning and the next `launch` (traced only).
    pub(crate) fn observe_gap(&self, gap_ns: u64) {
        if self.tracing.load(Relaxed) {
            let mut t = self.gaps.lock().unwrap();
            if t.len() < TRACE_CAP {
                t.push((gap_ns / 1000).min(u32::MAX as u64) as u32);
            }
        }
    }

    /// Starts (or keeps) recording each step's period, and returns those recorded since the last
    /// call, in µs (benchmarks: exact percentiles of a measured window).
    pub fn take_step_trace(&self) -> Vec<u32> {
        self.tracing.store(true, Relaxed);
        std::mem::take(&mut *self.trace.lock().unwrap())
    }

    /// As [`Stats::take_step_trace`], for the gaps between a step's `collect` and the next
    /// `launch` (µs): the device's idle time the loop causes.
    pub fn take_gap_trace(&self) -> Vec<u32> {
        self.tracing.store(true, Relaxed);
        std::mem::take(&mut *self.gaps.lock().unwrap())
    }
}
