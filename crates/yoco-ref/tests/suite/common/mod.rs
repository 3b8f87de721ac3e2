//! Shared by the property and mutation tests.
#![allow(dead_code)]

use yoco_core::kv::{HashExtras, KvConfig, LayerKind};
use yoco_core::sched::{NewRequest, Policy, SchedulerConfig, StepPlan};
use yoco_ref::driver::RunReport;
use yoco_ref::workload::{Arrival, Workload};

/// `YOCO_REF_<NAME>` overrides a workload count (e.g. `YOCO_REF_ORACLE_WORKLOADS=100000`).
pub fn count(name: &str, default: u64) -> u64 {
    std::env::var(format!("YOCO_REF_{name}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Sums of what a batch of runs exercised.
#[derive(Debug, Default)]
pub struct Coverage {
    pub workloads: u64,
    pub steps: u64,
    pub self_checks: u64,
    pub cross_checks: u64,
    pub windowed_queries: u64,
    pub copies: u64,
    pub adoptions: u64,
    pub cached_admissions: u64,
    pub preemptions: u64,
    pub aborted: u64,
    pub follow_ups: u64,
    pub output_tokens: u64,
    pub sliding_workloads: u64,
    pub shared_kv_workloads: u64,
    pub sub_block_workloads: u64,
}

impl Coverage {
    pub fn add(&mut self, w: &Workload, r: &RunReport) {
        self.workloads += 1;
        self.steps += r.steps as u64;
        self.self_checks += r.oracle.self_checks;
        self.cross_checks += r.oracle.cross_checks;
        self.windowed_queries += r.oracle.windowed_queries;
        self.copies += r.kv.copies;
        self.adoptions += r.kv.adoptions;
        self.cached_admissions += r.oracle.cached_admissions;
        self.preemptions += r.preemptions;
        self.aborted += r.aborted as u64;
        self.follow_ups += r.follow_ups as u64;
        self.output_tokens += r.output_tokens as u64;
        let l = &w.sched.layers;
        self.sliding_workloads += l.iter().any(|k| matches!(k, LayerKind::Sliding { .. })) as u64;
        self.shared_kv_workloads +=
            l.iter().any(|k| matches!(k, LayerKind::SharesKv { .. })) as u64;
        self.sub_block_workloads += (w.sched.kv.sub_block_size < w.sched.kv.block_size) as u64;
    }
}

/// Number of KV groups a plan addresses.
pub fn num_groups(p: &StepPlan) -> usize {
    p.slot_mapping.len() / (p.num_tokens_padded as usize).max(1)
}

fn rows_with_tokens(p: &StepPlan, min: i32) -> impl Iterator<Item = usize> + '_ {
    (0..p.req_ids.len()).filter(move |&r| p.query_start_loc[r + 1] - p.query_start_loc[r] >= min)
}

/// Off-by-one in slot mapping: every token of the first row with >= 2 tokens writes one slot
/// further, in every group.
pub fn slot_mapping_plus_one(p: &mut StepPlan) -> bool {
    let Some(r) = rows_with_tokens(p, 2).next() else {
        return false;
    };
    let tp = p.num_tokens_padded as usize;
    for g in 0..num_groups(p) {
        for t in p.query_start_loc[r] as usize..p.query_start_loc[r + 1] as usize {
            p.slot_mapping[g * tp + t] += 1;
        }
    }
    true
}

/// Off-by-one in copy length: every copy op of the step copies one token fewer.
pub fn copy_length_minus_one(p: &mut StepPlan) -> bool {
    if p.kv_copies.is_empty() {
        return false;
    }
    for c in p.kv_copies.chunks_exact_mut(4) {
        c[3] -= 1;
    }
    true
}

/// Off-by-one in the logits index: a request that completes a multi-token chunk samples (and
/// selects for the cross-decoder) its second-to-last token instead of its last, consistently in
/// `logits_indices` and `cross_indices`.
pub fn logits_index_minus_one(p: &mut StepPlan) -> bool {
    for s in 0..p.logits_indices.len() {
        let r = p.sample_rows[s] as usize;
        let (n, nx) = (
            p.query_start_loc[r + 1] - p.query_start_loc[r],
            p.cross_query_start_loc[r + 1] - p.cross_query_start_loc[r],
        );
        if n >= 2 && nx == 1 {
            p.logits_indices[s] -= 1;
            let x = p.logits_cross_pos[s] as usize;
            let old = p.cross_indices[x];
            for c in p.cross_indices.iter_mut().skip(x) {
                if *c == old {
                    *c -= 1;
                }
            }
            return true;
        }
    }
    false
}

/// A block-table update the plan forgets to announce: dirty rows dropped.
pub fn forget_dirty_rows(p: &mut StepPlan) -> bool {
    if p.dirty_rows.is_empty() || p.admitted_ids.is_empty() {
        return false;
    }
    p.dirty_rows.clear();
    true
}

/// Applies `m` at its first opportunity only.
pub fn once(mut m: impl FnMut(&mut StepPlan) -> bool) -> impl FnMut(&mut StepPlan) -> bool {
    let mut done = false;
    move |p| {
        if done {
            return false;
        }
        done = m(p);
        done
    }
}

/// Applies `m` at every opportunity.
pub fn every(m: impl FnMut(&mut StepPlan) -> bool) -> impl FnMut(&mut StepPlan) -> bool {
    m
}

/// The stall `scheduler_findings::prefix_hit_whose_copy_cannot_fit_still_admits` pins (fixed: admission
/// trims an unfittable hit): a
/// 3-block pool, A computes 40 tokens and finishes; B shares 36 of them, a hit of 2 full blocks and
/// one sub-block whose copy would need a 4th block. B alone fits (3 blocks) without the hit.
pub fn unfittable_hit_workload() -> Workload {
    let a: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 64).collect();
    let mut b = a[..36].to_vec();
    b.extend([60, 61, 62, 63]);
    let kv = KvConfig {
        block_size: 16,
        sub_block_size: 4,
        num_blocks: vec![4],
        enable_prefix_caching: true,
        enable_events: false,
        hash_seed: None,
        max_num_batched_tokens: 64,
    };
    let sched = SchedulerConfig {
        layers: vec![LayerKind::Full],
        kv,
        max_num_seqs: 2,
        max_num_batched_tokens: 64,
        max_model_len: 48,
        long_prefill_token_threshold: 0,
        policy: Policy::Fcfs,
        max_admission_skips: 16,
        max_num_encoder_input_tokens: 8192,
        token_capture_sizes: vec![],
        cross_capture_sizes: vec![],
    };
    let req = |id: u64, prompt: Vec<u32>| NewRequest {
        id,
        prompt,
        max_tokens: 2,
        hash_extras: HashExtras::default(),
        ..Default::default()
    };
    Workload {
        seed: 1,
        sched,
        vocab: 64,
        arrivals: vec![
            Arrival {
                step: 0,
                req: req(0, a),
            },
            Arrival {
                step: 5,
                req: req(1, b),
            },
        ],
        abort_chance: 0.0,
        follow_up_chance: 0.0,
        max_follow_ups: 0,
    }
}
