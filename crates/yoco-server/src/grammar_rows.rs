//! Structured outputs on the loop side: one llguidance matcher per constrained sequence
//! (`yoco-grammar`'s [`MatcherTable`]), advanced with each step's accepted tokens, and the next
//! step's token bitmasks computed on the grammar thread pool while the forward runs.
//!
//! The step loop calls [`GrammarRows`] at these points only:
//! 1. a request is added / ends: [`GrammarRows::add`] / [`GrammarRows::remove`];
//! 2. after `schedule(N)`, before `launch(N)`: [`GrammarRows::start`] starts one job on the pool
//!    that first advances the matchers by step N−1's tokens, then computes the masks of plan N's
//!    constrained sampling rows; the executor gets the [`GrammarMasks`] handle and waits on it
//!    after its forward;
//! 3. after `collect(N)`, whatever it returned: [`GrammarRows::finish`] waits for the job (when the
//!    executor did not) and keeps the sequences whose grammar failed;
//! 4. after `update(N)`: [`GrammarRows::record`] keeps the appended tokens for job N+1, and
//!    [`GrammarRows::failed`] names the rows to end with `finish_reason: "abort"`.
//!
//! Semantics as `docs/structured-outputs.md`: EOS is allowed exactly where the grammar accepts;
//! `n > 1` completions have independent matchers; preemption keeps output tokens, so a matcher
//! stays where it is; a sequence whose grammar failed may only emit EOS and ends as an abort.

use std::fmt;
use std::sync::{Arc, Mutex};

use rustc_hash::{FxHashMap, FxHashSet};
use yoco_core::sched::{StepOutcome, StepPlan};
use yoco_grammar::{CompiledGrammar, MaskJob, MatcherTable, StepMasks};

/// A compiled constraint as a request carries it to the loop (compiled by the front end, off the
/// loop, under the compile budget).
#[derive(Clone)]
pub struct Grammar {
    /// The grammar every sequence of the request forks its own matcher from.
    pub compiled: Arc<CompiledGrammar>,
    /// Tokens the masks cover (the model's logits width).
    pub vocab_size: usize,
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Grammar({:?}, vocab {})",
            self.compiled.kind, self.vocab_size
        )
    }
}

/// The bitmasks of a step's constrained sampling rows, as [`GrammarMasks::take`] hands them over.
#[derive(Debug, Default)]
pub struct MaskRows {
    /// Positions (into the step's `sample_rows`) of the constrained rows, ascending.
    pub rows: Vec<i64>,
    /// `[rows.len() * words]` packed bits, row-major: bit `t % 32` of word `t / 32` allows `t`.
    pub bitmask: Vec<i32>,
    /// Words per row.
    pub words: usize,
}

/// The token bitmasks of one step, possibly still being computed on the grammar pool. Cloneable
/// (one shared job): the executor takes the masks, the loop then collects the job's failures.
#[derive(Clone)]
pub struct GrammarMasks {
    inner: Arc<Mutex<JobState>>,
}

struct JobState {
    job: Option<MaskJob>,
    done: Option<StepMasks>,
}

impl JobState {
    fn ready(&mut self) -> &mut StepMasks {
        if self.done.is_none() {
            self.done = Some(self.job.take().map(MaskJob::wait).unwrap_or_default());
        }
        self.done.as_mut().expect("set above")
    }
}

impl GrammarMasks {
    fn new(job: MaskJob) -> Self {
        Self {
            inner: Arc::new(Mutex::new(JobState {
                job: Some(job),
                done: None,
            })),
        }
    }

    /// Waits for the masks and moves them out (a second call gets no rows). Blocking: call it with
    /// no lock a mask computation could need (the GIL is not one).
    pub fn take(&self) -> MaskRows {
        let mut st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let m = st.ready();
        MaskRows {
            rows: std::mem::take(&mut m.rows),
            bitmask: std::mem::take(&mut m.bitmask),
            words: m.words,
        }
    }

    /// Waits for the job and takes the sequences whose grammar failed while it advanced them.
    fn take_failed(&self) -> Vec<u64> {
        let mut st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut st.ready().failed)
    }
}

/// The matchers of a loop's constrained sequences and the step's grammar job.
pub(crate) struct GrammarRows {
    eos: Vec<u32>,
    table: Option<MatcherTable>,
    /// Tokens appended last step to constrained sequences: the next job advances by them first.
    adv_ids: Vec<u64>,
    adv_tokens: Vec<u32>,
    /// Sequences whose grammar failed, not yet ended.
    failed: FxHashSet<u64>,
    job: Option<GrammarMasks>,
    sample_ids: Vec<u64>,
}

impl GrammarRows {
    /// EOS (`eos`) is allowed exactly where a grammar accepts.
    pub(crate) fn new(eos: &[u32]) -> Self {
        Self {
            eos: eos.to_vec(),
            table: None,
            adv_ids: Vec::new(),
            adv_tokens: Vec::new(),
            failed: FxHashSet::default(),
            job: None,
            sample_ids: Vec::new(),
        }
    }

    /// A fresh matcher of `g` for sequence `id` (each of `n` completions gets its own).
    pub(crate) fn add(&mut self, id: u64, g: &Grammar) -> Result<(), String> {
        let eos = &self.eos;
        let table = self
            .table
            .get_or_insert_with(|| MatcherTable::new(g.vocab_size, eos));
        table.add(id, &g.compiled).map_err(|e| e.to_string())
    }

    /// Drop `id`'s matcher (finished or aborted; a job still holding it finishes with its copy).
    pub(crate) fn remove(&mut self, id: u64) {
        if let Some(t) = self.table.as_mut() {
            if t.remove(id) {
                self.failed.remove(&id);
            }
        }
    }

    /// Starts the step's job (advance by last step's tokens, then the masks of `plan`'s
    /// constrained sampling rows). Returns the masks handle for the executor when a sampling row
    /// is constrained, None otherwise (also without any constrained sequence: then no job runs).
    pub(crate) fn start(&mut self, plan: &StepPlan) -> Option<&GrammarMasks> {
        let Some(table) = self.table.as_ref().filter(|t| !t.is_empty()) else {
            self.adv_ids.clear();
            self.adv_tokens.clear();
            return None;
        };
        self.sample_ids.clear();
        self.sample_ids
            .extend(plan.sample_rows.iter().map(|&r| plan.req_ids[r as usize]));
        let constrained = self.sample_ids.iter().any(|&id| table.contains(id));
        let job = table.start_masks(&self.sample_ids, &self.adv_ids, &self.adv_tokens);
        self.adv_ids.clear();
        self.adv_tokens.clear();
        self.job = Some(GrammarMasks::new(job));
        if constrained {
            self.job.as_ref()
        } else {
            None
        }
    }

    /// Collects the step's job (waiting when the executor did not take the masks) and keeps the
    /// sequences whose grammar failed. Call after every `collect`, failed or not.
    pub(crate) fn finish(&mut self) {
        if let Some(job) = self.job.take() {
            for id in job.take_failed() {
                if self.table.as_ref().is_some_and(|t| t.contains(id)) {
                    self.failed.insert(id);
                }
            }
        }
    }

    /// Keeps the tokens `update` appended to constrained sequences (the next job consumes them).
    pub(crate) fn record(&mut self, outcome: &StepOutcome) {
        let Some(table) = self.table.as_ref().filter(|t| !t.is_empty()) else {
            return;
        };
        for (&id, &tok) in outcome.req_ids.iter().zip(&outcome.new_tokens) {
            if tok >= 0 && table.contains(id) {
                self.adv_ids.push(id);
                self.adv_tokens.push(tok as u32);
            }
        }
    }

    /// Whether a constrained sequence is live: then the loop does not plan ahead (a mask needs the
    /// previous step's token of its row, on the host only after that step's update).
    pub(crate) fn any_constrained(&self) -> bool {
        self.table.as_ref().is_some_and(|t| !t.is_empty())
    }

    /// Every matcher and failed grammar belongs to a request in `live` (`check_invariants`: a
    /// finished or aborted request leaves none behind).
    pub(crate) fn check_live<V>(&self, live: &FxHashMap<u64, V>) -> Result<(), String> {
        if let Some(t) = &self.table {
            let held = live.keys().filter(|&&id| t.contains(id)).count();
            if held != t.len() {
                return Err(format!(
                    "{} grammar matchers, {held} of them of live requests",
                    t.len()
                ));
            }
        }
        match self.failed.iter().find(|id| !live.contains_key(id)) {
            Some(id) => Err(format!(
                "request {id} ended with its failed grammar still marked"
            )),
            None => Ok(()),
        }
    }

    /// Whether any sequence's grammar failed and is not yet ended.
    pub(crate) fn any_failed(&self) -> bool {
        !self.failed.is_empty()
    }

    /// Whether `id`'s grammar failed (the loop ends it with `finish_reason: "abort"`).
    pub(crate) fn failed(&self, id: u64) -> bool {
        self.failed.contains(&id)
    }
}
