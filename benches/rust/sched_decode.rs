//! Criterion: one steady-state decode step (`schedule()` + `update()`) at N running requests, the
//! scheduler's hot path. Pure Rust, no Python. Cost should grow linearly in N. Times are thread CPU
//! time (criterion's `iter_custom`), so other processes on a shared machine do not inflate them.
//!
//! `cargo bench -p yoco-core --bench sched_decode`

#[path = "cpu_time.rs"]
mod cpu_time;
#[path = "decode_setup.rs"]
mod decode_setup;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use decode_setup::{decoding, full, gemma3n};
use yoco_core::kv::LayerKind;

/// Steps per fresh scheduler: requests never finish inside a measured run.
const STEPS_PER_SETUP: u64 = 1024;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_step");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    for (layout, layers) in [
        ("full", full as fn() -> Vec<LayerKind>),
        ("gemma3n", gemma3n),
    ] {
        for n in [32u32, 128, 256, 512] {
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::new(layout, n), &n, |b, &n| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut left = iters;
                    let sampled = vec![100i32; n as usize];
                    while left > 0 {
                        let mut s = decoding(n, STEPS_PER_SETUP as u32, layers());
                        let k = left.min(STEPS_PER_SETUP);
                        let t = cpu_time::thread_ns();
                        for _ in 0..k {
                            s.schedule();
                            s.update(&sampled).unwrap();
                        }
                        total += Duration::from_nanos(cpu_time::thread_ns() - t);
                        left -= k;
                    }
                    total
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
