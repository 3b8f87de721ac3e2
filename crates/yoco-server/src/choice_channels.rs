//! A request's choice channels (one per choice: `n` per prompt), turned into its HTTP answer: merged
//! into one SSE body, or awaited for one JSON body.
//!
//! Every answer that streams (completions, chat) has the same body: its events in arrival order,
//! each turned into zero or more `data: ...` chunks by the answer's own [`SseAnswer`], then its
//! closing chunks once every channel has finished. Dropping the body drops the receivers, which is
//! how a disconnect aborts the requests (the step loop reaps closed channels).

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::openai::ApiError;
use crate::output::{Event, Finished, RequestError};

/// The channels of a request's choices, by choice index.
pub(crate) type Subs = Vec<(usize, UnboundedReceiver<Event>)>;

/// One `data: {json}` SSE event.
pub(crate) fn sse_event(v: &Value) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut out, v).expect("JSON of plain values");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// One streamed chunk of `object` (`text_completion`, `chat.completion.chunk`,
/// `transcription.chunk`): the three streams differ only in that name.
pub(crate) fn chunk(
    object: &str,
    id: &str,
    model: &str,
    created: u64,
    choices: Value,
    usage: Option<Value>,
) -> Bytes {
    let mut v = json!({"id": id, "object": object, "created": created, "model": model,
                       "choices": choices});
    if let Some(u) = usage {
        v["usage"] = u;
    }
    sse_event(&v)
}

/// The error event of a request that failed after the 200 was sent (the envelope, as a chunk).
pub(crate) fn error_event(e: &RequestError) -> Bytes {
    sse_event(&e.api_error().body())
}

/// What a streamed answer makes of its events.
pub(crate) trait SseAnswer: Send + 'static {
    /// The chunks of choice `idx`'s event `ev`, appended to `out` (possibly none).
    fn on_event(&mut self, idx: usize, ev: Event, out: &mut VecDeque<Bytes>);

    /// The closing chunks once every choice has finished (usage, then `data: [DONE]`).
    fn finish(&mut self, out: &mut VecDeque<Bytes>);
}

fn receiver_stream(idx: usize, rx: UnboundedReceiver<Event>) -> BoxStream<'static, (usize, Event)> {
    stream::unfold(rx, move |mut rx| async move {
        rx.recv().await.map(|e| ((idx, e), rx))
    })
    .boxed()
}

struct SseBody<A> {
    answer: A,
    merged: SelectAll<BoxStream<'static, (usize, Event)>>,
    pending: VecDeque<Bytes>,
    done: bool,
}

/// The `text/event-stream` answer of `subs`, chunked by `answer`.
pub(crate) fn sse_response<A: SseAnswer>(answer: A, subs: Subs) -> Response {
    let mut merged = SelectAll::new();
    for (idx, rx) in subs {
        merged.push(receiver_stream(idx, rx));
    }
    let st = SseBody {
        answer,
        merged,
        pending: VecDeque::new(),
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
                Some((idx, ev)) => st.answer.on_event(idx, ev, &mut st.pending),
                None => {
                    st.answer.finish(&mut st.pending);
                    st.done = true;
                }
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

/// Every choice's last event, in choice order, once all have finished (their deltas are
/// skipped). A 503 if the engine stopped first; a 500 with the message of a step that failed.
pub(crate) async fn await_finished(subs: Subs) -> Result<Vec<(usize, Finished)>, ApiError> {
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
    if let Some(e) = fins.iter().find_map(|(_, f)| f.error.as_ref()) {
        return Err(e.api_error());
    }
    fins.sort_by_key(|(i, _)| *i);
    Ok(fins)
}
