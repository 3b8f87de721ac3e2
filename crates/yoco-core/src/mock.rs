//! A mock executor: a deterministic "model" whose next token is a function of the plan, so the
//! scheduler can be tested and benchmarked without torch (the same mock is bound to Python).
//!
//! Two modes:
//! * **plain**: the next token of a sampling request is a hash of its last scheduled token's id and
//!   position (`input_ids[i]`, `positions[i]` at `logits_indices[s]`). A wrong id or position
//!   changes the stream. O(S) per step: the benchmark mode.
//! * **KV-simulating** ([`MockExecutor::simulating_kv`]): a toy "attention" with real paged memory.
//!   Every scheduled token writes to its slot (per KV group) the value `mix(prev, id, position)`,
//!   where `prev` is read from the slot of the previous position through the persistent block table
//!   (or the seed at position 0); copy ops are applied first. The sampled token hashes the last
//!   token's value over all groups. So the value at position p encodes the whole prefix, and any
//!   wrong slot mapping, block table row, prefix hit, copy-on-match or premature block reuse changes
//!   the output, while a correct schedule produces exactly what one request alone would
//!   ([`MockExecutor::reference_next`]). O(T) per step.
//!
//! An optional timing model (modelled step time, optionally slept) lets throughput experiments
//! see plausible executor time.

use std::time::Duration;

use crate::sched::StepPlan;

/// splitmix64's finalizer: a cheap, well-mixed 64-bit hash step.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[inline]
fn mix3(prev: u64, token: u32, pos: u64) -> u64 {
    mix64(
        prev ^ mix64(
            ((token as u64) << 32 | (pos & 0xFFFF_FFFF)).wrapping_add(0x9E37_79B9_7F4A_7C15),
        ),
    )
}

/// Value of "position -1": the seed of every chain.
const SEED: u64 = 0x005E_ED0F_C0DE;
/// What a read through a null/out-of-range table entry yields: poisons the stream.
const POISON: u64 = 0xDEAD_BEEF_DEAD_BEEF;

/// Modelled executor time per step: `base_us + per_token_us * T + per_cross_row_us * X`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TimingModel {
    /// Fixed cost of a non-empty step (launch overhead, sampling), µs.
    pub base_us: f64,
    /// Cost per scheduled token (the self-decoder runs every token), µs.
    pub per_token_us: f64,
    /// Cost per cross-decoder row (only rows whose logits are needed), µs.
    pub per_cross_row_us: f64,
    /// Sleep for the modelled time in `sample` (otherwise only report it).
    pub sleep: bool,
}

impl TimingModel {
    /// Modelled time of `plan`, µs: 0 for an empty plan (nothing would launch), else the linear
    /// model over its real (unpadded) token and cross-row counts.
    pub fn step_us(&self, plan: &StepPlan) -> f64 {
        if plan.num_rows() == 0 {
            return 0.0;
        }
        self.base_us
            + self.per_token_us * plan.num_tokens as f64
            + self.per_cross_row_us * plan.num_cross as f64
    }
}

/// The KV-simulating mode's paged memory: one value per token slot per group.
#[derive(Debug, Clone)]
struct SimKv {
    block_size: u32,
    max_blocks: usize,
    /// Per group, one value per token slot.
    slots: Vec<Vec<u64>>,
}

/// A torch-free stand-in for the executor: consumes [`StepPlan`]s and samples deterministic tokens
/// that expose wrong plans (see the module docs for the two modes). Build with
/// [`MockExecutor::new`], then chain [`MockExecutor::simulating_kv`] / [`MockExecutor::with_timing`].
#[derive(Debug, Clone)]
pub struct MockExecutor {
    vocab_size: u32,
    first_token: u32,
    kv: Option<SimKv>,
    timing: TimingModel,
    /// Per token (group-major) values of the current step, KV mode.
    vals: Vec<u64>,
    out: Vec<i32>,
    /// The previous step's sampled ids: the source of a plan's placeholder inputs.
    prev: Vec<i32>,
    /// The plan's input ids with placeholders filled (async plans only).
    ids: Vec<i32>,
    modelled_us: f64,
}

impl MockExecutor {
    /// Plain mode; sampled tokens lie in `0..vocab_size` (`vocab_size >= 1`).
    pub fn new(vocab_size: u32) -> Self {
        assert!(vocab_size >= 1, "vocab_size must be >= 1");
        MockExecutor {
            vocab_size,
            first_token: 0,
            kv: None,
            timing: TimingModel::default(),
            vals: Vec::new(),
            out: Vec::new(),
            prev: Vec::new(),
            ids: Vec::new(),
            modelled_us: 0.0,
        }
    }

    /// Sample only ids in `first..vocab_size` (e.g. 16 to never produce low special ids like EOS 2).
    pub fn first_token(mut self, first: u32) -> Self {
        assert!(first < self.vocab_size, "first_token must be < vocab_size");
        self.first_token = first;
        self
    }

    /// KV-simulating mode over pools of `num_blocks[g]` blocks of `block_size` tokens, reading
    /// block tables `[.., max_blocks_per_seq]`.
    pub fn simulating_kv(
        mut self,
        num_blocks: &[u32],
        block_size: u32,
        max_blocks_per_seq: usize,
    ) -> Self {
        self.kv = Some(SimKv {
            block_size,
            max_blocks: max_blocks_per_seq,
            slots: num_blocks
                .iter()
                .map(|&n| vec![POISON; n as usize * block_size as usize])
                .collect(),
        });
        self
    }

    /// KV-simulating mode sized for `sched`.
    pub fn simulating_kv_of(self, sched: &crate::sched::Scheduler) -> Self {
        let c = sched.config();
        self.simulating_kv(
            &c.kv.num_blocks,
            c.kv.block_size,
            sched.max_blocks_per_seq(),
        )
    }

    /// Charges (and, with [`TimingModel::sleep`], sleeps) a modelled step time in every
    /// [`MockExecutor::sample`], so throughput experiments see executor time without torch.
    pub fn with_timing(mut self, timing: TimingModel) -> Self {
        self.timing = timing;
        self
    }

    /// Whether the KV-simulating mode is on (then `sample` needs the block tables).
    pub fn simulates_kv(&self) -> bool {
        self.kv.is_some()
    }

    /// Total modelled executor time so far, µs.
    pub fn modelled_us(&self) -> f64 {
        self.modelled_us
    }

    fn token_of(&self, v: u64) -> u32 {
        self.first_token + (mix64(v) % (self.vocab_size - self.first_token) as u64) as u32
    }

    /// Runs `plan` and returns one sampled token per `logits_indices` entry. `tables[g]` is the
    /// persistent block table of group g (only read in KV mode; pass `&[]` otherwise). A plan's
    /// placeholder inputs (async scheduling) are filled from the ids the previous call sampled, as
    /// a device executor fills them from its previous step's output.
    pub fn sample(&mut self, plan: &StepPlan, tables: &[&[i32]]) -> &[i32] {
        std::mem::swap(&mut self.out, &mut self.prev);
        self.out.clear();
        let ids: &[i32] = if plan.num_placeholders() == 0 {
            &plan.input_ids
        } else {
            self.ids.clear();
            self.ids.extend_from_slice(&plan.input_ids);
            plan.fill_placeholders(&mut self.ids, &self.prev);
            &self.ids
        };
        if let Some(kv) = self.kv.as_mut() {
            kv.run(plan, ids, tables, &mut self.vals);
            let t = plan.num_tokens_padded as usize;
            let groups = kv.slots.len();
            for &i in &plan.logits_indices {
                let mut h = SEED;
                for g in 0..groups {
                    h = mix64(h ^ self.vals[g * t + i as usize]);
                }
                self.out.push(self.token_of(h) as i32);
            }
        } else {
            for &i in &plan.logits_indices {
                let i = i as usize;
                let v = mix3(SEED, ids[i] as u32, plan.positions[i] as u64);
                self.out.push(self.token_of(v) as i32);
            }
        }
        let us = self.timing.step_us(plan);
        self.modelled_us += us;
        if self.timing.sleep && us > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(us * 1e-6));
        }
        &self.out
    }

    /// The token this mock samples after the context `tokens` when the plan is right: what one
    /// request alone, with no cache, gets. The independent reference for tests.
    pub fn reference_next(&self, tokens: &[u32]) -> u32 {
        let last = tokens.len() - 1;
        if let Some(kv) = &self.kv {
            let mut v = SEED;
            for (p, &tok) in tokens.iter().enumerate() {
                v = mix3(v, tok, p as u64);
            }
            let mut h = SEED;
            for _ in 0..kv.slots.len() {
                h = mix64(h ^ v);
            }
            self.token_of(h)
        } else {
            self.token_of(mix3(SEED, tokens[last], last as u64))
        }
    }
}

impl SimKv {
    fn slot_of(&self, table: &[i32], row: usize, pos: u32) -> Option<usize> {
        let bs = self.block_size;
        let idx = (pos / bs) as usize;
        if idx >= self.max_blocks {
            return None;
        }
        let block = *table.get(row * self.max_blocks + idx)?;
        if block <= 0 {
            return None;
        }
        Some(block as usize * bs as usize + (pos % bs) as usize)
    }

    fn run(&mut self, plan: &StepPlan, ids: &[i32], tables: &[&[i32]], vals: &mut Vec<u64>) {
        let bs = self.block_size as usize;
        for op in plan.kv_copies.chunks_exact(4) {
            let (g, src, dst, n) = (
                op[0] as usize,
                op[1] as usize,
                op[2] as usize,
                op[3] as usize,
            );
            self.slots[g].copy_within(src * bs..src * bs + n, dst * bs);
        }
        let t_pad = plan.num_tokens_padded as usize;
        let groups = self.slots.len();
        vals.clear();
        vals.resize(groups * t_pad, 0);
        for g in 0..groups {
            let table = tables.get(g).copied().unwrap_or(&[]);
            for r in 0..plan.num_rows() {
                let row = plan.req_rows[r] as usize;
                for t in plan.query_start_loc[r] as usize..plan.query_start_loc[r + 1] as usize {
                    let pos = plan.positions[t] as u32;
                    let prev = if pos == 0 {
                        SEED
                    } else {
                        self.slot_of(table, row, pos - 1)
                            .map_or(POISON, |s| self.slots[g][s])
                    };
                    let v = mix3(prev, ids[t] as u32, pos as u64);
                    let s = plan.slot_mapping[g * t_pad + t] as usize;
                    // The write must land where the table says this position lives.
                    let expect = self.slot_of(table, row, pos);
                    let v = if expect == Some(s) { v } else { POISON };
                    vals[g * t_pad + t] = v;
                    if let Some(cell) = self.slots[g].get_mut(s) {
                        *cell = v;
                    }
                }
            }
        }
    }
}
