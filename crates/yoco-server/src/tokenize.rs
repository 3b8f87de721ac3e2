//! `POST /tokenize` and `POST /detokenize` in vLLM's shapes (vllm-router's `cache_aware` policy
//! calls `/tokenize` to match prefixes on tokens). A body with `messages` is a conversation,
//! rendered by the chat template first (as `/v1/chat/completions` renders it); one with `prompt`
//! is text. The ids are those the matching generation request runs.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::AppState;
use crate::body::parse_json;
use crate::body_fields::{ANY_OBJECT, CHAT, DETOKENIZE, TOKENIZE_TEXT};
use crate::chat::render;
use crate::chat_protocol::ChatCompletionRequest;
use crate::openai::ApiError;
use crate::validate::{encode_rendered, too_long};

#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    messages: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct TextRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    return_token_strs: Option<bool>,
}

#[derive(Deserialize)]
struct IdsRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    tokens: Option<Vec<i64>>,
}

/// `POST /tokenize`: `{"count", "max_model_len", "tokens"}` (and `token_strs` on request).
pub(crate) async fn tokenize(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run_tokenize(s, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn run_tokenize(
    s: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = match body {
        Ok(b) => b,
        Err(e) => return parse_json::<Probe>(&s, Err(e), &ANY_OBJECT).map(|_| unreachable!()),
    };
    let probe: Probe = parse_json(&s, Ok(bytes.clone()), &ANY_OBJECT)?;
    let (ids, strs) = if probe.messages.is_some() {
        let req: ChatCompletionRequest = parse_json(&s, Ok(bytes), &CHAT)?;
        s.check_model(req.model.as_deref())?;
        s.ensure_serving()?;
        let text = render(&s, &req, None, None).await?;
        let ids = encode_rendered(&s, text, req.add_special_tokens.unwrap_or(false), None).await?;
        (
            ids,
            req.rest
                .get("return_token_strs")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        )
    } else {
        let req: TextRequest = parse_json(&s, Ok(bytes), &TOKENIZE_TEXT)?;
        s.check_model(req.model.as_deref())?;
        s.ensure_serving()?;
        let text = req.prompt.ok_or_else(|| {
            ApiError::bad(
                "give 'prompt' (text) or 'messages' (a conversation) to tokenize",
                Some("prompt"),
            )
        })?;
        if text.len() > s.cfg.max_prompt_bytes() {
            return Err(too_long("prompt", &text, s.cfg.max_model_len, "prompt"));
        }
        let add = req.add_special_tokens.unwrap_or(true);
        let ids = if text.is_empty() {
            s.cfg.bos_token_id.filter(|_| add).into_iter().collect()
        } else {
            encode_rendered(&s, text, add, None)
                .await
                .map_err(|mut e| {
                    e.param = Some("prompt".into());
                    e
                })?
        };
        (ids, req.return_token_strs.unwrap_or(false))
    };
    let mut body = json!({"count": ids.len(), "max_model_len": s.cfg.max_model_len, "tokens": ids});
    if strs {
        let t: Vec<Option<String>> = ids.iter().map(|&i| s.tok.id_to_token(i)).collect();
        body["token_strs"] = json!(t);
    }
    Ok(Json(body).into_response())
}

/// `POST /detokenize`: ids back to text, special tokens kept; ids outside the vocabulary are a 400.
pub(crate) async fn detokenize(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let req: IdsRequest = parse_json(&s, body, &DETOKENIZE)?;
        s.check_model(req.model.as_deref())?;
        s.ensure_serving()?;
        let tokens = req
            .tokens
            .ok_or_else(|| ApiError::bad("tokens is required", Some("tokens")))?;
        let v = s.cfg.vocab_size as i64;
        if let Some(bad) = tokens.iter().find(|&&t| t < 0 || t >= v) {
            return Err(ApiError::bad(
                format!("tokens holds token id {bad}, outside the vocabulary [0, {v})"),
                Some("tokens"),
            ));
        }
        let ids: Vec<u32> = tokens.into_iter().map(|t| t as u32).collect();
        let s2 = s.clone();
        let text = tokio::task::spawn_blocking(move || s2.tok.decode(&ids, false))
            .await
            .map_err(|e| ApiError::bad(e.to_string(), None))?
            .map_err(|e| {
                ApiError::bad(format!("tokens could not be decoded: {e}"), Some("tokens"))
            })?;
        Ok::<_, ApiError>(Json(json!({"prompt": text})).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
