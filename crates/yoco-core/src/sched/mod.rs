//! The scheduler: requests and their state machine, the token budget, chunked prefill, preemption,
//! and the flat [`StepPlan`] each step hands the executor.
//!
//! CONTRACT: `plan.rs` (the step plan and outcome) and the `Scheduler` API in `scheduler.rs` are what
//! `yoco-py`, `yoco-ref` and the Python engine consume. Add to them; do not change meanings.

pub mod plan;
pub mod request;
pub mod scheduler;

pub use plan::{FinishReason, StepOutcome, StepPlan};
pub use request::NewRequest;
pub use scheduler::{Policy, Scheduler, SchedulerConfig};
