//! The scheduler: requests and their state machine, the token budget, chunked prefill, preemption,
//! and the flat [`StepPlan`] each step hands the executor.
//!
//! CONTRACT: `plan.rs` (the step plan and outcome) and the `Scheduler` API in `scheduler.rs` are what
//! `yoco-py`, `yoco-ref` and the Python engine consume. Add to them; do not change meanings.
//!
//! Files: `config.rs` (limits, layout, policy), `request.rs` (what the engine submits), `state.rs` (a live request, stop checks),
//! `queue.rs` (waiting order), `table.rs` (persistent block tables), `step.rs` (phases A and B of a
//! step), `build.rs` (phase C: the plan), `update.rs` (sampled tokens in, outcome out),
//! `validate.rs`, `invariants.rs`.

mod build;
pub mod config;
mod encoder_budget;
mod invariants;
pub mod plan;
mod queue;
pub mod request;
pub mod scheduler;
mod state;
mod step;
mod table;
mod update;
mod validate;

pub use plan::{FinishReason, StepOutcome, StepPlan, NOT_FINISHED};
pub use request::NewRequest;
pub use scheduler::{
    Policy, Scheduler, SchedulerConfig, SchedulerStats, DEFAULT_MAX_ADMISSION_SKIPS,
};
