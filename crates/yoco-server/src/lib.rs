//! yoco-server: the serving path in Rust.
//!
//! ```text
//!  clients ──HTTP/SSE──> app (axum, tokio)                       executor (a trait)
//!                        validate · tokenize                        │
//!                        per-request channel <── Event ──┐          │
//!                              │ submit / abort           │          │
//!                              v                          │          │
//!                        step loop thread ────────────────┘          │
//!                        launch(N) ─────────────────────────────────>│ forward + sample
//!                        update(N−1) · detokenize · stop strings     │
//!                        deliver(N−1) · admit · schedule_ahead(N+1)  │
//!                        collect(N) <────────────────────────────────┘
//! ```
//!
//! * [`step_loop`] owns the scheduler (`yoco-core`), the text state (`yoco-text`) and every live
//!   request's output channel, and calls the [`executor::Executor`] once per step, split into
//!   `launch` and `collect` so the loop's own work (the previous step's update and text,
//!   delivering its outputs, admitting new requests, planning the next step on placeholder tokens)
//!   runs while the device computes.
//! * [`app`] is the OpenAI-compatible HTTP front end: validation, tokenization, SSE and metrics
//!   happen on tokio tasks, never on the loop thread; a dropped connection closes the request's
//!   channel, which the loop treats as an abort.
//!
//! No pyo3 here: a Python executor plugs in through the bindings crate implementing
//! [`executor::Executor`]. Benchmarks and protocol tests use [`executor::MockModel`].

#![warn(missing_docs)]

mod answer;
pub mod app;
mod completions;
mod delivery;
pub mod dispatch;
pub mod executor;
pub mod handle;
mod metrics;
pub mod openai;
pub mod output;
pub mod params;
mod signal;
pub mod stats;
mod step_cycle;
pub mod step_loop;
mod step_outputs;
mod validate;

pub use app::{router, serve_router, AppConfig};
pub use dispatch::Engines;
pub use executor::{ExecError, Executor, MockModel, StepInputs};
pub use handle::{EngineHandle, LoopConfig, SubmitError};
pub use output::{Event, FinishReason};
pub use params::GenParams;
pub use signal::shutdown_signal;
