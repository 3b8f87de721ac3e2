//! Requests as the engine submits them. Per-request data crosses the Python boundary once, here.

use crate::kv::HashExtras;

/// What the engine submits for one sequence to generate (vLLM's `n > 1` becomes `n` of these).
#[derive(Debug, Clone, Default)]
pub struct NewRequest {
    /// Engine-chosen id, unique among live requests.
    pub id: u64,
    /// Prompt token ids (>= 1 token, at most `max_model_len`); hashed at once for prefix caching.
    pub prompt: Vec<u32>,
    /// Output tokens at most (>= 1).
    pub max_tokens: u32,
    /// EOS and stop tokens do not stop the request before this many output tokens.
    pub min_tokens: u32,
    /// Stop with reason `Stop` when one of these is sampled (ignored when `ignore_eos`).
    pub eos_token_ids: Vec<u32>,
    /// Stop with reason `StopToken` when one of these is sampled.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS tokens (benchmarks that need exact output lengths); stop token ids
    /// still stop the request.
    pub ignore_eos: bool,
    /// Lower value = more important (priority policy only).
    pub priority: i32,
    /// Prefix-cache namespace.
    pub hash_extras: HashExtras,
    /// The engine wants logits for every prompt position: the cross-decoder selection widens to all
    /// scheduled prompt rows of this request, and the request never reads cached KV.
    pub prompt_logprobs: bool,
    /// Admission waits until request `after` has computed its whole prompt (or ended), so siblings of
    /// an `n > 1` request reuse the prompt's KV instead of recomputing it in the same step.
    pub after: Option<u64>,
}
