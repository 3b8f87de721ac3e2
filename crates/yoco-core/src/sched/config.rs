//! What a scheduler is built from: its limits, KV layout and policy ([`SchedulerConfig`],
//! [`Policy`]). Its own room so the modules that only read configuration (the waiting queue,
//! validation) do not depend on the scheduler itself.

use crate::error::Result;
use crate::kv::{kv_groups, KvConfig, LayerKind};

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
    /// `kv.max_num_batched_tokens` is overwritten with [`SchedulerConfig::max_num_batched_tokens`].
    pub kv: KvConfig,
    /// Requests running at once (rows of a plan and of the persistent block tables).
    pub max_num_seqs: u32,
    /// Token budget of one step, all rows together (the executor's largest batch).
    pub max_num_batched_tokens: u32,
    /// Longest sequence (prompt + output) a request may reach; sizes each block-table row.
    pub max_model_len: u32,
    /// Per-request chunk cap for long prompts when other requests compete (0 = off). Ignored when
    /// only one request is unfinished (vLLM 0.33).
    pub long_prefill_token_threshold: u32,
    /// Waiting-queue order and preemption victim choice.
    pub policy: Policy,
    /// Skip-and-continue admission: a waiting request that does not fit may be passed over by later
    /// ones at most this many steps; then admission stops behind it until it fits (0 = strict HOL).
    pub max_admission_skips: u32,
    /// Encoder budget of one step: multimodal encoder output tokens (image / audio soft tokens)
    /// the scheduled chunks may need computed (vLLM's `max_num_encoder_input_tokens`; see
    /// `encoder_budget.rs`). Every item must fit in it.
    pub max_num_encoder_input_tokens: u32,
    /// Ascending token counts the executor captured graphs for (empty: no padding).
    pub token_capture_sizes: Vec<u32>,
    /// Ascending cross-decoder row counts the executor captured graphs for (empty: no padding).
    pub cross_capture_sizes: Vec<u32>,
}

/// Default of [`SchedulerConfig::max_admission_skips`].
pub const DEFAULT_MAX_ADMISSION_SKIPS: u32 = 16;

impl SchedulerConfig {
    /// A configuration with vLLM-like defaults: 256 sequences, 8192 tokens per step, FCFS, no
    /// capture sizes, prefix caching on, and `max_model_len` = what the pool holds for one sequence
    /// (capped at 1 << 20) unless set afterwards.
    pub fn new(layers: Vec<LayerKind>, block_size: u32, num_blocks: u32) -> Result<Self> {
        let groups = kv_groups(&layers)?;
        let max_model_len =
            (num_blocks.saturating_sub(1) as u64 * block_size as u64).clamp(1, 1 << 20) as u32;
        Ok(SchedulerConfig {
            layers,
            kv: KvConfig {
                block_size,
                sub_block_size: block_size,
                num_blocks: vec![num_blocks; groups.len()],
                enable_prefix_caching: true,
                enable_events: false,
                hash_seed: None,
                max_num_batched_tokens: 8192,
            },
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len,
            long_prefill_token_threshold: 0,
            policy: Policy::Fcfs,
            max_admission_skips: DEFAULT_MAX_ADMISSION_SKIPS,
            max_num_encoder_input_tokens: 8192,
            token_capture_sizes: Vec::new(),
            cross_capture_sizes: Vec::new(),
        })
    }
}
