//! Request lifecycles through the step loop: disconnects abort, failed steps fail their requests
//! and not the engine, memory pressure preempts without changing outputs, nothing leaks.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Opts, TestServer};
use serde_json::{json, Value};
use yoco_server::MockModel;

fn raw_post(s: &TestServer, body: &str) -> TcpStream {
    let mut c = TcpStream::connect(s.addr).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
               Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    c
}

fn idle_and_empty(s: &TestServer) -> bool {
    s.metric("yoco:num_requests_running") == 0.0
        && s.metric("yoco:num_requests_waiting") == 0.0
        && s.metric("yoco:kv_cache_usage_perc") == 0.0
}

fn aborted(s: &TestServer) -> f64 {
    let (_, m) = s.get("/metrics");
    m.lines()
        .find(|l| {
            l.starts_with("yoco:request_success_total") && l.contains("finished_reason=\"abort\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap()
}

#[test]
fn client_disconnect_mid_stream_aborts_the_request_and_frees_its_blocks() {
    let s = TestServer::start(Opts {
        forward: Duration::from_millis(2),
        ..Default::default()
    });
    let mut c = raw_post(
        &s,
        r#"{"prompt": "A long story", "max_tokens": 400, "stream": true, "ignore_eos": true}"#,
    );
    let mut buf = [0u8; 4096];
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("\"text\"") {
        let n = c.read(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert!(s.metric("yoco:num_requests_running") == 1.0);
    drop(c);
    s.wait_for("the abort", |s| aborted(s) == 1.0 && idle_and_empty(s));
    assert!(
        s.metric("yoco:generation_tokens_total") < 400.0,
        "it stopped early"
    );
}

#[test]
fn client_disconnect_while_awaiting_a_whole_answer_aborts_the_request() {
    let s = TestServer::start(Opts {
        forward: Duration::from_millis(2),
        ..Default::default()
    });
    let c = raw_post(
        &s,
        r#"{"prompt": "A long story", "max_tokens": 400, "ignore_eos": true}"#,
    );
    s.wait_for("admission", |s| {
        s.metric("yoco:num_requests_running") == 1.0
    });
    drop(c);
    s.wait_for("the abort", |s| aborted(s) == 1.0 && idle_and_empty(s));
}

#[test]
fn failed_step_fails_its_requests_and_the_engine_serves_the_next() {
    let calls = Arc::new(AtomicU32::new(0));
    let c2 = calls.clone();
    let tok = common::tokenizer();
    let exec = MockModel::new(tok.get_vocab_size(true) as u32, 16, Duration::ZERO)
        .failing_when(move |_| c2.fetch_add(1, Ordering::Relaxed) == 0);
    let s = TestServer::start(Opts {
        exec: Some(exec),
        ..Default::default()
    });
    let (st, v) = s.json("/v1/completions", r#"{"prompt": "first", "max_tokens": 4}"#);
    assert_eq!(st, 500, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("injected step failure"),
        "{v}"
    );
    let (st, v) = s.json(
        "/v1/completions",
        r#"{"prompt": "second", "max_tokens": 4}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(s.get("/health").0, 200);
    assert_eq!(s.metric("yoco:engine_failed_steps_total"), 1.0);
    s.wait_idle_and_empty();
}

#[test]
fn failed_step_mid_stream_ends_the_stream_with_an_error_event() {
    let calls = Arc::new(AtomicU32::new(0));
    let c2 = calls.clone();
    let tok = common::tokenizer();
    let exec = MockModel::new(tok.get_vocab_size(true) as u32, 16, Duration::ZERO)
        .failing_when(move |_| c2.fetch_add(1, Ordering::Relaxed) == 3);
    let s = TestServer::start(Opts {
        exec: Some(exec),
        ..Default::default()
    });
    let (st, body) = s.post(
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 10, "stream": true}"#,
    );
    assert_eq!(st, 200);
    let ev = common::sse_events(&body);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], 500, "{body}");
    assert_eq!(ev.len(), 2 + 3, "three tokens, then the error: {body}");
}

/// The dead engine's answer: 503 `EngineDeadError` naming the failure that stopped it.
fn assert_engine_dead(status: u16, v: &Value) {
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["type"], "EngineDeadError");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("it failed: mock executor: injected step failure"),
        "{msg}"
    );
}

#[test]
fn consecutive_failed_steps_stop_the_engine_and_the_server_answers_503() {
    let tok = common::tokenizer();
    let exec =
        MockModel::new(tok.get_vocab_size(true) as u32, 16, Duration::ZERO).failing_when(|_| true);
    let s = TestServer::start(Opts {
        exec: Some(exec),
        max_failures: 2,
        ..Default::default()
    });
    let (st, _) = s.json("/v1/completions", r#"{"prompt": "a", "max_tokens": 2}"#);
    assert_eq!(st, 500);
    // The failure that stops the engine: its own request gets the dead engine's 503, as the
    // requests after it do (and as the Python server answers), not a contained failure's 500.
    let (st, v) = s.json("/v1/completions", r#"{"prompt": "b", "max_tokens": 2}"#);
    assert_engine_dead(st, &v);
    s.wait_for("the engine to stop", |s| s.get("/health").0 == 503);
    let (_, health) = s.get("/health");
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "dead");
    assert!(
        health["error"]
            .as_str()
            .unwrap()
            .contains("injected step failure"),
        "{health}"
    );
    let (st, v) = s.json("/v1/completions", r#"{"prompt": "c", "max_tokens": 2}"#);
    assert_engine_dead(st, &v);
}

#[test]
fn memory_pressure_preempts_without_changing_any_output() {
    // 24 blocks of 16 tokens for 8 requests that each grow to 8 + 60 tokens: they cannot all fit.
    let s = TestServer::start(Opts {
        num_blocks: 24,
        max_num_seqs: 8,
        max_model_len: 128,
        // A forward long enough that all eight are running together (each needs 60 steps).
        forward: Duration::from_millis(3),
        ..Default::default()
    });
    let solo = TestServer::start(Opts::default());
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| (0..8).map(|t| 300 + i * 10 + t).collect())
        .collect();
    let bodies: Vec<String> = prompts
        .iter()
        .map(|p| json!({"prompt": p, "max_tokens": 60, "ignore_eos": true}).to_string())
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
    for (b, (st, v)) in bodies.iter().zip(&outs) {
        assert_eq!(*st, 200, "{v}");
        let (_, alone) = solo.json("/v1/completions", b);
        assert_eq!(v["choices"][0]["text"], alone["choices"][0]["text"]);
    }
    s.wait_idle_and_empty();
}

#[test]
fn storm_of_requests_with_disconnects_leaks_nothing() {
    let s = TestServer::start(Opts {
        forward: Duration::from_micros(300),
        num_blocks: 200,
        ..Default::default()
    });
    // Seeded: which requests stream, how long they are, and which clients leave early.
    let mut x: u64 = 0x5eed;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    let plan: Vec<(bool, u32, bool)> = (0..48)
        .map(|_| (next() % 2 == 0, 1 + next() % 120, next() % 3 == 0))
        .collect();
    std::thread::scope(|sc| {
        for (i, &(stream, max_tokens, leave)) in plan.iter().enumerate() {
            let s = &s;
            sc.spawn(move || {
                let body = json!({"prompt": format!("storm {i}"), "max_tokens": max_tokens, "stream": stream,
                                  "ignore_eos": true})
                .to_string();
                if leave {
                    let mut c = raw_post(s, &body);
                    let mut b = [0u8; 64];
                    let _ = c.read(&mut b);
                    drop(c);
                } else {
                    let (st, _) = s.post("/v1/completions", &body);
                    assert_eq!(st, 200);
                }
            });
        }
    });
    s.wait_for("every request to end", |s| {
        let (_, m) = s.get("/metrics");
        let done: f64 = m
            .lines()
            .filter(|l| l.starts_with("yoco:request_success_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        done == plan.len() as f64
    });
    s.wait_idle_and_empty();
}
