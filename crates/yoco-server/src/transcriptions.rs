//! `POST /v1/audio/transcriptions` (OpenAI's shape, as vLLM serves Gemma 3n; the Python server's
//! `serve/transcriptions.py`): a multipart upload of one audio file with `model`, `language`,
//! `prompt`, `temperature`, `response_format` (`json` or `text`), `max_completion_tokens`, `seed` and
//! `stream`. The clip becomes Gemma 3n's transcription prompt through the media seam (on the
//! blocking pool); streaming sends `transcription.chunk` objects, a usage chunk when asked
//! (`stream_include_usage`), then `[DONE]`. The body is bounded by `--max-request-body-bytes` (the
//! router's limit) and the file by `--max-media-bytes`.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::choice_channels::{
    await_finished, chunk, error_event, sse_event, sse_response, SseAnswer,
};

use crate::app::AppState;
use crate::completions::{now, uuid_like};
use crate::media::{MediaError, TranscriptionAudio};
use crate::openai::{stop_reason, usage, ApiError};
use crate::output::Event;
use crate::params::{GenParams, SamplingFields};
use crate::transcription_form as form;

/// Most fields a form may have (the Python server's `max_fields`).
const MAX_FIELDS: usize = 32;
/// Longest text field, bytes (a prompt is the longest one).
const MAX_TEXT_FIELD: usize = 64 << 10;

pub(crate) async fn create(State(s): State<Arc<AppState>>, req: Request) -> Response {
    match run(s, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The form as read: text fields by name (the last wins), the upload, every name in order.
#[derive(Default)]
struct Form {
    names: Vec<String>,
    text: Vec<(String, String)>,
    file: Option<(Option<String>, Vec<u8>)>,
}

impl Form {
    fn get(&self, name: &str) -> Option<&str> {
        self.text
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn unparsable(e: impl std::fmt::Display) -> ApiError {
    ApiError::bad(format!("the multipart body cannot be parsed: {e}"), None)
}

/// Reads the multipart body: at most one file, [`MAX_FIELDS`] fields, the file's first
/// `max_file + 1` bytes (more is refused by the seam's size check, as the Python server does).
async fn read_form(mut mp: Multipart, max_file: usize) -> Result<Form, ApiError> {
    let mut f = Form::default();
    while let Some(mut field) = mp.next_field().await.map_err(unparsable)? {
        if f.names.len() >= MAX_FIELDS {
            return Err(unparsable(format!("more than {MAX_FIELDS} fields")));
        }
        let name = field.name().unwrap_or("").to_string();
        f.names.push(name.clone());
        if let Some(filename) = field.file_name().map(str::to_string) {
            if f.file.is_some() {
                return Err(unparsable("more than one file"));
            }
            let mut data = Vec::new();
            while let Some(chunk) = field.chunk().await.map_err(unparsable)? {
                let room = (max_file + 1).saturating_sub(data.len());
                data.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            if name == "file" {
                f.file = Some((Some(filename), data));
            }
        } else {
            let mut data = Vec::new();
            while let Some(chunk) = field.chunk().await.map_err(unparsable)? {
                if data.len() + chunk.len() > MAX_TEXT_FIELD {
                    return Err(ApiError::bad(
                        format!("field {name:?} is over {MAX_TEXT_FIELD} bytes"),
                        Some(&name),
                    ));
                }
                data.extend_from_slice(&chunk);
            }
            let v = String::from_utf8(data).map_err(|_| {
                ApiError::bad(format!("field {name:?} is not UTF-8 text"), Some(&name))
            })?;
            f.text.push((name, v));
        }
    }
    Ok(f)
}

async fn run(s: Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase())
        .unwrap_or_default();
    if !ct.starts_with("multipart/form-data") {
        return Err(ApiError::status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the audio as multipart/form-data (a 'file' field and the options)",
        ));
    }
    let max_file = s.cfg.media.max_bytes;
    let mp = Multipart::from_request(req, &s).await.map_err(unparsable)?;
    let f = read_form(mp, max_file).await?;
    form::check_fields(f.names.iter().map(String::as_str))?;
    let model = s.check_model(f.get("model"))?;
    s.ensure_serving()?;
    let Some(seam) = s.cfg.media.seam.clone() else {
        return Err(ApiError::bad(
            "this model takes no audio: serve a multimodal Gemma 3n checkpoint for transcriptions",
            Some("model"),
        ));
    };
    let Some((filename, data)) = f.file.clone() else {
        return Err(ApiError::bad(
            "the 'file' field with the audio is missing",
            Some("file"),
        ));
    };
    let format = form::audio_format(filename.as_deref())?;
    let language = form::language(f.get("language"))?;
    let as_text = form::text_format(f.get("response_format"))?;
    let stream = form::boolean(f.get("stream"), "stream")?;
    let include_usage = form::boolean(f.get("stream_include_usage"), "stream_include_usage")?;
    let temperature = match f.get("temperature") {
        Some(v) => form::number(v, "temperature", 0.0, 2.0)?,
        None => 0.0,
    };
    let audio = TranscriptionAudio {
        data,
        format,
        language,
        prompt: f.get("prompt").map(str::to_string),
    };
    let prepared = s
        .media_call(move || seam.transcription(&audio))
        .await
        .map_err(|e| match e {
            MediaError::Bad(m) => ApiError::bad(m, Some("file")),
            e => ApiError::from(e),
        })?;
    let n_prompt = prepared.token_ids.len() as u64;
    let left = s.cfg.max_model_len as i64 - n_prompt as i64;
    if left < 1 {
        return Err(ApiError::bad(
            format!(
                "This model's maximum context length is {} tokens; the transcription prompt has {n_prompt}",
                s.cfg.max_model_len
            ),
            Some("file"),
        ));
    }
    let max_tokens = match f.get("max_completion_tokens") {
        Some(v) => form::integer(v, "max_completion_tokens", 1, left)?,
        None => left,
    };
    let seed = match f.get("seed") {
        Some(v) => Some(form::integer(v, "seed", 0, i64::MAX)? as u64),
        None => None,
    };
    let params = GenParams {
        prompt: prepared.token_ids,
        max_tokens: max_tokens as u32,
        skip_special_tokens: true,
        stream,
        sampling: SamplingFields {
            temperature: temperature as f32,
            seed,
            ..SamplingFields::default()
        },
        media: Some(prepared.media),
        ..GenParams::default()
    };
    s.front.observe_params(1, params.max_tokens);
    let (_, _, rx) = s
        .engines
        .submit(params)
        .map_err(|_| ApiError::engine_dead(s.engines.dead_error().as_deref()))?;
    let id = format!("trsc-{}", uuid_like());
    if stream {
        let answer = TranscriptionStream {
            id,
            model,
            created: now(),
            n_prompt,
            include_usage,
            usage: None,
            finished: false,
        };
        return Ok(sse_response(answer, vec![(0, rx)]));
    }
    let (_, f) = await_finished(vec![(0, rx)])
        .await?
        .pop()
        .expect("one choice");
    if as_text {
        return Ok((
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            f.text,
        )
            .into_response());
    }
    let out = f.completion_tokens as u64;
    Ok(axum::Json(json!({"text": f.text, "usage": {"type": "tokens", "input_tokens": n_prompt,
                                                    "output_tokens": out, "total_tokens": n_prompt + out}}))
    .into_response())
}

/// The streamed answer: one `transcription.chunk` per step with text, the last with the finish
/// reason, the usage chunk when asked, `[DONE]`; an error event if the step failed or the engine
/// stopped first.
struct TranscriptionStream {
    id: String,
    model: String,
    created: u64,
    n_prompt: u64,
    include_usage: bool,
    /// The usage chunk's value, once the request finished without an error.
    usage: Option<Value>,
    finished: bool,
}

impl TranscriptionStream {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        chunk(
            "transcription.chunk",
            &self.id,
            &self.model,
            self.created,
            choices,
            usage,
        )
    }
}

impl SseAnswer for TranscriptionStream {
    fn on_event(&mut self, _idx: usize, ev: Event, out: &mut VecDeque<Bytes>) {
        match ev {
            Event::Delta { text, .. } if !text.is_empty() => out.push_back(self.chunk(
                json!([{"delta": {"content": text}, "finish_reason": null, "stop_reason": null}]),
                None,
            )),
            Event::Delta { .. } => {}
            Event::Finished(f) => {
                self.finished = true;
                if let Some(e) = &f.error {
                    out.push_back(error_event(e));
                    return;
                }
                out.push_back(self.chunk(
                    json!([{"delta": {"content": f.text}, "finish_reason": f.reason.as_str(),
                            "stop_reason": stop_reason(&f)}]),
                    None,
                ));
                if self.include_usage {
                    self.usage = Some(usage(self.n_prompt, f.completion_tokens as u64, 0));
                }
            }
        }
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        if !self.finished {
            let err = ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "The engine stopped before the request finished.",
            );
            out.push_back(sse_event(&err.body()));
        }
        if let Some(u) = self.usage.take() {
            out.push_back(self.chunk(json!([]), Some(u)));
        }
        out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}
