//! Seeded randomized runs: thousands of random arrivals, aborts, finishes, pool sizes, layer layouts
//! and limits, driven with the KV-simulating mock executor. Every request must produce exactly the
//! tokens it produces alone with no cache (a sequential run), every plan must be well formed, the
//! scheduler and block manager invariants must hold after every step, and nothing may stay
//! referenced at the end.

use crate::common;

use std::collections::HashMap;

use common::check_plan;
use common::random::{expected, random_config, random_requests, VOCAB};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yoco_core::mock::MockExecutor;
use yoco_core::sched::{FinishReason, NewRequest, Scheduler, NOT_FINISHED};
use yoco_core::Error;

/// One randomized run; returns (requests, steps, preemptions, prefix-hit tokens, copies, requests stopped early).
fn run(seed: u64, num_requests: usize) -> (usize, u64, u64, u64, u64, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let c = random_config(&mut rng);
    let specs = random_requests(&mut rng, &c, num_requests);
    let ctx = format!("seed {seed} config {c:?}");
    let mut s = Scheduler::new(c.clone()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let mut mock = MockExecutor::new(VOCAB).simulating_kv_of(&s);
    let mut outputs: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut reasons: HashMap<u64, u8> = HashMap::new();
    let mut gone: Vec<u64> = Vec::new(); // aborted, finished by the engine, or rejected
    let mut next = 0;
    let mut step: u64 = 0;
    let mut idle = 0;
    while next < specs.len() || s.num_unfinished() > 0 {
        while next < specs.len() && specs[next].arrival <= step {
            match s.add_request(specs[next].req.clone()) {
                Ok(()) => {}
                Err(Error::Capacity(_)) => gone.push(specs[next].req.id),
                Err(e) => panic!("{ctx}: request {next} rejected: {e}"),
            }
            next += 1;
        }
        // Aborts and engine-side finishes in any state, before scheduling.
        if rng.random_bool(0.04) && next > 0 {
            let id = rng.random_range(0..next) as u64;
            let done = if rng.random_bool(0.5) {
                s.abort(id)
            } else {
                s.finish(id, FinishReason::StopString)
            };
            if done {
                gone.push(id);
            }
        }
        let plan = s.schedule().clone();
        check_plan(&s, &plan);
        let tables: Vec<&[i32]> = (0..s.num_groups()).map(|g| s.block_table(g)).collect();
        let sampled = mock.sample(&plan, &tables).to_vec();
        // Aborts between schedule and update.
        if rng.random_bool(0.04) && plan.num_rows() > 0 {
            let id = plan.req_ids[rng.random_range(0..plan.num_rows())];
            assert!(s.abort(id));
            gone.push(id);
        }
        let out = s
            .update(&sampled)
            .unwrap_or_else(|e| panic!("{ctx}: update: {e}"));
        for k in 0..out.req_ids.len() {
            let id = out.req_ids[k];
            assert!(
                !reasons.contains_key(&id),
                "{ctx}: request {id} got a token after finishing"
            );
            outputs
                .entry(id)
                .or_default()
                .push(out.new_tokens[k] as u32);
            if out.finish_reasons[k] != NOT_FINISHED {
                reasons.insert(id, out.finish_reasons[k]);
            }
        }
        s.take_kv_events();
        if let Err(e) = s.check_invariants() {
            panic!("{ctx}: step {step}: {e}");
        }
        idle = if plan.num_rows() == 0 && s.num_unfinished() > 0 {
            idle + 1
        } else {
            0
        };
        assert!(
            idle < 3,
            "{ctx}: step {step}: nothing scheduled while {} requests wait",
            s.num_unfinished()
        );
        step += 1;
        assert!(step < 20_000, "{ctx}: no progress");
    }
    for spec in &specs {
        let id = spec.req.id;
        let (want, why) = expected(&mock, &spec.req, c.max_model_len);
        let got = outputs.get(&id).cloned().unwrap_or_default();
        if gone.contains(&id) && !reasons.contains_key(&id) {
            assert!(
                want.starts_with(&got),
                "{ctx}: request {id} (stopped early): {got:?} is not a prefix of {want:?}"
            );
        } else {
            assert_eq!(got, want, "{ctx}: request {id} {:?}", spec.req);
            assert_eq!(reasons[&id], why, "{ctx}: request {id} finish reason");
        }
    }
    for g in 0..s.num_groups() {
        assert_eq!(
            s.kv().num_free_blocks(g),
            c.kv.num_blocks[g] - 1,
            "{ctx}: group {g} leaks blocks"
        );
    }
    let st = s.stats();
    assert_eq!(st.kv.blocks_used, 0, "{ctx}");
    (
        specs.len(),
        step,
        st.num_preemptions,
        st.kv.prefix_hit_tokens,
        st.kv.copies + st.kv.adoptions,
        gone.len(),
    )
}

#[test]
fn random_arrivals_aborts_and_pools_reproduce_the_sequential_output() {
    let seeds: u64 = 300;
    let (mut total, mut steps, mut preempt, mut hits, mut copies, mut gone) = (0, 0, 0, 0, 0, 0);
    for seed in 0..seeds {
        let (n, k, p, h, c, g) = run(seed, 48);
        total += n;
        steps += k;
        preempt += p;
        hits += h;
        copies += c;
        gone += g;
    }
    eprintln!("{total} requests, {steps} steps, {preempt} preemptions, {hits} prefix-hit tokens, {copies} copies/adoptions, {gone} stopped early");
    // The runs exercise what they claim to.
    assert!(total >= 10_000, "thousands of requests: {total}");
    assert!(preempt > 100 && hits > 1000 && copies > 50 && gone > 100);
}

/// The reference function the randomized test compares with is what a sequential run gives: one
/// request at a time, prefix caching off, a roomy pool.
#[test]
fn the_reference_output_is_what_one_request_alone_produces() {
    let mut rng = StdRng::seed_from_u64(7);
    for trial in 0..40 {
        let mut c = random_config(&mut rng);
        c.kv.enable_prefix_caching = false;
        c.max_num_seqs = 1;
        let groups = c.kv.num_blocks.len();
        c.kv.num_blocks = vec![c.max_model_len.div_ceil(c.kv.block_size) + 2; groups];
        let specs = random_requests(&mut rng, &c, 6);
        let mut s = Scheduler::new(c.clone()).unwrap();
        let mut mock = MockExecutor::new(VOCAB).simulating_kv_of(&s);
        for spec in specs {
            let r = NewRequest {
                after: None,
                ..spec.req
            };
            let (want, _) = expected(&mock, &r, c.max_model_len);
            s.add_request(r.clone()).unwrap();
            let mut got = Vec::new();
            while s.num_unfinished() > 0 {
                s.schedule();
                let tables: Vec<&[i32]> = (0..s.num_groups()).map(|g| s.block_table(g)).collect();
                let sampled = mock.sample(s.plan(), &tables).to_vec();
                got.extend(
                    s.update(&sampled)
                        .unwrap()
                        .new_tokens
                        .iter()
                        .map(|&t| t as u32),
                );
            }
            assert_eq!(got, want, "trial {trial} {r:?}");
        }
    }
}
