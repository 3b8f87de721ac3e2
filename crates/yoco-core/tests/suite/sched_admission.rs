//! Admission: skip-and-continue with an aging bound (scheduler.md §12.2), `after` for n > 1 siblings.

use crate::common;

use common::*;
use yoco_core::sched::NewRequest;

/// Block size 4, 10 usable blocks. R (20-token prompt, 8 outputs) runs; X (24 tokens = 6 blocks)
/// cannot fit until R finishes; one small request (4 tokens, 1 output) arrives per step.
/// Returns, per step, (X admitted this step, small requests admitted this step).
fn skip_scenario(max_skips: u32) -> Vec<(bool, Vec<u64>)> {
    let mut c = config(4, 11);
    c.max_admission_skips = max_skips;
    let mut d = Driver::new(c);
    d.add(req(1, tokens(1, 20), 8));
    d.step();
    d.add(req(2, tokens(2, 24), 2));
    let mut log = Vec::new();
    let mut next_small = 100;
    while d.s.num_unfinished() > 0 {
        if next_small < 112 {
            d.add(req(next_small, tokens(next_small, 4), 1));
            next_small += 1;
        }
        let (p, _) = d.step();
        let x = p.admitted_ids.contains(&2);
        let small: Vec<u64> = p
            .admitted_ids
            .iter()
            .copied()
            .filter(|&id| id >= 100)
            .collect();
        log.push((x, small));
        assert!(d.steps < 100);
    }
    log
}

#[test]
fn small_requests_pass_a_blocked_one_only_for_the_aging_bound() {
    let log = skip_scenario(2);
    let x_step = log
        .iter()
        .position(|(x, _)| *x)
        .expect("X is admitted: no starvation");
    // The first two steps in which X did not fit admitted the small requests behind it ...
    assert_eq!(log[0].1, [100]);
    assert_eq!(log[1].1, [101]);
    // ... then admission stopped behind X until it fit.
    for (step, (_, small)) in log.iter().enumerate().take(x_step).skip(2) {
        assert!(
            small.is_empty(),
            "step {step} admitted {small:?} past an aged request"
        );
    }
    // R finishes in the 8th step (index 7 here): X is admitted in the next one, before the small
    // requests that waited behind it, which follow in arrival order.
    assert_eq!(x_step, 7);
    let after: Vec<u64> = log[x_step..].iter().flat_map(|(_, s)| s.clone()).collect();
    let mut sorted = after.clone();
    sorted.sort();
    assert_eq!(after, sorted, "skipped requests keep FCFS order");
    assert_eq!(after.first(), Some(&102));
}

#[test]
fn zero_skips_is_strict_head_of_line_admission() {
    let log = skip_scenario(0);
    let x_step = log.iter().position(|(x, _)| *x).unwrap();
    assert!(log[..x_step].iter().all(|(_, s)| s.is_empty()));
    assert_eq!(log[x_step].1.first(), Some(&100));
}

#[test]
fn a_sibling_waits_for_its_parents_prompt_and_then_hits_its_kv() {
    let mut d = Driver::new(config(16, 64));
    let prompt = tokens(3, 40);
    d.add(req(1, prompt.clone(), 4));
    d.add(NewRequest {
        after: Some(1),
        ..req(2, prompt.clone(), 4)
    });
    d.add(req(3, tokens(4, 8), 4));
    let (p, _) = d.step();
    assert_eq!(
        p.admitted_ids,
        [1, 3],
        "the sibling waits; later requests do not"
    );
    let (p, _) = d.step();
    assert_eq!(p.admitted_ids, [2]);
    assert_eq!(
        p.admitted_num_cached,
        [32],
        "two full blocks of the parent's prompt are reused"
    );
    d.run(20);
}

#[test]
fn a_sibling_of_an_unknown_or_finished_request_is_not_blocked() {
    let mut d = Driver::new(config(16, 64));
    d.add(NewRequest {
        after: Some(77),
        ..req(2, tokens(1, 10), 2)
    });
    let (p, _) = d.step();
    assert_eq!(p.admitted_ids, [2]);
}

/// Block 16, sub-block 4, 3 usable blocks. A (40 tokens) runs and finishes, leaving its blocks
/// cached. B shares A's first 36 tokens: the full hit (2 shared blocks + 1 sub-block copied out of
/// A's third block) would pin that source while a copy destination is allocated: 4 blocks, more
/// than the pool has. Admission trims the hit to its full blocks instead of retrying it forever.
#[test]
fn a_prefix_hit_whose_copy_cannot_fit_is_trimmed_to_its_full_blocks() {
    let mut c = config(16, 4);
    c.kv.sub_block_size = 4;
    let mut d = Driver::new(c);
    let a = tokens(1, 40);
    d.add(req(1, a.clone(), 2));
    d.run(10);
    let mut b = a[..36].to_vec();
    b.extend(tokens(2, 4));
    d.add(req(2, b.clone(), 2));
    let (p, _) = d.step();
    assert_eq!(p.admitted_ids, [2], "B is admitted on the idle pool");
    assert_eq!(
        p.admitted_num_cached,
        [32],
        "the hit keeps its 2 shared blocks and drops the copy"
    );
    assert!(p.kv_copies.is_empty());
    d.run(10);
    assert_eq!(d.s.num_unfinished(), 0);
}
