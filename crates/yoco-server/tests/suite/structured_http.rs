//! Structured outputs driven by the Rust step loop, black-box over HTTP with the mock model (which
//! picks an allowed token where the mask forbids its own): every spelling of a constraint gives
//! outputs of its grammar, streamed and not, under `n`, batching and preemption; a token the
//! grammar rejects ends the sequence as an abort; bad constraints are 400s naming the field; over
//! the compile budget a 400, too many compiling at once a 503 with `Retry-After: 1`.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::{sse_events, Opts, TestServer};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use yoco_grammar::CompileLimits;
use yoco_server::MockModel;

const SCHEMA: &str = r#"{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
    "b": {"enum": ["x", "y"]}, "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
    "required": ["a", "b", "c"], "additionalProperties": false}"#;

/// Independent check of `SCHEMA`.
fn valid_schema_output(t: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(t) else {
        return false;
    };
    let Some(o) = v.as_object() else { return false };
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys == ["a", "b", "c"]
        && o["a"].as_i64().is_some_and(|a| (0..=9).contains(&a))
        && (o["b"] == json!("x") || o["b"] == json!("y"))
        && o["c"]
            .as_array()
            .is_some_and(|c| c.len() <= 2 && c.iter().all(Value::is_boolean))
}

/// `[a-z]{2,5}-[0-9]{2}`.
fn valid_regex_output(t: &str) -> bool {
    t.split_once('-').is_some_and(|(a, b)| {
        (2..=5).contains(&a.len())
            && a.bytes().all(|c| c.is_ascii_lowercase())
            && b.len() == 2
            && b.bytes().all(|c| c.is_ascii_digit())
    })
}

/// `start: "x" NUM`, `NUM: /[0-9]{1,3}/`.
fn valid_lark_output(t: &str) -> bool {
    t.strip_prefix('x')
        .is_some_and(|d| (1..=3).contains(&d.len()) && d.bytes().all(|c| c.is_ascii_digit()))
}

type Check = fn(&str) -> bool;

fn cases() -> Vec<(Value, Check)> {
    let schema: Value = serde_json::from_str(SCHEMA).unwrap();
    vec![
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}),
            valid_schema_output as Check,
        ),
        (
            json!({"structured_outputs": {"json": schema}}),
            valid_schema_output,
        ),
        (json!({"guided_json": schema}), valid_schema_output),
        (
            json!({"structured_outputs": {"regex": "[a-z]{2,5}-[0-9]{2}"}}),
            valid_regex_output,
        ),
        (
            json!({"guided_regex": "[a-z]{2,5}-[0-9]{2}"}),
            valid_regex_output,
        ),
        (
            json!({"structured_outputs": {"choice": ["north", "south", "east"]}}),
            |t: &str| ["north", "south", "east"].contains(&t),
        ),
        (json!({"guided_choice": ["up", "down"]}), |t: &str| {
            t == "up" || t == "down"
        }),
        (
            json!({"structured_outputs": {"grammar": "start: \"x\" NUM\nNUM: /[0-9]{1,3}/"}}),
            valid_lark_output,
        ),
        (
            json!({"guided_grammar": "start: \"x\" NUM\nNUM: /[0-9]{1,3}/"}),
            valid_lark_output,
        ),
    ]
}

fn with(extra: &Value, base: Value) -> String {
    let mut b = base;
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

#[test]
fn every_constraint_spelling_gives_outputs_of_its_grammar_streamed_and_not() {
    // Compact JSON by default (a random walk through JSON's optional whitespace never ends).
    let s = TestServer::start(Opts {
        compact_json: true,
        ..Default::default()
    });
    for (extra, check) in cases() {
        let body = with(
            &extra,
            json!({"prompt": ["Answer:", "Q: go"], "n": 2, "max_tokens": 64}),
        );
        let (st, v) = s.json("/v1/completions", &body);
        assert_eq!(st, 200, "{extra} -> {v}");
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 4);
        for c in choices {
            assert_eq!(c["finish_reason"], "stop", "{extra}: {c}");
            assert!(
                check(c["text"].as_str().unwrap()),
                "{extra}: {:?}",
                c["text"]
            );
        }
        let streamed = with(
            &extra,
            json!({"prompt": "Answer:", "max_tokens": 64, "stream": true}),
        );
        let (st, sse) = s.post("/v1/completions", &streamed);
        assert_eq!(st, 200, "{sse}");
        let mut text = String::new();
        let mut reason = Value::Null;
        for e in sse_events(&sse).iter().filter(|e| e.as_str() != "[DONE]") {
            let c = &serde_json::from_str::<Value>(e).unwrap()["choices"][0];
            text.push_str(c["text"].as_str().unwrap());
            if !c["finish_reason"].is_null() {
                reason = c["finish_reason"].clone();
            }
        }
        assert_eq!(reason, "stop", "{extra}");
        assert!(check(&text), "{extra}: {text:?}");
        // The same constraint, streamed or not, gives the same text (one matcher per sequence).
        assert_eq!(json!(text), choices[0]["text"], "{extra}");
    }
    // Any JSON object: free keys and strings, so a random walk may run to max_tokens; what it has
    // then is an object's beginning, and what ends is an object.
    for seed in 0..4 {
        let body = json!({"prompt": format!("Object {seed}:"), "max_tokens": 48, "response_format": {"type": "json_object"}});
        let (_, v) = s.json("/v1/completions", &body.to_string());
        let c = &v["choices"][0];
        let t = c["text"].as_str().unwrap();
        assert!(t.starts_with('{'), "{t:?}");
        if c["finish_reason"] == "stop" {
            assert!(
                serde_json::from_str::<Value>(t).is_ok_and(|v| v.is_object()),
                "{t:?}"
            );
        } else {
            assert_eq!(c["finish_reason"], "length");
        }
    }
    // Unconstrained, the mock's text is nothing like these grammars (the masks did the work).
    let (_, v) = s.json(
        "/v1/completions",
        r#"{"prompt": "Answer:", "max_tokens": 16, "ignore_eos": true}"#,
    );
    let t = v["choices"][0]["text"].as_str().unwrap();
    assert!(
        !valid_regex_output(t) && !valid_schema_output(t) && !valid_lark_output(t),
        "{t:?}"
    );
}

#[test]
fn constrained_completions_stay_valid_under_n_batching_and_preemption() {
    // 24 blocks for 8 concurrent requests of n = 2 with 40-token prompts: the pool runs out, some are
    // preempted and resume with their matcher where it was; siblings each advance their own.
    let s = TestServer::start(Opts {
        num_blocks: 24,
        max_num_seqs: 8,
        max_model_len: 256,
        forward: Duration::from_millis(2),
        compact_json: true,
        ..Default::default()
    });
    let bodies: Vec<String> = (0..4)
        .map(|i| {
            let prompt: Vec<u32> = (0..40).map(|t| 500 + 13 * i + t).collect();
            json!({"prompt": prompt, "n": 2, "max_tokens": 80, "guided_json": serde_json::from_str::<Value>(SCHEMA).unwrap()})
                .to_string()
        })
        .chain((0..4).map(|i| {
            let prompt: Vec<u32> = (0..40).map(|t| 900 + 17 * i + t).collect();
            json!({"prompt": prompt, "max_tokens": 80, "ignore_eos": true}).to_string()
        }))
        .collect();
    let outs: Vec<(u16, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = bodies
            .iter()
            .map(|b| sc.spawn(|| s.json("/v1/completions", b)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        s.metric("yoco:num_preemptions_total") > 0.0,
        "the pool was meant to run out"
    );
    for (st, v) in &outs[..4] {
        assert_eq!(*st, 200, "{v}");
        for c in v["choices"].as_array().unwrap() {
            assert_eq!(c["finish_reason"], "stop", "{c}");
            assert!(valid_schema_output(c["text"].as_str().unwrap()), "{c}");
        }
    }
    for (st, v) in &outs[4..] {
        assert_eq!(*st, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 80);
    }
    s.wait_idle_and_empty();
}

#[test]
fn a_token_the_grammar_rejects_ends_the_sequence_as_an_abort() {
    let s = TestServer::start(Opts {
        exec_of: Some(|_, vocab| MockModel::new(vocab, 16, Duration::ZERO).ignoring_masks()),
        ..Default::default()
    });
    let (st, v) = s.json(
        "/v1/completions",
        r#"{"prompt": "Answer:", "max_tokens": 32, "guided_regex": "qqqqqqqqqq"}"#,
    );
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "abort", "{v}");
    // The rejected token, then the one sampled while its mask allowed only EOS.
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    s.wait_for("idle", |s| s.metric("yoco:num_requests_running") == 0.0);
}

#[test]
fn bad_constraints_are_400s_naming_the_field_and_admit_nothing() {
    let s = TestServer::start(Opts::default());
    let cases = [
        (
            r#"{"prompt": "x", "structured_outputs": {"json": {"type": "nosuchtype"}}}"#,
            "structured_outputs",
            "nosuchtype",
        ),
        (
            r#"{"prompt": "x", "guided_json": "{not json"}"#,
            "guided_json",
            "not valid JSON",
        ),
        (
            r#"{"prompt": "x", "guided_regex": "(unclosed"}"#,
            "guided_regex",
            "regex",
        ),
        (
            r#"{"prompt": "x", "guided_grammar": "start: undefined_rule"}"#,
            "guided_grammar",
            "undefined_rule",
        ),
        (
            r#"{"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}}"#,
            "structured_outputs",
            "exactly one",
        ),
        (
            r#"{"prompt": "x", "structured_outputs": {"jsn": {}}}"#,
            "structured_outputs",
            "jsn",
        ),
        (
            r#"{"prompt": "x", "guided_choice": []}"#,
            "guided_choice",
            "choice",
        ),
        (
            r#"{"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}"#,
            "guided_choice",
            "only one",
        ),
        (
            r#"{"prompt": "x", "response_format": {"type": "yaml"}}"#,
            "response_format",
            "'yaml'",
        ),
        (
            r#"{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}"#,
            "response_format",
            "schema is required",
        ),
    ];
    for (body, param, needle) in cases {
        s.assert_400("/v1/completions", body, param, needle);
    }
    assert_eq!(s.metric("yoco:prompt_tokens_total"), 0.0);
    // `text` is no constraint.
    let (st, _) = s.json(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 2, "response_format": {"type": "text"}}"#,
    );
    assert_eq!(st, 200);
}

/// POST returning (status, retry-after header, body).
fn post_with_headers(s: &TestServer, body: &str) -> (u16, Option<String>, Value) {
    let req = hyper::Request::post(s.url("/v1/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    s.rt.block_on(async {
        let r = s.client.request(req).await.unwrap();
        let st = r.status().as_u16();
        let ra = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let b = r.into_body().collect().await.unwrap().to_bytes();
        (st, ra, serde_json::from_slice(&b).unwrap())
    })
}

#[test]
fn over_the_compile_budget_is_a_400_and_too_many_compiling_a_503_with_retry_after() {
    let slow = TestServer::start(Opts {
        grammar_limits: Some(CompileLimits {
            time_budget_ms: 1,
            ..CompileLimits::default()
        }),
        ..Default::default()
    });
    let big: Vec<String> = (0..20_000).map(|i| format!("value-{i}")).collect();
    let body = json!({"prompt": "x", "guided_json": {"enum": big}}).to_string();
    let (st, ra, v) = post_with_headers(&slow, &body);
    assert_eq!((st, ra), (400, None), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("time budget"),
        "{v}"
    );
    assert_eq!(v["error"]["param"], "guided_json");

    let busy = TestServer::start(Opts {
        grammar_limits: Some(CompileLimits {
            max_in_flight: 0,
            ..CompileLimits::default()
        }),
        ..Default::default()
    });
    let (st, ra, v) = post_with_headers(&busy, r#"{"prompt": "x", "guided_regex": "[0-9]+"}"#);
    assert_eq!(st, 503, "{v}");
    assert_eq!(ra.as_deref(), Some("1"));
    assert_eq!(v["error"]["type"], "ServiceUnavailableError");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too many grammars"),
        "{v}"
    );
    assert_eq!(busy.metric("yoco:prompt_tokens_total"), 0.0);
}
