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
//!
//! "The Python server" and `serve/*.py` in this crate's docs name the FastAPI server this crate was
//! written to match (its words, its behaviour), retired on 2026-12-03: it is in the git history
//! (before commit "Retire the FastAPI server"); the modules still in `python/yoco_rs/serve` are
//! `rust_frontend.py`, `rust_media.py`, `chat_media.py` and `media_fetch.py`.

#![warn(missing_docs)]

mod answer;
pub mod app;
mod body;
mod body_fields;
mod chat;
mod chat_answer;
mod chat_media;
pub mod chat_protocol;
mod choice_channels;
mod completions;
pub mod content_format;
mod cors;
mod delivery;
mod delta_chunk;
pub mod dispatch;
pub mod executor;
mod front_metrics;
mod grammar_rows;
pub mod handle;
pub mod hist;
pub mod kv_events;
mod logprobs;
mod logprobs_json;
pub mod manual_loop;
pub mod media;
mod metrics;
pub mod openai;
pub mod output;
pub mod params;
mod pyjson;
pub mod pylit;
mod refused;
mod render;
mod signal;
pub mod stats;
mod step_cycle;
pub mod step_loop;
mod step_outputs;
mod structured;
pub mod template;
mod tokenize;
mod tool_delta;
pub mod tool_parse;
mod tool_scan;
pub mod tool_stream;
pub mod tools;
pub mod transcription_form;
mod transcriptions;
mod validate;

pub use app::{router, serve_router, try_router, AppConfig, SamplingDefaults, StructuredConfig};
pub use dispatch::Engines;
pub use executor::{
    ExecError, Executor, GrammarMasks, LogprobTable, MaskRows, MockModel, PromptScoring,
    StepInputs, StepOutput,
};
pub use handle::{EngineHandle, LoopConfig, SubmitError};
pub use kv_events::KvEventSink;
pub use manual_loop::{Aborter, ManualLoop, StepReport};
pub use output::{Event, FinishReason, PromptLogprobs, RequestError, TokenLogprob};
pub use params::GenParams;
pub use signal::{shutdown_signal, stop_signal, StopSignal};
pub use template::{load_checkpoint_template, SpecialTokens};
pub use tools::{ToolConfig, ToolParser};
