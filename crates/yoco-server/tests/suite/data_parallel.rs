//! `--data-parallel-size`: several step loops behind one front end, requests dispatched by prefix
//! overlap and load; a stopped loop is routed around.

use crate::common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::{Opts, TestServer};
use serde_json::json;
use yoco_server::MockModel;

fn per_loop(s: &TestServer, series: &str) -> Vec<f64> {
    let (_, m) = s.get("/metrics");
    (0..s.loops.len())
        .map(|i| {
            let key = format!("{series}{{model_name=\"mock\",engine=\"{i}\"}}");
            m.lines()
                .find(|l| l.starts_with(&key))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {key}"))
        })
        .collect()
}

#[test]
fn requests_sharing_a_prefix_land_on_the_loop_that_caches_it() {
    let s = TestServer::start(Opts {
        loops: 3,
        ..Default::default()
    });
    for p in 0..6u32 {
        let prefix: Vec<u32> = (0..64).map(|t| 300 + p * 100 + t).collect();
        for q in 0..3u32 {
            let mut prompt = prefix.clone();
            prompt.extend([2000 + q, 2001 + q, 2002 + q]);
            let (st, v) = s.json(
                "/v1/completions",
                &json!({"prompt": prompt, "max_tokens": 2}).to_string(),
            );
            assert_eq!(st, 200, "{v}");
            let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            // The first of each family computes the prefix; the others find its 64 tokens cached.
            assert_eq!(
                cached,
                if q == 0 { 0 } else { 64 },
                "prefix {p}, request {q}"
            );
        }
    }
    // Six prefix families over three idle loops: each loop got some (load breaks the ties).
    let prompts = per_loop(&s, "yoco:prompt_tokens_total");
    assert!(prompts.iter().all(|&x| x > 0.0), "{prompts:?}");
}

#[test]
fn concurrent_distinct_prompts_spread_over_the_loops() {
    let s = TestServer::start(Opts {
        loops: 2,
        forward: Duration::from_millis(2),
        ..Default::default()
    });
    std::thread::scope(|sc| {
        for i in 0..8 {
            let s = &s;
            sc.spawn(move || {
                let body = json!({"prompt": format!("distinct prompt number {i}"), "max_tokens": 40,
                                  "ignore_eos": true});
                assert_eq!(s.post("/v1/completions", &body.to_string()).0, 200);
            });
        }
    });
    let done: Vec<u64> = s
        .loops
        .iter()
        .map(|l| l.stats().finished.iter().map(|c| c.load(Relaxed)).sum())
        .collect();
    assert_eq!(done.iter().sum::<u64>(), 8);
    assert!(done.iter().all(|&d| d >= 3), "unbalanced: {done:?}");
}

#[test]
fn a_stopped_loop_is_routed_around_and_health_stays_ok() {
    fn exec(i: usize, vocab: u32) -> MockModel {
        let m = MockModel::new(vocab, 16, Duration::ZERO);
        if i == 0 {
            m.failing_when(|_| true)
        } else {
            m
        }
    }
    let s = TestServer::start(Opts {
        loops: 2,
        max_failures: 1,
        exec_of: Some(exec),
        ..Default::default()
    });
    let mut failed = 0;
    for i in 0..10 {
        let (st, v) = s.json(
            "/v1/completions",
            &json!({"prompt": format!("request {i}"), "max_tokens": 3}).to_string(),
        );
        match st {
            200 => assert_eq!(v["usage"]["completion_tokens"], 3),
            // The request whose failure stopped loop 0 gets that engine's 503 (retryable: the
            // next attempt goes to the loop still serving).
            503 if v["error"]["type"] == "EngineDeadError" => failed += 1,
            other => panic!("{other}: {v}"),
        }
    }
    assert!(
        failed <= 1,
        "only requests sent before loop 0 stopped may fail: {failed}"
    );
    assert!(s.loops[0].stats().dead.load(Relaxed));
    assert_eq!(s.get("/health").0, 200, "one loop still serves");
}
