//! The step loop with async scheduling (the default) against the synchronous loop
//! (`async_scheduling: false`): the same answers for the same requests, decodes planned on
//! placeholders only in async mode, and stop strings ending a request one step late without
//! emitting the extra token.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{sse_events, Opts, TestServer};
use serde_json::{json, Value};
use yoco_core::mock::MockExecutor;
use yoco_server::MockModel;

/// Every plan's request ids and placeholder count, as the executor saw them.
type Trace = Arc<Mutex<Vec<(Vec<u64>, usize)>>>;

fn spied(trace: &Trace) -> MockModel {
    let vocab = common::tokenizer().get_vocab_size(true) as u32;
    let t = trace.clone();
    MockModel::new(vocab, 16, Duration::ZERO).failing_when(move |p| {
        t.lock()
            .unwrap()
            .push((p.req_ids.clone(), p.num_placeholders()));
        false
    })
}

/// The synchronous server also delivers its events from the loop thread (the other delivery
/// path), so the comparisons cover both.
fn server(async_scheduling: bool, trace: &Trace) -> TestServer {
    TestServer::start(Opts {
        exec: Some(spied(trace)),
        async_scheduling,
        direct_delivery: !async_scheduling,
        ..Default::default()
    })
}

/// The choices and usage of an answer, without ids and timestamps.
fn answer(v: &Value) -> Value {
    json!({"choices": v["choices"], "usage": v["usage"]})
}

#[test]
fn async_and_synchronous_loops_give_the_same_answers() {
    let (ta, ts) = (Trace::default(), Trace::default());
    let (a, s) = (server(true, &ta), server(false, &ts));
    let bodies = [
        json!({"prompt": "The sea was calm", "max_tokens": 12}),
        json!({"prompt": "The sea was calm", "max_tokens": 12, "stream": true}),
        json!({"prompt": ["one", "two two", "three three three"], "max_tokens": 7, "n": 2}),
        json!({"prompt": [300, 301, 302], "max_tokens": 1}),
        json!({"prompt": "min", "max_tokens": 5, "min_tokens": 5, "ignore_eos": true}),
        json!({"prompt": "echo me", "max_tokens": 3, "echo": true}),
    ];
    for b in &bodies {
        let b = b.to_string();
        if b.contains("\"stream\":true") {
            let (_, ea) = a.post("/v1/completions", &b);
            let (_, es) = s.post("/v1/completions", &b);
            let strip = |e: &str| -> Vec<Value> {
                sse_events(e)
                    .iter()
                    .filter(|x| *x != "[DONE]")
                    .map(|x| {
                        let v: Value = serde_json::from_str(x).unwrap();
                        json!({"choices": v["choices"]})
                    })
                    .collect()
            };
            assert_eq!(strip(&ea), strip(&es), "{b}");
        } else {
            let (sa, va) = a.json("/v1/completions", &b);
            let (ss, vs) = s.json("/v1/completions", &b);
            assert_eq!((sa, ss), (200, 200), "{va} {vs}");
            assert_eq!(answer(&va), answer(&vs), "{b}");
        }
    }
    // Concurrent requests share steps: then decodes are planned ahead on placeholders.
    let many: Vec<String> = (0..12)
        .map(|i| json!({"prompt": format!("request {i}"), "max_tokens": 20 + i}).to_string())
        .collect();
    let run = |srv: &TestServer| -> Vec<Value> {
        std::thread::scope(|sc| {
            let hs: Vec<_> = many
                .iter()
                .map(|b| sc.spawn(move || answer(&srv.json("/v1/completions", b).1)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    assert_eq!(run(&a), run(&s));
    let holes = |t: &Trace| t.lock().unwrap().iter().map(|x| x.1).sum::<usize>();
    assert!(holes(&ta) > 50, "async plans decode on placeholders");
    assert_eq!(holes(&ts), 0, "the synchronous loop never does");
}

#[test]
fn preemption_under_async_scheduling_changes_no_output() {
    // The KV-simulating mock: any wrong placeholder, slot or block reuse changes the tokens. 24
    // blocks for 8 requests growing to 68 tokens each: preemptions happen while placeholders are
    // outstanding.
    let kv_mock = |_: usize, vocab: u32| {
        let mut c = yoco_core::sched::SchedulerConfig::new(common::layers(), 16, 24).unwrap();
        c.max_num_seqs = 8;
        c.max_model_len = 128;
        let s = yoco_core::sched::Scheduler::new(c).unwrap();
        MockModel::with(
            MockExecutor::new(vocab)
                .first_token(16)
                .simulating_kv_of(&s),
            Duration::from_millis(2),
        )
    };
    let opts = |async_scheduling| Opts {
        num_blocks: 24,
        max_num_seqs: 8,
        max_model_len: 128,
        exec_of: Some(kv_mock),
        async_scheduling,
        ..Default::default()
    };
    let (a, s) = (
        TestServer::start(opts(true)),
        TestServer::start(opts(false)),
    );
    let bodies: Vec<String> = (0..8)
        .map(|i| {
            let p: Vec<u32> = (0..8).map(|t| 300 + i * 10 + t).collect();
            json!({"prompt": p, "max_tokens": 60, "ignore_eos": true}).to_string()
        })
        .collect();
    let run = |srv: &TestServer| -> Vec<Value> {
        std::thread::scope(|sc| {
            let hs: Vec<_> = bodies
                .iter()
                .map(|b| sc.spawn(move || srv.json("/v1/completions", b).1))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let (oa, os) = (run(&a), run(&s));
    assert!(
        a.metric("yoco:num_preemptions_total") > 0.0,
        "the pool was meant to run out"
    );
    for (x, y) in oa.iter().zip(&os) {
        assert_eq!(x["choices"][0]["text"], y["choices"][0]["text"]);
        assert_eq!(x["usage"]["completion_tokens"], 60);
    }
    assert_eq!(a.metric("yoco:num_requests_running"), 0.0);
    assert_eq!(a.metric("yoco:kv_cache_usage_perc"), 0.0, "no block leaked");
}

#[test]
fn a_stop_string_ends_its_request_one_step_late_without_emitting_the_extra_token() {
    // Find a stop string in the request's own output: the text of its 5th streamed token.
    let (ta, ts) = (Trace::default(), Trace::default());
    let (a, s) = (server(true, &ta), server(false, &ts));
    let body = json!({"prompt": "stop here", "max_tokens": 16, "stream": true}).to_string();
    let (_, ev) = s.post("/v1/completions", &body);
    let deltas: Vec<String> = sse_events(&ev)
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let (k, stop) = deltas
        .iter()
        .enumerate()
        .skip(4)
        .find(|(k, d)| !d.trim().is_empty() && !deltas[..*k].concat().contains(d.as_str()))
        .map(|(k, d)| (k, d.clone()))
        .expect("a token whose text did not occur before");
    ta.lock().unwrap().clear();
    ts.lock().unwrap().clear();
    let body = json!({"prompt": "stop here", "max_tokens": 16, "stop": [stop]}).to_string();
    let (_, va) = a.json("/v1/completions", &body);
    let (_, vs) = s.json("/v1/completions", &body);
    assert_eq!(answer(&va), answer(&vs));
    assert_eq!(va["choices"][0]["finish_reason"], "stop");
    assert_eq!(va["usage"]["completion_tokens"], k as u64 + 1);
    let steps = |t: &Trace| t.lock().unwrap().len();
    assert_eq!(
        steps(&ts),
        k + 1,
        "sync: the step that produced the match is the last"
    );
    assert_eq!(
        steps(&ta),
        k + 2,
        "async: one more step was already running when the match was found"
    );
}

#[test]
fn a_prefix_longer_than_the_sliding_window_is_cached_as_in_synchronous_mode() {
    // The test layout's sliding window is 64 tokens: the first blocks of a 200-token prompt leave
    // the window in the plan built right after the prefill, before its update. They must still
    // be indexed, so a second request sharing 160 tokens hits them.
    let (ta, ts) = (Trace::default(), Trace::default());
    let (a, s) = (server(true, &ta), server(false, &ts));
    let first: Vec<u32> = (0..200).map(|t| 300 + t).collect();
    let mut second = first[..160].to_vec();
    second.extend(1000..1040);
    let cached = |srv: &TestServer| {
        for p in [&first, &second] {
            let (st, v) = srv.json(
                "/v1/completions",
                &json!({"prompt": p, "max_tokens": 4}).to_string(),
            );
            assert_eq!(st, 200, "{v}");
            if std::ptr::eq(p, &second) {
                return v["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
            }
        }
        unreachable!()
    };
    let (ca, cs) = (cached(&a), cached(&s));
    assert_eq!(
        cs, 160,
        "synchronous: the shared prefix is served from the cache"
    );
    assert_eq!(ca, cs, "async scheduling caches the same prefix");
}
