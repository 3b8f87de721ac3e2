//! Metamorphic tests with the mock executor: whatever the scheduler does (prefix caching with
//! sub-block copy-on-match and zero-copy adoption, preemption and recompute, chunked prefill,
//! batching, fast prefill's cross-decoder selection), every request's token stream must equal the
//! stream of a cache-less, unbatched run of the same model.

use crate::common;

use common::{count, Coverage};
use yoco_core::kv::{HashExtras, KvConfig, LayerKind};
use yoco_core::sched::{NewRequest, Policy, SchedulerConfig};
use yoco_ref::driver::{mock_model, run_mock, DriverOptions, RunReport};
use yoco_ref::workload::{random_workload, Arrival, Workload, WorkloadSpec};

fn sweep(n: u64, fast_prefill: bool) -> Coverage {
    let spec = WorkloadSpec::default();
    let opts = DriverOptions::default();
    let mut cov = Coverage::default();
    let mut failures = Vec::new();
    for seed in 0..n {
        let w = random_workload(seed, &spec);
        match run_mock(&w, fast_prefill, &opts, None) {
            Ok(r) => cov.add(&w, &r),
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} workloads failed (rerun one with `YOCO_REF_TRACE=1 cargo run -p yoco-ref --profile ci --example sweep -- mock SEED 1`):\n{}",
        failures.len(),
        failures.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    cov
}

#[test]
fn token_streams_equal_the_cache_less_run_over_random_workloads() {
    let n = count("MOCK_WORKLOADS", 2_000);
    let cov = sweep(n, true);
    eprintln!("{cov:#?}");
    if n >= 2_000 {
        assert!(
            cov.copies >= 500 && cov.adoptions >= 300 && cov.preemptions >= 100,
            "{cov:?}"
        );
        assert!(cov.output_tokens >= 20_000, "{cov:?}");
    }
}

#[test]
fn token_streams_equal_the_cache_less_run_without_fast_prefill() {
    sweep(count("MOCK_FULL_WORKLOADS", 300), false);
}

/// A hand-made workload on the Gemma-like layout: 2 sliding (window 6) + 2 full producers, a
/// shared tail reading layers 2 and 3.
fn workload(
    block_size: u32,
    sub_block_size: u32,
    num_blocks: u32,
    budget: u32,
    reqs: Vec<(usize, Vec<u32>, u32)>,
) -> Workload {
    let layers = vec![
        LayerKind::Sliding { window: 6 },
        LayerKind::Full,
        LayerKind::Sliding { window: 6 },
        LayerKind::Full,
        LayerKind::SharesKv { donor: 2 },
        LayerKind::SharesKv { donor: 3 },
    ];
    let kv = KvConfig {
        block_size,
        sub_block_size,
        num_blocks: vec![num_blocks; 2],
        enable_prefix_caching: true,
        enable_events: false,
        hash_seed: None,
        max_num_batched_tokens: budget,
    };
    let sched = SchedulerConfig {
        layers,
        kv,
        max_num_seqs: 4,
        max_num_batched_tokens: budget,
        max_model_len: 96,
        long_prefill_token_threshold: 0,
        policy: Policy::Fcfs,
        max_admission_skips: 16,
        max_num_encoder_input_tokens: 8192,
        token_capture_sizes: vec![],
        cross_capture_sizes: vec![],
    };
    let arrivals = reqs
        .into_iter()
        .enumerate()
        .map(|(id, (step, prompt, max_tokens))| Arrival {
            step,
            req: NewRequest {
                id: id as u64,
                prompt,
                max_tokens,
                hash_extras: HashExtras::default(),
                ..Default::default()
            },
        })
        .collect();
    Workload {
        seed: 11,
        sched,
        vocab: 64,
        arrivals,
        abort_chance: 0.0,
        follow_up_chance: 0.0,
        max_follow_ups: 0,
    }
}

/// Runs `w` and also compares every stream with a token-by-token cache-less generation.
fn run_exact(w: &Workload) -> RunReport {
    let r = run_mock(w, true, &DriverOptions::default(), None).unwrap();
    let model = mock_model(w).unwrap();
    for s in &r.streams {
        assert_eq!(
            s.output,
            model.generate_uncached(&s.prompt, &s.stop),
            "request {}",
            s.id
        );
    }
    assert_eq!(r.finished, w.arrivals.len());
    r
}

fn base(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 64).collect()
}

#[test]
fn sub_block_copy_on_match_keeps_the_stream() {
    // A computes 13 tokens (block 8, sub-block 4); B shares 12 of them: one full block shared, one
    // sub-block copied into a fresh block.
    let a = base(13);
    let mut b = a[..12].to_vec();
    b.extend([1, 2, 3, 4, 5]);
    let r = run_exact(&workload(8, 4, 32, 64, vec![(0, a, 4), (8, b, 4)]));
    assert!(r.kv.copies >= 2, "one copy per group expected: {:?}", r.kv);
}

#[test]
fn second_turn_adopts_the_first_turns_tail_block_without_copying() {
    // Turn 2 = turn 1's prompt + answer + new text: turn 1's partial tail block holds exactly
    // turn 2's leading sub-blocks and nobody references it, so it is adopted in place.
    let a = base(21);
    let w1 = workload(8, 4, 32, 64, vec![(0, a.clone(), 3)]);
    let answer = run_exact(&w1).streams[0].output.clone();
    let mut b = a.clone();
    b.extend(&answer);
    b.extend([9, 8, 7]);
    let r = run_exact(&workload(8, 4, 32, 64, vec![(0, a, 3), (8, b, 3)]));
    assert!(r.kv.adoptions >= 1, "{:?}", r.kv);
}

#[test]
fn preemption_and_recompute_keep_the_streams() {
    // Four 30-token prompts generating 12 tokens each in a pool that holds about two of them.
    let reqs = (0..4)
        .map(|i| {
            (
                0,
                base(30 + i).iter().map(|t| (t + i as u32) % 64).collect(),
                12,
            )
        })
        .collect();
    let r = run_exact(&workload(4, 2, 20, 16, reqs));
    assert!(
        r.preemptions >= 1,
        "expected preemption under the tiny pool"
    );
}

#[test]
fn chunked_prefill_keeps_the_stream() {
    // A budget of 5 tokens splits a 40-token prompt into 8 chunks, none aligned to the block.
    let r = run_exact(&workload(
        8,
        8,
        32,
        5,
        vec![(0, base(40), 6), (0, base(23), 6)],
    ));
    assert!(r.steps >= 8);
}
