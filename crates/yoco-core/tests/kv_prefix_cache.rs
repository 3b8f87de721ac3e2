//! Prefix-cache manager scenarios (scheduler.md §10.3-10.4), block size 16, sub-block 16 unless
//! stated. Adapted to deferred indexing: a block becomes matchable only after the step that wrote
//! it executed, so each scenario calls `execute` (commit) where vLLM would have cached at schedule
//! time.

mod kv_common;
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
        assert_eq!(m.indexed_hashes(0, b), &r0.sub_block_hashes()[b as usize - 1..b as usize]);
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
    assert_eq!(r2.table(0), &[1, 2, 3, 5], "the partial block is reused from the head");
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
