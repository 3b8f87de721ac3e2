//! The real scheduler and block manager over random workloads; after every step, every query's
//! attention over paged memory must equal attention over its request's contiguous history (1e-6),
//! and every cross-decoder row must attend to exactly the keys at or before its own position.

use crate::common;

use common::{count, Coverage};
use yoco_ref::driver::{run_oracle, DriverOptions};
use yoco_ref::workload::{random_workload, WorkloadSpec};

#[test]
fn paged_attention_equals_contiguous_attention_over_random_workloads() {
    let n = count("ORACLE_WORKLOADS", 10_000);
    let spec = WorkloadSpec::default();
    let opts = DriverOptions::default();
    let mut cov = Coverage::default();
    let mut failures = Vec::new();
    for seed in 0..n {
        let w = random_workload(seed, &spec);
        match run_oracle(&w, &opts, None) {
            Ok(r) => cov.add(&w, &r),
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} workloads failed (rerun one with `YOCO_REF_TRACE=1 cargo run -p yoco-ref --profile ci --example sweep -- oracle SEED 1`):\n{}",
        failures.len(),
        failures.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    eprintln!("{cov:#?}");
    if n >= 10_000 {
        // The run is not vacuous: every mechanism the issue names was exercised many times.
        assert!(cov.copies >= 5_000, "copy-on-match: {cov:?}");
        assert!(cov.adoptions >= 2_000, "zero-copy adoption: {cov:?}");
        assert!(cov.cached_admissions >= 10_000, "prefix hits: {cov:?}");
        assert!(cov.preemptions >= 500, "preemption: {cov:?}");
        assert!(cov.aborted >= 1_000, "aborts: {cov:?}");
        assert!(cov.follow_ups >= 5_000, "multi-turn follow-ups: {cov:?}");
        assert!(cov.windowed_queries >= 100_000, "sliding windows: {cov:?}");
        assert!(cov.cross_checks >= 50_000, "cross-decoder rows: {cov:?}");
        assert!(
            cov.sub_block_workloads >= 5_000 && cov.shared_kv_workloads >= 2_000,
            "{cov:?}"
        );
    }
}
