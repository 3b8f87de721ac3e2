//! `POST /v1/completions`: one or several prompts, `n` completions each, streamed or not.
//!
//! Choice `index` is `prompt_index * n + sample_index` (OpenAI's layout); `usage` counts each prompt
//! once and every generated token; `prompt_tokens_details.cached_tokens` is the prefix-cache hit.
//! A dropped connection drops the requests' channels, which aborts them in the step loop.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::app::{parse_json, AppState};
use crate::openai::{usage, ApiError, CompletionRequest, PromptInput, StopInput};
use crate::output::{Event, Finished, StopReason};
use crate::params::{GenParams, SamplingFields};

/// Prompts longer than this many bytes are tokenized on the blocking pool.
const INLINE_TOKENIZE_BYTES: usize = 4096;

pub(crate) async fn create(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(s, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

struct Prompt {
    ids: Vec<u32>,
    text: Option<String>,
}

async fn run(s: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_json(body)?;
    let model = s.check_model(req.model.as_deref())?;
    if s.engine
        .stats()
        .dead
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "The engine is not running.",
        ));
    }
    refuse_unserved(&req)?;
    let n = match req.n {
        None => 1,
        Some(n) if n >= 1 && n <= s.cfg.max_n as i64 => n as u32,
        Some(n) => {
            return Err(ApiError::bad(
                format!(
                    "n must be in [1, {}] (the server's --max-n), got {n}",
                    s.cfg.max_n
                ),
                Some("n"),
            ))
        }
    };
    let prompts = prompts(&s, req.prompt.clone()).await?;
    let stream = req.stream.unwrap_or(false);
    let params: Vec<GenParams> = prompts
        .iter()
        .map(|p| gen_params(&s, &req, &p.ids, stream))
        .collect::<Result<_, _>>()?;
    let mut subs = Vec::with_capacity(prompts.len() * n as usize);
    for (i, p) in params.iter().enumerate() {
        for j in 0..n {
            let mut p = p.clone();
            if let (Some(seed), true) = (p.sampling.seed, j > 0) {
                p.sampling.seed = Some(seed.wrapping_add(j as u64));
            }
            let (id, rx) = s.engine.submit(p).map_err(|e| {
                ApiError::status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("The engine is not running: {e}"),
                )
            })?;
            let _ = id;
            subs.push((i * n as usize + j as usize, rx));
        }
    }
    let echo: Vec<Option<String>> = if req.echo.unwrap_or(false) {
        prompts
            .iter()
            .map(|p| p.text.clone().or_else(|| s.tok.decode(&p.ids, false).ok()))
            .collect()
    } else {
        vec![None; prompts.len()]
    };
    let ctx = Ctx {
        id: format!("cmpl-{}", uuid_like()),
        model,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        n: n as usize,
        prompt_lens: prompts.iter().map(|p| p.ids.len() as u64).collect(),
        echo,
    };
    if stream {
        let opts = req.stream_options.clone().unwrap_or_default();
        Ok(stream_response(
            ctx,
            subs,
            opts.include_usage.unwrap_or(false),
            opts.continuous_usage_stats.unwrap_or(false),
        ))
    } else {
        final_response(ctx, subs).await
    }
}

fn refuse_unserved(req: &CompletionRequest) -> Result<(), ApiError> {
    let fields: [(&str, bool); 10] = [
        (
            "logprobs",
            req.logprobs.as_ref().is_some_and(|v| !v.is_null()),
        ),
        (
            "prompt_logprobs",
            req.prompt_logprobs.as_ref().is_some_and(|v| !v.is_null()),
        ),
        (
            "best_of",
            req.best_of
                .as_ref()
                .is_some_and(|v| !v.is_null() && v != &json!(1)),
        ),
        ("suffix", req.suffix.as_ref().is_some_and(|v| !v.is_null())),
        (
            "logit_bias",
            req.logit_bias.as_ref().is_some_and(|v| !v.is_null()),
        ),
        (
            "presence_penalty",
            req.presence_penalty.is_some_and(|v| v != 0.0),
        ),
        (
            "frequency_penalty",
            req.frequency_penalty.is_some_and(|v| v != 0.0),
        ),
        (
            "repetition_penalty",
            req.repetition_penalty.is_some_and(|v| v != 1.0),
        ),
        (
            "response_format",
            req.response_format.as_ref().is_some_and(|v| !v.is_null()),
        ),
        (
            "structured_outputs",
            req.structured_outputs
                .as_ref()
                .is_some_and(|v| !v.is_null()),
        ),
    ];
    for (name, set) in fields {
        if set {
            return Err(ApiError::bad(
                format!("{name} is not supported by the Rust front end yet; use yoco-serve's default server"),
                Some(name),
            ));
        }
    }
    Ok(())
}

async fn prompts(s: &Arc<AppState>, input: Option<PromptInput>) -> Result<Vec<Prompt>, ApiError> {
    let input = input.ok_or_else(|| ApiError::bad("prompt is required", Some("prompt")))?;
    let max = s.cfg.max_prompts_per_request as usize;
    let count = match &input {
        PromptInput::Text(_) | PromptInput::Ids(_) => 1,
        PromptInput::Texts(v) => v.len(),
        PromptInput::IdLists(v) => v.len(),
    };
    if count == 0 {
        return Err(ApiError::bad(
            "prompt is an empty list: give a string, a list of strings, a list of token ids or a list of lists of token ids",
            Some("prompt"),
        ));
    }
    if count > max {
        return Err(ApiError::bad(
            format!("prompt holds {count} prompts; at most {max} per request (the server's --max-prompts-per-request)"),
            Some("prompt"),
        ));
    }
    let mut out = Vec::with_capacity(count);
    match input {
        PromptInput::Text(t) => out.push(encode(s, t, "prompt").await?),
        PromptInput::Texts(ts) => {
            for (i, t) in ts.into_iter().enumerate() {
                out.push(encode(s, t, &format!("prompt[{i}]")).await?);
            }
        }
        PromptInput::Ids(ids) => out.push(check_ids(s, ids, "prompt")?),
        PromptInput::IdLists(ls) => {
            for (i, ids) in ls.into_iter().enumerate() {
                out.push(check_ids(s, ids, &format!("prompt[{i}]"))?);
            }
        }
    }
    Ok(out)
}

async fn encode(s: &Arc<AppState>, text: String, wher: &str) -> Result<Prompt, ApiError> {
    if text.is_empty() {
        return Err(ApiError::bad(
            format!("{wher} is empty: give at least one character or token id"),
            Some("prompt"),
        ));
    }
    // A token is at least one byte: a text with more bytes than 32 x the context cannot fit; refusing
    // it before tokenizing keeps a huge body from occupying a worker.
    if text.len() > 32 * s.cfg.max_model_len as usize {
        return Err(ApiError::bad(
            format!(
                "{wher} is too long: {} bytes make more than {} tokens",
                text.len(),
                s.cfg.max_model_len
            ),
            Some("prompt"),
        ));
    }
    let enc = if text.len() > INLINE_TOKENIZE_BYTES {
        let s2 = s.clone();
        let t = text.clone();
        tokio::task::spawn_blocking(move || {
            s2.tok
                .encode(t.as_str(), true)
                .map(|e| e.get_ids().to_vec())
        })
        .await
        .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    } else {
        s.tok
            .encode(text.as_str(), true)
            .map(|e| e.get_ids().to_vec())
    };
    let ids = enc.map_err(|e| {
        ApiError::bad(
            format!("{wher} could not be tokenized: {e}"),
            Some("prompt"),
        )
    })?;
    Ok(Prompt {
        ids,
        text: Some(text),
    })
}

fn check_ids(s: &AppState, ids: Vec<i64>, wher: &str) -> Result<Prompt, ApiError> {
    if ids.is_empty() {
        return Err(ApiError::bad(
            format!("{wher} is an empty list of token ids: give at least one token id"),
            Some("prompt"),
        ));
    }
    let v = s.cfg.vocab_size as i64;
    if let Some(bad) = ids.iter().find(|&&t| t < 0 || t >= v) {
        return Err(ApiError::bad(
            format!("{wher} holds token id {bad}, outside the vocabulary [0, {v})"),
            Some("prompt"),
        ));
    }
    Ok(Prompt {
        ids: ids.into_iter().map(|t| t as u32).collect(),
        text: None,
    })
}

fn context_error(limit: u32, prompt_len: usize, max_tokens: Option<i64>) -> ApiError {
    let p = prompt_len as i64;
    let n = limit as i64;
    if p >= n {
        let asked = max_tokens
            .map(|m| {
                format!(
                    " and you requested {m} output tokens, for a total of {} tokens",
                    p + m
                )
            })
            .unwrap_or_default();
        return ApiError::bad(
            format!("This model's maximum context length is {n} tokens. However, your prompt contains {p} input \
                     tokens{asked}. The prompt must be at most {} tokens to leave room for at least one output \
                     token; please reduce the length of the prompt.", n - 1),
            Some("prompt"),
        );
    }
    let m = max_tokens.unwrap_or(0);
    ApiError::bad(
        format!("This model's maximum context length is {n} tokens. However, you requested {m} output tokens \
                 and your prompt contains {p} input tokens, for a total of {} tokens. Please reduce the length \
                 of the prompt or the number of requested output tokens (max_tokens <= {} fits this prompt).",
                p + m, n - p),
        Some("max_tokens"),
    )
}

fn finite_in(name: &str, v: Option<f64>, lo: f64, hi: f64, default: f64) -> Result<f32, ApiError> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x as f32),
        Some(x) => Err(ApiError::bad(
            format!("{name} must be in [{lo}, {hi}], got {x}"),
            Some(name),
        )),
    }
}

fn gen_params(
    s: &AppState,
    r: &CompletionRequest,
    prompt: &[u32],
    stream: bool,
) -> Result<GenParams, ApiError> {
    let limit = s.cfg.max_model_len;
    if let Some(m) = r.max_tokens {
        if m < 1 {
            return Err(ApiError::bad(
                format!("max_tokens must be an integer >= 1 (or omitted for up to the context length), got {m}"),
                Some("max_tokens"),
            ));
        }
    }
    let room = limit as i64 - prompt.len() as i64;
    if room < 1 || r.max_tokens.is_some_and(|m| m > room) {
        return Err(context_error(limit, prompt.len(), r.max_tokens));
    }
    let max_tokens = r.max_tokens.unwrap_or(room) as u32;
    let temperature = finite_in("temperature", r.temperature, 0.0, 100.0, 1.0)?;
    let top_p = finite_in("top_p", r.top_p, f64::MIN_POSITIVE, 1.0, 1.0)?;
    let min_p = finite_in("min_p", r.min_p, 0.0, 1.0, 0.0)?;
    let top_k = match r.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if (1..=i32::MAX as i64).contains(&k) => k as u32,
        Some(k) => {
            return Err(ApiError::bad(
                format!("top_k must be 0 or -1 (disabled) or in [1, 2**31 - 1], got {k}"),
                Some("top_k"),
            ))
        }
    };
    let min_tokens = match r.min_tokens {
        None => 0,
        Some(m) if m >= 0 && m <= max_tokens as i64 => m as u32,
        Some(m) => {
            return Err(ApiError::bad(
                format!("min_tokens must be in [0, max_tokens ({max_tokens})], got {m}"),
                Some("min_tokens"),
            ))
        }
    };
    let stop = match &r.stop {
        None => Vec::new(),
        Some(StopInput::One(x)) => vec![x.clone()],
        Some(StopInput::Many(v)) => v.clone(),
    };
    if stop.len() > s.cfg.max_stop_strings {
        return Err(ApiError::bad(
            format!(
                "stop holds {} strings; at most {}",
                stop.len(),
                s.cfg.max_stop_strings
            ),
            Some("stop"),
        ));
    }
    let v = s.cfg.vocab_size as i64;
    let stop_token_ids = r.stop_token_ids.clone().unwrap_or_default();
    if let Some(bad) = stop_token_ids.iter().find(|&&t| t < 0 || t >= v) {
        return Err(ApiError::bad(
            format!("stop_token_ids holds {bad}, outside the vocabulary [0, {v})"),
            Some("stop_token_ids"),
        ));
    }
    let priority = match r.priority {
        None => 0,
        Some(p) if p == 0 => 0,
        Some(p) => {
            return Err(ApiError::bad(
                format!("priority is only supported with --scheduling-policy priority (this server schedules \
                         first come, first served), got {p}"),
                Some("priority"),
            ))
        }
    };
    Ok(GenParams {
        prompt: prompt.to_vec(),
        max_tokens,
        min_tokens,
        ignore_eos: r.ignore_eos.unwrap_or(false),
        stop_token_ids: stop_token_ids.into_iter().map(|t| t as u32).collect(),
        stop,
        include_stop_str: r.include_stop_str_in_output.unwrap_or(false),
        skip_special_tokens: r.skip_special_tokens.unwrap_or(true),
        stream,
        cache_salt: r.cache_salt.clone(),
        priority,
        sampling: SamplingFields {
            temperature,
            top_p,
            top_k,
            min_p,
            seed: r.seed.map(|x| x as u64),
        },
    })
}

struct Ctx {
    id: String,
    model: String,
    created: u64,
    n: usize,
    prompt_lens: Vec<u64>,
    echo: Vec<Option<String>>,
}

impl Ctx {
    fn stop_reason(f: &Finished) -> Value {
        match &f.stop_reason {
            Some(StopReason::Text(t)) => json!(t),
            Some(StopReason::Token(t)) => json!(t),
            None => Value::Null,
        }
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let mut v = json!({"id": self.id, "object": "text_completion", "created": self.created,
                           "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"data: ");
        serde_json::to_writer(&mut out, &v).expect("JSON of plain values");
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }
}

fn receiver_stream(idx: usize, rx: UnboundedReceiver<Event>) -> BoxStream<'static, (usize, Event)> {
    stream::unfold(rx, move |mut rx| async move {
        rx.recv().await.map(|e| ((idx, e), rx))
    })
    .boxed()
}

struct StreamState {
    ctx: Ctx,
    merged: SelectAll<BoxStream<'static, (usize, Event)>>,
    pending: VecDeque<Bytes>,
    started: Vec<bool>,
    generated: Vec<u64>,
    cached: Vec<u64>,
    include_usage: bool,
    continuous: bool,
    done: bool,
}

impl StreamState {
    fn usage_of(&self, prompt: usize) -> Value {
        let g: u64 = (0..self.ctx.n)
            .map(|j| self.generated[prompt * self.ctx.n + j])
            .sum();
        usage(self.ctx.prompt_lens[prompt], g, self.cached[prompt])
    }

    fn on_event(&mut self, idx: usize, ev: Event) {
        let prompt = idx / self.ctx.n;
        let first = !self.started[idx];
        self.started[idx] = true;
        let (mut text, finish, stop_reason) = match ev {
            Event::Delta { token_ids, text } => {
                self.generated[idx] += token_ids.len() as u64;
                (text, Value::Null, Value::Null)
            }
            Event::Finished(f) => {
                self.generated[idx] = f.completion_tokens as u64;
                self.cached[prompt] = self.cached[prompt].max(f.cached_tokens as u64);
                if let Some(err) = &f.error {
                    let e = ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, err.clone());
                    let mut out = b"data: ".to_vec();
                    serde_json::to_writer(&mut out, &e.body()).expect("JSON");
                    out.extend_from_slice(b"\n\n");
                    self.pending.push_back(Bytes::from(out));
                    return;
                }
                (
                    f.text.clone(),
                    json!(f.reason.as_str()),
                    Ctx::stop_reason(&f),
                )
            }
        };
        if first {
            if let Some(p) = &self.ctx.echo[prompt] {
                text = format!("{p}{text}");
            }
        }
        let choice = json!([{"index": idx, "text": text, "logprobs": null,
                             "finish_reason": finish, "stop_reason": stop_reason}]);
        let u = self.continuous.then(|| self.usage_of(prompt));
        self.pending.push_back(self.ctx.chunk(choice, u));
    }

    fn finish(&mut self) {
        if self.include_usage {
            let p: u64 = self.ctx.prompt_lens.iter().sum();
            let g: u64 = self.generated.iter().sum();
            let c: u64 = self.cached.iter().sum();
            let b = self.ctx.chunk(json!([]), Some(usage(p, g, c)));
            self.pending.push_back(b);
        }
        self.pending
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.done = true;
    }
}

fn stream_response(
    ctx: Ctx,
    subs: Vec<(usize, UnboundedReceiver<Event>)>,
    include_usage: bool,
    continuous: bool,
) -> Response {
    let total = subs.len();
    let prompts = ctx.prompt_lens.len();
    let mut merged = SelectAll::new();
    for (idx, rx) in subs {
        merged.push(receiver_stream(idx, rx));
    }
    let st = StreamState {
        ctx,
        merged,
        pending: VecDeque::new(),
        started: vec![false; total],
        generated: vec![0; total],
        cached: vec![0; prompts],
        include_usage,
        continuous: include_usage && continuous,
        done: false,
    };
    let body = stream::unfold(st, |mut st| async move {
        loop {
            if let Some(b) = st.pending.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), st));
            }
            if st.done {
                return None;
            }
            match st.merged.next().await {
                Some((idx, ev)) => st.on_event(idx, ev),
                None => st.finish(),
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

async fn final_response(
    ctx: Ctx,
    subs: Vec<(usize, UnboundedReceiver<Event>)>,
) -> Result<Response, ApiError> {
    let mut fins: Vec<(usize, Finished)> = Vec::with_capacity(subs.len());
    for (idx, mut rx) in subs {
        loop {
            match rx.recv().await {
                Some(Event::Finished(f)) => {
                    fins.push((idx, f));
                    break;
                }
                Some(Event::Delta { .. }) => continue,
                None => {
                    return Err(ApiError::status(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The engine stopped before the request finished.",
                    ))
                }
            }
        }
    }
    if let Some((_, f)) = fins.iter().find(|(_, f)| f.error.is_some()) {
        return Err(ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            f.error.clone().unwrap_or_default(),
        ));
    }
    fins.sort_by_key(|(i, _)| *i);
    let mut cached = vec![0u64; ctx.prompt_lens.len()];
    let mut completion = 0u64;
    let choices: Vec<Value> = fins
        .iter()
        .map(|(idx, f)| {
            let p = idx / ctx.n;
            cached[p] = cached[p].max(f.cached_tokens as u64);
            completion += f.completion_tokens as u64;
            let text = match &ctx.echo[p] {
                Some(e) => format!("{e}{}", f.text),
                None => f.text.clone(),
            };
            json!({"index": idx, "text": text, "logprobs": null, "finish_reason": f.reason.as_str(),
                   "stop_reason": Ctx::stop_reason(f)})
        })
        .collect();
    let prompt: u64 = ctx.prompt_lens.iter().sum();
    let body = json!({"id": ctx.id, "object": "text_completion", "created": ctx.created, "model": ctx.model,
                      "choices": choices, "usage": usage(prompt, completion, cached.iter().sum())});
    Ok(axum::Json(body).into_response())
}

/// A random-enough request id without a uuid dependency: time and a process-wide counter, mixed.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:016x}{:08x}",
        yoco_core::mock::mix64(t ^ c.rotate_left(32)),
        c as u32
    )
}
