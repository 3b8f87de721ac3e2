//! Figures the step loop publishes and the front end reads (metrics, health), lock-free except for
//! the bounded step trace.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use crate::hist::{Hist, ITL_BUCKETS, LATENCY_BUCKETS, TOKEN_BUCKETS, TTFT_BUCKETS};

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
    /// Why the loop stopped, when a failing executor stopped it (the last step's error).
    pub dead_error: Mutex<Option<String>>,
    /// The KV pool and prefix cache as the core counts them (`yoco:` series).
    pub kv: KvFigures,
    /// Tokens scheduled through the self-decoder (`yoco:scheduled_tokens`).
    pub scheduled_tokens: AtomicU64,
    /// Rows the plans ran through the cross-decoder (`yoco:cross_decoder_rows`).
    pub cross_rows: AtomicU64,
    /// KV event batches published (`--kv-events-config`).
    pub kv_events_published: AtomicU64,
    /// KV event batches dropped on a full publisher queue, plus events the core's bounded log
    /// discarded.
    pub kv_events_dropped: AtomicU64,
    /// Per-request and per-step histograms, vLLM's names.
    pub hists: LoopHists,
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
            dead_error: Mutex::new(None),
            kv: KvFigures::default(),
            scheduled_tokens: AtomicU64::new(0),
            cross_rows: AtomicU64::new(0),
            kv_events_published: AtomicU64::new(0),
            kv_events_dropped: AtomicU64::new(0),
            hists: LoopHists::default(),
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

/// The core's KV figures beyond the gauges above, copied each step.
#[derive(Debug, Default)]
pub struct KvFigures {
    /// Usable blocks.
    pub blocks_total: AtomicU64,
    /// Blocks held by requests.
    pub blocks_used: AtomicU64,
    /// Free blocks (cached ones included).
    pub blocks_free: AtomicU64,
    /// Free blocks still holding a cached prefix.
    pub blocks_cached: AtomicU64,
    /// Sub-block copy-on-match operations.
    pub copies: AtomicU64,
    /// Tokens those copies moved.
    pub copied_tokens: AtomicU64,
    /// Partial blocks adopted instead of copied.
    pub adoptions: AtomicU64,
}

/// vLLM's request histograms (`time_to_first_token_seconds` ...), as the Python engine observes
/// them: from the loop's arrival of a request, its first admission, its first and later tokens, and
/// its end.
#[derive(Debug)]
pub struct LoopHists {
    /// Arrival to first token.
    pub ttft: Hist,
    /// Between two tokens of a request.
    pub itl: Hist,
    /// Arrival to end.
    pub e2e: Hist,
    /// Arrival to first admission.
    pub queue: Hist,
    /// First admission to first token.
    pub prefill: Hist,
    /// First token to last token.
    pub decode: Hist,
    /// Prompt tokens per finished request.
    pub prompt_tokens: Hist,
    /// Generated tokens per finished request.
    pub generation_tokens: Hist,
    /// Tokens per step.
    pub iteration_tokens: Hist,
}

impl Default for LoopHists {
    fn default() -> Self {
        Self {
            ttft: Hist::new(TTFT_BUCKETS),
            itl: Hist::new(ITL_BUCKETS),
            e2e: Hist::new(LATENCY_BUCKETS),
            queue: Hist::new(LATENCY_BUCKETS),
            prefill: Hist::new(LATENCY_BUCKETS),
            decode: Hist::new(LATENCY_BUCKETS),
            prompt_tokens: Hist::new(TOKEN_BUCKETS),
            generation_tokens: Hist::new(TOKEN_BUCKETS),
            iteration_tokens: Hist::new(TOKEN_BUCKETS),
        }
    }
}

/// The moments of one request the histograms are made of (kept by the loop per live request).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestTimes {
    arrival: Instant,
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

impl RequestTimes {
    pub(crate) fn new(arrival: Instant) -> Self {
        Self {
            arrival,
            scheduled: None,
            first_token: None,
            last_token: None,
        }
    }
}

impl Stats {
    /// A plan ran: its scheduled tokens and cross-decoder rows.
    pub(crate) fn observe_plan(&self, num_tokens: u32, num_cross: u32) {
        self.scheduled_tokens.fetch_add(num_tokens as u64, Relaxed);
        self.cross_rows.fetch_add(num_cross as u64, Relaxed);
        self.hists.iteration_tokens.observe(num_tokens as f64);
    }

    /// The request was admitted for the first time at `now`.
    pub(crate) fn observe_admitted(&self, t: &mut RequestTimes, now: Instant) {
        if t.scheduled.is_none() {
            t.scheduled = Some(now);
        }
    }

    /// The request got a token at `now`: its TTFT, or an inter-token gap.
    pub(crate) fn observe_token(&self, t: &mut RequestTimes, now: Instant) {
        match t.last_token {
            None => {
                t.first_token = Some(now);
                self.hists.ttft.observe((now - t.arrival).as_secs_f64());
            }
            Some(prev) => self.hists.itl.observe((now - prev).as_secs_f64()),
        }
        t.last_token = Some(now);
    }

    /// The request ended at `now` with these token counts.
    pub(crate) fn observe_end(&self, t: &RequestTimes, now: Instant, prompt: u32, generated: u32) {
        let h = &self.hists;
        h.e2e.observe((now - t.arrival).as_secs_f64());
        if let Some(s) = t.scheduled {
            h.queue.observe((s - t.arrival).as_secs_f64());
            if let Some(f) = t.first_token {
                h.prefill.observe((f.max(s) - s).as_secs_f64());
            }
        }
        if let (Some(f), Some(l)) = (t.first_token, t.last_token) {
            h.decode.observe((l - f).as_secs_f64());
        }
        h.prompt_tokens.observe(prompt as f64);
        h.generation_tokens.observe(generated as f64);
    }

    /// The core's KV figures after a step.
    pub(crate) fn publish_kv(&self, kv: &yoco_core::kv::KvMetrics) {
        let k = &self.kv;
        k.blocks_total.store(kv.blocks_total, Relaxed);
        k.blocks_used.store(kv.blocks_used, Relaxed);
        k.blocks_free.store(kv.blocks_free, Relaxed);
        k.blocks_cached.store(kv.blocks_cached, Relaxed);
        k.copies.store(kv.copies, Relaxed);
        k.copied_tokens.store(kv.copied_tokens, Relaxed);
        k.adoptions.store(kv.adoptions, Relaxed);
    }
}
