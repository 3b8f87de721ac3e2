//! Criterion: one steady-state decode step (`schedule()` + `update()`) at N running requests, the
//! scheduler's hot path. Pure Rust, no Python. Cost should grow linearly in N. Times are thread CPU
//! time (criterion's `iter_custom`), so other processes on a shared machine do not inflate them.
//!
//! `cargo bench -p yoco-core --bench sched_decode`

#[path = "cpu_time.rs"]
mod cpu_time;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use yoco_core::kv::LayerKind;
use yoco_core::sched::{NewRequest, Scheduler, SchedulerConfig};

/// Steps per fresh scheduler: requests never finish inside a measured run.
const STEPS_PER_SETUP: u64 = 1024;

fn decoding(n: u32, layers: Vec<LayerKind>) -> Scheduler {
    let bs = 16;
    let len = 128 + STEPS_PER_SETUP as u32 + 16;
    let mut c = SchedulerConfig::new(layers, bs, n * len.div_ceil(bs) + 64).unwrap();
    c.max_num_seqs = n;
    c.max_model_len = len;
    let mut s = Scheduler::new(c).unwrap();
    for i in 0..n {
        let prompt = (0..128)
            .map(|t| 16 + (i * 7919 + t * 104_729) % 31_000)
            .collect();
        s.add_request(NewRequest {
            id: i as u64,
            prompt,
            max_tokens: len - 128,
            eos_token_ids: vec![2],
            ..Default::default()
        })
        .unwrap();
    }
    // Prefill everything, so the measured steps are pure decodes.
    while s.plan().max_query_len != 1 {
        let k = s.schedule().num_samples();
        s.update(&vec![100; k]).unwrap();
    }
    s
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_step");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    let gemma = || {
        let mut l: Vec<LayerKind> = (0..20)
            .map(|i| {
                if i % 5 == 4 {
                    LayerKind::Full
                } else {
                    LayerKind::Sliding { window: 512 }
                }
            })
            .collect();
        l.extend((20..30).map(|i| LayerKind::SharesKv {
            donor: if i % 5 == 4 { 19 } else { 18 },
        }));
        l
    };
    for (layout, layers) in [
        ("full", (|| vec![LayerKind::Full]) as fn() -> Vec<LayerKind>),
        ("gemma3n", gemma),
    ] {
        for n in [32u32, 128, 256, 512] {
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::new(layout, n), &n, |b, &n| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut left = iters;
                    let sampled = vec![100i32; n as usize];
                    while left > 0 {
                        let mut s = decoding(n, layers());
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
