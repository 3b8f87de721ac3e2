//! KV block manager benches: prefix lookup and admission allocation for a 32k-token prompt
//! (block/sub-block 4096/128 and 16/16, plus a full + sliding-512 hybrid at 16/16), hashing a 32k
//! prompt, and free / evict-on-allocate at 10k blocks.
//!
//! `cargo bench -p yoco-core --bench kv_block_manager` (add `-- lookup` etc. to filter).

use std::cell::RefCell;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use yoco_core::kv::*;

const PROMPT: usize = 32 * 1024;
const SHARED: usize = 30_000;

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) % 50_000)
        .collect()
}

fn manager(layers: &[LayerKind], bs: u32, sbs: u32, blocks: u32) -> KvManager {
    let mut c = KvConfig::new(bs, vec![blocks; kv_groups(layers).unwrap().len()]);
    c.sub_block_size = sbs;
    KvManager::new(kv_groups(layers).unwrap(), c).unwrap()
}

fn seq(m: &KvManager, t: &[u32]) -> SeqKv {
    let mut s = m.new_seq(HashExtras::default(), false);
    m.hash_tokens(&mut s, t);
    s
}

/// A manager whose cache holds a finished 32k request; returns it and a prompt sharing 30k tokens.
fn cached(layers: &[LayerKind], bs: u32, sbs: u32) -> (KvManager, Vec<u32>) {
    let blocks = 3 * (PROMPT as u32).div_ceil(bs) + 4;
    let mut m = manager(layers, bs, sbs, blocks);
    let a = tokens(1, PROMPT);
    let mut s = seq(&m, &a);
    m.allocate(&mut s, None, 0, PROMPT, PROMPT).unwrap();
    m.commit_computed(&mut s, PROMPT);
    m.free(s);
    let mut b = a[..SHARED].to_vec();
    b.extend(tokens(2, PROMPT - SHARED));
    (m, b)
}

fn configs() -> Vec<(&'static str, Vec<LayerKind>, u32, u32)> {
    vec![
        ("4096_128", vec![LayerKind::Full], 4096, 128),
        ("16_16", vec![LayerKind::Full], 16, 16),
        (
            "hybrid_swa512_16_16",
            vec![LayerKind::Full, LayerKind::Sliding { window: 512 }],
            16,
            16,
        ),
    ]
}

fn bench_hash(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_hash_32k");
    for (name, layers, bs, sbs) in configs().into_iter().take(2) {
        let m = manager(&layers, bs, sbs, 16);
        let t = tokens(3, PROMPT);
        g.bench_function(name, |b| {
            b.iter_batched(
                || m.new_seq(HashExtras::default(), false),
                |mut s| {
                    m.hash_tokens(&mut s, black_box(&t));
                    s
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn bench_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_lookup_32k");
    for (name, layers, bs, sbs) in configs() {
        let (m, b) = cached(&layers, bs, sbs);
        let s = seq(&m, &b);
        let hit = m.lookup(&s, PROMPT).expect("hit");
        assert!(hit.num_tokens as usize >= SHARED - sbs as usize);
        g.bench_function(name, |bch| bch.iter(|| m.lookup(black_box(&s), PROMPT)));
        let mut m = m;
        m.free(s);
    }
    g.finish();
}

/// Admission of the 32k prompt with its 30k hit: shares full blocks, copies the partial one,
/// allocates the rest. The previous iteration's request is freed in the (untimed) setup.
fn bench_allocate(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_allocate_32k_hit");
    for (name, layers, bs, sbs) in configs() {
        let (m, b) = cached(&layers, bs, sbs);
        let state = RefCell::new((m, None::<SeqKv>));
        g.bench_function(name, |bch| {
            bch.iter_batched(
                || {
                    let (m, prev) = &mut *state.borrow_mut();
                    if let Some(p) = prev.take() {
                        m.take_copy_ops();
                        m.release_copy_sources();
                        m.free(p);
                    }
                    let s = seq(m, &b);
                    let hit = m.lookup(&s, PROMPT).unwrap();
                    (s, hit)
                },
                |(mut s, hit)| {
                    let (m, prev) = &mut *state.borrow_mut();
                    let n = hit.num_tokens as usize;
                    m.allocate(&mut s, Some(&hit), n, PROMPT - n, PROMPT)
                        .unwrap();
                    *prev = Some(s);
                },
                BatchSize::PerIteration,
            )
        });
        let (mut m, prev) = state.into_inner();
        if let Some(p) = prev {
            m.free(p);
        }
    }
    g.finish();
}

const BIG: u32 = 10_000;

/// Freeing a request that holds 10k blocks (all indexed: they go to the LRU tail).
fn bench_free(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_10k_blocks");
    let t = tokens(4, BIG as usize * 16);
    let state = RefCell::new(manager(&[LayerKind::Full], 16, 16, BIG + 1));
    g.bench_function("free", |bch| {
        bch.iter_batched(
            || {
                let m = &mut *state.borrow_mut();
                let mut s = seq(m, &t);
                m.allocate(&mut s, None, 0, t.len(), t.len()).unwrap();
                m.commit_computed(&mut s, t.len());
                s
            },
            |s| state.borrow_mut().free(s),
            BatchSize::PerIteration,
        )
    });
    // allocating 10k blocks when every free block holds cached KV: each one is evicted
    let other = tokens(5, BIG as usize * 16);
    let prev = RefCell::new(None::<SeqKv>);
    g.bench_function("allocate_evicting", |bch| {
        bch.iter_batched(
            || {
                let m = &mut *state.borrow_mut();
                if let Some(p) = prev.borrow_mut().take() {
                    m.free(p);
                }
                // fill the cache: a 10k-block request, executed and freed
                let mut s = seq(m, &t);
                m.allocate(&mut s, None, 0, t.len(), t.len()).unwrap();
                m.commit_computed(&mut s, t.len());
                m.free(s);
                assert_eq!(m.metrics().blocks_cached, BIG as u64);
                let mut s = m.new_seq(HashExtras::default(), false);
                m.hash_tokens(&mut s, &other);
                s
            },
            |mut s| {
                let m = &mut *state.borrow_mut();
                m.allocate(&mut s, None, 0, other.len(), other.len())
                    .unwrap();
                *prev.borrow_mut() = Some(s);
            },
            BatchSize::PerIteration,
        )
    });
    if let Some(p) = prev.into_inner() {
        state.borrow_mut().free(p);
    }
    g.finish();
}

fn short() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = short(); targets = bench_hash, bench_lookup, bench_allocate, bench_free }
criterion_main!(benches);
