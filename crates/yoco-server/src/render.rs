//! `POST /v1/completions/render` and `POST /v1/chat/completions/render` (vLLM's render endpoints):
//! the prompt a request would run, template applied and tokenized, without generating.
//!
//! Prefix-aware routers (llm-d's token producer, vllm-router's `cache_aware` policy) hash these
//! `token_ids` in blocks and look them up in what the replicas' KV events announced, so the ids are
//! exactly those the generation request runs: the same validation, template, special tokens and
//! truncation. The body is vLLM's generate request (`request_id`, `token_ids`, `features`,
//! `sampling_params`, `model`, `stream`, `cache_salt`, `priority`); the completions form is a list,
//! one per prompt.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::app::AppState;
use crate::body::parse_json;
use crate::body_fields::{CHAT, COMPLETION};
use crate::chat::chat_inputs;
use crate::chat_protocol::ChatCompletionRequest;
use crate::completions::{completion_inputs, uuid_like};
use crate::openai::{ApiError, CompletionRequest};
use crate::params::GenParams;

/// The sampling parameters as the Python server's `SamplingParams` holds them (defaults filled in).
fn sampling_params(s: &AppState, r: &CompletionRequest, p: &GenParams, n: u32) -> Value {
    let d = &s.cfg.sampling_defaults;
    json!({
        "n": n,
        "temperature": r.sampling.temperature.or(d.temperature).unwrap_or(1.0),
        "top_p": r.sampling.top_p.or(d.top_p).unwrap_or(1.0),
        "top_k": r.sampling.top_k.or(d.top_k).unwrap_or(0),
        "min_p": r.sampling.min_p.or(d.min_p).unwrap_or(0.0),
        "seed": r.sampling.seed,
        "stop": if p.stop.is_empty() { Value::Null } else { json!(p.stop) },
        "stop_token_ids": r.sampling.stop_token_ids,
        "max_tokens": p.max_tokens,
        "min_tokens": p.min_tokens,
        "ignore_eos": p.ignore_eos,
        "logprobs": p.logprobs,
        "prompt_logprobs": p.prompt_logprobs,
        "presence_penalty": r.sampling.presence_penalty.unwrap_or(0.0),
        "frequency_penalty": r.sampling.frequency_penalty.unwrap_or(0.0),
        "repetition_penalty": r.sampling.repetition_penalty.or(d.repetition_penalty).unwrap_or(1.0),
        "skip_special_tokens": p.skip_special_tokens,
        "include_stop_str_in_output": p.include_stop_str,
    })
}

fn generate_request(
    s: &AppState,
    rid: String,
    p: &GenParams,
    r: &CompletionRequest,
    n: u32,
    model: &str,
) -> Value {
    json!({
        "request_id": rid,
        "token_ids": p.prompt,
        "features": null,
        "sampling_params": sampling_params(s, r, p, n),
        "model": model,
        "stream": r.sampling.stream.unwrap_or(false),
        "cache_salt": r.sampling.cache_salt,
        "priority": r.sampling.priority.unwrap_or(0),
    })
}

/// `POST /v1/completions/render`: one generate request per prompt.
pub(crate) async fn completion(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let req: CompletionRequest = parse_json(&s, body, &COMPLETION)?;
        let (model, _, params, n) = completion_inputs(&s, &req).await?;
        let rid = format!("cmpl-{}", uuid_like());
        let one = params.len() == 1;
        let out: Vec<Value> = params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let id = if one {
                    rid.clone()
                } else {
                    format!("{rid}-{i}")
                };
                generate_request(&s, id, p, &req, n, &model)
            })
            .collect();
        Ok::<_, ApiError>(Json(Value::from(out)).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/chat/completions/render`: the conversation rendered by the chat template, tokenized.
pub(crate) async fn chat(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let req: ChatCompletionRequest = parse_json(&s, body, &CHAT)?;
        let inputs = chat_inputs(&s, &req).await?;
        let rid = format!("chatcmpl-{}", uuid_like());
        let view = req.sampling_view(s.cfg.max_logprobs)?;
        let out = generate_request(&s, rid, &inputs.params, &view, inputs.n, &inputs.model);
        Ok::<_, ApiError>(Json(out).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
