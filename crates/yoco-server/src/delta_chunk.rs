//! The SSE chunk of a plain streamed text delta, spliced into bytes serialized once per request.
//!
//! Most chunks of a stream carry nothing but a choice index and a piece of text (no logprobs, no
//! finish, no usage, no tool calls): a completion's `choices[0].text`, a chat reply's
//! `choices[0].delta.content`. Building each through `json!` allocates a map per object and copies the
//! request's id and model into every one: at 256 streams that is ~170k value trees a second on
//! the front end's two workers, CPU the burst's new connections wait for. Here the chunk is
//! serialized once through the same `json!` path with a zero index and an empty text, and each
//! delta writes the bytes around those two values with its own index and JSON-escaped text, so
//! the output is byte-identical to the general path (`delta_chunk_equals_the_json_path`).

use std::io::Write;

use axum::body::Bytes;
use serde_json::Value;

/// A chunk template: `bytes` with the index value at `index` and the text value at `text`
/// (`0` and `""` in the template).
pub(crate) struct DeltaChunk {
    bytes: Vec<u8>,
    index: usize,
    text: usize,
}

const INDEX_KEY: &[u8] = b"\"index\":";

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl DeltaChunk {
    /// A completion's plain delta: `render(choices)` is the general path's chunk; the template is
    /// its output for `{"index": 0, "text": "", "logprobs": null, "finish_reason": null,
    /// "stop_reason": null}`.
    pub(crate) fn completion(render: impl Fn(Value) -> Bytes) -> Option<Self> {
        let choice = serde_json::json!({"index": 0, "text": "", "logprobs": null,
                                        "finish_reason": null, "stop_reason": null});
        Self::new(render, choice, b"\"text\":")
    }

    /// A chat reply's plain delta: the template is the chunk of `{"index": 0, "delta":
    /// {"content": ""}, "logprobs": null, "finish_reason": null, "stop_reason": null}`.
    pub(crate) fn chat(render: impl Fn(Value) -> Bytes) -> Option<Self> {
        let choice = serde_json::json!({"index": 0, "delta": {"content": ""}, "logprobs": null,
                                        "finish_reason": null, "stop_reason": null});
        Self::new(render, choice, b"\"content\":")
    }

    /// None if the keys are not found once each (then the caller keeps the general path). A key
    /// cannot occur inside a string value: its quotes would be escaped there.
    fn new(render: impl Fn(Value) -> Bytes, choice: Value, text_key: &[u8]) -> Option<Self> {
        let bytes = render(Value::Array(vec![choice])).to_vec();
        let once = |key: &[u8], value: &[u8]| {
            let at = find(&bytes, key)?;
            let rest = &bytes[at + key.len()..];
            (find(rest, key).is_none() && rest.starts_with(value)).then_some(at + key.len())
        };
        let index = once(INDEX_KEY, b"0")?;
        let text = once(text_key, b"\"\"")?;
        Some(Self { bytes, index, text })
    }

    /// The chunk of choice `idx` carrying `text`.
    pub(crate) fn render(&self, idx: usize, text: &str) -> Bytes {
        let mut out = Vec::with_capacity(self.bytes.len() + text.len() + 24);
        let put_index = |out: &mut Vec<u8>| write!(out, "{idx}").expect("a Vec takes the bytes");
        let put_text =
            |out: &mut Vec<u8>| serde_json::to_writer(&mut *out, text).expect("a str serializes");
        // The template's values are `0` (1 byte) and `""` (2 bytes).
        if self.index < self.text {
            out.extend_from_slice(&self.bytes[..self.index]);
            put_index(&mut out);
            out.extend_from_slice(&self.bytes[self.index + 1..self.text]);
            put_text(&mut out);
            out.extend_from_slice(&self.bytes[self.text + 2..]);
        } else {
            out.extend_from_slice(&self.bytes[..self.text]);
            put_text(&mut out);
            out.extend_from_slice(&self.bytes[self.text + 2..self.index]);
            put_index(&mut out);
            out.extend_from_slice(&self.bytes[self.index + 1..]);
        }
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn general<'a>(object: &'a str, id: &'a str, model: &'a str) -> impl Fn(Value) -> Bytes + 'a {
        move |choices| {
            let v = json!({"id": id, "object": object, "created": 1_700_000_000u64,
                           "model": model, "choices": choices});
            let mut out = b"data: ".to_vec();
            serde_json::to_writer(&mut out, &v).unwrap();
            out.extend_from_slice(b"\n\n");
            Bytes::from(out)
        }
    }

    /// Seeded texts with quotes, backslashes, control characters and non-ASCII; ids and model
    /// names that themselves look like the spliced keys: the splice equals `choice(idx, text)`
    /// through the general path.
    fn equals_the_json_path(
        object: &str,
        template: impl Fn(&dyn Fn(Value) -> Bytes) -> Option<DeltaChunk>,
        choice: impl Fn(usize, &str) -> Value,
    ) {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = [
            'a', ' ', '"', '\\', '\n', '\u{1}', 'é', '語', '🙂', ':', '{', '}',
        ];
        for (id, model) in [
            ("cmpl-1", "yoco-tiny"),
            ("\"index\":0", "\"text\":\"\""),
            ("\"content\":\"\"", "\"delta\":{}"),
            ("", ""),
        ] {
            let render = general(object, id, model);
            let t = template(&render).expect("template");
            for _ in 0..500 {
                let len = (next() % 12) as usize;
                let text: String = (0..len).map(|_| alphabet[(next() % 12) as usize]).collect();
                let idx = (next() % 300) as usize;
                let want = render(Value::Array(vec![choice(idx, &text)]));
                assert_eq!(t.render(idx, &text), want, "idx {idx} text {text:?}");
            }
        }
    }

    #[test]
    fn completion_delta_chunk_equals_the_json_path() {
        equals_the_json_path(
            "text_completion",
            |r| DeltaChunk::completion(r),
            |idx, text| {
                json!({"index": idx, "text": text, "logprobs": null, "finish_reason": null,
                       "stop_reason": null})
            },
        );
    }

    #[test]
    fn chat_delta_chunk_equals_the_json_path() {
        equals_the_json_path(
            "chat.completion.chunk",
            |r| DeltaChunk::chat(r),
            |idx, text| {
                json!({"index": idx, "delta": {"content": text}, "logprobs": null,
                       "finish_reason": null, "stop_reason": null})
            },
        );
    }

    #[test]
    fn a_template_without_the_keys_is_refused() {
        assert!(DeltaChunk::completion(|_| Bytes::from_static(b"data: {}\n\n")).is_none());
        assert!(DeltaChunk::chat(|_| Bytes::from_static(b"data: {}\n\n")).is_none());
    }
}
