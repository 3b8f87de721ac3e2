//! Structured outputs for yoco-rs: the grammar engine (llguidance) behind the sampler's token mask.
//!
//! Three pieces, one per file:
//! - [`GrammarSpec`] (`spec.rs`): what a request constrains its output to (JSON Schema, any JSON
//!   object, regex, a choice of strings, a Lark grammar), with the canonical text compiled grammars
//!   are cached by.
//! - [`GrammarCompiler`] (`compiler.rs`): the tokenizer's token trie, built once, and a bounded cache
//!   of compiled grammars. Compilation runs on its own thread under a size and a time budget, so a
//!   hostile schema costs a 400, never a stalled step loop.
//! - [`MatcherTable`] (`table.rs`): one llguidance matcher per constrained sequence, keyed by the
//!   core's sequence id; each step it computes the packed `int32` token bitmask of every constrained
//!   row in parallel (rayon), optionally in the background while the forward runs, and advances the
//!   matchers with the tokens the core appended.
//!
//! EOS is allowed exactly where the grammar accepts (every id in the engine's EOS set); tokens beyond
//! the tokenizer's vocabulary (the model's padding rows) are never allowed.

mod apply;
mod compiler;
mod spec;
mod table;
mod tokenizer;

pub use apply::mask_logits;
pub use compiler::{CompileLimits, CompiledGrammar, Fork, GrammarCompiler};
pub use spec::{GrammarKind, GrammarSpec};
pub use table::{grammar_pool, MaskJob, MatcherTable, StepMasks};
pub use tokenizer::{token_bytes, TokenBytes};

/// Why a grammar could not be used; the message names the problem for the client (a 400).
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    #[error("invalid {kind}: {message}")]
    Invalid { kind: &'static str, message: String },
    #[error("grammar compilation exceeded its time budget of {budget_ms} ms (the grammar is too large or too complex)")]
    Timeout { budget_ms: u64 },
    #[error("too many grammars are compiling at once ({limit}); retry later")]
    Busy { limit: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("unknown sequence id {0}")]
    UnknownSequence(u64),
    #[error("sequence id {0} already has a matcher")]
    DuplicateSequence(u64),
}

/// Words of a packed bitmask over `vocab_size` tokens (bit `t % 32` of word `t / 32` allows token `t`).
pub fn bitmask_words(vocab_size: usize) -> usize {
    vocab_size.div_ceil(32)
}
