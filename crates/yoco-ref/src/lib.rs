//! yoco-ref: a candle-core reference of paged KV memory and attention, used as a test oracle for the
//! step plans that `yoco-core` produces, and a mock executor that runs the real scheduler end to end
//! in Rust. Never shipped in the wheel (`yoco-py` does not depend on it).
//!
//! Two ways to use it:
//! * [`oracle::PlanOracle`]: executes each plan with synthetic K/V on [`paged::PagedKv`] and checks
//!   that every query's attention over paged memory equals attention over its request's contiguous
//!   history (the *meaning* of slot mappings, block tables, copies, seq lens and cross selections).
//! * [`executor::MockExecutor`]: a tiny deterministic Gemma-3n-shaped model (sliding and full layers,
//!   KV-sharing cross-decoder) whose token streams must equal a cache-less, unbatched run.
//!
//! [`driver`] runs either against the real scheduler over random [`workload`]s; [`golden`] writes
//! fixtures for the Python and Triton kernels' tests.

#![warn(missing_docs)]

pub mod attention;
pub mod batch;
pub mod driver;
pub mod error;
pub mod executor;
pub mod golden;
pub mod layout;
pub mod model;
pub mod oracle;
pub mod paged;
pub mod plan_view;
pub mod rng;
pub mod synth;
pub mod tables;
pub mod toy;
pub mod truth;
pub mod workload;

pub use error::{Error, Result};
