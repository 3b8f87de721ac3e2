//! The answers of `/v1/completions`: one JSON body, or an SSE stream merging the requests' channels
//! (`data: {chunk}` per event, an error event if a step failed, the usage chunk, `data: [DONE]`).

use std::collections::VecDeque;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::choice_channels::{await_finished, chunk, error_event, sse_response, SseAnswer, Subs};
use crate::delta_chunk::DeltaChunk;
use crate::logprobs_json::{echo_and_output, prompt_logprobs_json, CompletionLogprobs, TokenText};
use crate::openai::{stop_reason, usage, ApiError};
use crate::output::Event;

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
    /// A text delta of choice `idx` (of prompt `prompt`) is its chunk's only content: no logprobs
    /// were asked and, on the choice's first chunk, no echoed prompt or prompt logprobs ride along.
    /// (No running usage either: the caller checks that.)
    fn plain_delta(&self, first: bool, prompt: usize) -> bool {
        !self.logprobs && (!first || (self.echo[prompt].is_none() && !self.prompt_logprobs))
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
        chunk(
            "text_completion",
            &self.id,
            &self.model,
            self.created,
            choices,
            usage,
        )
    }
}

struct StreamState {
    ctx: Ctx,
    /// The plain text delta's chunk, serialized once (None: every chunk takes the general path).
    plain: Option<DeltaChunk>,
    started: Vec<bool>,
    generated: Vec<u64>,
    cached: Vec<u64>,
    lps: Vec<CompletionLogprobs>,
    include_usage: bool,
    continuous: bool,
}

impl StreamState {
    fn usage_of(&self, prompt: usize) -> Value {
        let g: u64 = (0..self.ctx.n)
            .map(|j| self.generated[prompt * self.ctx.n + j])
            .sum();
        usage(self.ctx.prompt_lens[prompt], g, self.cached[prompt])
    }
}

impl SseAnswer for StreamState {
    fn on_event(&mut self, idx: usize, ev: Event, out: &mut VecDeque<Bytes>) {
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
            if !self.continuous && self.ctx.plain_delta(first, prompt) {
                self.generated[idx] += token_id.is_some() as u64;
                out.push_back(plain.render(idx, text));
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
                    out.push_back(error_event(err));
                    return;
                }
                (
                    std::mem::take(&mut f.text),
                    json!(f.reason.as_str()),
                    stop_reason(&f),
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
        out.push_back(self.ctx.chunk(Value::Array(vec![choice]), u));
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        if self.include_usage {
            let p: u64 = self.ctx.prompt_lens.iter().sum();
            let g: u64 = self.generated.iter().sum();
            let c: u64 = self.cached.iter().sum();
            out.push_back(self.ctx.chunk(json!([]), Some(usage(p, g, c))));
        }
        out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

pub(crate) fn stream_response(
    ctx: Ctx,
    subs: Subs,
    include_usage: bool,
    continuous: bool,
) -> Response {
    let total = subs.len();
    let prompts = ctx.prompt_lens.len();
    let plain = DeltaChunk::completion(|choices| ctx.chunk(choices, None));
    let st = StreamState {
        ctx,
        plain,
        started: vec![false; total],
        generated: vec![0; total],
        cached: vec![0; prompts],
        lps: (0..total).map(|_| CompletionLogprobs::default()).collect(),
        include_usage,
        continuous: include_usage && continuous,
    };
    sse_response(st, subs)
}

pub(crate) async fn final_response(mut ctx: Ctx, subs: Subs) -> Result<Response, ApiError> {
    let fins = await_finished(subs).await?;
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
                                "finish_reason": f.reason.as_str(), "stop_reason": stop_reason(f)});
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
