//! [`ManualLoop`]: the step loop stepped by its owner (what the Python `Engine` runs). One call is
//! one synchronous step with its events; aborts act before they return; a failed step reports
//! its error and the loop goes on; an `n > 1` sibling waits for the first completion's prompt.

use crate::common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use yoco_core::sched::SchedulerConfig;
use yoco_grammar::{GrammarCompiler, GrammarKind, GrammarSpec};
use yoco_server::params::Grammar;
use yoco_server::{
    EngineHandle, Event, Executor, FinishReason, GenParams, LoopConfig, ManualLoop, MockModel,
};

/// Every plan's request ids, as the executor saw them.
type Trace = Arc<Mutex<Vec<Vec<u64>>>>;

fn config(max_failures: u32) -> LoopConfig {
    let mut sc = SchedulerConfig::new(common::layers(), 16, 256).unwrap();
    sc.max_num_seqs = 8;
    sc.max_model_len = 512;
    sc.max_num_batched_tokens = 256;
    LoopConfig {
        scheduler: sc,
        tokenizer: common::tokenizer(),
        eos_token_ids: vec![1],
        max_consecutive_failures: max_failures,
        async_scheduling: false,
        kv_events: None,
    }
}

/// The deterministic mock model; records each plan into `trace` and fails the plans `fail` picks.
fn mock(trace: &Trace, mut fail: impl FnMut(&[u64]) -> bool + Send + 'static) -> Box<dyn Executor> {
    let vocab = common::tokenizer().get_vocab_size(true) as u32;
    let t = trace.clone();
    Box::new(
        MockModel::new(vocab, 16, Duration::ZERO).failing_when(move |p| {
            t.lock().unwrap().push(p.req_ids.clone());
            fail(&p.req_ids)
        }),
    )
}

fn params(prompt: Vec<u32>, max_tokens: u32, stream: bool) -> GenParams {
    GenParams {
        prompt,
        max_tokens,
        stream,
        ignore_eos: true,
        ..GenParams::default()
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    std::iter::once(common::BOS)
        .chain((0..len as u32 - 1).map(|i| 100 + (seed * 31 + i * 7) % 900))
        .collect()
}

/// Token ids of each request's answer, by request id, from events (deltas then the last event).
fn answers(events: &[(u64, Event)]) -> std::collections::BTreeMap<u64, Vec<u32>> {
    let mut out = std::collections::BTreeMap::<u64, Vec<u32>>::new();
    for (id, ev) in events {
        let ids = out.entry(*id).or_default();
        match ev {
            Event::Delta { token_id, .. } => ids.extend(token_id),
            Event::Finished(f) => ids.extend(&f.token_ids),
        }
    }
    out
}

#[test]
fn each_manual_step_hands_back_its_own_events_and_the_tokens_equal_the_threaded_loops() {
    let trace = Trace::default();
    let mut m = ManualLoop::new(config(3), mock(&trace, |_| false)).unwrap();
    let reqs: Vec<GenParams> = (0..3)
        .map(|i| params(prompt(i, 20 + 9 * i as usize), 5, i != 1))
        .collect();
    let ids: Vec<u64> = reqs.iter().map(|p| m.submit(p.clone())).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    let mut all = Vec::new();
    let mut steps = 0;
    while m.num_unfinished() > 0 {
        let r = m.step();
        assert!(r.ran && r.error.is_none());
        steps += 1;
        let ev = m.take_events();
        // Every step samples one token for each of the three: the streams get one delta each
        // (their last rides on `Finished`), so each step's events name every request once.
        let mut named: Vec<u64> = ev.iter().map(|(id, _)| *id).collect();
        named.sort();
        assert_eq!(
            named,
            if steps == 5 {
                vec![1, 2, 3]
            } else {
                vec![1, 3]
            },
            "step {steps}"
        );
        all.extend(ev);
    }
    assert_eq!(steps, 5, "one prefill step, then one decode step per token");
    assert!(!m.step().ran, "nothing left to run");
    assert_eq!(m.stats().generation_tokens.load(Relaxed), 15);
    m.check_invariants().unwrap();

    // The threaded loop, same requests: the same tokens.
    let t2 = Trace::default();
    let h = EngineHandle::start(config(3), mock(&t2, |_| false)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut threaded = Vec::new();
    for p in reqs {
        let (id, mut rx) = h.submit(p).unwrap();
        rt.block_on(async {
            while let Some(ev) = rx.recv().await {
                threaded.push((id, ev));
            }
        });
    }
    h.shutdown();
    assert_eq!(answers(&all), answers(&threaded));
    assert!(answers(&all).values().all(|t| t.len() == 5));
}

#[test]
fn abort_frees_the_blocks_before_it_returns_and_its_event_is_taken_next() {
    let trace = Trace::default();
    let mut m = ManualLoop::new(config(3), mock(&trace, |_| false)).unwrap();
    let id = m.submit(params(prompt(7, 40), 50, true));
    m.step();
    m.take_events();
    assert!(m.stats().kv.blocks_used.load(Relaxed) > 0);
    m.abort(id);
    assert_eq!(m.stats().kv.blocks_used.load(Relaxed), 0);
    assert_eq!(m.num_unfinished(), 0);
    m.check_invariants().unwrap();
    let ev = m.take_events();
    assert!(
        matches!(&ev[..], [(i, Event::Finished(f))] if *i == id && f.reason == FinishReason::Abort && f.error.is_none())
    );
    m.abort(id); // unknown now: ignored
    assert!(m.take_events().is_empty());
}

#[test]
fn a_failed_step_ends_its_requests_with_the_error_and_later_steps_run() {
    let trace = Trace::default();
    let mut calls = 0;
    // The second step fails; max_consecutive_failures 1 would stop a threaded loop there.
    let mut m = ManualLoop::new(
        config(u32::MAX),
        mock(&trace, move |_| {
            calls += 1;
            calls == 2
        }),
    )
    .unwrap();
    let a = m.submit(params(prompt(1, 10), 8, true));
    assert!(m.step().error.is_none());
    m.take_events();
    let r = m.step();
    assert!(r.ran);
    assert!(
        r.error
            .as_deref()
            .is_some_and(|e| e.contains("injected step failure")),
        "{r:?}"
    );
    let ev = m.take_events();
    assert!(
        matches!(&ev[..], [(i, Event::Finished(f))] if *i == a && f.reason == FinishReason::Abort
        && f.error.as_ref().is_some_and(|e| !e.engine_dead))
    );
    assert_eq!(m.stats().kv.blocks_used.load(Relaxed), 0);
    let b = m.submit(params(prompt(2, 10), 3, false));
    while m.num_unfinished() > 0 {
        assert!(m.step().error.is_none());
    }
    let ev = m.take_events();
    assert!(
        matches!(&ev[..], [(i, Event::Finished(f))] if *i == b && f.token_ids.len() == 3 && f.error.is_none())
    );
    assert!(!m.stats().dead.load(Relaxed));
}

#[test]
fn after_max_consecutive_failures_the_loop_stops_and_refuses_new_requests() {
    let trace = Trace::default();
    let mut m = ManualLoop::new(config(2), mock(&trace, |_| true)).unwrap();
    let a = m.submit(params(prompt(1, 10), 8, true));
    assert!(m.step().error.is_some());
    assert!(!m.stats().dead.load(Relaxed));
    let ev = m.take_events();
    assert!(matches!(&ev[..], [(i, Event::Finished(f))] if *i == a
        && f.error.as_ref().is_some_and(|e| !e.engine_dead)));
    let b = m.submit(params(prompt(2, 10), 8, true));
    assert!(m.step().error.is_some());
    assert!(
        m.stats().dead.load(Relaxed),
        "the second failure in a row stops it"
    );
    let ev = m.take_events();
    assert!(matches!(&ev[..], [(i, Event::Finished(f))] if *i == b
        && f.error.as_ref().is_some_and(|e| e.engine_dead)));
    let late = m.submit(params(prompt(3, 10), 8, true));
    let ev = m.take_events();
    assert!(matches!(&ev[..], [(i, Event::Finished(f))] if *i == late
        && f.error.as_ref().is_some_and(|e| e.engine_dead)));
    assert!(!m.step().ran);
    assert_eq!(trace.lock().unwrap().len(), 2, "nothing ran after the stop");
}

#[test]
fn a_sibling_waits_for_the_first_completions_prompt_and_reuses_its_blocks() {
    let trace = Trace::default();
    let mut m = ManualLoop::new(config(3), mock(&trace, |_| false)).unwrap();
    let p = prompt(3, 70);
    let first = m.submit(params(p.clone(), 4, false));
    let mut sib = params(p.clone(), 4, false);
    sib.after = Some(first);
    let second = m.submit(sib);
    let mut done = Vec::new();
    while m.num_unfinished() > 0 {
        m.step();
        done.extend(m.take_events());
    }
    let plans = trace.lock().unwrap().clone();
    assert_eq!(
        plans[0],
        vec![first],
        "the sibling is not admitted beside its parent"
    );
    assert!(plans[1].contains(&second));
    let cached = |id: u64| {
        done.iter()
            .find_map(|(i, e)| match e {
                Event::Finished(f) if *i == id => Some(f.cached_tokens),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(cached(first), 0);
    assert_eq!(
        cached(second),
        64,
        "the parent's four full blocks of 16 are reused"
    );
}

#[test]
fn an_aborted_constrained_request_leaves_no_matcher_text_or_logprob_state_behind() {
    // check_invariants covers the loop's own per-request tables too: a request that ends by abort,
    // mid-generation, with a grammar and logprobs, must leave none of them behind.
    let tok = common::tokenizer();
    let vocab = tok.get_vocab_size(true);
    let json = tok.to_string(false).unwrap();
    let comp =
        GrammarCompiler::from_tokenizer_json(json.as_bytes(), vocab, &[1], Default::default())
            .unwrap();
    let spec = GrammarSpec::parse(GrammarKind::Regex, "[a-z]{40,60}").unwrap();
    let grammar = Grammar {
        compiled: comp.compile(&spec).unwrap(),
        vocab_size: vocab,
    };
    let trace = Trace::default();
    let mut m = ManualLoop::new(config(3), mock(&trace, |_| false)).unwrap();
    let ask = |seed, stream| GenParams {
        grammar: Some(grammar.clone()),
        logprobs: Some(2),
        prompt_logprobs: Some(1),
        ignore_eos: false,
        ..params(prompt(seed, 24), 50, stream)
    };
    let (a, b) = (m.submit(ask(1, true)), m.submit(ask(2, false)));
    for _ in 0..3 {
        m.step();
        m.check_invariants().unwrap();
    }
    m.abort(a);
    m.check_invariants().unwrap();
    m.step();
    m.abort(b);
    m.check_invariants().unwrap();
    assert_eq!(m.num_unfinished(), 0);
    let aborted = m
        .take_events()
        .into_iter()
        .filter(|(_, e)| matches!(e, Event::Finished(f) if f.reason == FinishReason::Abort))
        .count();
    assert_eq!(aborted, 2);
}
