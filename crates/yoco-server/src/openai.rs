//! The OpenAI protocol as the front end speaks it: request bodies, response pieces and the error
//! envelope `{"error": {"message", "type", "param", "code"}}` (vLLM's shape; `code` is the HTTP
//! status). Client mistakes are 400s that name the field, never 422 or 500.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::structured::ConstraintFields;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What is wrong, for a person.
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// The envelope's `type` when the status's usual one does not say it (`EngineDeadError`).
    pub kind: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn bad(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: param.map(str::to_string),
            kind: None,
        }
    }

    /// Any status.
    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            kind: None,
        }
    }

    /// The 503 of a server whose engine stopped (the Python server's `EngineDeadError`).
    pub fn engine_dead(why: Option<&str>) -> Self {
        let message = match why {
            Some(e) => format!("The engine is not running: it failed: {e}"),
            None => "The engine is not running.".to_string(),
        };
        Self {
            kind: Some("EngineDeadError"),
            ..Self::status(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// The envelope's JSON.
    pub fn body(&self) -> Value {
        let ty = self.kind.unwrap_or(match self.status.as_u16() {
            400 => "BadRequestError",
            401 => "AuthenticationError",
            404 => "NotFoundError",
            405 => "MethodNotAllowedError",
            413 => "RequestEntityTooLargeError",
            415 => "UnsupportedMediaTypeError",
            501 => "NotImplementedError",
            503 => "ServiceUnavailableError",
            s if s < 500 => "BadRequestError",
            _ => "InternalServerError",
        });
        json!({"error": {"message": self.message, "type": ty, "param": self.param,
                         "code": self.status.as_u16()}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

/// `prompt`: a string, token ids, or a list of either.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// One tokenized prompt.
    Ids(Vec<i64>),
    /// Several text prompts.
    Texts(Vec<String>),
    /// Several tokenized prompts.
    IdLists(Vec<Vec<i64>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// A last chunk with `usage` and no choices.
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// `usage` on every chunk too.
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// The sampling, stopping and structured-output fields that `/v1/completions` and
/// `/v1/chat/completions` share, read once here and flattened into both requests (so the chat
/// request hands them to the completions validator as they are, not copied field by field).
/// Serde's `flatten` buffers these fields; a wrong type is still a 400 with serde's message.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingRequest {
    /// Output tokens at most (default: what the context leaves).
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// Sampling temperature (0 = greedy).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Top-k (-1 or 0 = off).
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Min-p.
    #[serde(default)]
    pub min_p: Option<f64>,
    /// Per-request seed.
    #[serde(default)]
    pub seed: Option<i64>,
    /// Completions per prompt.
    #[serde(default)]
    pub n: Option<i64>,
    /// Server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<StopInput>,
    /// Stop token ids.
    #[serde(default)]
    pub stop_token_ids: Option<Vec<i64>>,
    /// Generate past EOS.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// EOS and stop tokens do not stop before this many tokens.
    #[serde(default)]
    pub min_tokens: Option<i64>,
    /// Leave special tokens out of the text.
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
    /// Keep the stop string in the text.
    #[serde(default)]
    pub include_stop_str_in_output: Option<bool>,
    /// Prefix-cache namespace.
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// Priority (lower first, with the priority policy).
    #[serde(default)]
    pub priority: Option<i64>,
    /// vLLM's: logprobs of each prompt position, with this many alternatives.
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
    /// vLLM's: keep the last k prompt tokens (-1: the context length).
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM's: logprob tokens as `token_id:N`.
    #[serde(default)]
    pub return_tokens_as_token_ids: Option<bool>,
    /// OpenAI's presence penalty, [-2, 2].
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// OpenAI's frequency penalty, [-2, 2].
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// vLLM's repetition penalty (> 0, 1 = off).
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    /// OpenAI's structured outputs (`text`, `json_object`, `json_schema`).
    #[serde(default)]
    pub response_format: Option<Value>,
    /// vLLM's structured outputs object (`json`, `regex`, `choice`, `grammar`, `json_object`).
    #[serde(default)]
    pub structured_outputs: Option<Value>,
    /// vLLM's older spelling: a JSON Schema.
    #[serde(default)]
    pub guided_json: Option<Value>,
    /// vLLM's older spelling: a regex.
    #[serde(default)]
    pub guided_regex: Option<Value>,
    /// vLLM's older spelling: a list of choices.
    #[serde(default)]
    pub guided_choice: Option<Value>,
    /// vLLM's older spelling: a Lark grammar.
    #[serde(default)]
    pub guided_grammar: Option<Value>,
}

impl SamplingRequest {
    /// The constraint fields, as [`crate::structured::constraint_of`] reads them.
    pub(crate) fn constraint_fields(&self) -> ConstraintFields<'_> {
        ConstraintFields {
            response_format: self.response_format.as_ref(),
            structured_outputs: self.structured_outputs.as_ref(),
            guided_json: self.guided_json.as_ref(),
            guided_regex: self.guided_regex.as_ref(),
            guided_choice: self.guided_choice.as_ref(),
            guided_grammar: self.guided_grammar.as_ref(),
        }
    }
}

/// `POST /v1/completions`: the fields this front end serves (unknown fields are ignored, as vLLM
/// does; known fields it does not serve yet are refused by name in `completions.rs`).
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// Served model name (optional: the only model).
    #[serde(default)]
    pub model: Option<String>,
    /// The prompt(s).
    pub prompt: Option<PromptInput>,
    /// Prepend the prompt to the output.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Logprobs of each sampled token, with this many most likely alternatives.
    #[serde(default)]
    pub logprobs: Option<i64>,
    /// The fields shared with chat.
    #[serde(flatten)]
    pub sampling: SamplingRequest,
    /// Every other field, checked by name in [`crate::refused::refuse`].
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

/// OpenAI's `usage`, with the prefix-cache hit as `prompt_tokens_details.cached_tokens`.
pub fn usage(prompt: u64, completion: u64, cached: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// A choice's `stop_reason`: the stop string or stop token id that ended it, else null.
pub(crate) fn stop_reason(f: &crate::output::Finished) -> Value {
    match &f.stop_reason {
        Some(crate::output::StopReason::Text(t)) => json!(t),
        Some(crate::output::StopReason::Token(t)) => json!(t),
        None => Value::Null,
    }
}
