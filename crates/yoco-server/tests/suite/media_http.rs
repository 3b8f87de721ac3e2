//! Images, audio and `/v1/audio/transcriptions` on the Rust front end, over a real port against the
//! mock executor and a mock media seam: the content part shapes and the template input they make,
//! the refs reaching the seam in order, refusals by name, `--limit-mm-per-prompt`, the seam's 400s,
//! placeholders keying the prefix cache, items freed after the request, and the multipart route.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use yoco_server::media::{
    MediaConfig, MediaError, MediaInputs, MediaItems, MediaRef, MediaSeam, MediaSource,
    MmPlaceholder, Modality, Prepared, TranscriptionAudio,
};

use crate::common::{self, sse_events, Opts, TestServer};

/// A template that renders media parts as Gemma 3n's does: one placeholder token each.
const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n\
{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}\
{% if p['type'] == 'image' %}<image_soft_token>{% elif p['type'] == 'audio' %}<audio_soft_token>\
{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}\
<start_of_turn>model\n";

/// Placeholder tokens per item in the mock's expansion.
const RUN: u32 = 4;

/// Counts the mock's processed items alive (they must all drop once their request ends).
struct Item(Arc<AtomicUsize>);

impl Drop for Item {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// Records what it is asked; "expands" each ref into a run of `RUN` tokens after the rendered
/// prompt's first id, identified by its source (so the same image hits the prefix cache);
/// a source containing "broken" is a 400 naming the part.
#[derive(Default)]
struct MockSeam {
    calls: Mutex<Vec<(String, Vec<MediaRef>)>>,
    transcriptions: Mutex<Vec<TranscriptionAudio>>,
    live: Arc<AtomicUsize>,
}

fn source_id(r: &MediaRef) -> String {
    match &r.source {
        MediaSource::Url(u) => format!("url:{u}"),
        MediaSource::Inline { data, format } => format!("inline:{data}:{format:?}"),
    }
}

impl MockSeam {
    fn expand(&self, text: Vec<u32>, ids_of: Vec<String>) -> Prepared {
        let mut placeholders = Vec::new();
        let mut ids = text[..1].to_vec();
        for identifier in ids_of {
            placeholders.push(MmPlaceholder {
                offset: ids.len() as u32,
                length: RUN,
                identifier,
            });
            ids.extend(std::iter::repeat_n(300, RUN as usize));
        }
        ids.extend_from_slice(&text[1..]);
        ids.push(108); // a text token after the rest
        self.live.fetch_add(1, SeqCst);
        Prepared {
            token_ids: ids,
            media: MediaInputs {
                placeholders,
                items: MediaItems(Arc::new(Item(self.live.clone()))),
            },
        }
    }
}

impl MediaSeam for MockSeam {
    fn prepare(&self, rendered: &str, _: bool, refs: &[MediaRef]) -> Result<Prepared, MediaError> {
        self.calls
            .lock()
            .unwrap()
            .push((rendered.to_string(), refs.to_vec()));
        if let Some(r) = refs.iter().find(|r| source_id(r).contains("broken")) {
            return Err(MediaError::Bad(format!(
                "{}: image data is not a decodable image",
                r.location
            )));
        }
        let ids = common::tokenizer()
            .encode(rendered, false)
            .unwrap()
            .get_ids()
            .to_vec();
        Ok(self.expand(ids, refs.iter().map(source_id).collect()))
    }

    fn transcription(&self, a: &TranscriptionAudio) -> Result<Prepared, MediaError> {
        self.transcriptions.lock().unwrap().push(a.clone());
        if a.data.starts_with(b"noise") {
            return Err(MediaError::Bad("file: audio data cannot be decoded".into()));
        }
        let ids = common::encode("Transcribe this audio: ");
        Ok(self.expand(ids, vec![format!("clip:{}", a.data.len())]))
    }
}

fn server(limits: Vec<(Modality, u32)>) -> (TestServer, Arc<MockSeam>) {
    let seam = Arc::new(MockSeam::default());
    let s = TestServer::start(Opts {
        chat_template: Some(TEMPLATE.into()),
        media: Some(MediaConfig {
            seam: Some(seam.clone()),
            limits,
            max_bytes: 1 << 20,
        }),
        ..Opts::default()
    });
    (s, seam)
}

fn chat(content: Value) -> String {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 3, "temperature": 0})
        .to_string()
}

fn img(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

#[test]
fn media_parts_render_as_placeholders_and_reach_the_seam_in_order() {
    let (s, seam) = server(Vec::new());
    let content = json!([img("data:image/png;base64,AAA"), {"type": "text", "text": "and"},
                         {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
                         {"type": "audio_url", "audio_url": "file:///m/a.wav"},
                         {"type": "image_url", "image_url": "http://h/b.png"}]);
    let (st, v) = s.json("/v1/chat/completions", &chat(content));
    assert_eq!(st, 200, "{v}");
    let calls = seam.calls.lock().unwrap();
    let (rendered, refs) = &calls[0];
    assert_eq!(
        rendered,
        "<bos><start_of_turn>user\n<image_soft_token>and<audio_soft_token><audio_soft_token>\
         <image_soft_token><end_of_turn>\n<start_of_turn>model"
    );
    let got: Vec<(Modality, &str, String)> = refs
        .iter()
        .map(|r| (r.modality, r.location.as_str(), source_id(r)))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Modality::Image,
                "messages[0].content[0]",
                "url:data:image/png;base64,AAA".into()
            ),
            (
                Modality::Audio,
                "messages[0].content[2]",
                "inline:UklG:Some(\"wav\")".into()
            ),
            (
                Modality::Audio,
                "messages[0].content[3]",
                "url:file:///m/a.wav".into()
            ),
            (
                Modality::Image,
                "messages[0].content[4]",
                "url:http://h/b.png".into()
            ),
        ]
    );
    // The prompt is the seam's ids: the rendered text's plus four runs and a token.
    let text_ids = common::tokenizer()
        .encode(rendered.as_str(), false)
        .unwrap()
        .len() as u64;
    assert_eq!(
        v["usage"]["prompt_tokens"],
        json!(text_ids + 4 * RUN as u64 + 1)
    );
}

#[test]
fn a_text_only_conversation_on_a_media_server_renders_as_on_a_text_server() {
    let (s, seam) = server(Vec::new());
    let (st, v) = s.json(
        "/v1/chat/completions/render",
        &chat(json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])),
    );
    assert_eq!(st, 200, "{v}");
    assert!(
        seam.calls.lock().unwrap().is_empty(),
        "no media: no seam call"
    );
    let want = common::tokenizer()
        .encode(
            "<bos><start_of_turn>user\nab<end_of_turn>\n<start_of_turn>model",
            false,
        )
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(v["token_ids"], json!(want));
}

#[test]
fn bad_parts_are_400s_naming_the_part_before_the_seam_runs() {
    let (s, seam) = server(vec![(Modality::Image, 2), (Modality::Audio, 1)]);
    let cases = [
        (json!([img("x"), {"type": "video_url", "video_url": {"url": "x"}}]),
         "messages[0].content[1]: unsupported content part 'video_url'; use text, image_url, input_audio or audio_url"),
        (json!([{"type": "image_url", "image_url": {}}]),
         "messages[0].content[0]: image_url needs a url"),
        (json!([{"type": "input_audio", "input_audio": {"format": "wav"}}]),
         "messages[0].content[0]: input_audio needs {'data': <base64>"),
        (json!([img("a"), img("b"), img("c")]),
         "the request has 3 image item(s); at most 2 per prompt are allowed (--limit-mm-per-prompt)"),
        (json!([{"type": "audio_url", "audio_url": "a"}, {"type": "audio_url", "audio_url": "b"}]),
         "the request has 2 audio item(s); at most 1 per prompt"),
    ];
    for (content, want) in cases {
        let (st, v) = s.json("/v1/chat/completions", &chat(content.clone()));
        assert_eq!(st, 400, "{content}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.starts_with(want), "{content}: {msg}");
        assert_eq!(v["error"]["param"], "messages");
    }
    let body =
        json!({"messages": [{"role": "user", "content": [img("a")]}], "truncate_prompt_tokens": 8});
    let (st, v) = s.json("/v1/chat/completions", &body.to_string());
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("truncate_prompt_tokens")),
        "{v}"
    );
    assert!(
        seam.calls.lock().unwrap().is_empty(),
        "refused before any fetching"
    );
    // The seam's own refusal is the client's 400, in its words.
    let (st, v) = s.json(
        "/v1/chat/completions",
        &chat(json!([img("a"), img("broken")])),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(
        v["error"]["message"],
        "messages[0].content[1]: image data is not a decodable image"
    );
}

#[test]
fn a_text_only_server_refuses_media_parts_as_before() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json("/v1/chat/completions", &chat(json!([img("data:,")])));
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("messages[0].content[0]: only text parts"));
    let (st, v) = s.post_with(
        "/v1/audio/transcriptions",
        &multipart(&[("model", None, b"mock"), ("file", Some("a.wav"), b"RIFF")]),
        &[("content-type", CT)],
    );
    assert_eq!(st, 400, "{v}");
    assert!(v.contains("this model takes no audio"), "{v}");
}

#[test]
fn placeholders_key_the_prefix_cache_and_items_drop_when_requests_end() {
    let (s, seam) = server(Vec::new());
    let cached = |url: &str| {
        let (st, v) = s.json("/v1/chat/completions", &chat(json!([img(url)])));
        assert_eq!(st, 200, "{v}");
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
    };
    let first = cached("data:one");
    assert_eq!(first, 0);
    // The run sits in the first block (after `<bos>`): the same image hits that block, another
    // image with the same token ids misses it (its content keys the block).
    let again = cached("data:one");
    let other = cached("data:two");
    assert_eq!((again, other), (16, 0), "same image vs another");
    s.wait_for("items dropped", |_| seam.live.load(SeqCst) == 0);
}

/// A form field: name, file name (a file upload), bytes.
type Field<'a> = (&'a str, Option<&'a str>, &'a [u8]);

const BOUNDARY: &str = "XyZboundary";
const CT: &str = "multipart/form-data; boundary=XyZboundary";

fn multipart(fields: &[(&str, Option<&str>, &[u8])]) -> String {
    let mut b = String::new();
    for (name, file, data) in fields {
        b.push_str(&format!("--{BOUNDARY}\r\n"));
        match file {
            Some(f) => b.push_str(&format!(
                "Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )),
            None => b.push_str(&format!(
                "Content-Disposition: form-data; name=\"{name}\"\r\n\r\n"
            )),
        }
        b.push_str(std::str::from_utf8(data).unwrap());
        b.push_str("\r\n");
    }
    b.push_str(&format!("--{BOUNDARY}--\r\n"));
    b
}

fn transcribe(s: &TestServer, fields: &[(&str, Option<&str>, &[u8])]) -> (u16, String) {
    s.post_with(
        "/v1/audio/transcriptions",
        &multipart(fields),
        &[("content-type", CT)],
    )
}

#[test]
fn transcriptions_answer_json_text_and_a_stream_of_the_same_text() {
    let (s, seam) = server(Vec::new());
    let base: [(&str, Option<&str>, &[u8]); 4] = [
        ("model", None, b"mock"),
        ("file", Some("clip.WAV"), b"RIFFclip"),
        ("language", None, b"de"),
        ("max_completion_tokens", None, b"5"),
    ];
    let (st, body) = transcribe(&s, &base);
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let text = v["text"].as_str().unwrap().to_string();
    assert_eq!(v["usage"]["output_tokens"], 5);
    assert_eq!(v["usage"]["type"], "tokens");
    let a = seam.transcriptions.lock().unwrap()[0].clone();
    assert_eq!(
        (
            a.data.as_slice(),
            a.format.as_deref(),
            a.language.as_deref()
        ),
        (&b"RIFFclip"[..], Some("wav"), Some("de"))
    );
    let mut as_text = base.to_vec();
    as_text.push(("response_format", None, b"text"));
    assert_eq!(transcribe(&s, &as_text), (200, text.clone()));
    let mut streamed = base.to_vec();
    streamed.push(("stream", None, b"true"));
    streamed.push(("stream_include_usage", None, b"1"));
    let (st, body) = transcribe(&s, &streamed);
    assert_eq!(st, 200, "{body}");
    let ev = sse_events(&body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks.iter().all(|c| c["object"] == "transcription.chunk"));
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| c["delta"]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 5);
    s.wait_for("items dropped", |_| seam.live.load(SeqCst) == 0);
}

#[test]
fn bad_transcription_requests_are_4xx_naming_the_field() {
    let (s, _) = server(Vec::new());
    let file: (&str, Option<&str>, &[u8]) = ("file", Some("a.wav"), b"RIFF");
    let cases: Vec<(Vec<Field>, &str, &str)> = vec![
        (
            vec![("other", Some("x"), b"1")],
            "other",
            "unsupported field(s) ['other']",
        ),
        (
            vec![("model", None, b"mock")],
            "file",
            "the 'file' field with the audio is missing",
        ),
        (
            vec![("file", Some("a.aiff"), b"RIFF")],
            "file",
            "audio format 'aiff' is not supported",
        ),
        (
            vec![file, ("language", None, b"xx")],
            "language",
            "language 'xx' is not supported",
        ),
        (
            vec![file, ("response_format", None, b"srt")],
            "response_format",
            "response_format 'srt'",
        ),
        (
            vec![file, ("stream", None, b"maybe")],
            "stream",
            "stream must be true or false",
        ),
        (
            vec![file, ("temperature", None, b"3")],
            "temperature",
            "temperature must be in [0.0, 2.0]",
        ),
        (
            vec![file, ("max_completion_tokens", None, b"0")],
            "max_completion_tokens",
            "max_completion_tokens must be in [1, ",
        ),
        (
            vec![("file", Some("a.wav"), b"noise")],
            "file",
            "file: audio data cannot be decoded",
        ),
    ];
    for (fields, param, want) in cases {
        let (st, body) = transcribe(&s, &fields);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(st, 400, "{want}: {body}");
        assert_eq!(v["error"]["param"], param, "{body}");
        assert!(
            v["error"]["message"].as_str().unwrap().starts_with(want),
            "{body}"
        );
    }
    let (st, body) = s.post("/v1/audio/transcriptions", r#"{"model": "mock"}"#);
    assert_eq!(st, 415, "{body}");
}
