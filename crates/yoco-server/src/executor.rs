//! The executor seam: what the step loop asks of the model, once per step.
//!
//! A step is split in two calls so the loop can work while the device computes: [`Executor::launch`]
//! starts the forward and sampling of a plan and may return before they finish (a GPU executor
//! enqueues kernels and a device-to-host copy of the sampled ids); [`Executor::collect`] waits for
//! them and returns the sampled ids and the logprobs the step was asked for, as flat arrays
//! ([`StepOutput`]). A CPU executor may do all the work in `launch`.
//!
//! Besides the plan, a step hands the executor the token bitmasks of its constrained sampling rows
//! ([`GrammarMasks`], computed on the grammar pool while the forward runs: wait on them after the
//! forward, apply them to the logits before sampling) and the prompt positions to score for
//! `prompt_logprobs` ([`PromptScoring`]).

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use yoco_core::mock::{mix64, MockExecutor};
use yoco_core::sched::StepPlan;

pub use crate::grammar_rows::{GrammarMasks, MaskRows};
use crate::params::GenParams;

/// What one step gives the executor.
pub struct StepInputs<'a> {
    /// The plan (flat arrays; see `yoco_core::sched::plan`).
    pub plan: &'a StepPlan,
    /// KV group g's persistent block table (`[max_num_seqs * max_blocks_per_seq]`, row-major,
    /// indexed by `plan.req_rows`).
    pub tables: &'a [&'a [i32]],
    /// `max_blocks_per_seq`: the tables' row length.
    pub max_blocks_per_seq: usize,
    /// Output tokens so far of requests this plan resumes after a preemption (samplers that count
    /// outputs, for `min_tokens` or penalties, restore their state from them).
    pub resumed: &'a [(u64, Vec<u32>)],
    /// The token bitmasks of this step's constrained sampling rows, being computed while the
    /// forward runs; None when no sampling row is constrained. Wait for them
    /// ([`GrammarMasks::take`]) after the forward and set every disallowed logit to `-inf` before
    /// sampling.
    pub masks: Option<&'a GrammarMasks>,
    /// Prompt positions whose logprobs this step must report (requests with `prompt_logprobs`).
    pub prompt_scoring: &'a PromptScoring,
}

/// Prompt positions to score in one step: for each entry, a row of the step's logits (its cross
/// rows, as `plan.cross_query_start_loc` counts them) and the prompt token that row predicts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptScoring {
    /// Logits rows (cross rows) to score, one per prompt position.
    pub rows: Vec<i32>,
    /// The prompt token each row predicts: its logprob and rank are reported.
    pub targets: Vec<i32>,
    /// Most likely alternatives to report per row (the largest any request of the step asked).
    pub k: u32,
}

impl PromptScoring {
    /// Positions to score.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Nothing to score.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Logprobs of a set of positions as flat arrays: position `i`'s chosen token has
/// `token_logprobs[i]` and 1-based `token_ranks[i]`; its `k` most likely tokens are
/// `top_ids[i * k..(i + 1) * k]` (descending) with `top_logprobs` alongside.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogprobTable {
    /// Alternatives per position.
    pub k: usize,
    /// `[n]` logprob of the chosen token (sampled, or the prompt's).
    pub token_logprobs: Vec<f32>,
    /// `[n]` its 1-based rank.
    pub token_ranks: Vec<i32>,
    /// `[n * k]` the most likely ids.
    pub top_ids: Vec<i32>,
    /// `[n * k]` their logprobs.
    pub top_logprobs: Vec<f32>,
}

impl LogprobTable {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.token_logprobs.len()
    }

    /// No position.
    pub fn is_empty(&self) -> bool {
        self.token_logprobs.is_empty()
    }

    /// Empties the table, keeping its buffers.
    pub fn clear(&mut self) {
        self.k = 0;
        self.token_logprobs.clear();
        self.token_ranks.clear();
        self.top_ids.clear();
        self.top_logprobs.clear();
    }

    /// Whether the arrays hold `n` positions of `k` alternatives each (an executor's output is
    /// checked before anything reads it).
    pub fn check(&self, n: usize, what: &str) -> Result<(), String> {
        let k = self.k;
        if self.token_logprobs.len() != n
            || self.token_ranks.len() != n
            || self.top_ids.len() != n * k
            || self.top_logprobs.len() != n * k
        {
            return Err(format!(
                "executor returned {what} logprobs of shapes {}/{}/{}/{} for {n} positions of {k}",
                self.token_logprobs.len(),
                self.token_ranks.len(),
                self.top_ids.len(),
                self.top_logprobs.len()
            ));
        }
        Ok(())
    }
}

/// What a step produced, filled by the executor (buffers reused across steps).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// One sampled id per entry of `plan.sample_rows`, in order.
    pub sampled: Vec<i32>,
    /// Positions (into `plan.sample_rows`) of the rows whose request asked for logprobs,
    /// ascending; `sample_logprobs` holds one position per entry.
    pub sample_lp_rows: Vec<i32>,
    /// Logprobs of the sampled tokens (of the distribution they were sampled from after the
    /// grammar mask, before temperature and the other processors, as vLLM reports them).
    pub sample_logprobs: LogprobTable,
    /// Logprobs of `StepInputs::prompt_scoring`'s positions, in its order.
    pub prompt_logprobs: LogprobTable,
}

impl StepOutput {
    /// Empties every array, keeping the buffers.
    pub fn clear(&mut self) {
        self.sampled.clear();
        self.sample_lp_rows.clear();
        self.sample_logprobs.clear();
        self.prompt_logprobs.clear();
    }
}

/// An executor failure: the step's requests are aborted with this message, the loop goes on.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ExecError(pub String);

/// The model behind the step loop.
pub trait Executor: Send + 'static {
    /// A request was queued under `id`; its sampling parameters (penalties and `logprobs`
    /// included) apply to its rows once a plan admits it (the plan's `admitted_*` arrays).
    fn add_request(&mut self, id: u64, params: &GenParams);

    /// The request `id` ended (finished or aborted): drop its per-request state.
    fn remove_request(&mut self, id: u64);

    /// Start the forward and sampling of a step. At most one step is in flight: the loop calls
    /// [`Executor::collect`] before the next launch.
    fn launch(&mut self, step: &StepInputs<'_>) -> Result<(), ExecError>;

    /// Wait for the step launched last and return what it produced.
    fn collect(&mut self) -> Result<&StepOutput, ExecError>;
}

/// Which steps a [`MockModel`] fails.
type FailWhen = Box<dyn FnMut(&StepPlan) -> bool + Send>;

/// A mock model for benchmarks and protocol tests: the core's deterministic [`MockExecutor`] (the
/// next token is a hash of the last token and its position; KV-simulating optional), whose
/// "forward" takes `forward` of wall time after `launch` returns, like a device running
/// asynchronously. The time is not spent on the loop's thread: `collect` sleeps only for what is
/// left of it, so whatever the loop did in between is overlapped.
///
/// It honours the grammar masks as a device executor does, after its forward (in `collect`, so the
/// masks' computation overlaps the modelled forward): a constrained row whose hashed token is
/// disallowed takes an allowed one, chosen by the same hash. It reports logprobs that are pure functions of what
/// the client sees ([`MockModel::sample_logprob`], [`MockModel::prompt_logprob`]), so tests can
/// check that each request received its own.
pub struct MockModel {
    inner: MockExecutor,
    vocab_size: u32,
    forward: Duration,
    ready_at: Option<Instant>,
    fail_when: Option<FailWhen>,
    failed: bool,
    ignore_masks: bool,
    logprobs: FxHashMap<u64, u32>,
    /// The launched step's masks (applied in `collect`) and each sampling row's position.
    masks: Option<GrammarMasks>,
    positions: Vec<u64>,
    /// The launched step's sampling rows that want logprobs, and the most alternatives asked.
    lp_rows: Vec<i32>,
    lp_k: usize,
    out: StepOutput,
}

/// One position's mock logprobs: (chosen token's logprob, its rank, the alternatives).
pub type MockLogprob = (f32, i32, Vec<(i32, f32)>);

impl MockModel {
    /// Tokens are drawn from `first_token..vocab_size` (keep EOS and other special ids out by
    /// choosing `first_token` above them); `forward` is the modelled device time of a step.
    pub fn new(vocab_size: u32, first_token: u32, forward: Duration) -> Self {
        let mut m = Self::with(
            MockExecutor::new(vocab_size).first_token(first_token),
            forward,
        );
        m.vocab_size = vocab_size;
        m
    }

    /// Wraps a configured [`MockExecutor`] (e.g. KV-simulating). Its vocabulary is taken as large
    /// as `u32` allows for the mock logprobs' alternative ids; use [`MockModel::new`] for exact ids.
    pub fn with(inner: MockExecutor, forward: Duration) -> Self {
        Self {
            inner,
            vocab_size: u32::MAX,
            forward,
            ready_at: None,
            fail_when: None,
            failed: false,
            ignore_masks: false,
            logprobs: FxHashMap::default(),
            masks: None,
            positions: Vec::new(),
            lp_rows: Vec::new(),
            lp_k: 0,
            out: StepOutput::default(),
        }
    }

    /// Fail every step for which `pred(plan)` is true (tests of step-failure containment).
    pub fn failing_when(mut self, pred: impl FnMut(&StepPlan) -> bool + Send + 'static) -> Self {
        self.fail_when = Some(Box::new(pred));
        self
    }

    /// Sample as if unconstrained (tests of a grammar that rejects a token).
    pub fn ignoring_masks(mut self) -> Self {
        self.ignore_masks = true;
        self
    }

    /// The mock's logprobs of sampled token `token` with `k` alternatives: a pure function of the
    /// token, so a test that sees the token (`return_tokens_as_token_ids`) knows what it must get.
    pub fn sample_logprob(vocab_size: u32, token: u32, k: usize) -> MockLogprob {
        let lp = -0.25 - (token % 97) as f32 / 8.0;
        let rank = 1 + (token % 5) as i32;
        let top = (0..k)
            .map(|j| {
                (
                    ((token as u64 + 1 + 3 * j as u64) % vocab_size as u64) as i32,
                    -0.125 * (j as f32 + 1.0),
                )
            })
            .collect();
        (lp, rank, top)
    }

    /// The mock's logprobs of prompt token `target` predicted at prompt position `pos`: a pure
    /// function of both, so a wrong row (another position, another request) shows.
    pub fn prompt_logprob(vocab_size: u32, target: u32, pos: u32, k: usize) -> MockLogprob {
        let lp = -((mix64(((target as u64) << 32) | pos as u64) % 1000) as f32) / 64.0;
        let rank = 1 + (pos % 7) as i32;
        let top = (0..k)
            .map(|j| {
                (
                    ((target as u64 + pos as u64 + 2 + j as u64) % vocab_size as u64) as i32,
                    -0.5 * (j as f32 + 1.0),
                )
            })
            .collect();
        (lp, rank, top)
    }

    fn push(table: &mut LogprobTable, (lp, rank, top): MockLogprob) {
        table.token_logprobs.push(lp);
        table.token_ranks.push(rank);
        for (id, l) in top {
            table.top_ids.push(id);
            table.top_logprobs.push(l);
        }
    }

    fn honour_masks(&mut self, masks: &GrammarMasks) {
        let m = masks.take();
        for (i, &pos) in m.rows.iter().enumerate() {
            let s = pos as usize;
            let bits = &m.bitmask[i * m.words..(i + 1) * m.words];
            let allowed = |t: u32| {
                bits.get((t / 32) as usize)
                    .is_some_and(|&w| (w as u32) >> (t % 32) & 1 == 1)
            };
            let t = self.out.sampled[s] as u32;
            if allowed(t) {
                continue;
            }
            let count: u32 = bits.iter().map(|w| w.count_ones()).sum();
            if count == 0 {
                continue; // nothing allowed: leave the token (the grammar has failed)
            }
            let h = mix64(t as u64 ^ self.positions[s] << 32);
            let mut nth = (h % count as u64) as u32;
            let mut pick = t;
            'words: for (w, &word) in bits.iter().enumerate() {
                let mut word = word as u32;
                while word != 0 {
                    let b = word.trailing_zeros();
                    if nth == 0 {
                        pick = w as u32 * 32 + b;
                        break 'words;
                    }
                    nth -= 1;
                    word &= word - 1;
                }
            }
            self.out.sampled[s] = pick as i32;
        }
    }

    /// The sampled tokens' logprobs (after the masks chose the tokens).
    fn fill_sample_logprobs(&mut self) {
        if self.lp_rows.is_empty() {
            return;
        }
        self.out.sample_logprobs.k = self.lp_k;
        for &s in &self.lp_rows {
            self.out.sample_lp_rows.push(s);
            let t = self.out.sampled[s as usize] as u32;
            let e = Self::sample_logprob(self.vocab_size, t, self.lp_k);
            Self::push(&mut self.out.sample_logprobs, e);
        }
    }

    fn fill_prompt_logprobs(&mut self, step: &StepInputs<'_>) -> Result<(), ExecError> {
        let plan = step.plan;
        let ps = step.prompt_scoring;
        self.out.prompt_logprobs.k = ps.k as usize;
        for (&x, &t) in ps.rows.iter().zip(&ps.targets) {
            let x = usize::try_from(x)
                .ok()
                .filter(|&x| x < plan.num_cross as usize)
                .ok_or_else(|| {
                    ExecError(format!(
                        "prompt logprob row {x} outside the {} cross rows",
                        plan.num_cross
                    ))
                })?;
            // The cross row's token and position; it predicts the next position.
            let ti = plan.cross_indices[x] as usize;
            let pos = plan.positions[ti] as u32 + 1;
            let e = Self::prompt_logprob(self.vocab_size, t as u32, pos, ps.k as usize);
            Self::push(&mut self.out.prompt_logprobs, e);
        }
        Ok(())
    }
}

impl Executor for MockModel {
    fn add_request(&mut self, id: u64, params: &GenParams) {
        if let Some(k) = params.logprobs {
            self.logprobs.insert(id, k);
        }
    }

    fn remove_request(&mut self, id: u64) {
        self.logprobs.remove(&id);
    }

    fn launch(&mut self, step: &StepInputs<'_>) -> Result<(), ExecError> {
        let plan = step.plan;
        self.failed = self.fail_when.as_mut().is_some_and(|f| f(plan));
        self.out.clear();
        self.lp_rows.clear();
        self.lp_k = 0;
        self.masks = None;
        if !self.failed {
            self.out
                .sampled
                .extend_from_slice(self.inner.sample(plan, step.tables));
            self.fill_prompt_logprobs(step)?;
            for s in 0..plan.num_samples() {
                if let Some(&k) = self
                    .logprobs
                    .get(&plan.req_ids[plan.sample_rows[s] as usize])
                {
                    self.lp_rows.push(s as i32);
                    self.lp_k = self.lp_k.max(k as usize);
                }
            }
            if let Some(m) = step.masks.filter(|_| !self.ignore_masks) {
                self.masks = Some(m.clone());
                self.positions.clear();
                self.positions.extend(
                    plan.logits_indices
                        .iter()
                        .map(|&i| plan.positions[i as usize] as u64),
                );
            }
        }
        self.ready_at = Some(Instant::now() + self.forward);
        Ok(())
    }

    fn collect(&mut self) -> Result<&StepOutput, ExecError> {
        if let Some(t) = self.ready_at.take() {
            let now = Instant::now();
            if t > now {
                std::thread::sleep(t - now);
            }
        }
        if self.failed {
            return Err(ExecError("mock executor: injected step failure".into()));
        }
        // After the forward, before "sampling": the masks, then the chosen tokens' logprobs.
        if let Some(m) = self.masks.take() {
            self.honour_masks(&m);
        }
        self.fill_sample_logprobs();
        Ok(&self.out)
    }
}
