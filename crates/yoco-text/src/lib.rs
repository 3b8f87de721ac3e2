//! yoco-text: the engine's per-step text work in Rust, so Python does O(1) calls per step.
//!
//! For every request that received a token this step, [`TextBatch::step`] decodes the new text
//! incrementally ([`IncrementalDecoder`], vLLM's prefix/read offsets), appends it to the request's
//! output text, looks for stop strings in the part that changed ([`StopStrings`]), and returns the
//! streamable deltas (holding back a possible partial stop string) and the requests whose stop
//! string matched, as flat arrays. The tokenizer is Hugging Face's `tokenizers` crate reading the
//! checkpoint's `tokenizer.json`.
//!
//! Kept out of `yoco-core` on purpose: the tokenizer is a large dependency every core build would pay.

#![warn(missing_docs)]

mod batch;
mod incremental;
mod pieces;
mod stop;

pub use batch::{SeqOptions, StepText, TextBatch, TextError};
pub use incremental::{DecodeScratch, Detok, IncrementalDecoder};
pub use pieces::PieceDecoder;
pub use stop::StopStrings;

pub use tokenizers::Tokenizer;

/// Prompt tokens used as decoding context for the first output token (vLLM uses 5): enough for the
/// decoder to render the first token's leading space the way it appears mid-sequence.
pub const PROMPT_CONTEXT_TOKENS: usize = 5;
