//! The step loop with async scheduling (the default) against the synchronous loop
//! (`async_scheduling: false`): the same answers for the same requests, decodes planned on
//! placeholders only in async mode, and stop strings ending a request one step late without
//! emitting the extra token.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{sse_events, Opts, TestServer};
use serde_json::{json, Value};
use yoco_core::mock::MockExecutor;
use yoco_server::MockModel;

/// Every plan's request ids and placeholder count, as the executor saw them.
type Trace = Arc<Mutex<Vec<(Vec<u64>, usize)>>>;

/// A mock that records every plan into `trace`, with a modelled forward of `forward` (so
/// concurrent requests share steps).
fn spied_with(trace: &Trace, forward: Duration) -> MockModel {
    let vocab = common::tokenizer().get_vocab_size(true) as u32;
    let t = trace.clone();
    MockModel::new(vocab, 16, forward).failing_when(move |p| {
        t.lock()
            .unwrap()
            .push((p.req_ids.clone(), p.num_placeholders()));
        false
    })
}

/// The synchronous server also delivers its events from the loop thread (the other delivery
/// path), so the comparisons cover both.
fn server(async_scheduling: bool, trace: &Trace) -> TestServer {
    server_with(async_scheduling, trace, Duration::ZERO)
}

fn server_with(async_scheduling: bool, trace: &Trace, forward: Duration) -> TestServer {
    TestServer::start(Opts {
        exec: Some(spied_with(trace, forward)),
        async_scheduling,
        direct_delivery: !async_scheduling,
        ..Default::default()
    })
}

/// The choices and usage of an answer, without ids and timestamps.
fn answer(v: &Value) -> Value {
    json!({"choices": v["choices"], "usage": v["usage"]})
}

/// A stop string taken from the output of `{"prompt": "stop here"}` itself: the text of its first
/// streamed token from the 5th on that is not blank and did not occur in the text before it, and
/// that token's index. A request for "stop here" with this stop string ends at that token.
fn stop_probe(srv: &TestServer) -> (usize, String) {
    let body = json!({"prompt": "stop here", "max_tokens": 16, "stream": true}).to_string();
    let (_, ev) = srv.post("/v1/completions", &body);
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
    (4..deltas.len())
        .find(|&k| !deltas[k].trim().is_empty() && !deltas[..k].concat().contains(&deltas[k]))
        .map(|k| (k, deltas[k].clone()))
        .expect("a token whose text did not occur before")
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
    a.wait_idle_and_empty();
}

#[test]
fn a_stop_string_ends_its_request_one_step_late_without_emitting_the_extra_token() {
    // A stop string from the request's own output (`stop_probe`): the text of its k-th streamed token.
    let (ta, ts) = (Trace::default(), Trace::default());
    let (a, s) = (server(true, &ta), server(false, &ts));
    let (k, stop) = stop_probe(&s);
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

/// `[a-z]{2,5}-[0-9]{2}`, checked independently of the grammar.
fn valid_code(t: &str) -> bool {
    t.split_once('-').is_some_and(|(a, b)| {
        (2..=5).contains(&a.len())
            && a.bytes().all(|c| c.is_ascii_lowercase())
            && b.len() == 2
            && b.bytes().all(|c| c.is_ascii_digit())
    })
}

/// Posts every body at once (threads), in order of the bodies; the raw bodies back.
fn post_all(srv: &TestServer, bodies: &[String]) -> Vec<(u16, String)> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = bodies
            .iter()
            .map(|b| sc.spawn(move || srv.post("/v1/completions", b)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A non-streamed answer, or a stream's chunks, without ids and timestamps.
fn comparable(body: &str) -> Value {
    match serde_json::from_str::<Value>(body) {
        Ok(v) => answer(&v),
        Err(_) => sse_events(body)
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"].clone())
            .collect(),
    }
}

#[test]
fn structured_outputs_under_async_scheduling_are_valid_and_token_identical_to_synchronous() {
    // A mask for step N+1 needs the token of step N: while a constrained sequence is live the loop
    // plans no step ahead. The mock picks an allowed token where the mask forbids its own, so a
    // mask computed from a matcher one token behind would change (and break) the output.
    let (ta, ts) = (Trace::default(), Trace::default());
    let ms2 = Duration::from_millis(2);
    let (a, s) = (server_with(true, &ta, ms2), server_with(false, &ts, ms2));
    let code = json!({"regex": "[a-z]{2,5}-[0-9]{2}"});
    let constrained = [
        json!({"prompt": "code:", "max_tokens": 24, "n": 2, "structured_outputs": code,
               "return_tokens_as_token_ids": true, "logprobs": 1}),
        json!({"prompt": "another code:", "max_tokens": 24, "stream": true,
               "structured_outputs": code}),
        json!({"prompt": ["pick", "pick one"], "max_tokens": 8,
               "structured_outputs": {"choice": ["north", "south", "east"]}}),
    ];
    let bodies: Vec<String> = constrained.iter().map(Value::to_string).collect();
    // Constrained requests alone, then batched with unconstrained ones (one streamed) that keep
    // running after the constrained ones end.
    let mut mixed = bodies.clone();
    mixed.push(
        json!({"prompt": "free text", "max_tokens": 40, "ignore_eos": true,
               "return_tokens_as_token_ids": true, "logprobs": 2})
        .to_string(),
    );
    mixed.push(
        json!({"prompt": "free stream", "max_tokens": 40, "ignore_eos": true, "stream": true})
            .to_string(),
    );
    for (round, set) in [&bodies, &mixed].into_iter().enumerate() {
        ta.lock().unwrap().clear();
        let (oa, os) = (post_all(&a, set), post_all(&s, set));
        for (i, ((sa, ba), (ss, bs))) in oa.iter().zip(&os).enumerate() {
            assert_eq!((*sa, *ss), (200, 200), "{ba} {bs}");
            assert_eq!(comparable(ba), comparable(bs), "round {round}, body {i}");
        }
        for (i, (_, body)) in oa.iter().enumerate().take(constrained.len()) {
            let texts: Vec<String> = match serde_json::from_str::<Value>(body) {
                Ok(v) => v["choices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["text"].as_str().unwrap().to_string())
                    .collect(),
                Err(_) => vec![sse_events(body)
                    .iter()
                    .filter(|e| *e != "[DONE]")
                    .map(|e| {
                        serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                            .as_str()
                            .unwrap_or("")
                            .to_string()
                    })
                    .collect()],
            };
            for t in texts {
                let ok = if i == 2 {
                    ["north", "south", "east"].contains(&t.as_str())
                } else {
                    valid_code(&t)
                };
                assert!(ok, "round {round}, body {i}: {t:?}");
            }
        }
        let trace = ta.lock().unwrap();
        if round == 0 {
            assert!(
                trace.iter().all(|&(_, ph)| ph == 0),
                "no step is planned ahead while constrained sequences are live"
            );
        } else {
            assert!(
                trace.iter().any(|&(_, ph)| ph > 0),
                "async planning resumes once the constrained sequences have ended"
            );
        }
    }
    a.wait_idle_and_empty();
}

#[test]
fn logprobs_stay_with_their_requests_when_a_batched_request_s_extra_row_is_discarded() {
    // In async mode a request matching a stop string at step k was already planned for k+1; that
    // row is dropped from k+1's outcome, so the outcome's rows are no longer the sampling rows
    // one for one. The other requests' logprobs of step k+1 must still reach them.
    let (ta, ts) = (Trace::default(), Trace::default());
    let ms2 = Duration::from_millis(2);
    let (a, s) = (server_with(true, &ta, ms2), server_with(false, &ts, ms2));
    let (_, stop) = stop_probe(&s);
    let bodies = vec![
        json!({"prompt": "stop here", "max_tokens": 16, "stop": [stop]}).to_string(),
        json!({"prompt": "keep going", "max_tokens": 24, "ignore_eos": true, "logprobs": 1,
               "return_tokens_as_token_ids": true})
        .to_string(),
        json!({"prompt": "keep streaming", "max_tokens": 24, "ignore_eos": true, "logprobs": 0,
               "stream": true})
        .to_string(),
    ];
    let (oa, os) = (post_all(&a, &bodies), post_all(&s, &bodies));
    for (i, ((sa, ba), (ss, bs))) in oa.iter().zip(&os).enumerate() {
        assert_eq!((*sa, *ss), (200, 200), "{ba} {bs}");
        assert_eq!(comparable(ba), comparable(bs), "body {i}");
    }
    let v: Value = serde_json::from_str(&oa[0].1).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let v: Value = serde_json::from_str(&oa[1].1).unwrap();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 24, "{lp}");
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 24);
    let streamed: usize = sse_events(&oa[2].1)
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| {
            let c: Value = serde_json::from_str(e).unwrap();
            c["choices"][0]["logprobs"]["tokens"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .sum();
    assert_eq!(streamed, 24, "every streamed token has its logprob");
}

/// The synchronous loop sends a step's tokens before it launches the next step. With an executor
/// whose forward runs inside `launch` (the CPU's), a token held until after the next launch reaches
/// the client one whole forward late (TTFT and every inter-token gap one step longer). Here the
/// mock's second launch waits for the client to have read the first token: a loop that delivered
/// only after launching would make it time out. Both delivery paths.
#[test]
fn the_synchronous_loop_sends_a_steps_tokens_before_the_next_launch() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};

    for direct_delivery in [false, true] {
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<()>();
        let launches = Arc::new(AtomicU32::new(0));
        let late = Arc::new(AtomicBool::new(false));
        let (n, lt) = (launches.clone(), late.clone());
        let vocab = common::tokenizer().get_vocab_size(true) as u32;
        let exec = MockModel::new(vocab, 16, Duration::ZERO).failing_when(move |_| {
            if n.fetch_add(1, SeqCst) == 1 && seen_rx.recv_timeout(Duration::from_secs(10)).is_err()
            {
                lt.store(true, SeqCst);
            }
            false
        });
        let srv = TestServer::start(Opts {
            exec: Some(exec),
            async_scheduling: false,
            direct_delivery,
            ..Default::default()
        });
        let body = r#"{"prompt": "hello", "max_tokens": 3, "stream": true, "ignore_eos": true}"#;
        let mut c = std::net::TcpStream::connect(srv.addr).unwrap();
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let (mut buf, mut got, mut signalled) = ([0u8; 4096], Vec::new(), false);
        while !String::from_utf8_lossy(&got).contains("[DONE]") {
            let k = c.read(&mut buf).unwrap();
            assert!(
                k > 0,
                "the stream ended early: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..k]);
            if !signalled && String::from_utf8_lossy(&got).contains("\"text\"") {
                signalled = true;
                let _ = seen_tx.send(());
            }
        }
        assert!(
            !late.load(SeqCst),
            "the first token reached the client only after the next launch (direct delivery: {direct_delivery})"
        );
        assert!(launches.load(SeqCst) >= 3);
        srv.wait_idle_and_empty();
    }
}

#[test]
fn the_completions_of_an_n_request_prefill_its_prompt_once() {
    // Each completion is its own sequence; the later ones wait until the first has computed the
    // prompt, then reuse its cached blocks instead of prefilling the same tokens side by side.
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": vec![300; 70], "max_tokens": 3, "n": 3}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "the sea ".repeat(30)}],
                   "max_tokens": 3, "n": 3}),
        ),
    ] {
        let t = Trace::default();
        let srv = server(false, &t);
        let (status, v) = srv.json(path, &body.to_string());
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"].as_array().unwrap().len(), 3);
        let plans = t.lock().unwrap().clone();
        assert_eq!(
            plans[0].0.len(),
            1,
            "{path}: only the first completion prefills"
        );
        assert_eq!(
            plans[1].0.len(),
            3,
            "{path}: the siblings join once the prompt is cached"
        );
    }
}
