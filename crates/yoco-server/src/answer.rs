//! The answers of `/v1/completions`: one JSON body, or an SSE stream merging the requests' channels
//! (`data: {chunk}` per event, an error event if a step failed, the usage chunk, `data: [DONE]`).

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::delta_chunk::DeltaChunk;
use crate::logprobs_json::{echo_and_output, prompt_logprobs_json, CompletionLogprobs, TokenText};
use crate::openai::{usage, ApiError};
use crate::output::{Event, Finished, StopReason};

pub(crate) struct Ctx {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub n: usize,
    pub prompt_lens: Vec<u64>,
    pub echo: Vec<Option<String>>,
    /// Per prompt: its ids when `echo` shows them with logprobs.
    pub echo_ids: Vec<Option<Vec<u32>>>,
    /// The request asked for `logprobs`.
    pub logprobs: bool,
    /// The request asked for `prompt_logprobs` (each choice carries them).
    pub prompt_logprobs: bool,
    /// Token texts of the logprobs (`return_tokens_as_token_ids` or decoded).
    pub text: TokenText,
}

impl Ctx {
    fn stop_reason(f: &Finished) -> Value {
        match &f.stop_reason {
            Some(StopReason::Text(t)) => json!(t),
            Some(StopReason::Token(t)) => json!(t),
            None => Value::Null,
        }
    }

    /// A choice's `logprobs` (null unless asked): the echoed prompt's block first when `head`.
    fn logprobs(
        &mut self,
        lp: &mut CompletionLogprobs,
        prompt: usize,
        head: bool,
        plp: Option<&crate::output::PromptLogprobs>,
        tokens: &[u32],
        logprobs: &[crate::output::TokenLogprob],
    ) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let echo = match (&self.echo_ids[prompt], head) {
            (Some(ids), true) => Some((ids.as_slice(), plp)),
            _ => None,
        };
        echo_and_output(lp, &mut self.text, echo, tokens, logprobs)
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
    /// The plain text delta's chunk, serialized once (None: every chunk takes the general path).
    plain: Option<DeltaChunk>,
    merged: SelectAll<BoxStream<'static, (usize, Event)>>,
    pending: VecDeque<Bytes>,
    started: Vec<bool>,
    generated: Vec<u64>,
    cached: Vec<u64>,
    lps: Vec<CompletionLogprobs>,
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
        if let (
            Some(plain),
            Event::Delta {
                token_id,
                text,
                logprob: None,
                prompt_logprobs: None,
            },
        ) = (&self.plain, &ev)
        {
            let plain_head =
                !first || (self.ctx.echo[prompt].is_none() && !self.ctx.prompt_logprobs);
            if plain_head && !self.ctx.logprobs && !self.continuous {
                self.generated[idx] += token_id.is_some() as u64;
                self.pending.push_back(plain.render(idx, text));
                return;
            }
        }
        let (mut text, finish, stop_reason, tokens, logprobs, plp) = match ev {
            Event::Delta {
                token_id,
                text,
                logprob,
                prompt_logprobs,
            } => {
                self.generated[idx] += token_id.is_some() as u64;
                (
                    text,
                    Value::Null,
                    Value::Null,
                    token_id.into_iter().collect::<Vec<u32>>(),
                    logprob.into_iter().collect::<Vec<_>>(),
                    prompt_logprobs,
                )
            }
            Event::Finished(mut f) => {
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
                    std::mem::take(&mut f.text),
                    json!(f.reason.as_str()),
                    Ctx::stop_reason(&f),
                    std::mem::take(&mut f.token_ids),
                    std::mem::take(&mut f.logprobs),
                    f.prompt_logprobs.take(),
                )
            }
        };
        let mut lp = std::mem::take(&mut self.lps[idx]);
        let logprobs = self
            .ctx
            .logprobs(&mut lp, prompt, first, plp.as_ref(), &tokens, &logprobs);
        self.lps[idx] = lp;
        if first {
            if let Some(p) = &self.ctx.echo[prompt] {
                text = format!("{p}{text}");
            }
        }
        let mut choice = json!({"index": idx, "text": text, "logprobs": logprobs,
                                "finish_reason": finish, "stop_reason": stop_reason});
        if first && self.ctx.prompt_logprobs {
            choice["prompt_logprobs"] = prompt_logprobs_json(&mut self.ctx.text, plp.as_ref());
        }
        let u = self.continuous.then(|| self.usage_of(prompt));
        self.pending
            .push_back(self.ctx.chunk(Value::Array(vec![choice]), u));
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

pub(crate) fn stream_response(
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
    let plain = DeltaChunk::new(|choices| ctx.chunk(choices, None));
    let st = StreamState {
        ctx,
        plain,
        merged,
        pending: VecDeque::new(),
        started: vec![false; total],
        generated: vec![0; total],
        cached: vec![0; prompts],
        lps: (0..total).map(|_| CompletionLogprobs::default()).collect(),
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

pub(crate) async fn final_response(
    mut ctx: Ctx,
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
    let mut choices: Vec<Value> = Vec::with_capacity(fins.len());
    for (idx, f) in &fins {
        let p = idx / ctx.n;
        cached[p] = cached[p].max(f.cached_tokens as u64);
        completion += f.completion_tokens as u64;
        let text = match &ctx.echo[p] {
            Some(e) => format!("{e}{}", f.text),
            None => f.text.clone(),
        };
        let plp = f.prompt_logprobs.as_ref();
        let mut lp = CompletionLogprobs::default();
        let logprobs = ctx.logprobs(&mut lp, p, true, plp, &f.token_ids, &f.logprobs);
        let mut choice = json!({"index": idx, "text": text, "logprobs": logprobs,
                                "finish_reason": f.reason.as_str(), "stop_reason": Ctx::stop_reason(f)});
        if ctx.prompt_logprobs {
            choice["prompt_logprobs"] = prompt_logprobs_json(&mut ctx.text, plp);
        }
        choices.push(choice);
    }
    let prompt: u64 = ctx.prompt_lens.iter().sum();
    let body = json!({"id": ctx.id, "object": "text_completion", "created": ctx.created, "model": ctx.model,
                      "choices": choices, "usage": usage(prompt, completion, cached.iter().sum())});
    Ok(axum::Json(body).into_response())
}
