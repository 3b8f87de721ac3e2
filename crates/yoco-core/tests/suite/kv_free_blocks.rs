//! `KvManager::free_blocks`: recompute preemption returns a request's blocks exactly as `free`
//! does but keeps its hash chain, so resuming it does not rehash its history.

use crate::kv_common;

use kv_common::*;
use yoco_core::kv::*;

/// Sliding window 8 + full attention, block 4, sub-block 2: a hybrid model in miniature.
fn hybrid() -> KvManager {
    let mut c = KvConfig::new(4, vec![24, 24]);
    c.sub_block_size = 2;
    c.enable_events = true;
    mgr_with(&[LayerKind::Sliding { window: 8 }, LayerKind::Full], c)
}

/// Prefill 13 tokens, then decode 6 more (allocate, commit, append, hash), as the scheduler does.
fn running(m: &mut KvManager, tokens: &mut Vec<u32>) -> SeqKv {
    let mut s = seq(m, tokens);
    prefill(m, &mut s, tokens.len());
    for t in 0..6 {
        let nc = tokens.len();
        tokens.push(100 + t);
        m.hash_tokens(&mut s, tokens);
        m.allocate(&mut s, None, nc, 1, 0).unwrap();
        execute(m, &mut s, nc + 1);
    }
    s
}

#[test]
fn free_blocks_returns_blocks_like_free_and_keeps_the_chain() {
    let prompt: Vec<u32> = (0..13).collect();
    let (mut a, mut b) = (hybrid(), hybrid());
    let (mut ta, mut tb) = (prompt.clone(), prompt.clone());
    let sa = running(&mut a, &mut ta);
    let mut sb = running(&mut b, &mut tb);
    let chain = sb.sub_block_hashes().to_vec();
    assert_eq!(chain.len(), 9, "19 tokens, sub-block 2");
    a.take_events();
    b.take_events();

    // The preemption: `free` + a fresh state rehashed from the tokens, or `free_blocks`.
    a.free(sa);
    let mut sa = seq(&a, &ta);
    b.free_blocks(&mut sb);
    for g in 0..2 {
        assert_eq!(
            a.free_block_ids(g),
            b.free_block_ids(g),
            "group {g} LRU order"
        );
        assert!(sb.table(g).is_empty());
    }
    assert_eq!(a.metrics(), b.metrics());
    assert_eq!(a.take_events(), b.take_events());
    assert_eq!(sb.sub_block_hashes(), &chain[..], "the chain is kept");
    assert_eq!(sb.sub_block_hashes(), sa.sub_block_hashes());
    assert_eq!(sb.num_committed_tokens(), 0);
    assert!(!sb.holds_blocks());
    b.check_invariants([&sb]).unwrap();

    // Resuming: hashing again adds nothing; admission hits the cached prefix the same way, and
    // counts as a new admission in the prefix metrics.
    b.hash_tokens(&mut sb, &tb);
    assert_eq!(sb.sub_block_hashes(), &chain[..]);
    let ha = admit(&mut a, &mut sa, ta.len()).unwrap();
    let hb = admit(&mut b, &mut sb, tb.len()).unwrap();
    assert_eq!((ha, hb), (18, 18), "all but the last sub-block hit");
    for g in 0..2 {
        assert_eq!(sa.table(g), sb.table(g));
    }
    assert_eq!(a.metrics(), b.metrics());
    assert_eq!(a.take_copy_ops(), b.take_copy_ops());
    b.check_invariants([&sb]).unwrap();
    a.release_copy_sources();
    b.release_copy_sources();
    a.free(sa);
    b.free(sb);
    assert_eq!(a.metrics(), b.metrics());
}
