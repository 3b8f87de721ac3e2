//! What the step loop sends down a request's channel.

pub use crate::logprobs::{PromptLogprobs, TokenLogprob};

/// Why a request ended, as the OpenAI API names it (`abort` is yoco/vLLM's extra).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Aborted by the engine (shutdown, a failed step).
    Abort,
}

impl FinishReason {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }

    /// From the core's finish code (`yoco_core::sched::FinishReason as u8`): 1, 2 and 5 are stops,
    /// 3 is length, anything else an abort.
    pub fn from_core(code: u8) -> Self {
        match code {
            1 | 2 | 5 => FinishReason::Stop,
            3 => FinishReason::Length,
            _ => FinishReason::Abort,
        }
    }
}

/// One message from the step loop to the task serving the request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Streaming requests: the tokens and text this step produced (text may be empty while the
    /// detokenizer or a possible stop string holds bytes back).
    Delta {
        /// The token produced this step (None: the step produced none for this request).
        token_id: Option<u32>,
        /// New text.
        text: String,
        /// The token's logprobs (requests that asked for `logprobs`).
        logprob: Option<TokenLogprob>,
        /// The prompt's logprobs, on the request's first event (requests that asked).
        prompt_logprobs: Option<PromptLogprobs>,
    },
    /// The request ended; nothing follows.
    Finished(Finished),
}

/// The end of a request, with its usage figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// Why it ended.
    pub reason: FinishReason,
    /// The matched stop string, or the stop token id, when one ended it.
    pub stop_reason: Option<StopReason>,
    /// The whole output text (non-streaming), or the text not yet delivered as deltas (streaming).
    pub text: String,
    /// Output token ids not yet delivered (all of them for non-streaming requests).
    pub token_ids: Vec<u32>,
    /// Logprobs of those tokens, one per id, when the request asked for `logprobs`.
    pub logprobs: Vec<TokenLogprob>,
    /// The prompt's logprobs, unless an earlier event carried them (requests that asked).
    pub prompt_logprobs: Option<PromptLogprobs>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens in total.
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
    /// Times the request lost its blocks to a preemption and was queued again (recomputed).
    pub preemptions: u32,
    /// A failure the client should see (a failed step, a refused admission).
    pub error: Option<RequestError>,
}

/// Why a request failed, as its client is told.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestError {
    /// What failed, for a person.
    pub message: String,
    /// The failure stopped the engine: the last step the loop was allowed to fail, or the loop
    /// stopping after it. Answered as the 503 `EngineDeadError` that a request arriving after the
    /// death gets (as the Python server answers both), not as a contained step failure's 500.
    pub engine_dead: bool,
}

impl Finished {
    /// The end of a request refused before it ran (no tokens), with `error`.
    pub fn refused(prompt_tokens: u32, error: RequestError) -> Self {
        Self {
            reason: FinishReason::Abort,
            stop_reason: None,
            text: String::new(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            prompt_logprobs: None,
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: 0,
            preemptions: 0,
            error: Some(error),
        }
    }
}

impl RequestError {
    /// A contained failure (the engine goes on): a 500.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            engine_dead: false,
        }
    }

    /// A failure that stopped the engine: a 503 `EngineDeadError`.
    pub fn engine_dead(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            engine_dead: true,
        }
    }

    /// The error envelope the client gets (as the response, or as a stream's error event).
    pub fn api_error(&self) -> crate::openai::ApiError {
        if self.engine_dead {
            crate::openai::ApiError::engine_dead(Some(&self.message))
        } else {
            crate::openai::ApiError::status(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                self.message.clone(),
            )
        }
    }
}

/// What ended a request that stopped (OpenAI's/vLLM's `stop_reason`).
#[derive(Debug, Clone, PartialEq)]
pub enum StopReason {
    /// A stop string.
    Text(String),
    /// A stop token id.
    Token(u32),
}
