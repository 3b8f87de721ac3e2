//! The answers of `/v1/chat/completions`, as the Python server (and vLLM) send them.
//!
//! Streamed, per choice: a first chunk `delta: {"role": "assistant", "content": ""}` when the
//! choice's first output arrives, then one chunk per step that produced a token (`delta.content`,
//! possibly empty while the detokenizer holds bytes back), the last one carrying `finish_reason`
//! and `stop_reason` (its `delta` is `{}` when no text is left). With `include_usage` a last chunk
//! with no choices carries `usage`; `continuous_usage_stats` puts the running usage on every chunk.
//! Then `data: [DONE]`. An engine failure after the 200 is an error event before `[DONE]`.
//! With `logprobs`, each chunk with tokens carries their chat-form logprobs; non-streaming, each
//! choice carries its own and the body the prompt's (`prompt_logprobs`), as the Python server does.
//! With tools in play (`tool_choice` auto / required / named), a reply's calls are `message.tool_calls`
//! ([`crate::tool_parse`]) or, streamed, `delta.tool_calls` ([`crate::tool_stream`]), and a reply
//! that called tools under auto / required finishes with `tool_calls`.

use std::collections::VecDeque;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::choice_channels::{await_finished, chunk, error_event, sse_response, SseAnswer, Subs};
use crate::delta_chunk::DeltaChunk;
use crate::logprobs::TokenLogprob;
use crate::logprobs_json::{chat_logprobs, prompt_logprobs_json, TokenText};
use crate::openai::{stop_reason, usage, ApiError};
use crate::output::Event;
use crate::tool_parse::parse_reply;
use crate::tool_stream::{merge_deltas, ToolCallStream};
use crate::tools::{finish_reason as tool_finish, ToolPlan};

/// What every chunk of one chat response shares.
pub(crate) struct ChatCtx {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub prompt_len: u64,
    /// `Some(top_logprobs)` when the request asked for `logprobs`.
    pub top_logprobs: Option<usize>,
    /// The request asked for `prompt_logprobs` (the body carries them, non-streaming).
    pub prompt_logprobs: bool,
    /// Token texts for the logprobs.
    pub text: TokenText,
    /// The request's tools.
    pub tools: ToolPlan,
}

impl ChatCtx {
    /// The chat-form logprobs of `tokens`, or null when the request did not ask.
    fn logprobs(&mut self, tokens: &[u32], lps: &[TokenLogprob]) -> Value {
        match self.top_logprobs {
            Some(n) => chat_logprobs(&mut self.text, tokens, lps, n),
            None => Value::Null,
        }
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        chunk(
            "chat.completion.chunk",
            &self.id,
            &self.model,
            self.created,
            choices,
            usage,
        )
    }

    /// A text delta is its chunk's only content: no logprobs asked, no tools in play (the
    /// choice's first chunk, the role, goes out before it either way).
    fn plain_delta(&self) -> bool {
        self.top_logprobs.is_none() && !self.tools.active()
    }
}

struct ChatStream {
    ctx: ChatCtx,
    /// The plain text delta's chunk, serialized once (None: every chunk takes the general path).
    plain: Option<DeltaChunk>,
    started: Vec<bool>,
    /// Each choice's streamed tool calls (tools in play).
    calls: Vec<Option<ToolCallStream>>,
    generated: u64,
    cached: u64,
    include_usage: bool,
    continuous: bool,
}

impl ChatStream {
    fn running_usage(&self) -> Option<Value> {
        self.continuous
            .then(|| usage(self.ctx.prompt_len, self.generated, self.cached))
    }
}

impl SseAnswer for ChatStream {
    fn on_event(&mut self, idx: usize, ev: Event, out: &mut VecDeque<Bytes>) {
        if let Event::Finished(f) = &ev {
            self.cached = self.cached.max(f.cached_tokens as u64);
            if let Some(err) = &f.error {
                out.push_back(error_event(err));
                return;
            }
        }
        if !self.started[idx] {
            self.started[idx] = true;
            let u = self.running_usage();
            let role = json!([{"index": idx, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null}]);
            out.push_back(self.ctx.chunk(role, u));
        }
        if let (Some(plain), Event::Delta { token_id, text, .. }) = (&self.plain, &ev) {
            if !self.continuous && self.ctx.plain_delta() {
                self.generated += token_id.is_some() as u64;
                if !text.is_empty() || token_id.is_some() {
                    out.push_back(plain.render(idx, text));
                }
                return;
            }
        }
        let (text, ids, lps, finish, stop) = match ev {
            Event::Delta {
                token_id,
                text,
                logprob,
                ..
            } => (
                text,
                token_id.into_iter().collect::<Vec<_>>(),
                logprob.into_iter().collect::<Vec<_>>(),
                Value::Null,
                Value::Null,
            ),
            Event::Finished(f) => {
                let reason = json!(f.reason.as_str());
                let stop = stop_reason(&f);
                (f.text, f.token_ids, f.logprobs, reason, stop)
            }
        };
        self.generated += ids.len() as u64;
        if text.is_empty() && ids.is_empty() && finish.is_null() {
            return;
        }
        let logprobs = if ids.is_empty() {
            Value::Null
        } else {
            self.ctx.logprobs(&ids, &lps)
        };
        let mut finish = finish;
        let delta = if self.ctx.tools.active() {
            // Calls stream as they are generated: a call's first delta names it, later ones carry
            // fragments of its arguments; other text is content.
            let tools = &self.ctx.tools;
            let ts = self.calls[idx].get_or_insert_with(|| ToolCallStream::new(tools));
            let (mut content, mut tcs) = ts.feed(&text);
            if let Some(reason) = finish.as_str() {
                let (more, tail) = ts.end();
                content.push_str(&more);
                tcs.extend(tail);
                tcs = merge_deltas(tcs);
                finish = json!(tool_finish(reason, tools, ts.called()));
            }
            let mut d = serde_json::Map::new();
            if !content.is_empty() {
                d.insert("content".into(), json!(content));
            }
            if !tcs.is_empty() {
                let list: Vec<Value> = tcs.iter().map(|t| t.to_json()).collect();
                d.insert("tool_calls".into(), Value::Array(list));
            }
            if d.is_empty() && finish.is_null() && logprobs.is_null() {
                return;
            }
            Value::Object(d)
        } else if !text.is_empty() || finish.is_null() {
            json!({"content": text})
        } else {
            json!({})
        };
        let choice = json!([{"index": idx, "delta": delta, "logprobs": logprobs,
                             "finish_reason": finish, "stop_reason": stop}]);
        let u = self.running_usage();
        out.push_back(self.ctx.chunk(choice, u));
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        if self.include_usage {
            let u = usage(self.ctx.prompt_len, self.generated, self.cached);
            out.push_back(self.ctx.chunk(json!([]), Some(u)));
        }
        out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

/// The SSE answer over the choices' channels (dropping it drops them: the requests abort).
pub(crate) fn chat_stream(
    ctx: ChatCtx,
    subs: Subs,
    include_usage: bool,
    continuous: bool,
) -> Response {
    let total = subs.len();
    let plain = DeltaChunk::chat(|choices| ctx.chunk(choices, None));
    let st = ChatStream {
        ctx,
        plain,
        started: vec![false; total],
        calls: (0..total).map(|_| None).collect(),
        generated: 0,
        cached: 0,
        include_usage,
        continuous: include_usage && continuous,
    };
    sse_response(st, subs)
}

/// The `chat.completion` body once every choice finished.
pub(crate) async fn chat_final(ctx: ChatCtx, subs: Subs) -> Result<Response, ApiError> {
    let fins = await_finished(subs).await?;
    let mut ctx = ctx;
    let mut completion = 0u64;
    let mut cached = 0u64;
    let mut choices = Vec::with_capacity(fins.len());
    for (idx, f) in &fins {
        completion += f.completion_tokens as u64;
        cached = cached.max(f.cached_tokens as u64);
        let logprobs = ctx.logprobs(&f.token_ids, &f.logprobs);
        let mut reason = f.reason.as_str();
        let message = if ctx.tools.active() {
            let (content, calls) = parse_reply(&f.text, &ctx.tools);
            reason = tool_finish(reason, &ctx.tools, !calls.is_empty());
            let calls: Vec<Value> = calls.iter().map(|c| c.to_json()).collect();
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        } else {
            json!({"role": "assistant", "content": f.text})
        };
        choices.push(
            json!({"index": idx, "message": message, "logprobs": logprobs,
                            "finish_reason": reason, "stop_reason": stop_reason(f)}),
        );
    }
    let mut body = json!({"id": ctx.id, "object": "chat.completion", "created": ctx.created,
                          "model": ctx.model, "choices": choices,
                          "usage": usage(ctx.prompt_len, completion, cached)});
    if ctx.prompt_logprobs {
        // One prompt for every choice: the first that carries them.
        let plp = fins.iter().find_map(|(_, f)| f.prompt_logprobs.as_ref());
        body["prompt_logprobs"] = prompt_logprobs_json(&mut ctx.text, plp);
    }
    Ok(axum::Json(body).into_response())
}
