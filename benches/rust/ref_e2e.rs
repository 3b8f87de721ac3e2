//! The real scheduler end to end in Rust over a fixed set of random workloads, executed by nothing
//! (the scheduler's own cost), by the plan oracle, and by the mock executor with fast prefill on and
//! off. Ratios within one run say what the checks cost relative to scheduling.
//!
//! `cargo bench -p yoco-ref --bench ref_e2e`

use criterion::{criterion_group, criterion_main, Criterion};
use yoco_ref::driver::{run_mock, run_null, run_oracle, DriverOptions};
use yoco_ref::workload::{random_workload, Workload, WorkloadSpec};

fn workloads() -> Vec<Workload> {
    (0..50).map(|s| random_workload(1_000_000 + s, &WorkloadSpec::default())).filter(|w| run_null(w).is_ok()).collect()
}

fn bench(c: &mut Criterion) {
    let ws = workloads();
    let steps: usize = ws.iter().map(|w| run_null(w).unwrap().steps).sum();
    eprintln!("{} workloads, {steps} scheduler steps per iteration", ws.len());
    let opts = DriverOptions::default();
    let mut g = c.benchmark_group("ref_e2e");
    g.sample_size(10);
    g.bench_function("scheduler_only", |b| b.iter(|| ws.iter().map(|w| run_null(w).unwrap().steps).sum::<usize>()));
    g.bench_function("scheduler_plus_oracle", |b| b.iter(|| ws.iter().map(|w| run_oracle(w, &opts, None).unwrap().steps).sum::<usize>()));
    g.bench_function("scheduler_plus_mock_fast_prefill", |b| b.iter(|| ws.iter().map(|w| run_mock(w, true, &opts, None).unwrap().steps).sum::<usize>()));
    g.bench_function("scheduler_plus_mock_full", |b| b.iter(|| ws.iter().map(|w| run_mock(w, false, &opts, None).unwrap().steps).sum::<usize>()));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
