//! The scheduler's public face. CONTRACT: signatures below are what `yoco-py` and `yoco-ref` call.

use super::plan::{FinishReason, StepOutcome, StepPlan};
use super::request::NewRequest;
use crate::error::Result;
use crate::kv::{KvConfig, KvMetrics, LayerKind};

/// Order of the waiting queue and choice of preemption victims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// First come, first served; the victim is the most recently admitted running request.
    #[default]
    Fcfs,
    /// Lowest `priority` value first, then arrival; the victim is the least important running request.
    Priority,
}

/// Scheduler limits. KV layout comes from `layers` + `kv`.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// One entry per decoder layer.
    pub layers: Vec<LayerKind>,
    pub kv: KvConfig,
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    pub max_model_len: u32,
    /// Per-request chunk cap for long prompts when other requests compete (0 = off).
    pub long_prefill_token_threshold: u32,
    pub policy: Policy,
    /// Skip-and-continue admission: a waiting request that does not fit may be passed over by later
    /// ones at most this many steps; then admission stops behind it until it fits (0 = strict HOL).
    pub max_admission_skips: u32,
    /// Ascending token counts the executor captured graphs for (empty: no padding).
    pub token_capture_sizes: Vec<u32>,
    /// Ascending cross-decoder row counts the executor captured graphs for (empty: no padding).
    pub cross_capture_sizes: Vec<u32>,
}

/// Scheduler statistics the engine exports.
#[derive(Debug, Clone, Copy, Default)]
pub struct SchedulerStats {
    pub num_running: u32,
    pub num_waiting: u32,
    pub num_preemptions: u64,
    pub kv: KvMetrics,
}

pub struct Scheduler {
    _private: (),
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Result<Self> {
        let _ = config;
        todo!()
    }
    /// Validates and queues a request (`Error::Request` names what is wrong).
    pub fn add_request(&mut self, req: NewRequest) -> Result<()> {
        let _ = req;
        todo!()
    }
    /// Aborts a request in any state and frees everything it holds; unknown ids are a no-op (false).
    pub fn abort(&mut self, id: u64) -> bool {
        let _ = id;
        todo!()
    }
    /// Finishes a request for an engine-side reason (a stop string) and frees it.
    pub fn finish(&mut self, id: u64, reason: FinishReason) -> bool {
        let _ = (id, reason);
        todo!()
    }
    /// Plans the next step. An empty plan (R = 0) means nothing can run.
    pub fn schedule(&mut self) -> &StepPlan {
        todo!()
    }
    /// Applies the step's sampled tokens, one per sampling request in `sample_rows` order.
    pub fn update(&mut self, sampled: &[i32]) -> Result<&StepOutcome> {
        let _ = sampled;
        todo!()
    }
    /// Persistent block table of group `g`, `[max_num_seqs * max_blocks_per_seq]` row-major,
    /// indexed by `req_rows`; updated in place by `schedule`.
    pub fn block_table(&self, g: usize) -> &[i32] {
        let _ = g;
        todo!()
    }
    pub fn max_blocks_per_seq(&self) -> usize {
        todo!()
    }
    pub fn num_unfinished(&self) -> usize {
        todo!()
    }
    pub fn stats(&self) -> SchedulerStats {
        todo!()
    }
}
