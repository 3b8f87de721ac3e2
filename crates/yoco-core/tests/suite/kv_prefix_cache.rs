//! Prefix-cache manager scenarios (scheduler.md §10.3-10.4), block size 16, sub-block 16 unless
//! stated. Adapted to deferred indexing: a block becomes matchable only after the step that wrote
//! it executed, so each scenario calls `execute` (commit) where vLLM would have cached at schedule
//! time.

use crate::kv_common;
use kv_common::*;
use yoco_core::kv::*;

fn common() -> Vec<u32> {
    cat(&[&run(0, 16), &run(1, 16), &run(2, 16)])
}

#[test]
fn prefill_shares_full_blocks_and_frees_in_lru_order() {
    // PC-1 (test_prefill, pool 11)
    let mut m = full_mgr(16, 16, 11);
    let t0 = cat(&[&common(), &run(3, 7)]);
    let mut r0 = seq(&m, &t0);
    assert_eq!(r0.sub_block_hashes().len(), 3);
    assert_eq!(prefill(&mut m, &mut r0, 55).0, 0);
    assert_eq!(r0.table(0), &[1, 2, 3, 4]);
    for b in 1..=3 {
        assert_eq!(
            m.indexed_hashes(0, b),
            &r0.sub_block_hashes()[b as usize - 1..b as usize]
        );
        assert_eq!(m.ref_count(0, b), 1);
    }
    assert!(m.indexed_hashes(0, 4).is_empty());

    let t1 = cat(&[&common(), &run(4, 5)]);
    let mut r1 = seq(&m, &t1);
    assert_eq!(prefill(&mut m, &mut r1, 53).0, 48);
    assert_eq!(r1.table(0), &[1, 2, 3, 5]);
    for b in 1..=3 {
        assert_eq!(m.ref_count(0, b), 2);
    }
    assert_eq!(m.num_free_blocks(0), 5);
    m.check_invariants([&r0, &r1]).unwrap();

    m.free(r0);
    m.free(r1);
    assert_eq!(m.free_block_ids(0), vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);

    let t2 = cat(&[&common(), &run(5, 6)]);
    let mut r2 = seq(&m, &t2);
    assert_eq!(prefill(&mut m, &mut r2, 54).0, 48);
    assert_eq!(
        r2.table(0),
        &[1, 2, 3, 5],
        "the partial block is reused from the head"
    );
    assert_eq!(m.num_free_blocks(0), 6);
    m.free(r2);

    let t3 = run(9, 160);
    let mut r3 = seq(&m, &t3);
    assert_eq!(prefill(&mut m, &mut r3, 160).0, 0);
    assert_eq!(r3.table(0), &[5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
    assert_eq!(m.num_free_blocks(0), 0);
    m.check_invariants([&r3]).unwrap();
    m.free(r3);
}

#[test]
fn prompt_logprobs_request_writes_the_cache_but_never_reads_it() {
    // PC-2: skip_prefix_read
    let mut m = full_mgr(16, 16, 11);
    let t0 = cat(&[&common(), &run(3, 7)]);
    let mut r0 = m.new_seq(HashExtras::default(), true);
    m.hash_tokens(&mut r0, &t0);
    assert_eq!(prefill(&mut m, &mut r0, 55).0, 0);
    assert_eq!(m.indexed_hashes(0, 3).len(), 1, "r0 still writes the cache");
    let mut r1 = seq(&m, &cat(&[&common(), &run(4, 5)]));
    assert_eq!(
        prefill(&mut m, &mut r1, 53).0,
        48,
        "a normal request reads r0's blocks"
    );
    let mut r2 = m.new_seq(HashExtras::default(), true);
    m.hash_tokens(&mut r2, &cat(&[&common(), &run(5, 6)]));
    assert!(m.lookup(&r2, 54).is_none());
    assert_eq!(prefill(&mut m, &mut r2, 54).0, 0);
    assert_eq!(r2.table(0), &[6, 7, 8, 9]);
    for b in 6..=8u32 {
        assert_eq!(m.ref_count(0, b), 1);
        assert_eq!(
            m.indexed_hashes(0, b),
            m.indexed_hashes(0, b - 5),
            "duplicate holders are allowed"
        );
        assert_eq!(m.holders(0, &m.indexed_hashes(0, b)[0]).len(), 2);
    }
    m.check_invariants([&r0, &r1, &r2]).unwrap();
    for r in [r0, r1, r2] {
        m.free(r);
    }
}

#[test]
fn decode_fills_the_last_block_then_takes_exactly_one_more() {
    // PC-3
    let mut m = full_mgr(16, 16, 11);
    let mut toks = cat(&[&common(), &run(3, 7)]);
    let mut r = seq(&m, &toks);
    prefill(&mut m, &mut r, 55);
    assert_eq!(r.table(0), &[1, 2, 3, 4]);
    toks.extend(run(3, 4));
    m.hash_tokens(&mut r, &toks);
    let a = m.allocate(&mut r, None, 55, 4, 0).unwrap();
    assert_eq!(a.num_new_blocks, 0);
    execute(&mut m, &mut r, 59);
    assert!(
        m.indexed_hashes(0, 4).is_empty(),
        "59 tokens: the last block is still partial"
    );
    toks.extend(run(3, 19));
    m.hash_tokens(&mut r, &toks);
    let a = m.allocate(&mut r, None, 59, 19, 0).unwrap();
    assert_eq!(a.num_new_blocks, 1);
    assert_eq!(r.table(0), &[1, 2, 3, 4, 5]);
    execute(&mut m, &mut r, 78);
    assert_eq!(
        m.indexed_hashes(0, 4),
        &r.sub_block_hashes()[3..4],
        "the previous last block is now cached"
    );
    assert!(m.indexed_hashes(0, 5).is_empty());
    m.check_invariants([&r]).unwrap();
    m.free(r);
}

#[test]
fn freed_requests_queue_partial_blocks_first_and_cached_blocks_tail_first() {
    // PC-4 (pool 11)
    let mut m = full_mgr(16, 16, 11);
    let t0: Vec<u32> = (0..87).collect();
    let mut r0 = seq(&m, &t0);
    prefill(&mut m, &mut r0, 87);
    assert_eq!(r0.table(0), &[1, 2, 3, 4, 5, 6]);
    let mut r1 = seq(&m, &(100..148).collect::<Vec<u32>>());
    prefill(&mut m, &mut r1, 48);
    assert_eq!(r1.table(0), &[7, 8, 9]);
    assert_eq!(m.num_free_blocks(0), 1);
    m.free(r0);
    assert_eq!(m.free_block_ids(0), vec![6, 10, 5, 4, 3, 2, 1]);
    m.free(r1);
    assert_eq!(m.free_block_ids(0), vec![6, 10, 5, 4, 3, 2, 1, 9, 8, 7]);
    let mut r2 = seq(&m, &t0[..35]);
    assert_eq!(prefill(&mut m, &mut r2, 35).0, 32);
    assert_eq!(r2.table(0), &[1, 2, 6]);
    assert_eq!(m.num_free_blocks(0), 7);
    m.free(r2);
}

#[test]
fn a_reused_cached_block_loses_its_hash() {
    // PC-5 (pool 2)
    let mut m = full_mgr(16, 16, 2);
    let mut r0 = seq(&m, &run(1, 16));
    prefill(&mut m, &mut r0, 16);
    assert_eq!(m.indexed_hashes(0, 1).len(), 1);
    m.free(r0);
    assert_eq!(m.metrics().blocks_cached, 1);
    let mut r1 = seq(&m, &run(2, 15));
    admit(&mut m, &mut r1, 15).unwrap();
    assert_eq!(r1.table(0), &[1]);
    assert!(m.indexed_hashes(0, 1).is_empty());
    assert_eq!(m.num_indexed_hashes(0), 0);
    m.free(r1);
}

#[test]
fn hit_blocks_are_not_the_ones_evicted_for_the_same_request() {
    // PC-6 (pool 3)
    let mut m = full_mgr(16, 16, 3);
    let t: Vec<u32> = (0..32).collect();
    let mut r0 = seq(&m, &t[..16]);
    prefill(&mut m, &mut r0, 16);
    let mut r1 = seq(&m, &t[16..]);
    prefill(&mut m, &mut r1, 16);
    m.free(r0);
    m.free(r1);
    let mut r2 = seq(&m, &t);
    assert_eq!(prefill(&mut m, &mut r2, 32).0, 16);
    assert_eq!(r2.table(0), &[1, 2]);
    m.free(r2);
}

#[test]
fn caching_disabled_never_hits_and_runs_out_of_blocks() {
    // PC-7 (bs 4, pool 5)
    let mut c = KvConfig::new(4, vec![5]);
    c.enable_prefix_caching = false;
    let mut m = mgr_with(&[LayerKind::Full], c);
    let t: Vec<u32> = (0..16).collect();
    let mut r0 = seq(&m, &t[..10]);
    prefill(&mut m, &mut r0, 10);
    assert_eq!(r0.table(0), &[1, 2, 3]);
    m.free(r0);
    let mut r1 = seq(&m, &t);
    assert!(m.lookup(&r1, 16).is_none());
    assert_eq!(prefill(&mut m, &mut r1, 16).0, 0);
    assert_eq!(r1.table(0).len(), 4);
    let mut r2 = seq(&m, &t[..4]);
    assert_eq!(admit(&mut m, &mut r2, 4), Err(NoSpace));
    assert_eq!(
        m.metrics().prefix_query_tokens,
        0,
        "no queries are counted with caching off"
    );
    m.check_invariants([&r1, &r2]).unwrap();
    m.free(r1);
    m.free(r2);
}

#[test]
fn cache_salt_separates_namespaces() {
    // PC-9
    let mut m = full_mgr(16, 16, 20);
    let t = cat(&[&common(), &run(7, 3)]);
    let salted = |m: &KvManager, s: &str| {
        let mut q = m.new_seq(
            HashExtras {
                cache_salt: Some(s.into()),
                lora: None,
            },
            false,
        );
        m.hash_tokens(&mut q, &t);
        q
    };
    let mut r0 = salted(&m, "a");
    prefill(&mut m, &mut r0, 51);
    assert_eq!(
        m.lookup(&salted(&m, "a"), 51).map(|h| h.num_tokens),
        Some(48)
    );
    assert!(m.lookup(&salted(&m, "b"), 51).is_none());
    assert!(m.lookup(&seq(&m, &t), 51).is_none());
    // the salt enters only the first sub-block's hash (it is still in every later hash through the chain)
    let (a, b) = (salted(&m, "a"), salted(&m, "b"));
    assert_ne!(a.sub_block_hashes()[1], b.sub_block_hashes()[1]);
    m.free(r0);
}

#[test]
fn failed_admission_with_hits_leaves_ref_counts_unchanged() {
    // PC-10 (pool 11)
    let mut m = full_mgr(16, 16, 11);
    let t1: Vec<u32> = cat(&[&common(), &run(3, 16), &run(4, 16), &run(5, 16)]);
    let mut r0 = seq(&m, &t1[..48]);
    prefill(&mut m, &mut r0, 48);
    let mut r1 = seq(&m, &t1);
    assert_eq!(prefill(&mut m, &mut r1, 96).0, 48);
    assert_eq!(r1.table(0), &[1, 2, 3, 4, 5, 6]);
    m.free(r1);
    for b in 1..=3 {
        assert_eq!(m.ref_count(0, b), 1);
    }
    let mut r2 = seq(&m, &run(9, 32));
    prefill(&mut m, &mut r2, 32);
    assert_eq!(m.num_free_blocks(0), 5);
    let t3 = cat(&[&t1, &run(6, 16), &run(7, 16), &run(8, 16)]);
    let mut r3 = seq(&m, &t3);
    let hit = m.lookup(&r3, 144).unwrap();
    assert_eq!(hit.num_tokens, 96, "3 live + 3 free cached blocks");
    let before: Vec<u32> = (1..=10).map(|b| m.ref_count(0, b)).collect();
    let free_before = m.free_block_ids(0);
    assert_eq!(
        m.allocate(&mut r3, Some(&hit), 96, 48, 144),
        Err(NoSpace),
        "3 new + 3 evictable hit blocks > 5 free"
    );
    assert_eq!(
        (1..=10).map(|b| m.ref_count(0, b)).collect::<Vec<_>>(),
        before
    );
    assert_eq!(m.free_block_ids(0), free_before);
    assert!(r3.table(0).is_empty());
    m.check_invariants([&r0, &r2, &r3]).unwrap();
    for r in [r0, r2, r3] {
        m.free(r);
    }
}

#[test]
fn reset_fails_while_blocks_are_held_then_clears_every_hash() {
    // PC-11
    let mut m = full_mgr(16, 16, 11);
    let mut r0 = seq(&m, &cat(&[&common(), &run(3, 7)]));
    prefill(&mut m, &mut r0, 55);
    assert!(!m.reset_prefix_cache());
    assert_eq!(
        m.num_indexed_hashes(0),
        3,
        "a failed reset leaves the index alone"
    );
    m.free(r0);
    assert!(m.reset_prefix_cache());
    assert_eq!(m.num_indexed_hashes(0), 0);
    assert!((1..11).all(|b| m.indexed_hashes(0, b).is_empty()));
    assert_eq!(m.metrics().blocks_cached, 0);
    m.check_invariants([]).unwrap();
    let mut r1 = seq(&m, &cat(&[&common(), &run(3, 7)]));
    assert!(m.lookup(&r1, 55).is_none());
    prefill(&mut m, &mut r1, 55);
    m.free(r1);
}

#[test]
fn cached_sub_blocks_accumulate_as_blocks_fill() {
    // MAP-4 (14-token request, bs 4): caching 2 blocks adds 2 keys, a third adds 1.
    let mut m = full_mgr(4, 4, 8);
    let t: Vec<u32> = (0..14).collect();
    let mut r = seq(&m, &t);
    admit(&mut m, &mut r, 14).unwrap();
    m.commit_computed(&mut r, 8);
    assert_eq!(m.num_indexed_hashes(0), 2);
    m.commit_computed(&mut r, 12);
    assert_eq!(m.num_indexed_hashes(0), 3);
    m.commit_computed(&mut r, 14);
    assert_eq!(m.num_indexed_hashes(0), 3);
    m.free(r);
}

#[test]
fn a_multi_group_hit_needs_every_group() {
    // MAP-4 multi-group: a hash hits only when both groups hold it.
    let mut c = KvConfig::new(4, vec![8, 8]);
    c.sub_block_size = 4;
    let mut m = mgr_with(&[LayerKind::Full, LayerKind::Sliding { window: 64 }], c);
    let t: Vec<u32> = (0..13).collect();
    let mut r = seq(&m, &t);
    prefill(&mut m, &mut r, 12);
    m.free(r);
    let r2 = seq(&m, &t);
    assert_eq!(m.lookup(&r2, 13).unwrap().num_tokens, 12);
    // drop block 3 (tokens 8..12) of the sliding group only: the full group alone cannot serve 12
    m.evict_cached_blocks(1, &[3]);
    assert_eq!(m.lookup(&r2, 13).unwrap().num_tokens, 8);
    m.evict_cached_blocks(0, &[1]);
    assert!(m.lookup(&r2, 13).is_none());
    m.check_invariants([&r2]).unwrap();
    m.free(r2);
}

#[test]
fn prefix_metrics_count_each_admission_once() {
    let mut m = full_mgr(16, 16, 11);
    let t = cat(&[&common(), &run(3, 7)]);
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 55);
    let mut r1 = seq(&m, &t);
    prefill(&mut m, &mut r1, 55);
    let k = m.metrics();
    assert_eq!((k.prefix_query_tokens, k.prefix_hit_tokens), (110, 48));
    assert_eq!(
        (
            k.blocks_total,
            k.blocks_used,
            k.blocks_free,
            k.blocks_cached
        ),
        (10, 5, 5, 0)
    );
    m.free(r0);
    m.free(r1);
    let k = m.metrics();
    assert_eq!((k.blocks_used, k.blocks_free, k.blocks_cached), (0, 10, 3));
}
