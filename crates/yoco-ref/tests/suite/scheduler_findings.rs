//! Scheduler behaviour the random workloads found wrong, pinned as small deterministic cases.

use crate::common;

use yoco_ref::driver::{run_oracle, DriverOptions};

/// A 3-block pool (block 16, sub-block 4). A computes 40 tokens and finishes, leaving its blocks
/// cached. B shares A's first 36 tokens: the hit is 2 full blocks plus one sub-block, whose copy
/// needs a fresh block while the source stays pinned: 4 blocks, more than the pool has. B alone
/// fits in the pool (3 blocks) without the hit, so it must be admitted (recompute, or the
/// full-block part of the hit only), not wait forever with the pool empty.
#[test]
fn prefix_hit_whose_copy_cannot_fit_still_admits() {
    let r = run_oracle(
        &common::unfittable_hit_workload(),
        &DriverOptions::default(),
        None,
    )
    .unwrap();
    assert_eq!(r.finished, 2);
}
