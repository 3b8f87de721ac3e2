//! yoco-core: the Rust core of yoco-rs. Decides *what* runs each step (scheduler, paged KV block
//! manager, sub-block prefix cache) and hands the executor a flat [`sched::StepPlan`]. No Python, no
//! tensors: `yoco-py` binds it, `yoco-ref` checks what its plans mean.

#![warn(missing_docs)]

pub mod error;
pub mod kv;
pub mod mock;
pub mod sched;

pub use error::{Error, Result};
