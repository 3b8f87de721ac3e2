//! Chat completions with the sampling features of the completions endpoint, over a real port
//! against the mock executor: chat-form logprobs (`logprobs` + `top_logprobs`) streamed and not,
//! the body's `prompt_logprobs`, penalties accepted, structured outputs constraining the message,
//! and the 400s naming `top_logprobs`.
//!
//! The mock's logprobs are pure functions of the token (`MockModel::sample_logprob`), so a value
//! routed to another token or choice shows.

use crate::common;

use std::collections::BTreeSet;

use common::{sse_events, tokenizer, Opts, TestServer};
use serde_json::{json, Value};
use yoco_server::MockModel;

fn body(extra: Value) -> String {
    let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                       "ignore_eos": true, "return_tokens_as_token_ids": true});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

fn id_of(tok: &Value) -> u32 {
    tok.as_str()
        .and_then(|t| t.strip_prefix("token_id:"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not a token_id:N token: {tok}"))
}

/// Every `content` entry carries the mock's logprob of its token and at most `top_n` alternatives,
/// each one of the mock's (token, logprob) pairs for that position; returns the token ids.
fn check_content(lp: &Value, top_n: usize) -> Vec<u32> {
    let vocab = tokenizer().get_vocab_size(true) as u32;
    let content = lp["content"].as_array().unwrap_or_else(|| panic!("{lp}"));
    let mut ids = Vec::new();
    for e in content {
        let id = id_of(&e["token"]);
        let (want, _, top) = MockModel::sample_logprob(vocab, id, top_n);
        assert_eq!(e["logprob"].as_f64().unwrap(), want as f64, "{e}");
        assert_eq!(e["bytes"], json!(e["token"].as_str().unwrap().as_bytes()));
        let allowed: BTreeSet<(u32, String)> = top
            .iter()
            .map(|&(t, l)| (t as u32, format!("{l}")))
            .chain([(id, format!("{want}"))])
            .collect();
        let alts = e["top_logprobs"].as_array().unwrap();
        assert_eq!(alts.len(), top_n.min(allowed.len()), "{e}");
        for a in alts {
            let pair = (
                id_of(&a["token"]),
                format!("{}", a["logprob"].as_f64().unwrap() as f32),
            );
            assert!(allowed.contains(&pair), "{a} not among {allowed:?}");
        }
        ids.push(id);
    }
    ids
}

#[test]
fn chat_logprobs_are_each_tokens_own_in_the_chat_form_streamed_and_not() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/v1/chat/completions",
        &body(json!({"logprobs": true, "top_logprobs": 3, "n": 2})),
    );
    assert_eq!(st, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        let ids = check_content(&c["logprobs"], 3);
        assert_eq!(ids.len(), 8);
        // The entries are the message's tokens.
        assert_eq!(
            c["message"]["content"],
            json!(tokenizer().decode(&ids, true).unwrap())
        );
    }
    // Streamed: each chunk with a token carries that token's entry; together they are the text's.
    let (st, sse) = s.post(
        "/v1/chat/completions",
        &body(json!({"logprobs": true, "top_logprobs": 2, "stream": true})),
    );
    assert_eq!(st, 200, "{sse}");
    let mut ids = Vec::new();
    let mut text = String::new();
    for e in sse_events(&sse).iter().filter(|e| e.as_str() != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        let ch = &c["choices"][0];
        text.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        if !ch["logprobs"].is_null() {
            ids.extend(check_content(&ch["logprobs"], 2));
        }
    }
    assert_eq!(ids.len(), 8);
    assert_eq!(text, tokenizer().decode(&ids, true).unwrap());
    // Not asked: null, as the Python server answers.
    let (_, v) = s.json("/v1/chat/completions", &body(json!({})));
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    assert!(v.get("prompt_logprobs").is_none());
}

#[test]
fn chat_prompt_logprobs_cover_the_rendered_prompt_once_per_body() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/v1/chat/completions",
        &body(json!({"prompt_logprobs": 1, "n": 2})),
    );
    assert_eq!(st, 200, "{v}");
    let plp = v["prompt_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        plp.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert!(plp[0].is_null());
    assert!(plp[1..]
        .iter()
        .all(|p| p.as_object().is_some_and(|o| !o.is_empty())));
}

#[test]
fn a_guided_choice_constrains_the_chat_message_and_penalties_are_accepted() {
    let s = TestServer::start(Opts::default());
    let choices = ["yes", "no", "maybe"];
    for stream in [false, true] {
        let b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16,
                       "structured_outputs": {"choice": choices}, "stream": stream,
                       "presence_penalty": 0.5, "frequency_penalty": 0.25,
                       "repetition_penalty": 1.1});
        let (st, out) = s.post("/v1/chat/completions", &b.to_string());
        assert_eq!(st, 200, "{out}");
        let text = if stream {
            sse_events(&out)
                .iter()
                .filter(|e| e.as_str() != "[DONE]")
                .map(|e| {
                    let c: Value = serde_json::from_str(e).unwrap();
                    c["choices"][0]["delta"]["content"]
                        .as_str()
                        .unwrap_or("")
                        .to_string()
                })
                .collect::<String>()
        } else {
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert!(choices.contains(&text.as_str()), "{text:?}");
    }
}

#[test]
fn bad_chat_sampling_fields_are_400s_naming_them() {
    let s = TestServer::start(Opts::default());
    let cases = [
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"logprobs": true, "top_logprobs": -1}),
            "top_logprobs",
        ),
        (json!({"prompt_logprobs": 21}), "prompt_logprobs"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"guided_regex": "("}), "guided_regex"),
        (
            json!({"guided_choice": ["a"], "guided_regex": "a"}),
            "guided_choice",
        ),
        // Tools are served now (tests/tools_http.rs): a malformed one is the 400.
        (
            json!({"tools": [{"type": "function", "function": {"description": "no name"}}]}),
            "tools",
        ),
    ];
    for (extra, param) in cases {
        s.assert_400("/v1/chat/completions", &body(extra.clone()), param, "");
    }
}
