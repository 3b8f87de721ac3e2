//! Seeded randomized runs: thousands of random arrivals, aborts, finishes, pool sizes, layer layouts
//! and limits, driven with the KV-simulating mock executor. Every request must produce exactly the
//! tokens it produces alone with no cache (a sequential run), every plan must be well formed, the
//! scheduler and block manager invariants must hold after every step, and nothing may stay
//! referenced at the end.

mod common;

use std::collections::HashMap;

use common::check_plan;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yoco_core::kv::{HashExtras, LayerKind};
use yoco_core::mock::MockExecutor;
use yoco_core::sched::{
    FinishReason, NewRequest, Policy, Scheduler, SchedulerConfig, NOT_FINISHED,
};
use yoco_core::Error;

const VOCAB: u32 = 48;

#[derive(Clone, Debug)]
struct Spec {
    req: NewRequest,
    arrival: u64,
}

/// Expected output and finish reason of a request alone, from the mock's reference function and
/// vLLM's stop rules written out independently.
fn expected(mock: &MockExecutor, r: &NewRequest, max_model_len: u32) -> (Vec<u32>, u8) {
    let mut ctx = r.prompt.clone();
    let mut out = Vec::new();
    loop {
        let t = mock.reference_next(&ctx);
        ctx.push(t);
        out.push(t);
        let n = out.len() as u32;
        if n >= r.min_tokens {
            if !r.ignore_eos && r.eos_token_ids.contains(&t) {
                return (out, FinishReason::Stop as u8);
            }
            if r.stop_token_ids.contains(&t) {
                return (out, FinishReason::StopToken as u8);
            }
        }
        if n >= r.max_tokens || ctx.len() as u32 >= max_model_len {
            return (out, FinishReason::Length as u8);
        }
    }
}

fn random_config(rng: &mut StdRng) -> SchedulerConfig {
    let bs = [2u32, 4, 8, 16][rng.random_range(0..4)];
    let w = rng.random_range(2..40);
    let layers = match rng.random_range(0..4) {
        0 => vec![LayerKind::Full],
        1 => vec![
            LayerKind::Sliding { window: w },
            LayerKind::Full,
            LayerKind::SharesKv { donor: 0 },
            LayerKind::SharesKv { donor: 1 },
        ],
        2 => vec![
            LayerKind::Sliding { window: w },
            LayerKind::Sliding { window: w },
            LayerKind::Full,
            LayerKind::SharesKv { donor: 1 },
        ],
        _ => vec![LayerKind::Full, LayerKind::Sliding { window: w }],
    };
    let max_model_len = rng.random_range(24..160u32);
    let mut c = SchedulerConfig::new(layers, bs, 2).unwrap();
    c.max_model_len = max_model_len;
    c.max_num_seqs = rng.random_range(1..12);
    c.max_num_batched_tokens = rng.random_range(1..96);
    c.long_prefill_token_threshold = if rng.random_bool(0.3) {
        rng.random_range(1..32)
    } else {
        0
    };
    c.policy = if rng.random_bool(0.3) {
        Policy::Priority
    } else {
        Policy::Fcfs
    };
    c.max_admission_skips = rng.random_range(0..4);
    c.kv.enable_prefix_caching = rng.random_bool(0.8);
    c.kv.enable_events = rng.random_bool(0.2);
    let subs: Vec<u32> = (1..=bs).filter(|d| bs % d == 0).collect();
    c.kv.sub_block_size = subs[rng.random_range(0..subs.len())];
    if rng.random_bool(0.3) {
        c.token_capture_sizes = vec![1, 2, 4, 8, 16, 32, 64];
        c.cross_capture_sizes = vec![1, 2, 4, 8];
    }
    // Pools from "one longest sequence" (heavy preemption) to roomy.
    let one_seq = max_model_len.div_ceil(bs) + 1;
    let n = one_seq + rng.random_range(0..one_seq * 3);
    let groups = yoco_core::kv::kv_groups(&c.layers).unwrap().len();
    c.kv.num_blocks = (0..groups).map(|_| n + rng.random_range(0..4)).collect();
    c
}

fn random_requests(rng: &mut StdRng, c: &SchedulerConfig, n: usize) -> Vec<Spec> {
    let bases: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..rng.random_range(1..48))
                .map(|_| rng.random_range(0..VOCAB))
                .collect()
        })
        .collect();
    let mut specs: Vec<Spec> = Vec::new();
    let mut arrival = 0;
    for i in 0..n {
        arrival += rng.random_range(0..3u64);
        let mut prompt: Vec<u32> = if rng.random_bool(0.6) {
            let b = &bases[rng.random_range(0..bases.len())];
            b[..rng.random_range(1..=b.len())].to_vec()
        } else {
            Vec::new()
        };
        let extra = rng.random_range(if prompt.is_empty() { 1 } else { 0 }..24);
        prompt.extend((0..extra).map(|_| rng.random_range(0..VOCAB)));
        prompt.truncate(c.max_model_len as usize);
        let mut req = NewRequest {
            id: i as u64,
            max_tokens: rng.random_range(1..20),
            min_tokens: 0,
            eos_token_ids: if rng.random_bool(0.7) {
                vec![rng.random_range(0..VOCAB)]
            } else {
                vec![]
            },
            stop_token_ids: if rng.random_bool(0.2) {
                vec![rng.random_range(0..VOCAB)]
            } else {
                vec![]
            },
            ignore_eos: rng.random_bool(0.1),
            priority: rng.random_range(-2..3),
            hash_extras: HashExtras {
                cache_salt: if rng.random_bool(0.1) {
                    Some("salt".into())
                } else {
                    None
                },
                lora: None,
            },
            prompt_logprobs: rng.random_bool(0.1),
            after: None,
            prompt,
        };
        req.min_tokens = rng.random_range(0..=req.max_tokens.min(3));
        // n > 1 siblings: the same prompt, admitted after the parent's prompt is computed.
        if i > 0 && rng.random_bool(0.15) {
            let parent = &specs[rng.random_range(0..i)];
            req.prompt = parent.req.prompt.clone();
            req.hash_extras = parent.req.hash_extras.clone();
            req.after = Some(parent.req.id);
            arrival = arrival.max(parent.arrival);
        }
        specs.push(Spec { req, arrival });
    }
    specs
}

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
