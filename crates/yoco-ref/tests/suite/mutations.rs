//! A deliberately injected off-by-one in a real scheduler's plan (slot mapping, copy length, logits
//! index) or a forgotten block-table update makes the checks fail: proof that the property tests
//! would see these bugs. Each mutation is applied at its first opportunity in a workload that passes
//! unmutated; every workload where it was applied must then fail.

use crate::common;

use common::{
    copy_length_minus_one, every, forget_dirty_rows, logits_index_minus_one, once,
    slot_mapping_plus_one,
};
use yoco_core::kv::LayerKind;
use yoco_core::sched::StepPlan;
use yoco_ref::driver::{run_mock, run_oracle, DriverOptions};
use yoco_ref::workload::{random_workload, Workload, WorkloadSpec};

#[derive(Clone, Copy)]
enum Check {
    Oracle,
    /// Mock executor with the truth's structural sampling check off: only the token streams
    /// (compared with the cache-less run) can see the bug.
    TokenStreams,
}

/// Returns (workloads where the mutation applied, messages of those that still passed).
fn apply(
    check: Check,
    seeds: std::ops::Range<u64>,
    eligible: impl Fn(&Workload) -> bool,
    m: fn(&mut StepPlan) -> bool,
) -> (usize, Vec<String>) {
    apply_with(check, seeds, eligible, m, true)
}

fn apply_with(
    check: Check,
    seeds: std::ops::Range<u64>,
    eligible: impl Fn(&Workload) -> bool,
    m: fn(&mut StepPlan) -> bool,
    first_only: bool,
) -> (usize, Vec<String>) {
    let spec = WorkloadSpec::default();
    let opts = match check {
        Check::Oracle => DriverOptions::default(),
        Check::TokenStreams => DriverOptions {
            check_sampling: false,
            ..Default::default()
        },
    };
    let run = |w: &Workload, mutate: Option<&mut dyn FnMut(&mut StepPlan) -> bool>| match check {
        Check::Oracle => run_oracle(w, &opts, mutate),
        Check::TokenStreams => run_mock(w, true, &opts, mutate),
    };
    let (mut applied, mut missed) = (0, Vec::new());
    for seed in seeds {
        let w = random_workload(seed, &spec);
        if !eligible(&w) || run(&w, None).is_err() {
            continue;
        }
        let mut first = once(m);
        let mut all = every(m);
        let mutate: &mut dyn FnMut(&mut StepPlan) -> bool =
            if first_only { &mut first } else { &mut all };
        match run(&w, Some(mutate)) {
            Ok(r) if r.mutations > 0 => {
                applied += 1;
                missed.push(format!("seed {seed}"));
            }
            Ok(_) => {}
            Err(_) => applied += 1,
        }
    }
    (applied, missed)
}

fn has_full(w: &Workload) -> bool {
    w.sched.layers.iter().any(|k| matches!(k, LayerKind::Full))
}

fn has_cross(w: &Workload) -> bool {
    w.sched
        .layers
        .iter()
        .any(|k| matches!(k, LayerKind::SharesKv { .. }))
}

fn no_aborts(w: &Workload) -> bool {
    w.abort_chance == 0.0
}

fn any(_: &Workload) -> bool {
    true
}

fn assert_all_caught((applied, missed): (usize, Vec<String>), min_applied: usize) {
    assert!(
        applied >= min_applied,
        "the mutation applied in only {applied} workloads"
    );
    assert!(
        missed.is_empty(),
        "not caught in {} of {applied} workloads: {missed:?}",
        missed.len()
    );
}

#[test]
fn oracle_catches_slot_mapping_off_by_one() {
    assert_all_caught(
        apply(Check::Oracle, 0..150, any, slot_mapping_plus_one),
        100,
    );
}

#[test]
fn oracle_catches_copy_length_off_by_one() {
    // With only sliding groups of window 1, the last copied token is never visible again, so a short
    // copy is harmless there; a full-attention group always sees it.
    assert_all_caught(
        apply(Check::Oracle, 0..400, has_full, copy_length_minus_one),
        50,
    );
}

#[test]
fn oracle_catches_logits_index_off_by_one() {
    assert_all_caught(
        apply(Check::Oracle, 0..150, any, logits_index_minus_one),
        100,
    );
}

#[test]
fn oracle_catches_logits_index_off_by_one_numerically_in_the_cross_decoder() {
    // With the structural "who samples which token" check off, the cross-decoder attention check
    // alone sees the misaligned row.
    let opts = DriverOptions {
        check_sampling: false,
        ..Default::default()
    };
    let (mut applied, mut missed) = (0, vec![]);
    for seed in 0..300 {
        let w = random_workload(seed, &WorkloadSpec::default());
        if !has_cross(&w) || run_oracle(&w, &opts, None).is_err() {
            continue;
        }
        let mut m = once(logits_index_minus_one);
        match run_oracle(&w, &opts, Some(&mut m)) {
            Err(e) => {
                applied += 1;
                assert!(
                    e.to_string()
                        .contains("the plan aligns this query at position"),
                    "seed {seed}: {e}"
                );
            }
            Ok(r) if r.mutations > 0 => {
                applied += 1;
                missed.push(seed);
            }
            Ok(_) => {}
        }
    }
    assert!(
        applied >= 30 && missed.is_empty(),
        "applied {applied}, missed {missed:?}"
    );
}

#[test]
fn oracle_catches_block_table_changes_missing_from_dirty_rows() {
    assert_all_caught(apply(Check::Oracle, 0..150, any, forget_dirty_rows), 100);
}

// Token streams see a bug only through argmax, and one corrupted key among many can leave the
// greedy token unchanged (a single-shot mutation slipped through in about 1 workload in 10), so here
// the bug is planted at every opportunity, as a real off-by-one in the scheduler would be; and
// only workloads without aborts count, since an aborted request's corrupted KV may never reach a
// sampled token (a short copy into a request aborted before its first token is invisible).

#[test]
fn token_streams_catch_slot_mapping_off_by_one() {
    assert_all_caught(
        apply_with(
            Check::TokenStreams,
            0..80,
            no_aborts,
            slot_mapping_plus_one,
            false,
        ),
        40,
    );
}

#[test]
fn token_streams_catch_copy_length_off_by_one() {
    // A short copy corrupts a single key, which stale memory fills with some other prefix's KV:
    // among dozens of keys it can leave every greedy token unchanged (2 of 99 workloads here; the
    // oracle test above catches all of them), so the token streams are held to 95%.
    let (applied, missed) = apply_with(
        Check::TokenStreams,
        0..400,
        |w| has_full(w) && no_aborts(w),
        copy_length_minus_one,
        false,
    );
    assert!(
        applied >= 50,
        "the mutation applied in only {applied} workloads"
    );
    assert!(
        missed.len() * 20 <= applied,
        "not caught in {} of {applied} workloads: {missed:?}",
        missed.len()
    );
}

#[test]
fn token_streams_catch_logits_index_off_by_one() {
    assert_all_caught(
        apply_with(
            Check::TokenStreams,
            0..80,
            no_aborts,
            logits_index_minus_one,
            false,
        ),
        40,
    );
}
