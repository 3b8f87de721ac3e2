//! `/v1/completions` over a real port: the protocol, the texts and the errors.

use crate::common;

use common::{sse_events, Opts, TestServer};
use serde_json::{json, Value};

use common::{encode, reference_tokens};

fn decode(ids: &[u32]) -> String {
    common::tokenizer().decode(ids, true).unwrap()
}

#[test]
fn completion_text_is_the_mock_models_output_decoded() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/v1/completions",
        r#"{"prompt": "The sea was calm", "max_tokens": 12, "temperature": 0}"#,
    );
    assert_eq!(st, 200, "{v}");
    let want = decode(&reference_tokens(&encode("The sea was calm"), 12));
    assert_eq!(v["choices"][0]["text"], json!(want));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "mock");
    let p = encode("The sea was calm").len() as u64;
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": p, "completion_tokens": 12, "total_tokens": p + 12,
                                  "prompt_tokens_details": {"cached_tokens": 0}})
    );
}

#[test]
fn token_id_prompts_are_served_as_given() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/v1/completions",
        r#"{"prompt": [2, 300, 301, 302], "max_tokens": 5}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["choices"][0]["text"],
        json!(decode(&reference_tokens(&[2, 300, 301, 302], 5)))
    );
    assert_eq!(v["usage"]["prompt_tokens"], 4);
}

#[test]
fn streamed_deltas_concatenate_to_the_non_streamed_text() {
    let s = TestServer::start(Opts::default());
    let body = json!({"prompt": "Once upon a time", "max_tokens": 20, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (st, text) = s.post("/v1/completions", &body.to_string());
    assert_eq!(st, 200, "{text}");
    let ev = sse_events(&text);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    let deltas = &chunks[..chunks.len() - 1];
    assert_eq!(deltas.len(), 20, "one chunk per token");
    let joined: String = deltas
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined,
        decode(&reference_tokens(&encode("Once upon a time"), 20))
    );
    assert!(deltas[..19]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert_eq!(deltas[19]["choices"][0]["finish_reason"], "length");
    let (_, full) = s.json(
        "/v1/completions",
        r#"{"prompt": "Once upon a time", "max_tokens": 20}"#,
    );
    assert_eq!(full["choices"][0]["text"], json!(joined));
}

#[test]
fn stop_string_ends_the_request_before_the_match() {
    let s = TestServer::start(Opts::default());
    let full = decode(&reference_tokens(&encode("Tell me"), 40));
    // A stop string from the middle of the output: the text ends just before its first occurrence.
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let at = full.find(&stop).unwrap();
    for stream in [false, true] {
        let body = json!({"prompt": "Tell me", "max_tokens": 40, "stop": [stop], "stream": stream});
        let (st, text) = s.post("/v1/completions", &body.to_string());
        assert_eq!(st, 200, "{text}");
        let (out, last) = if stream {
            let ev = sse_events(&text);
            let chunks: Vec<Value> = ev[..ev.len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            let joined: String = chunks
                .iter()
                .map(|c| c["choices"][0]["text"].as_str().unwrap())
                .collect();
            (joined, chunks.last().unwrap()["choices"][0].clone())
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0].clone(),
            )
        };
        assert_eq!(out, full[..at], "stream={stream}");
        assert_eq!(last["finish_reason"], "stop");
        assert_eq!(last["stop_reason"], json!(stop));
    }
}

#[test]
fn several_prompts_and_n_give_indexed_choices_and_summed_usage() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/v1/completions",
        r#"{"prompt": ["a b c", "d e"], "n": 2, "max_tokens": 3}"#,
    );
    assert_eq!(st, 200, "{v}");
    let idx: Vec<u64> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, vec![0, 1, 2, 3]);
    let p = (encode("a b c").len() + encode("d e").len()) as u64;
    assert_eq!(v["usage"]["prompt_tokens"], p);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(
        v["choices"][2]["text"],
        json!(decode(&reference_tokens(&encode("d e"), 3)))
    );
}

#[test]
fn repeated_prompt_reports_its_prefix_cache_hit() {
    let s = TestServer::start(Opts::default());
    let prompt: Vec<u32> = (0..100).map(|i| 300 + i).collect();
    let body = json!({"prompt": prompt, "max_tokens": 2}).to_string();
    let (_, a) = s.json("/v1/completions", &body);
    let (_, b) = s.json("/v1/completions", &body);
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Whole 16-token blocks of the 100-token prompt, the last token always recomputed.
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

#[test]
fn truncate_prompt_tokens_keeps_the_last_tokens_and_integral_floats_are_integers() {
    let s = TestServer::start(Opts::default());
    let ids = encode("Hello there, my old friend");
    assert!(ids.len() > 3);
    let tail = &ids[ids.len() - 3..];
    let body = json!({"prompt": ids, "truncate_prompt_tokens": 3, "max_tokens": 4.0});
    let (st, v) = s.json("/v1/completions", &body.to_string());
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], json!(3));
    assert_eq!(
        v["choices"][0]["text"],
        json!(decode(&reference_tokens(tail, 4)))
    );
}

#[test]
fn echo_prepends_the_prompt_text() {
    let s = TestServer::start(Opts::default());
    let (_, v) = s.json(
        "/v1/completions",
        r#"{"prompt": "Hello there", "max_tokens": 3, "echo": true}"#,
    );
    let want = format!(
        "Hello there{}",
        decode(&reference_tokens(&encode("Hello there"), 3))
    );
    assert_eq!(v["choices"][0]["text"], json!(want));
}

#[test]
fn bad_fields_are_400s_naming_the_field() {
    let s = TestServer::start(Opts::default());
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 0}"#,
        "max_tokens",
        ">= 1",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 100000}"#,
        "max_tokens",
        "maximum context length is 512",
    );
    s.assert_400("/v1/completions", r#"{"prompt": "x", "n": 0}"#, "n", ">= 1");
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "n": 100000}"#,
        "n",
        "--max-n",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"max_tokens": 1}"#,
        "prompt",
        "missing required field 'prompt'",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "seed": 18446744073709551616}"#,
        "seed",
        "64-bit range",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": [1, 18446744073709551616]}"#,
        "prompt",
        "holds token id 18446744073709551616, outside the vocabulary",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "temperature": NaN}"#,
        "temperature",
        "must be a finite number, got nan",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x\ud800"}"#,
        "prompt",
        "lone UTF-16 surrogate",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "allowed_token_ids": [1]}"#,
        "allowed_token_ids",
        "not supported",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "best_of": 2}"#,
        "best_of",
        "must equal n=1",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "truncate_prompt_tokens": 0}"#,
        "truncate_prompt_tokens",
        ">= 1",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "temperature": -1}"#,
        "temperature",
        "got -1",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "top_p": 0}"#,
        "top_p",
        "top_p",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "top_k": -5}"#,
        "top_k",
        "got -5",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": [1, 99999999]}"#,
        "prompt",
        "outside the vocabulary",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": [-1]}"#,
        "prompt",
        "outside the vocabulary",
    );
    s.assert_400("/v1/completions", r#"{"prompt": ""}"#, "prompt", "empty");
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": [[]]}"#,
        "prompt",
        "empty list of token ids",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "stop_token_ids": [5000000]}"#,
        "stop_token_ids",
        "outside the vocabulary",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "min_tokens": 600, "max_tokens": 4}"#,
        "min_tokens",
        "min_tokens",
    );
    // Served since logprobs and penalties moved to the Rust front end; still refused by name:
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "logit_bias": {"5": 1}}"#,
        "logit_bias",
        "not supported",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "logprobs": 21}"#,
        "logprobs",
        "max_logprobs (20",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "logprobs": -1}"#,
        "logprobs",
        ">= 0",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "prompt_logprobs": 99}"#,
        "prompt_logprobs",
        "max_logprobs",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "presence_penalty": 2.5}"#,
        "presence_penalty",
        "[-2, 2]",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "frequency_penalty": -3}"#,
        "frequency_penalty",
        "[-2, 2]",
    );
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "repetition_penalty": 0}"#,
        "repetition_penalty",
        "> 0",
    );
    let long: Vec<u32> = vec![300; 600];
    s.assert_400(
        "/v1/completions",
        &json!({"prompt": long}).to_string(),
        "prompt",
        "maximum context length is 512",
    );
    // Malformed bodies.
    let (st, v) = s.json("/v1/completions", r#"{"prompt": "x", "#);
    assert_eq!(st, 400, "{v}");
    let (st, v) = s.json("/v1/completions", r#"{"prompt": {"a": 1}}"#);
    assert_eq!(st, 400, "{v}");
    s.assert_400(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": "many"}"#,
        "max_tokens",
        "max_tokens must be an integer, got 'many'",
    );
    // Nothing was admitted: the engine holds no request and no block.
    assert_eq!(s.metric("yoco:num_requests_running"), 0.0);
    assert_eq!(s.metric("yoco:prompt_tokens_total"), 0.0);
}

#[test]
fn unknown_model_and_route_are_404s_in_the_envelope() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json("/v1/completions", r#"{"model": "gpt-9", "prompt": "x"}"#);
    assert_eq!((st, v["error"]["param"].clone()), (404, json!("model")));
    let (st, b) = s.get("/v1/nothing");
    assert_eq!(st, 404);
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["error"]["type"], "NotFoundError");
    // Transcriptions are served (media_http.rs): a JSON body is the Python server's 415.
    let (st, v) = s.json("/v1/audio/transcriptions", r#"{}"#);
    assert_eq!(st, 415, "{v}");
    assert_eq!(v["error"]["type"], "UnsupportedMediaTypeError");
    let (st, b) = s.get("/v1/models");
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["data"][0]["id"], "mock");
    assert_eq!(v["data"][0]["max_model_len"], 512);
}

#[test]
fn oversized_body_is_413_and_missing_key_is_401() {
    let s = TestServer::start(Opts {
        api_keys: vec!["k1".into()],
        max_body: 1000,
        ..Default::default()
    });
    let (st, v) = s.post_with(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 1}"#,
        &[],
    );
    assert_eq!(st, 401, "{v}");
    let (st, _) = s.post_with(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 1}"#,
        &[("authorization", "Bearer wrong")],
    );
    assert_eq!(st, 401);
    let (st, v) = s.post_with(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 1}"#,
        &[("authorization", "Bearer k1")],
    );
    assert_eq!(st, 200, "{v}");
    let big = json!({"prompt": "y".repeat(5000)}).to_string();
    let (st, v) = s.post_with("/v1/completions", &big, &[("authorization", "Bearer k1")]);
    assert_eq!(st, 413, "{v}");
    // Health and metrics stay open without a key (probes and scrapers).
    assert_eq!(s.get("/health").0, 200);
    assert_eq!(s.get("/metrics").0, 200);
}

#[test]
fn bodies_that_are_not_json_are_refused_with_415() {
    let s = TestServer::start(Opts::default());
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let (st, b) = s.post_with(
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 1}"#,
            &[("content-type", ct)],
        );
        assert_eq!(st, 415, "{ct}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["type"], "UnsupportedMediaTypeError");
    }
    let (st, _) = s.post_with(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 1}"#,
        &[("content-type", "application/json; charset=utf-8")],
    );
    assert_eq!(st, 200);
    assert_eq!(
        s.metric("yoco:prompt_tokens_total"),
        encode("x").len() as f64,
        "only the JSON request ran"
    );
}

#[test]
fn generation_config_max_new_tokens_caps_every_request_s_max_tokens() {
    let s = TestServer::start(Opts {
        cfg: Some(|c| c.sampling_defaults.max_tokens = Some(5)),
        ..Opts::default()
    });
    // Unset: the cap, not the context room. Larger: capped (vLLM takes the least). Smaller: kept.
    for (body, want) in [
        (r#"{"prompt": [2, 300, 301], "temperature": 0}"#, 5),
        (
            r#"{"prompt": [2, 300, 301], "max_tokens": 40, "temperature": 0}"#,
            5,
        ),
        (
            r#"{"prompt": [2, 300, 301], "max_tokens": 3, "temperature": 0}"#,
            3,
        ),
    ] {
        let (st, v) = s.json("/v1/completions", body);
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], want, "{body}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{body}");
    }
}
