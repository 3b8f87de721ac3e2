//! The scheduler's public face. CONTRACT: signatures below are what `yoco-py` and `yoco-ref` call.
//!
//! One engine step is `schedule()` (decide, advance `num_computed`, build the [`StepPlan`]), the
//! executor's forward, then `update(sampled)` (append, stop, index, free). The algorithm lives in
//! `step.rs` (phases A/B), `build.rs` (phase C, the plan) and `update.rs`; requests in `state.rs`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

pub use super::config::{Policy, SchedulerConfig, DEFAULT_MAX_ADMISSION_SKIPS};
use super::plan::{FinishReason, StepOutcome, StepPlan};
use super::queue::WaitingQueue;
use super::request::NewRequest;
use super::state::{Req, Status, NO_ROW};
use super::table::BlockTables;
use super::validate;
use crate::error::{Error, Result};
use crate::kv::{kv_groups, KvEvent, KvEventBatch, KvGroup, KvManager, KvMetrics, MmPlaceholder};

/// Scheduler statistics the engine exports.
#[derive(Debug, Clone, Copy, Default)]
pub struct SchedulerStats {
    /// Requests holding a row and blocks now.
    pub num_running: u32,
    /// Requests queued for admission, preempted ones included.
    pub num_waiting: u32,
    /// Preemptions since the scheduler was built (a request preempted twice counts twice).
    pub num_preemptions: u64,
    /// The block manager's gauges and prefix-cache counters.
    pub kv: KvMetrics,
}

/// One request scheduled in the step being planned.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scheduled {
    pub slot: u32,
    pub num_new: u32,
    /// Admitted (new or resumed) in this step: its table rows are written from scratch.
    pub admitted: bool,
}

/// One row of the plan awaiting `update`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub slot: u32,
    /// Generation check: the slot still holds the request that was scheduled.
    pub seq_no: u64,
    pub samples: bool,
}

/// The engine's scheduler: owns the requests, the [`KvManager`] and the persistent block tables,
/// and turns them into one [`StepPlan`] per step. Single-threaded; the engine drives it as
/// `add_request`* then `schedule` / executor / `update` in a loop.
pub struct Scheduler {
    pub(super) cfg: SchedulerConfig,
    pub(super) kv: KvManager,
    pub(super) num_groups: usize,
    /// Request slab; `by_id` maps ids to slots.
    pub(super) reqs: Vec<Option<Req>>,
    pub(super) free_slots: Vec<u32>,
    pub(super) by_id: FxHashMap<u64, u32>,
    /// Running requests (slots) in admission order.
    pub(super) running: Vec<u32>,
    pub(super) waiting: WaitingQueue,
    /// Free persistent rows; the lowest is handed out first so rows stay dense.
    pub(super) free_rows: BinaryHeap<Reverse<u32>>,
    pub(super) tables: BlockTables,
    pub(super) plan: StepPlan,
    pub(super) outcome: StepOutcome,
    pub(super) next_seq_no: u64,
    pub(super) step_id: u64,
    pub(super) num_preemptions: u64,
    /// The step being planned (running first, then admitted), reused across steps.
    pub(super) sched: Vec<Scheduled>,
    /// The last plan's rows, for `update`.
    pub(super) pending: Vec<Pending>,
    /// Sampling rows among `pending`.
    pub(super) pending_samples: usize,
    /// A plan was handed out and `update` has not consumed it.
    pub(super) awaiting_update: bool,
}

impl Scheduler {
    /// Validates `config` (`Error::Config` names the field and what would work), derives the KV
    /// groups from its layers and sizes the pools and block tables. Overwrites
    /// `config.kv.max_num_batched_tokens` with the step budget.
    pub fn new(config: SchedulerConfig) -> Result<Self> {
        let mut config = config;
        validate::config(&config)?;
        config.kv.max_num_batched_tokens = config.max_num_batched_tokens;
        let groups = kv_groups(&config.layers)?;
        let num_groups = groups.len();
        let kv = KvManager::new(groups, config.kv.clone())?;
        let max_blocks = config.max_model_len.div_ceil(config.kv.block_size) as usize;
        let rows = config.max_num_seqs as usize;
        Ok(Scheduler {
            waiting: WaitingQueue::new(config.policy),
            tables: BlockTables::new(num_groups, rows, max_blocks),
            free_rows: (0..config.max_num_seqs).map(Reverse).collect(),
            cfg: config,
            kv,
            num_groups,
            reqs: Vec::new(),
            free_slots: Vec::new(),
            by_id: FxHashMap::default(),
            running: Vec::new(),
            plan: StepPlan::default(),
            outcome: StepOutcome::default(),
            next_seq_no: 0,
            step_id: 0,
            num_preemptions: 0,
            sched: Vec::new(),
            pending: Vec::new(),
            pending_samples: 0,
            awaiting_update: false,
        })
    }

    /// Validates and queues a request (`Error::Request` names what is wrong; `Error::Capacity`
    /// when the pool could never hold it).
    pub fn add_request(&mut self, req: NewRequest) -> Result<()> {
        self.add_request_mm(req, Vec::new())
    }

    /// [`Scheduler::add_request`] for a prompt with multimodal items: `mm` are the placeholder
    /// runs of its images / audio clips (sorted, disjoint, inside the prompt, each within
    /// `max_num_encoder_input_tokens`). Their identifiers enter the prefix hashes of the sub-blocks
    /// they overlap, and their lengths the step's encoder budget.
    pub fn add_request_mm(&mut self, mut req: NewRequest, mm: Vec<MmPlaceholder>) -> Result<()> {
        if self.by_id.contains_key(&req.id) {
            return Err(Error::Request(format!(
                "request id {} is already live; ids must be unique among unfinished requests",
                req.id
            )));
        }
        validate::request(&self.cfg, self.kv.groups(), &req)?;
        validate::mm_items(&self.cfg, req.id, req.prompt.len(), &mm)?;
        let ranges = mm.iter().map(|m| (m.offset, m.length)).collect();
        let extras = std::mem::take(&mut req.hash_extras);
        let mut seq = self.kv.new_seq_mm(extras, mm, req.prompt_logprobs);
        self.kv.hash_tokens(&mut seq, &req.prompt);
        let seq_no = self.next_seq_no;
        self.next_seq_no += 1;
        let r = Req::new(req, seq_no, seq, ranges);
        let (id, priority) = (r.id, r.priority);
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.reqs[s as usize] = Some(r);
                s
            }
            None => {
                self.reqs.push(Some(r));
                (self.reqs.len() - 1) as u32
            }
        };
        self.by_id.insert(id, slot);
        self.waiting.push_new(slot, priority, seq_no);
        Ok(())
    }

    /// Aborts a request in any state and frees everything it holds; unknown ids are a no-op (false).
    /// Safe between `schedule` and `update`: `update` skips rows whose request is gone.
    pub fn abort(&mut self, id: u64) -> bool {
        self.remove(id)
    }

    /// Finishes a request for an engine-side reason (a stop string) and frees it. The reason is for
    /// the caller's bookkeeping: like `abort`, it produces no outcome row.
    pub fn finish(&mut self, id: u64, reason: FinishReason) -> bool {
        let _ = reason;
        self.remove(id)
    }

    /// Plans the next step. An empty plan (R = 0) means nothing can run.
    ///
    /// # Panics
    /// When the previous non-empty plan was not consumed by [`Scheduler::update`] (check
    /// [`Scheduler::awaiting_update`]); overlapping steps are not supported.
    pub fn schedule(&mut self) -> &StepPlan {
        assert!(
            !self.awaiting_update,
            "schedule() called before update() consumed the previous plan"
        );
        self.schedule_step();
        &self.plan
    }

    /// Applies the step's sampled tokens, one per sampling request in `sample_rows` order.
    pub fn update(&mut self, sampled: &[i32]) -> Result<&StepOutcome> {
        self.update_step(sampled)?;
        Ok(&self.outcome)
    }

    /// Persistent block table of group `g`, `[max_num_seqs * max_blocks_per_seq]` row-major,
    /// indexed by `req_rows`; updated in place by `schedule`. The buffer never moves.
    pub fn block_table(&self, g: usize) -> &[i32] {
        self.tables.group(g)
    }

    /// Columns of each block-table row: `ceil(max_model_len / block_size)`.
    pub fn max_blocks_per_seq(&self) -> usize {
        self.tables.max_blocks()
    }

    /// Live requests (waiting, preempted or running); the engine's loop runs while this is > 0.
    pub fn num_unfinished(&self) -> usize {
        self.by_id.len()
    }

    /// A snapshot for the engine's metrics export (O(groups)).
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            num_running: self.running.len() as u32,
            num_waiting: self.waiting.len() as u32,
            num_preemptions: self.num_preemptions,
            kv: self.kv.metrics(),
        }
    }

    // ---- additions to the contract -----------------------------------------------------------

    /// The configuration in force (after [`Scheduler::new`]'s adjustments).
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The KV groups derived from the layers: group `g` is block table `g` and the executor's KV
    /// tensor `g`.
    pub fn kv_groups(&self) -> &[KvGroup] {
        self.kv.groups()
    }

    /// Number of KV groups (pools and block tables).
    pub fn num_groups(&self) -> usize {
        self.num_groups
    }

    /// The block manager (read-only: metrics, free counts).
    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    /// The last plan `schedule` built (empty before the first, or after [`Scheduler::take_plan`]).
    pub fn plan(&self) -> &StepPlan {
        &self.plan
    }

    /// Moves the last plan out (the Python boundary hands its buffers to numpy without copying);
    /// `update` does not need it.
    pub fn take_plan(&mut self) -> StepPlan {
        std::mem::take(&mut self.plan)
    }

    /// The last outcome `update` built.
    pub fn outcome(&self) -> &StepOutcome {
        &self.outcome
    }

    /// Moves the last outcome out, like [`Scheduler::take_plan`]; give it back with
    /// [`Scheduler::recycle_outcome`].
    pub fn take_outcome(&mut self) -> StepOutcome {
        std::mem::take(&mut self.outcome)
    }

    /// Gives back the buffers of a plan moved out with [`Scheduler::take_plan`] once its user is
    /// done, so the next `schedule` writes into warm, already allocated memory.
    pub fn recycle_plan(&mut self, mut old: StepPlan) {
        if self.plan.req_ids.capacity() < old.req_ids.capacity() {
            old.clear();
            self.plan = old;
        }
    }

    /// As [`Scheduler::recycle_plan`], for outcomes.
    pub fn recycle_outcome(&mut self, mut old: StepOutcome) {
        if self.outcome.req_ids.capacity() < old.req_ids.capacity() {
            old.req_ids.clear();
            old.new_tokens.clear();
            old.finish_reasons.clear();
            self.outcome = old;
        }
    }

    /// True between a non-empty `schedule` and its `update`.
    pub fn awaiting_update(&self) -> bool {
        self.awaiting_update
    }

    /// Whether `id` is live (waiting, preempted or running).
    pub fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Drops every prefix-cache entry; false while any block is referenced (requests running).
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.kv.reset_prefix_cache()
    }

    /// KV events collected since the last call, for the engine to publish (empty unless
    /// `kv.enable_events`).
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.kv.take_events()
    }

    /// KV events since the last call by buffer swap (see [`KvManager::swap_events`]): the
    /// publisher's path, free of per-event work on the step thread.
    pub fn swap_kv_events(&mut self, spare: KvEventBatch) -> KvEventBatch {
        self.kv.swap_events(spare)
    }

    /// Whether KV events are pending.
    pub fn has_kv_events(&self) -> bool {
        self.kv.has_events()
    }

    /// KV events dropped because nobody took them before the bounded log filled up.
    pub fn kv_events_dropped(&self) -> u64 {
        self.kv.dropped_events()
    }

    /// Output tokens so far and `num_computed` of a live request (tests, debugging).
    pub fn request_progress(&self, id: u64) -> Option<(&[u32], u32)> {
        let r = self.req_by_id(id)?;
        Some((&r.tokens[r.num_prompt as usize..], r.num_computed))
    }

    // ---- internals shared by the phases -------------------------------------------------------

    pub(super) fn req(&self, slot: u32) -> &Req {
        self.reqs[slot as usize].as_ref().expect("live slot")
    }

    pub(super) fn req_mut(&mut self, slot: u32) -> &mut Req {
        self.reqs[slot as usize].as_mut().expect("live slot")
    }

    fn req_by_id(&self, id: u64) -> Option<&Req> {
        self.by_id.get(&id).map(|&s| self.req(s))
    }

    /// Removes a live request from wherever it is and returns everything it holds.
    fn remove(&mut self, id: u64) -> bool {
        let Some(&slot) = self.by_id.get(&id) else {
            return false;
        };
        match self.req(slot).status {
            Status::Running => {
                let i = self
                    .running
                    .iter()
                    .position(|&s| s == slot)
                    .expect("running request is listed");
                self.running.remove(i);
            }
            Status::Waiting | Status::Preempted => {
                let found = self.waiting.remove_slot(slot);
                debug_assert!(found, "waiting request is queued");
            }
        }
        self.release(slot);
        true
    }

    /// Frees a request that is no longer listed in `running` or `waiting`: blocks, row, slot, id.
    pub(super) fn release(&mut self, slot: u32) {
        let r = self.reqs[slot as usize].take().expect("live slot");
        if let Some(seq) = r.kv {
            self.kv.free(seq);
        }
        if r.row != NO_ROW {
            self.release_row(r.row);
        }
        self.by_id.remove(&r.id);
        self.free_slots.push(slot);
    }

    pub(super) fn take_row(&mut self) -> u32 {
        self.free_rows
            .pop()
            .expect("a free row while running < max_num_seqs")
            .0
    }

    pub(super) fn release_row(&mut self, row: u32) {
        self.free_rows.push(Reverse(row));
    }

    /// Checks every invariant the scheduler keeps, and the block manager's (O(pool); tests).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        super::invariants::check(self)
    }
}

impl Drop for Scheduler {
    /// Gives every live request's KV state back, so dropping a busy scheduler (engine shutdown)
    /// is not mistaken for a leak.
    fn drop(&mut self) {
        for r in self.reqs.iter_mut().flatten() {
            if let Some(seq) = r.kv.take() {
                self.kv.free(seq);
            }
        }
    }
}
