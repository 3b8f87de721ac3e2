//! Seeded random workloads for the property tests and benches: a scheduler configuration (block and
//! sub-block sizes, layer layout with sliding windows shorter and longer than a block and a
//! KV-sharing cross-decoder, tiny or roomy pools, token budgets that force chunked prefill, capture
//! sizes) and a request stream whose prompts share prefixes that end just before, at and just after
//! sub-block and block boundaries, with arrivals spread over steps, aborts, siblings, salts and
//! prompt-logprob requests.

use yoco_core::kv::{HashExtras, KvConfig, LayerKind};
use yoco_core::sched::{NewRequest, Policy, SchedulerConfig};

use crate::attention::Heads;
use crate::layout::{gemma3n_layers, ModelLayout};
use crate::rng::Rng;

/// A request and the step before whose scheduling it arrives.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// Submitted just before the scheduler plans this step.
    pub step: usize,
    /// The request as submitted.
    pub req: NewRequest,
}

/// A reproducible run: the scheduler configuration and what arrives when. Everything follows from
/// `seed` (and the spec it was drawn with), so a failing seed is the whole bug report.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The seed it was drawn from (also seeds the driver's choices and the synthetic K/V).
    pub seed: u64,
    /// The scheduler under test.
    pub sched: SchedulerConfig,
    /// Token ids lie in `0..vocab` (the mock model's vocabulary).
    pub vocab: u32,
    /// Requests in step order.
    pub arrivals: Vec<Arrival>,
    /// Per step, chance to abort one live request (before `schedule` or between it and `update`).
    pub abort_chance: f64,
    /// Chance that a finished request is followed by another turn: its prompt + output + new text.
    pub follow_up_chance: f64,
    /// At most this many follow-up turns in the run.
    pub max_follow_ups: usize,
}

/// Knobs of the generator.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    /// Token ids are drawn from `0..vocab`.
    pub vocab: u32,
    /// Requests in the initial stream, at most (follow-up turns come on top).
    pub max_requests: usize,
    /// Prompt tokens, at most (also bounds `max_model_len` with `max_output`).
    pub max_prompt: usize,
    /// `max_tokens` of a request, at most.
    pub max_output: u32,
    /// Layer layouts to choose from; `None` draws a random one (see [`random_layers`]).
    pub layers: Option<Vec<LayerKind>>,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            vocab: 64,
            max_requests: 10,
            max_prompt: 48,
            max_output: 8,
            layers: None,
        }
    }
}

/// Heads used by the oracle's synthetic K/V: small, the oracle checks addressing not arithmetic.
pub const ORACLE_HEADS: Heads = Heads {
    num_heads: 2,
    kv_heads: 1,
    head_dim: 4,
};

/// A random layer layout: full only, sliding only, sliding + full, or Gemma-3n-like with a
/// KV-sharing tail (donors resolved by Gemma's rule), with windows around the block size.
pub fn random_layers(rng: &mut Rng, block_size: u32) -> Vec<LayerKind> {
    let bs = block_size;
    let windows = [
        1,
        (bs / 2).max(1),
        (bs - 1).max(1),
        bs,
        bs + 1,
        2 * bs + 1,
        3 * bs,
    ];
    let w = *rng.pick(&windows);
    match rng.below(6) {
        0 => vec![LayerKind::Full],
        1 => vec![LayerKind::Sliding { window: w }],
        2 => vec![LayerKind::Sliding { window: w }, LayerKind::Full],
        3 => {
            // Two sliding groups of different windows and a full one.
            let w2 = *rng.pick(&windows);
            let w2 = if w2 == w { w + 1 } else { w2 };
            vec![
                LayerKind::Sliding { window: w },
                LayerKind::Full,
                LayerKind::Sliding { window: w2 },
            ]
        }
        _ => {
            // (S, F) or (S, S, F) pattern, then a shared tail of 1..=3 layers.
            let pattern: &[bool] = if rng.chance(0.5) {
                &[true, false]
            } else {
                &[true, true, false]
            };
            let n_shared = rng.range(1, 3) as usize;
            let mut sliding: Vec<bool> = pattern.iter().chain(pattern.iter()).copied().collect();
            for i in 0..n_shared {
                sliding.push(i % 2 == 0);
            }
            gemma3n_layers(&sliding, w, n_shared).expect("both types precede the shared range")
        }
    }
}

/// Draws a workload from `seed`: configuration and request stream (see the module docs). The
/// same seed and spec always give the same workload.
pub fn random_workload(seed: u64, spec: &WorkloadSpec) -> Workload {
    let mut rng = Rng::new(seed);
    let bs = *rng.pick(&[2u32, 4, 4, 8, 8, 16]);
    let sbs = match rng.below(3) {
        0 => bs,
        1 => (bs / 2).max(1),
        _ => (bs / 4).max(1),
    };
    let layers = spec
        .layers
        .clone()
        .unwrap_or_else(|| random_layers(&mut rng, bs));
    let num_groups = ModelLayout::new(&layers)
        .expect("valid layers")
        .groups
        .len();
    let max_output = spec.max_output.max(1);
    let max_model_len = if rng.chance(0.15) {
        // Tight: some requests end by length rather than max_tokens.
        rng.range(
            spec.max_prompt as u64 / 2 + 2,
            spec.max_prompt as u64 + max_output as u64,
        ) as u32
    } else {
        spec.max_prompt as u32 + max_output
    };
    let budget = *rng.pick(&[4u32, 8, 8, 16, 16, 32, 64]);
    let budget = budget.max(2);
    // Tiny pools preempt often; roomy ones cache a lot.
    let per_seq = max_model_len.div_ceil(bs) + 1;
    let num_blocks = match rng.below(3) {
        0 => per_seq + rng.below(per_seq as u64 / 2 + 2) as u32,
        1 => 2 * per_seq + rng.below(per_seq as u64) as u32,
        _ => 6 * per_seq,
    };
    let kv = KvConfig {
        block_size: bs,
        sub_block_size: sbs,
        num_blocks: vec![num_blocks; num_groups],
        enable_prefix_caching: rng.chance(0.92),
        enable_events: false,
        hash_seed: None,
        max_num_batched_tokens: budget,
    };
    let capture = rng.chance(0.4);
    let sched = SchedulerConfig {
        layers,
        kv,
        max_num_seqs: rng.range(1, 6) as u32,
        max_num_batched_tokens: budget,
        max_model_len,
        long_prefill_token_threshold: if rng.chance(0.3) {
            rng.range(1, budget as u64) as u32
        } else {
            0
        },
        policy: if rng.chance(0.3) {
            Policy::Priority
        } else {
            Policy::Fcfs
        },
        max_admission_skips: if rng.chance(0.5) {
            16
        } else {
            rng.below(3) as u32
        },
        max_num_encoder_input_tokens: 8192,
        token_capture_sizes: if capture {
            capture_sizes(budget)
        } else {
            vec![]
        },
        cross_capture_sizes: if capture { capture_sizes(8) } else { vec![] },
    };

    // Prompts: a few shared bases, cut near sub-block and block boundaries, plus fresh suffixes.
    let vocab = spec.vocab;
    let max_prompt = (spec.max_prompt as u32).min(max_model_len - 1).max(1) as usize;
    let bases: Vec<Vec<u32>> = (0..rng.range(1, 3))
        .map(|_| {
            (0..max_prompt)
                .map(|_| rng.below(vocab as u64) as u32)
                .collect()
        })
        .collect();
    let n = rng.range(1, spec.max_requests as u64) as usize;
    let mut arrivals: Vec<Arrival> = Vec::with_capacity(n);
    for id in 0..n as u64 {
        let sibling = if !arrivals.is_empty() && rng.chance(0.05) {
            Some(rng.below(arrivals.len() as u64) as usize)
        } else {
            None
        };
        let prompt: Vec<u32> = if let Some(s) = sibling {
            arrivals[s].req.prompt.clone()
        } else if !arrivals.is_empty() && rng.chance(0.15) {
            arrivals[rng.below(arrivals.len() as u64) as usize]
                .req
                .prompt
                .clone()
        } else {
            let base = rng.pick(&bases);
            let unit = if rng.chance(0.5) { sbs } else { bs } as i64;
            let k = rng.range(0, (max_prompt as u64 / unit as u64).max(1)) as i64;
            let cut = (k * unit + rng.range(0, 2) as i64 - 1).clamp(0, max_prompt as i64) as usize;
            let cut = if rng.chance(0.15) {
                rng.range(0, max_prompt as u64) as usize
            } else {
                cut
            };
            let mut p = base[..cut].to_vec();
            let suffix = rng.range(if p.is_empty() { 1 } else { 0 }, 10) as usize;
            p.extend((0..suffix).map(|_| rng.below(vocab as u64) as u32));
            p.truncate(max_prompt);
            p
        };
        let max_tokens = rng.range(1, max_output as u64) as u32;
        let extras = if rng.chance(0.1) {
            HashExtras {
                cache_salt: Some(if rng.chance(0.5) { "a" } else { "b" }.into()),
                lora: None,
            }
        } else {
            HashExtras::default()
        };
        let req = NewRequest {
            id,
            prompt,
            max_tokens,
            min_tokens: if rng.chance(0.2) {
                rng.range(0, max_tokens as u64) as u32
            } else {
                0
            },
            eos_token_ids: if rng.chance(0.3) {
                vec![rng.below(vocab as u64) as u32]
            } else {
                vec![]
            },
            stop_token_ids: if rng.chance(0.1) {
                vec![rng.below(vocab as u64) as u32]
            } else {
                vec![]
            },
            ignore_eos: rng.chance(0.1),
            priority: rng.below(3) as i32,
            hash_extras: extras,
            prompt_logprobs: rng.chance(0.05),
            after: sibling.map(|s| arrivals[s].req.id),
        };
        let step = match sibling {
            Some(s) => arrivals[s].step,
            None if rng.chance(0.5) => 0,
            None => rng.below(12) as usize,
        };
        arrivals.push(Arrival { step, req });
    }
    arrivals.sort_by_key(|a| a.step);
    Workload {
        seed,
        sched,
        vocab,
        arrivals,
        abort_chance: if rng.chance(0.3) { 0.05 } else { 0.0 },
        follow_up_chance: 0.3,
        max_follow_ups: 3,
    }
}

/// 1, 2, 4, ... up to the first power of two >= `max`.
fn capture_sizes(max: u32) -> Vec<u32> {
    let mut v = vec![1];
    while *v.last().unwrap() < max {
        v.push(v.last().unwrap() * 2);
    }
    v
}
