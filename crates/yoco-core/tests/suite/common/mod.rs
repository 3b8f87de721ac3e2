//! Shared helpers of the scheduler tests: configurations, requests, a step driver with the
//! KV-simulating mock executor, and plan checks that hold for every plan.
#![allow(dead_code)]

pub mod random;

use std::collections::VecDeque;

use yoco_core::kv::LayerKind;
use yoco_core::mock::MockExecutor;
use yoco_core::sched::{NewRequest, Scheduler, SchedulerConfig, StepOutcome, StepPlan};

pub const VOCAB: u32 = 1000;

/// One full-attention layer (one KV group), block size `bs`, `num_blocks` blocks (block 0 included).
pub fn config(bs: u32, num_blocks: u32) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(vec![LayerKind::Full], bs, num_blocks).unwrap();
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 8192;
    c.max_model_len = 4096;
    c
}

/// Distinct pseudo-random tokens in `16..VOCAB` (seeded).
pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| {
            16 + (yoco_core::mock::mix64(seed.wrapping_mul(1_000_003) + i as u64)
                % (VOCAB as u64 - 16)) as u32
        })
        .collect()
}

pub fn req(id: u64, prompt: Vec<u32>, max_tokens: u32) -> NewRequest {
    NewRequest {
        id,
        prompt,
        max_tokens,
        ..Default::default()
    }
}

/// Tokens per row of a plan.
pub fn row_tokens(p: &StepPlan) -> Vec<i32> {
    p.query_start_loc.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Drives a scheduler step by step with the KV-simulating mock, checking every plan and every
/// invariant.
pub struct Driver {
    pub s: Scheduler,
    pub mock: MockExecutor,
    pub steps: u64,
}

impl Driver {
    pub fn new(c: SchedulerConfig) -> Self {
        let s = Scheduler::new(c).unwrap();
        let mock = MockExecutor::new(VOCAB)
            .first_token(16)
            .simulating_kv_of(&s);
        Driver { s, mock, steps: 0 }
    }

    pub fn add(&mut self, r: NewRequest) {
        self.s.add_request(r).unwrap();
    }

    /// `schedule()` only; the plan is checked.
    pub fn schedule(&mut self) -> StepPlan {
        self.s.schedule();
        let p = self.s.plan().clone();
        check_plan(&self.s, &p);
        p
    }

    /// Samples the last plan with the mock and applies it.
    pub fn finish_step(&mut self) -> StepOutcome {
        let tables: Vec<&[i32]> = (0..self.s.num_groups())
            .map(|g| self.s.block_table(g))
            .collect();
        let sampled = self.mock.sample(self.s.plan(), &tables).to_vec();
        let out = self.s.update(&sampled).unwrap().clone();
        self.s.check_invariants().unwrap();
        self.steps += 1;
        out
    }

    pub fn step(&mut self) -> (StepPlan, StepOutcome) {
        let p = self.schedule();
        let o = self.finish_step();
        (p, o)
    }

    /// Steps until nothing is unfinished (at most `max_steps`).
    pub fn run(&mut self, max_steps: usize) {
        for _ in 0..max_steps {
            if self.s.num_unfinished() == 0 {
                return;
            }
            self.step();
        }
        panic!("not finished after {max_steps} steps");
    }

    /// What the mock samples after `context` when every plan is right.
    pub fn reference(&self, prompt: &[u32], max_tokens: u32, eos: &[u32]) -> Vec<u32> {
        reference_output(&self.mock, prompt, max_tokens, eos)
    }
}

/// Drives a scheduler as the Rust step loop does in async mode: plan N+1 with
/// [`Scheduler::schedule_ahead`] while plan N awaits its update, run it on the KV-simulating mock
/// (which fills the placeholders from its previous step's samples, as a device executor does), then
/// update N. Every plan and every invariant is checked.
pub struct AsyncDriver {
    pub s: Scheduler,
    pub mock: MockExecutor,
    /// Sampled ids of the plans awaiting update, oldest first.
    pub in_flight: VecDeque<Vec<i32>>,
    pub steps: u64,
}

impl AsyncDriver {
    pub fn new(c: SchedulerConfig) -> Self {
        let s = Scheduler::new(c).unwrap();
        let mock = MockExecutor::new(VOCAB)
            .first_token(16)
            .simulating_kv_of(&s);
        AsyncDriver {
            s,
            mock,
            in_flight: VecDeque::new(),
            steps: 0,
        }
    }

    pub fn add(&mut self, r: NewRequest) {
        self.s.add_request(r).unwrap();
    }

    /// Plans the next step (ahead of the outstanding one, if any), checks it, and runs it on the
    /// mock ("launch" + "collect").
    pub fn schedule(&mut self) -> StepPlan {
        let prev_samples = self.in_flight.back().map_or(0, Vec::len);
        let p = if self.in_flight.is_empty() {
            self.s.schedule().clone()
        } else {
            self.s.schedule_ahead().clone()
        };
        check_plan(&self.s, &p);
        check_placeholders(&p, prev_samples);
        if self.in_flight.is_empty() {
            assert!(
                p.placeholder_indices.is_empty(),
                "no placeholders in a synchronous plan"
            );
        }
        if p.num_rows() > 0 {
            let tables: Vec<&[i32]> = (0..self.s.num_groups())
                .map(|g| self.s.block_table(g))
                .collect();
            let sampled = self.mock.sample(&p, &tables).to_vec();
            self.in_flight.push_back(sampled);
        }
        p
    }

    /// Applies the oldest outstanding plan's samples.
    pub fn update(&mut self) -> StepOutcome {
        let sampled = self.in_flight.pop_front().expect("a plan awaits update");
        let out = self.s.update(&sampled).unwrap().clone();
        self.s.check_invariants().unwrap();
        self.steps += 1;
        out
    }

    /// One loop iteration: plan N+1, then update N (when one is outstanding behind it, or when
    /// nothing new could be planned).
    pub fn step(&mut self) -> (StepPlan, Option<StepOutcome>) {
        let p = self.schedule();
        let due = self.in_flight.len() == 2 || (p.num_rows() == 0 && !self.in_flight.is_empty());
        let o = due.then(|| self.update());
        (p, o)
    }

    /// Steps until nothing is unfinished or in flight (at most `max_steps`), collecting every
    /// request's output tokens.
    pub fn run(&mut self, max_steps: usize) -> std::collections::HashMap<u64, Vec<u32>> {
        let mut outs: std::collections::HashMap<u64, Vec<u32>> = Default::default();
        for _ in 0..max_steps {
            if self.s.num_unfinished() == 0 && self.in_flight.is_empty() {
                return outs;
            }
            if let (_, Some(o)) = self.step() {
                for (k, &id) in o.req_ids.iter().enumerate() {
                    outs.entry(id).or_default().push(o.new_tokens[k] as u32);
                }
            }
        }
        panic!("not finished after {max_steps} steps");
    }

    pub fn reference(&self, prompt: &[u32], max_tokens: u32, eos: &[u32]) -> Vec<u32> {
        reference_output(&self.mock, prompt, max_tokens, eos)
    }
}

/// What every plan's placeholders satisfy: each is the only scheduled token of its row (a decode),
/// holds 0 in `input_ids`, and names a sample of the previous plan (`prev_samples` of them).
pub fn check_placeholders(p: &StepPlan, prev_samples: usize) {
    assert_eq!(p.placeholder_indices.len(), p.placeholder_sources.len());
    assert!(
        p.placeholder_indices.windows(2).all(|w| w[0] < w[1]),
        "placeholders ascending"
    );
    let mut sources = std::collections::HashSet::new();
    for (&t, &src) in p.placeholder_indices.iter().zip(&p.placeholder_sources) {
        let row = p.query_start_loc.partition_point(|&q| q <= t) - 1;
        assert_eq!(
            (p.query_start_loc[row], p.query_start_loc[row + 1]),
            (t, t + 1),
            "a placeholder is its row's only token"
        );
        assert_eq!(
            p.input_ids[t as usize], 0,
            "placeholder input reads 0 until filled"
        );
        assert!(
            (src as usize) < prev_samples,
            "source {src} of {prev_samples} samples"
        );
        assert!(sources.insert(src), "each previous sample feeds one row");
    }
}

/// The output of one request alone (no cache, no stop ids, no min_tokens), from the mock's
/// reference function.
pub fn reference_output(
    mock: &MockExecutor,
    prompt: &[u32],
    max_tokens: u32,
    eos: &[u32],
) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    let mut out = Vec::new();
    while (out.len() as u32) < max_tokens {
        let t = mock.reference_next(&ctx);
        ctx.push(t);
        out.push(t);
        if eos.contains(&t) {
            break;
        }
    }
    out
}

/// Structural checks every plan satisfies, whatever was scheduled.
pub fn check_plan(s: &Scheduler, p: &StepPlan) {
    let c = s.config();
    let r = p.num_rows();
    assert!(
        p.num_tokens <= c.max_num_batched_tokens,
        "token budget exceeded: {}",
        p.num_tokens
    );
    assert!(r <= c.max_num_seqs as usize);
    assert_eq!(p.query_start_loc.len(), if r == 0 { 1 } else { r + 1 });
    assert_eq!(p.query_start_loc[0], 0);
    assert_eq!(*p.query_start_loc.last().unwrap() as u32, p.num_tokens);
    assert!(
        p.query_start_loc.windows(2).all(|w| w[1] > w[0]),
        "every row schedules >= 1 token"
    );
    assert_eq!(p.input_ids.len(), p.num_tokens_padded as usize);
    assert_eq!(p.positions.len(), p.num_tokens_padded as usize);
    assert_eq!(
        p.slot_mapping.len(),
        s.num_groups() * p.num_tokens_padded as usize
    );
    let t = p.num_tokens as usize;
    let tp = p.num_tokens_padded as usize;
    assert!(p.input_ids[t..].iter().all(|&x| x == 0) && p.positions[t..].iter().all(|&x| x == 0));
    let bs = c.kv.block_size as i64;
    let mbps = s.max_blocks_per_seq();
    let mut rows = std::collections::HashSet::new();
    for k in 0..r {
        assert!(rows.insert(p.req_rows[k]), "rows unique");
        let (a, b) = (
            p.query_start_loc[k] as usize,
            p.query_start_loc[k + 1] as usize,
        );
        for tok in a..b {
            assert_eq!(
                p.positions[tok],
                (p.seq_lens[k] as usize - (b - tok)) as i64,
                "positions end at seq_len - 1"
            );
            for g in 0..s.num_groups() {
                let pos = p.positions[tok];
                let block =
                    s.block_table(g)[p.req_rows[k] as usize * mbps + (pos / bs) as usize] as i64;
                assert!(block > 0, "computed token in a real block");
                assert_eq!(
                    p.slot_mapping[g * tp + tok],
                    block * bs + pos % bs,
                    "slot mapping follows the table"
                );
            }
        }
    }
    for g in 0..s.num_groups() {
        assert!(
            p.slot_mapping[g * tp + t..(g + 1) * tp]
                .iter()
                .all(|&x| (0..bs).contains(&x)),
            "padding writes block 0"
        );
    }
    // Sampling and cross selection.
    assert_eq!(p.sample_rows.len(), p.logits_indices.len());
    assert_eq!(p.logits_cross_pos.len(), p.logits_indices.len());
    for (s_, &row) in p.sample_rows.iter().enumerate() {
        assert_eq!(
            p.logits_indices[s_],
            p.query_start_loc[row as usize + 1] - 1,
            "samples at the row's last token"
        );
        assert_eq!(
            p.cross_indices[p.logits_cross_pos[s_] as usize],
            p.logits_indices[s_]
        );
    }
    assert!(p.sample_rows.windows(2).all(|w| w[0] < w[1]));
    let x = p.num_cross as usize;
    assert_eq!(p.cross_indices.len(), p.num_cross_padded as usize);
    assert!(
        p.cross_indices[..x].windows(2).all(|w| w[0] < w[1]),
        "cross rows ascending"
    );
    if x > 0 {
        assert!(
            p.cross_indices[x..]
                .iter()
                .all(|&i| i == p.cross_indices[x - 1]),
            "padding repeats the last index"
        );
    }
    assert_eq!(p.cross_query_start_loc.len(), p.query_start_loc.len());
    assert_eq!(*p.cross_query_start_loc.last().unwrap() as usize, x);
    for k in 0..r {
        let (a, b) = (
            p.cross_query_start_loc[k] as usize,
            p.cross_query_start_loc[k + 1] as usize,
        );
        // A row's cross rows are the trailing tokens of its chunk.
        let end = p.query_start_loc[k + 1];
        for (j, ci) in (a..b).enumerate() {
            assert_eq!(p.cross_indices[ci], end - (b - a) as i32 + j as i32);
        }
    }
}
