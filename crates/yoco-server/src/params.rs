//! What the step loop needs of one request, validated by the front end before it is submitted.

pub use crate::grammar_rows::Grammar;
use crate::media::MediaInputs;

/// Sampling fields the executor applies on the device (the step loop only carries them).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingFields {
    /// 0 = greedy.
    pub temperature: f32,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 0.0 = off.
    pub min_p: f32,
    /// Per-request generator seed (None: derived by the executor).
    pub seed: Option<u64>,
    /// OpenAI's: subtracted once from the logit of every token already generated, [-2, 2].
    pub presence_penalty: f32,
    /// OpenAI's: subtracted per occurrence in the generated tokens, [-2, 2].
    pub frequency_penalty: f32,
    /// Hugging Face's (> 0, 1 = off): logits of tokens in the prompt or the output are divided by
    /// it when positive, multiplied when negative.
    pub repetition_penalty: f32,
}

impl Default for SamplingFields {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

/// One validated generation request (one completion; `n > 1` is the front end's fan-out).
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Prompt token ids, each below the vocabulary size, `1..max_model_len` of them.
    pub prompt: Vec<u32>,
    /// Output tokens at most (>= 1; prompt + max_tokens <= max_model_len).
    pub max_tokens: u32,
    /// EOS and stop tokens do not end the request before this many output tokens.
    pub min_tokens: u32,
    /// Generate past EOS (benchmarks).
    pub ignore_eos: bool,
    /// Token ids that end the request (the token is the stop reason).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end the request; the text stops before the match unless `include_stop_str`.
    pub stop: Vec<String>,
    /// Keep the matched stop string (or stop token's text) in the output.
    pub include_stop_str: bool,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// Deliver a delta every step (SSE); otherwise only the final event.
    pub stream: bool,
    /// Decode text at all (false: events carry token ids and empty text, vLLM's `detokenize=False`;
    /// stop strings then cannot match, so callers refuse them together).
    pub detokenize: bool,
    /// Prefix-cache namespace (vLLM's `cache_salt`).
    pub cache_salt: Option<String>,
    /// Lower = more important (priority policy).
    pub priority: i32,
    /// Carried to the executor.
    pub sampling: SamplingFields,
    /// Logprobs of each sampled token with this many most likely alternatives (`logprobs`).
    pub logprobs: Option<u32>,
    /// Logprobs of each prompt position with this many alternatives (vLLM's `prompt_logprobs`;
    /// also `echo` with `logprobs`).
    pub prompt_logprobs: Option<u32>,
    /// The output's constraint (structured outputs), compiled.
    pub grammar: Option<Grammar>,
    /// Images / audio of the prompt: their placeholder runs and processed items
    /// ([`crate::media`]); None for a text prompt.
    pub media: Option<MediaInputs>,
    /// Admit only once request `after` (a sibling completion of the same prompt, submitted first)
    /// has computed its whole prompt or ended, so the siblings reuse its cached prompt instead of
    /// prefilling it `n` times side by side. None: no wait.
    pub after: Option<u64>,
}

/// Everything off or empty except `detokenize` (text is decoded unless a caller opts out).
impl Default for GenParams {
    fn default() -> Self {
        Self {
            prompt: Vec::new(),
            max_tokens: 0,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            include_stop_str: false,
            skip_special_tokens: false,
            stream: false,
            detokenize: true,
            cache_salt: None,
            priority: 0,
            sampling: SamplingFields::default(),
            logprobs: None,
            prompt_logprobs: None,
            grammar: None,
            media: None,
            after: None,
        }
    }
}
