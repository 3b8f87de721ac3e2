//! The executor seam: what the step loop asks of the model, once per step.
//!
//! A step is split in two calls so the loop can work while the device computes: [`Executor::launch`]
//! starts the forward and sampling of a plan and may return before they finish (a GPU executor
//! enqueues kernels and a device-to-host copy of the sampled ids); [`Executor::collect`] waits for
//! them and returns the sampled ids. A CPU executor may do all the work in `launch`.
//!
//! With async scheduling (the loop's default) the plan of step N+1 is built before step N's
//! `update`: a decode whose step-N token is not known yet carries a *placeholder* input
//! (`plan.placeholder_indices` / `plan.placeholder_sources`). The executor fills those input ids
//! from the sampled ids of the step it collected last, before the forward (on the device, or on the
//! host: `collect` has returned them; `StepPlan::fill_placeholders` is the CPU form). The loop
//! always calls `launch(N+1)` after `collect(N)`, and after a failed step N it clears N+1's
//! placeholders (their rows belong to N's requests, which it aborts).

use std::sync::Arc;
use std::time::{Duration, Instant};

use yoco_core::mock::MockExecutor;
use yoco_core::sched::StepPlan;

use crate::params::GenParams;

/// What one step gives the executor.
pub struct StepInputs<'a> {
    /// The plan (flat arrays; see `yoco_core::sched::plan`), shared: an executor may keep a
    /// clone for as long as its device reads the buffers (a zero-copy hand-off to Python); the
    /// loop gives the buffers back to the scheduler once no clone is left.
    pub plan: &'a Arc<StepPlan>,
    /// KV group g's persistent block table (`[max_num_seqs * max_blocks_per_seq]`, row-major,
    /// indexed by `plan.req_rows`).
    pub tables: &'a [&'a [i32]],
    /// `max_blocks_per_seq`: the tables' row length.
    pub max_blocks_per_seq: usize,
    /// Output tokens so far of requests this plan resumes after a preemption (samplers that count
    /// outputs, for `min_tokens` or penalties, restore their state from them).
    pub resumed: &'a [(u64, Vec<u32>)],
}

/// An executor failure: the step's requests are aborted with this message, the loop goes on.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ExecError(pub String);

/// The model behind the step loop.
pub trait Executor: Send + 'static {
    /// A request was queued under `id`; its sampling parameters apply to its rows once a plan
    /// admits it (the plan's `admitted_*` arrays).
    fn add_request(&mut self, id: u64, params: &GenParams);

    /// The request `id` ended (finished or aborted): drop its per-request state.
    fn remove_request(&mut self, id: u64);

    /// Start the forward and sampling of a step, after filling the plan's placeholder inputs from
    /// the sampled ids of the step collected last (see the module docs). At most one step is in
    /// flight: the loop calls [`Executor::collect`] before the next launch.
    fn launch(&mut self, step: &StepInputs<'_>) -> Result<(), ExecError>;

    /// Wait for the step launched last; one sampled id per entry of `plan.sample_rows`, in order.
    fn collect(&mut self) -> Result<&[i32], ExecError>;
}

/// Which steps a [`MockModel`] fails.
type FailWhen = Box<dyn FnMut(&StepPlan) -> bool + Send>;

/// A mock model for benchmarks and protocol tests: the core's deterministic [`MockExecutor`] (the
/// next token is a hash of the last token and its position; KV-simulating optional; placeholders
/// filled from its previous samples), whose
/// "forward" takes `forward` of wall time after `launch` returns, like a device running
/// asynchronously. The time is not spent on the loop's thread: `collect` sleeps only for what is
/// left of it, so whatever the loop did in between is overlapped.
pub struct MockModel {
    inner: MockExecutor,
    forward: Duration,
    ready_at: Option<Instant>,
    fail_when: Option<FailWhen>,
    failed: bool,
    out: Vec<i32>,
}

impl MockModel {
    /// Tokens are drawn from `first_token..vocab_size` (keep EOS and other special ids out by
    /// choosing `first_token` above them); `forward` is the modelled device time of a step.
    pub fn new(vocab_size: u32, first_token: u32, forward: Duration) -> Self {
        Self::with(
            MockExecutor::new(vocab_size).first_token(first_token),
            forward,
        )
    }

    /// Wraps a configured [`MockExecutor`] (e.g. KV-simulating).
    pub fn with(inner: MockExecutor, forward: Duration) -> Self {
        Self {
            inner,
            forward,
            ready_at: None,
            fail_when: None,
            failed: false,
            out: Vec::new(),
        }
    }

    /// Fail every step for which `pred(plan)` is true (tests of step-failure containment).
    pub fn failing_when(mut self, pred: impl FnMut(&StepPlan) -> bool + Send + 'static) -> Self {
        self.fail_when = Some(Box::new(pred));
        self
    }
}

impl Executor for MockModel {
    fn add_request(&mut self, _id: u64, _params: &GenParams) {}

    fn remove_request(&mut self, _id: u64) {}

    fn launch(&mut self, step: &StepInputs<'_>) -> Result<(), ExecError> {
        self.failed = self.fail_when.as_mut().is_some_and(|f| f(step.plan));
        self.out.clear();
        if !self.failed {
            self.out
                .extend_from_slice(self.inner.sample(step.plan, step.tables));
        }
        self.ready_at = Some(Instant::now() + self.forward);
        Ok(())
    }

    fn collect(&mut self) -> Result<&[i32], ExecError> {
        if let Some(t) = self.ready_at.take() {
            let now = Instant::now();
            if t > now {
                std::thread::sleep(t - now);
            }
        }
        if self.failed {
            return Err(ExecError("mock executor: injected step failure".into()));
        }
        Ok(&self.out)
    }
}
