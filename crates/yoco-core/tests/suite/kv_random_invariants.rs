//! Seeded randomized invariant test (TGI-style loop): a miniature scheduler drives the block manager
//! through admission (lookup + allocate), chunked prefill, decode, preemption, abort, finish,
//! multi-turn follow-ups, explicit eviction and cache resets, over tiny vocabularies that force
//! sharing, on several pool / block / sub-block / window configurations. It also executes every
//! step against a shadow KV store (per block and slot: the identity of the token prefix whose KV is
//! there), running copy ops before the step's writes like the executor does.
//!
//! After every manager call: `check_invariants` (ref counts = holders, free <=> unreferenced, index
//! map = block lists = the requests' hash chains, LRU links) plus the shadow checks: every index
//! entry points at a block whose slots really hold that sub-block's KV; no write lands in an indexed
//! slot; the events replayed as a set equal the index; budgets (sliding-window cap) hold; a
//! failed allocation changes nothing. After every step: every live request reads exactly its own
//! prefix's KV from every non-null table entry.
//!
//! `YOCO_KV_FUZZ_OPS` overrides the number of manager calls (default 1,000,000 in optimized builds,
//! 100,000 unoptimized; split over the configurations); `YOCO_KV_FUZZ_SEED` the seed.

use crate::kv_common;

use kv_common::fuzz::{configs, Harness, S_ADMIT, S_HIT, S_NOSPACE, S_PREEMPT, S_RESET, S_STEPS};

#[test]
fn random_operations_keep_every_invariant_and_every_kv_read_correct() {
    // 1,000,000 calls when optimized (`--profile ci` / `--release`: a few seconds); an unoptimized
    // `cargo test` runs a tenth of that so iterating stays quick (`yoco_optimized` comes from build.rs).
    let default_ops = if cfg!(yoco_optimized) {
        1_000_000
    } else {
        100_000
    };
    let total: u64 = std::env::var("YOCO_KV_FUZZ_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_ops);
    let seed: u64 = std::env::var("YOCO_KV_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let cfgs = configs();
    let per = total / cfgs.len() as u64;
    let mut all = [0u64; 8];
    for (i, cfg) in cfgs.iter().enumerate() {
        let mut h = Harness::new(cfg, seed.wrapping_add(i as u64));
        h.run(per);
        for (a, s) in all.iter_mut().zip(h.stats) {
            *a += s;
        }
        let met = h.m.metrics();
        if cfg.caching {
            assert!(
                met.prefix_hit_tokens > 0,
                "config {i}: the workload must produce hits"
            );
        }
        eprintln!(
            "config {i}: {} ops, {} steps, {} admissions, {} hit tokens, {} preemptions, {} no-space, {} resets, copies {} ({} tokens), adoptions {}",
            h.ops, h.stats[S_STEPS], h.stats[S_ADMIT], h.stats[S_HIT], h.stats[S_PREEMPT], h.stats[S_NOSPACE], h.stats[S_RESET], met.copies, met.copied_tokens, met.adoptions
        );
    }
    assert!(all[S_PREEMPT] > 0 && all[S_ADMIT] > 0 && all[S_RESET] > 0);
}
