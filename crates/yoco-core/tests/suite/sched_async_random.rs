//! Seeded randomized runs of async scheduling against synchronous scheduling: the random layouts,
//! pools, limits and workloads of `sched_random.rs`, driven as the Rust step loop drives the core in
//! each mode (async: plan N+1 with `schedule_ahead`, run it, then update N; aborts before planning,
//! between planning and update, and engine finishes right after an update, as stop strings do).
//! In both modes every request must produce exactly the tokens it produces alone (so the two modes'
//! streams are identical), every plan must be well formed (placeholders included), every invariant
//! must hold after every update, and nothing may stay referenced at the end: blocks, copy pins, or
//! prefix-index entries built from KV that was not computed (the KV-simulating mock would make a
//! later hit on such an entry produce wrong tokens).

use crate::common;

use std::collections::{HashMap, HashSet, VecDeque};

use common::random::{expected, random_config, random_requests, VOCAB};
use common::{check_placeholders, check_plan};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yoco_core::mock::MockExecutor;
use yoco_core::sched::{FinishReason, Scheduler, NOT_FINISHED};
use yoco_core::Error;

/// What one run produced.
#[derive(Default)]
struct Run {
    outputs: HashMap<u64, Vec<u32>>,
    reasons: HashMap<u64, u8>,
    /// Aborted, finished by the engine, or rejected: their output may stop early.
    gone: HashSet<u64>,
    steps: u64,
    preemptions: u64,
    hits: u64,
    placeholders: u64,
    discarded: u64,
}

fn run(seed: u64, num_requests: usize, ahead: bool) -> Run {
    let mut rng = StdRng::seed_from_u64(seed);
    let c = random_config(&mut rng);
    let specs = random_requests(&mut rng, &c, num_requests);
    // The aborts draw from their own stream so both modes see the same workload.
    let mut chaos = StdRng::seed_from_u64(seed ^ 0xA5A5 ^ ahead as u64);
    let ctx = format!("seed {seed} ahead {ahead} config {c:?}");
    let mut s = Scheduler::new(c.clone()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let mut mock = MockExecutor::new(VOCAB).simulating_kv_of(&s);
    let mut r = Run::default();
    let mut in_flight: VecDeque<(Vec<i32>, Vec<u64>)> = VecDeque::new();
    let mut next = 0;
    let mut idle = 0;
    while next < specs.len() || s.num_unfinished() > 0 || !in_flight.is_empty() {
        while next < specs.len() && specs[next].arrival <= r.steps {
            match s.add_request(specs[next].req.clone()) {
                Ok(()) => {}
                Err(Error::Capacity(_)) => {
                    r.gone.insert(specs[next].req.id);
                }
                Err(e) => panic!("{ctx}: request {next} rejected: {e}"),
            }
            next += 1;
        }
        if chaos.random_bool(0.04) && next > 0 {
            let id = chaos.random_range(0..next) as u64;
            let done = if chaos.random_bool(0.5) {
                s.abort(id)
            } else {
                s.finish(id, FinishReason::StopString)
            };
            if done {
                r.gone.insert(id);
            }
        }
        // Plan: ahead of the outstanding step in async mode, after it in synchronous mode.
        if !ahead && !in_flight.is_empty() {
            unreachable!("synchronous mode updates before planning");
        }
        let prev_samples = in_flight.back().map_or(0, |f| f.0.len());
        let plan = if in_flight.is_empty() {
            s.schedule().clone()
        } else {
            s.schedule_ahead().clone()
        };
        check_plan(&s, &plan);
        check_placeholders(&plan, prev_samples);
        r.placeholders += plan.placeholder_indices.len() as u64;
        if plan.num_rows() > 0 {
            let tables: Vec<&[i32]> = (0..s.num_groups()).map(|g| s.block_table(g)).collect();
            let sampled = mock.sample(&plan, &tables).to_vec();
            in_flight.push_back((sampled, plan.req_ids.clone()));
        }
        // Abort a request of a plan in flight before its update.
        if chaos.random_bool(0.04) {
            if let Some((_, ids)) = in_flight.back() {
                let id = ids[chaos.random_range(0..ids.len())];
                if s.abort(id) {
                    r.gone.insert(id);
                }
            }
        }
        let due = in_flight.len() == 2 || (!ahead || plan.num_rows() == 0) && !in_flight.is_empty();
        if due {
            let (sampled, ids) = in_flight.pop_front().unwrap();
            let out = s
                .update(&sampled)
                .unwrap_or_else(|e| panic!("{ctx}: update: {e}"));
            let mut got: HashSet<u64> = HashSet::new();
            for k in 0..out.req_ids.len() {
                let id = out.req_ids[k];
                got.insert(id);
                assert!(
                    !r.reasons.contains_key(&id),
                    "{ctx}: request {id} got a token after finishing"
                );
                r.outputs
                    .entry(id)
                    .or_default()
                    .push(out.new_tokens[k] as u32);
                if out.finish_reasons[k] != NOT_FINISHED {
                    r.reasons.insert(id, out.finish_reasons[k]);
                }
            }
            // Rows of requests that ended before this update (finished earlier, aborted):
            // discarded, never reported.
            r.discarded += ids.iter().filter(|id| !got.contains(id)).count() as u64;
            // A stop string matched after this update: the engine finishes a running request.
            if chaos.random_bool(0.03) && !out.req_ids.is_empty() {
                let k = chaos.random_range(0..out.req_ids.len());
                let id = out.req_ids[k];
                if out.finish_reasons[k] == NOT_FINISHED && s.finish(id, FinishReason::StopString) {
                    r.gone.insert(id);
                }
            }
            s.take_kv_events();
            if let Err(e) = s.check_invariants() {
                panic!("{ctx}: step {}: {e}", r.steps);
            }
        }
        idle = if plan.num_rows() == 0 && in_flight.is_empty() && s.num_unfinished() > 0 {
            idle + 1
        } else {
            0
        };
        assert!(
            idle < 3,
            "{ctx}: step {}: nothing scheduled while {} requests wait",
            r.steps,
            s.num_unfinished()
        );
        r.steps += 1;
        assert!(r.steps < 20_000, "{ctx}: no progress");
    }
    for spec in &specs {
        let id = spec.req.id;
        let (want, why) = expected(&mock, &spec.req, c.max_model_len);
        let got = r.outputs.get(&id).cloned().unwrap_or_default();
        if r.gone.contains(&id) && !r.reasons.contains_key(&id) {
            assert!(
                want.starts_with(&got),
                "{ctx}: request {id} (stopped early): {got:?} is not a prefix of {want:?}"
            );
        } else {
            assert_eq!(got, want, "{ctx}: request {id} {:?}", spec.req);
            assert_eq!(r.reasons[&id], why, "{ctx}: request {id} finish reason");
        }
    }
    for g in 0..s.num_groups() {
        assert_eq!(
            s.kv().num_free_blocks(g),
            c.kv.num_blocks[g] - 1,
            "{ctx}: group {g} leaks blocks"
        );
    }
    s.check_invariants().unwrap();
    let st = s.stats();
    assert_eq!(st.kv.blocks_used, 0, "{ctx}");
    assert!(!s.awaiting_update());
    r.preemptions = st.num_preemptions;
    r.hits = st.kv.prefix_hit_tokens;
    r
}

#[test]
fn async_and_synchronous_scheduling_give_the_same_tokens_and_leak_nothing() {
    let (mut steps, mut preempt, mut hits, mut holes, mut discarded, mut compared) =
        (0, 0, 0, 0, 0, 0);
    let mut sync_hits = 0;
    for seed in 0..150 {
        let sync = run(seed, 40, false);
        let asy = run(seed, 40, true);
        assert_eq!(sync.placeholders, 0);
        // Both match the reference on their own; where neither stopped a request early, the
        // streams are the same, finish reasons included.
        for (id, out) in &sync.outputs {
            if sync.gone.contains(id) || asy.gone.contains(id) {
                continue;
            }
            assert_eq!(asy.outputs.get(id), Some(out), "seed {seed} request {id}");
            assert_eq!(asy.reasons.get(id), sync.reasons.get(id));
            compared += 1;
        }
        sync_hits += sync.hits;
        steps += asy.steps;
        preempt += asy.preemptions;
        hits += asy.hits;
        holes += asy.placeholders;
        discarded += asy.discarded;
    }
    eprintln!(
        "{compared} requests compared; async: {steps} steps, {holes} placeholders, {discarded} \
         discarded rows, {preempt} preemptions, {hits} prefix-hit tokens (sync: {sync_hits})"
    );
    // The runs exercise what they claim to.
    assert!(compared >= 3000, "{compared}");
    assert!(holes > 10_000 && discarded > 500 && preempt > 50 && hits > 1000);
    // Planning ahead of an update must not lose the prefix cache: the index gets the same KV
    // (scheduling differs between the modes, so the totals differ a little, not by a factor).
    assert!(
        hits as f64 >= 0.9 * sync_hits as f64,
        "async {hits} vs sync {sync_hits} prefix-hit tokens"
    );
}
