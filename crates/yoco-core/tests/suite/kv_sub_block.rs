//! Sub-block prefix caching: RBLN's checklist (scheduler.md §11.6, block 8 / sub-block 4 unless
//! stated), copy-on-match, zero-copy adoption, and DESIGN.md §1's worked example.
//!
//! Adapted to this design: (1) indexing is deferred until the step executed, so every scenario
//! "executes" (commits) before the next request looks up; (2) a partial match whose source is an
//! unreferenced block holding exactly the matched sub-blocks is *adopted* (no copy), where RBLN
//! would copy; scenarios that pin RBLN's copy behaviour use a source that holds more sub-blocks
//! than matched, or one still referenced.

use crate::kv_common;
use kv_common::*;
use yoco_core::kv::*;

fn m8() -> KvManager {
    full_mgr(8, 4, 16)
}

#[test]
fn first_request_has_no_hit_and_indexes_its_blocks_after_execution() {
    // SB-3
    let mut m = m8();
    let t: Vec<u32> = (0..16).collect();
    let mut r = seq(&m, &t);
    assert!(m.lookup(&r, 16).is_none());
    admit(&mut m, &mut r, 16).unwrap();
    assert!(m.take_copy_ops().is_empty());
    assert_eq!(
        m.num_indexed_hashes(0),
        0,
        "nothing is indexed before the step executed"
    );
    m.commit_computed(&mut r, 16);
    m.release_copy_sources();
    assert_eq!(m.indexed_hashes(0, 1).len(), 2);
    assert_eq!(m.indexed_hashes(0, 2).len(), 2);
    m.free(r);
}

#[test]
fn a_match_ending_inside_a_block_is_copied_into_a_private_block() {
    // SB-4: cache [0..8), new request [0..4) + 8 new tokens -> 4 tokens copied.
    let mut m = m8();
    let mut r0 = seq(&m, &(0..8).collect::<Vec<u32>>());
    prefill(&mut m, &mut r0, 8);
    m.free(r0);
    let t1 = cat(&[&[0, 1, 2, 3], &run(50, 8)]);
    let mut r1 = seq(&m, &t1);
    let hit = m.lookup(&r1, 12).unwrap();
    assert_eq!((hit.num_tokens, hit.num_shared_tokens(8)), (4, 0));
    m.allocate(&mut r1, Some(&hit), 4, 8, 12).unwrap();
    let ops = m.take_copy_ops();
    assert_eq!(
        ops,
        vec![CopyOp {
            group: 0,
            src: 1,
            dst: r1.table(0)[0],
            num_tokens: 4
        }]
    );
    assert_ne!(ops[0].src, ops[0].dst);
    assert_eq!(r1.table(0).len(), 2);
    m.commit_computed(&mut r1, 12);
    m.release_copy_sources();
    assert_eq!(
        m.indexed_hashes(0, r1.table(0)[0])[0],
        r1.sub_block_hashes()[0],
        "the copy is indexed after the step"
    );
    let k = m.metrics();
    assert_eq!((k.copies, k.copied_tokens, k.adoptions), (1, 4, 0));
    m.check_invariants([&r1]).unwrap();
    m.free(r1);
}

#[test]
fn full_block_hits_are_shared_and_matching_continues_in_the_next_block() {
    // SB-5: identical first block -> 8 shared, then one more sub-block copied -> 8 + 4.
    let mut m = m8();
    let t0: Vec<u32> = (0..16).collect();
    let mut r0 = seq(&m, &t0);
    prefill(&mut m, &mut r0, 16);
    let t1 = cat(&[&t0[..12], &run(90, 5)]);
    let mut r1 = seq(&m, &t1);
    let hit = m.lookup(&r1, 17).unwrap();
    assert_eq!((hit.num_tokens, hit.num_shared_tokens(8)), (12, 8));
    m.allocate(&mut r1, Some(&hit), 12, 5, 17).unwrap();
    assert_eq!(r1.table(0)[0], 1, "full block shared");
    assert_eq!(m.ref_count(0, 1), 2);
    let ops = m.take_copy_ops();
    assert_eq!(
        ops,
        vec![CopyOp {
            group: 0,
            src: 2,
            dst: r1.table(0)[1],
            num_tokens: 4
        }]
    );
    // an identical full first block alone is a pure share: no copy op
    let mut r2 = seq(&m, &cat(&[&t0[..8], &run(91, 3)]));
    let (h, ops) = prefill(&mut m, &mut r2, 11);
    assert_eq!(h, 8);
    assert!(ops.is_empty());
    m.release_copy_sources();
    m.check_invariants([&r0, &r1, &r2]).unwrap();
    for r in [r0, r1, r2] {
        m.free(r);
    }
}

#[test]
fn eviction_under_pressure_removes_blocks_from_the_index_and_drain_empties_ops() {
    // SB-6
    let mut m = full_mgr(8, 4, 3);
    let mut r0 = seq(&m, &(0..16).collect::<Vec<u32>>());
    prefill(&mut m, &mut r0, 16);
    m.free(r0);
    assert_eq!(m.num_indexed_hashes(0), 4);
    let mut r1 = seq(&m, &run(77, 9));
    admit(&mut m, &mut r1, 9).unwrap();
    assert_eq!(
        m.num_indexed_hashes(0),
        0,
        "both cached blocks were evicted for r1"
    );
    assert!(m.take_copy_ops().is_empty());
    m.free(r1);
}

#[test]
fn failed_allocation_after_a_match_leaves_the_source_untouched() {
    // SB-7: lookup pins nothing; a failed allocate changes nothing.
    let mut m = full_mgr(8, 4, 3);
    let mut r0 = seq(&m, &(0..8).collect::<Vec<u32>>());
    prefill(&mut m, &mut r0, 8);
    let mut r1 = seq(&m, &cat(&[&[0, 1, 2, 3], &run(9, 20)]));
    let hit = m.lookup(&r1, 24).unwrap();
    assert_eq!(hit.num_tokens, 4);
    assert_eq!(m.allocate(&mut r1, Some(&hit), 4, 20, 24), Err(NoSpace));
    assert_eq!(m.ref_count(0, 1), 1);
    assert!(m.take_copy_ops().is_empty());
    m.check_invariants([&r0, &r1]).unwrap();
    m.free(r0);
    m.free(r1);
}

#[test]
fn a_finished_requests_partial_tail_stays_indexed_and_is_kept_longest() {
    // SB-8: 12 tokens = 1 full block + 1 sub-block.
    let mut m = m8();
    let t: Vec<u32> = (0..12).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 12);
    assert_eq!(
        m.indexed_hashes(0, 2),
        &r0.sub_block_hashes()[2..3],
        "the running tail is indexed"
    );
    m.free(r0);
    assert_eq!(m.indexed_hashes(0, 2).len(), 1, "still indexed after free");
    let free = m.free_block_ids(0);
    assert_eq!(
        &free[free.len() - 2..],
        &[2, 1],
        "retained at the LRU tail, not reused first"
    );
    // a request sharing the 12 tokens and diverging: 8 shared + 4 from the tail (adopted here)
    let mut r1 = seq(&m, &cat(&[&t, &run(40, 6)]));
    let (hit, ops) = prefill(&mut m, &mut r1, 18);
    assert_eq!(hit, 12);
    assert!(ops.is_empty());
    assert_eq!(r1.table(0)[..2], [1, 2]);
    assert_eq!(m.metrics().adoptions, 1);
    m.free(r1);
    // a request whose last block is full adds no index entries on free
    let mut m = m8();
    let mut r = seq(&m, &(0..16).collect::<Vec<u32>>());
    prefill(&mut m, &mut r, 16);
    let n = m.num_indexed_hashes(0);
    m.free(r);
    assert_eq!(m.num_indexed_hashes(0), n);
}

#[test]
fn hits_never_cover_the_last_token() {
    // SB-9
    let mut m = m8();
    let t: Vec<u32> = (0..8).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 8);
    let r = seq(&m, &cat(&[&t, &[100, 101]]));
    assert_eq!(m.lookup(&r, 10).unwrap().num_tokens, 8);
    let r2 = seq(&m, &cat(&[&t, &[100, 101, 102, 103]]));
    assert!(m.lookup(&r2, 12).unwrap().num_tokens <= 11);
    m.free(r0);
    m.free(r);
    m.free(r2);
    // bs 16, sbs 4, a cached 12-token partial block
    let mut m = full_mgr(16, 4, 8);
    let t: Vec<u32> = (0..12).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 12);
    m.free(r0);
    let same = seq(&m, &t);
    assert_eq!(
        m.lookup(&same, 12).unwrap().num_tokens,
        8,
        "3 sub-blocks capped to 11 / 4 = 2"
    );
    let short = seq(&m, &t[..4]);
    assert!(m.lookup(&short, 4).is_none(), "3 / 4 = 0 sub-blocks");
    m.free(same);
    m.free(short);
}

#[test]
fn only_complete_sub_blocks_of_a_partial_block_are_indexed() {
    // SB-10
    let mut m = m8();
    let mut r = seq(&m, &(0..3).collect::<Vec<u32>>());
    prefill(&mut m, &mut r, 3);
    assert_eq!(m.num_indexed_hashes(0), 0);
    m.free(r);
    let mut m = full_mgr(16, 4, 8);
    let mut r = seq(&m, &(0..14).collect::<Vec<u32>>());
    prefill(&mut m, &mut r, 14);
    assert_eq!(m.indexed_hashes(0, 1).len(), 3);
    m.free(r);
}

#[test]
fn copy_sources_stay_pinned_until_released_after_execution() {
    // SB-11: a tiny pool; the source survives allocation pressure while pinned. The source holds
    // 2 sub-blocks and the match is 1, so it is copied (not adopted).
    let mut m = full_mgr(8, 4, 4); // 3 usable blocks
    let mut r0 = seq(&m, &(0..8).collect::<Vec<u32>>());
    prefill(&mut m, &mut r0, 8);
    m.free(r0);
    assert_eq!(m.ref_count(0, 1), 0);
    let mut r1 = seq(&m, &cat(&[&[0, 1, 2, 3], &run(5, 3)]));
    let hit = m.lookup(&r1, 7).unwrap();
    m.allocate(&mut r1, Some(&hit), 4, 3, 7).unwrap();
    assert_eq!(
        m.ref_count(0, 1),
        1,
        "the source is pinned by the queued op"
    );
    let ops = m.take_copy_ops();
    assert_eq!(ops.len(), 1);
    assert_eq!(
        m.ref_count(0, 1),
        1,
        "still pinned after the ops were taken"
    );
    // pressure: one free block left, the pinned source is not among them
    assert_eq!(m.free_block_ids(0), vec![3]);
    let mut r2 = seq(&m, &run(8, 16));
    assert_eq!(
        admit(&mut m, &mut r2, 16),
        Err(NoSpace),
        "the pinned source cannot be evicted"
    );
    m.check_invariants([&r1, &r2]).unwrap();
    m.commit_computed(&mut r1, 7);
    m.release_copy_sources();
    assert_eq!(m.ref_count(0, 1), 0);
    assert_eq!(m.free_block_ids(0), vec![3, 1]);
    // now (step executed) the source may be evicted and reused: a 2-block request takes it
    admit(&mut m, &mut r2, 16).unwrap();
    assert_eq!(r2.table(0), &[3, 1]);
    m.check_invariants([&r1, &r2]).unwrap();
    m.free(r1);
    m.free(r2);
}

#[test]
fn a_running_requests_tail_becomes_matchable_and_grows_during_decode() {
    // SB-12
    let mut m = full_mgr(16, 4, 8);
    let mut toks: Vec<u32> = (0..21).collect();
    let mut r = seq(&m, &toks);
    prefill(&mut m, &mut r, 21);
    assert_eq!(m.indexed_hashes(0, 1).len(), 4);
    assert_eq!(
        m.indexed_hashes(0, 2).len(),
        1,
        "tail: 1 complete sub-block of 5 tokens"
    );
    for step in 0..11 {
        let n = toks.len();
        toks.push(1000 + step);
        m.hash_tokens(&mut r, &toks);
        m.allocate(&mut r, None, n, 1, 0).unwrap();
        execute(&mut m, &mut r, n + 1);
        assert_eq!(m.indexed_hashes(0, 2).len(), ((n + 1 - 16) / 4).min(4));
    }
    assert_eq!(
        m.indexed_hashes(0, 2),
        &r.sub_block_hashes()[4..8],
        "the block filled: indexing complete"
    );
    let probe = seq(&m, &cat(&[&toks[..28], &[7]]));
    assert_eq!(
        m.lookup(&probe, 29).unwrap().num_tokens,
        28,
        "visible before the request finishes"
    );
    m.check_invariants([&r, &probe]).unwrap();
    m.free(r);
    m.free(probe);
}

#[test]
fn a_fully_cached_one_block_prompt_reuses_all_but_the_last_sub_block() {
    // SB-13: upstream would reuse 0 (block-aligned hits capped at num_tokens - 1).
    let mut m = m8();
    let t: Vec<u32> = (0..8).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 8);
    let r1 = seq(&m, &t);
    assert_eq!(m.lookup(&r1, 8).unwrap().num_tokens, 4);
    let mut up = full_mgr(8, 8, 16);
    let mut u0 = seq(&up, &t);
    prefill(&mut up, &mut u0, 8);
    assert!(up.lookup(&seq(&up, &t), 8).is_none());
    m.free(r0);
    m.free(r1);
    up.free(u0);
}

#[test]
fn prompt_logprobs_salts_and_loras_never_match_across_namespaces() {
    // SB-14
    let mut m = m8();
    let t: Vec<u32> = (0..12).collect();
    let with = |m: &KvManager, e: HashExtras, skip: bool| {
        let mut s = m.new_seq(e, skip);
        m.hash_tokens(&mut s, &t);
        s
    };
    let salt = |s: &str| HashExtras {
        cache_salt: Some(s.into()),
        lora: None,
    };
    let lora = |s: &str| HashExtras {
        cache_salt: None,
        lora: Some((s.into(), format!("/{s}"))),
    };
    for a in [salt("A"), lora("A")] {
        let mut r0 = with(&m, a.clone(), false);
        prefill(&mut m, &mut r0, 12);
        let probe = with(&m, a.clone(), false);
        assert_eq!(
            m.lookup(&probe, 12).map(|h| h.num_tokens),
            Some(8),
            "same namespace matches"
        );
        m.free(probe);
        m.free(r0);
    }
    // and the negative cases, each against a cache holding only the other namespace
    for (a, b) in [
        (salt("A"), salt("B")),
        (salt("A"), HashExtras::default()),
        (lora("A"), lora("B")),
    ] {
        let mut m = m8();
        let mut r0 = with(&m, a, false);
        prefill(&mut m, &mut r0, 12);
        let probe = with(&m, b, false);
        assert!(m.lookup(&probe, 12).is_none());
        m.free(probe);
        m.free(r0);
    }
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 12);
    let plp = with(&m, HashExtras::default(), true);
    assert!(
        m.lookup(&plp, 12).is_none(),
        "prompt logprobs never read the cache"
    );
    m.free(plp);
    m.free(r0);
}

#[test]
fn a_same_step_sibling_never_matches_unwritten_kv() {
    // SB-15: two overlapping prefills scheduled in the same step; the second gets no match. After
    // the step, a third matches.
    let mut m = m8();
    let a: Vec<u32> = (0..12).collect();
    let mut r1 = seq(&m, &a);
    admit(&mut m, &mut r1, 12).unwrap();
    let mut r2 = seq(&m, &cat(&[&a[..4], &run(60, 8)]));
    assert!(m.lookup(&r2, 12).is_none());
    admit(&mut m, &mut r2, 12).unwrap();
    assert!(m.take_copy_ops().is_empty());
    m.commit_computed(&mut r1, 12);
    m.commit_computed(&mut r2, 12);
    m.release_copy_sources();
    let r3 = seq(&m, &cat(&[&a[..4], &run(61, 8)]));
    assert_eq!(m.lookup(&r3, 12).unwrap().num_tokens, 4);
    for r in [r1, r2, r3] {
        m.free(r);
    }
}

#[test]
fn multi_group_hits_copy_once_per_group_and_take_the_minimum_extension() {
    // SB-16: full + sliding, same block/sub-block sizes (8/4).
    let mut c = KvConfig::new(8, vec![16, 16]);
    c.sub_block_size = 4;
    let mut m = mgr_with(&[LayerKind::Full, LayerKind::Sliding { window: 4 }], c);
    let t: Vec<u32> = (0..20).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 20);
    assert_eq!(m.num_indexed_hashes(0), 5);
    assert_eq!(m.num_indexed_hashes(1), 5, "both indices populated");
    let mut r1 = seq(&m, &cat(&[&t[..12], &run(70, 4)]));
    let hit = m.lookup(&r1, 16).unwrap();
    assert_eq!(hit.num_tokens, 12);
    m.allocate(&mut r1, Some(&hit), 12, 4, 16).unwrap();
    let ops = m.take_copy_ops();
    assert_eq!(ops.len(), 2, "one copy op per group");
    assert_eq!(ops.iter().map(|o| o.group).collect::<Vec<_>>(), vec![0, 1]);
    assert!(ops.iter().all(|o| o.num_tokens == 4));
    // the window (4) needs tokens [9, 12): sliding block 0 is not needed
    assert_eq!(r1.table(1)[0], NULL_BLOCK);
    assert_ne!(r1.table(0)[0], NULL_BLOCK);
    m.commit_computed(&mut r1, 16);
    m.release_copy_sources();
    // the extension is the minimum over groups: drop the sliding group's tail block
    let sliding_tail = r0.table(1)[2];
    let full_tail = r0.table(0)[2];
    m.free(r0);
    // partial tails (1 sub-block of 4 tokens) of both groups stay indexed after free
    assert_eq!(m.indexed_hashes(0, full_tail).len(), 1);
    assert_eq!(m.indexed_hashes(1, sliding_tail).len(), 1);
    let probe = seq(&m, &cat(&[&t, &[5]]));
    assert_eq!(m.lookup(&probe, 21).unwrap().num_tokens, 20);
    m.evict_cached_blocks(1, &[sliding_tail]);
    assert_eq!(
        m.lookup(&probe, 21).unwrap().num_tokens,
        16,
        "the full group alone could serve 20"
    );
    // reset clears all groups
    m.free(r1);
    m.free(probe);
    assert!(m.reset_prefix_cache());
    assert_eq!(m.num_indexed_hashes(0) + m.num_indexed_hashes(1), 0);
}

#[test]
fn multi_turn_chat_adopts_the_previous_turns_tail_without_copying() {
    // SB-17's multi-turn case, with page-layout adoption (RBLN I5b): turn 2 = turn 1 prompt +
    // output + new text hits turn 1's blocks; the partial tail is handed over, 0 copies.
    let mut m = full_mgr(16, 4, 32);
    let mut turn: Vec<u32> = (0..21).collect();
    let mut r = seq(&m, &turn);
    prefill(&mut m, &mut r, 21);
    for i in 0..6 {
        // decode 6 tokens
        let n = turn.len();
        turn.push(500 + i);
        m.hash_tokens(&mut r, &turn);
        m.allocate(&mut r, None, n, 1, 0).unwrap();
        execute(&mut m, &mut r, n + 1);
    }
    let tail = r.table(0)[1];
    m.free(r);
    // turn 2: 27 previous tokens (the last output token has no KV yet: 26 computed) + new text
    let turn2 = cat(&[&turn, &run(9, 10)]);
    let mut r2 = seq(&m, &turn2);
    let (hit, ops) = prefill(&mut m, &mut r2, turn2.len());
    assert_eq!(hit, 24, "1 full block + 2 sub-blocks of the tail");
    assert!(ops.is_empty(), "adopted, not copied");
    assert_eq!(r2.table(0)[1], tail);
    assert_eq!(m.metrics().adoptions, 1);
    assert_eq!(m.metrics().copies, 0);
    m.check_invariants([&r2]).unwrap();
    m.free(r2);
}

#[test]
fn adoption_needs_an_unreferenced_block_holding_exactly_the_match() {
    let mut m = full_mgr(16, 4, 32);
    let t: Vec<u32> = (0..24).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 24);
    // r0 still runs: its tail (2 sub-blocks) is referenced -> copy
    let mut r1 = seq(&m, &cat(&[&t, &[1, 2, 3]]));
    let (hit, ops) = prefill(&mut m, &mut r1, 27);
    assert_eq!(hit, 24);
    assert_eq!(ops.len(), 1);
    m.free(r1);
    m.free(r0);
    // now unreferenced, but the match is shorter than what the block holds -> copy
    let mut r2 = seq(&m, &cat(&[&t[..20], &[1, 2, 3]]));
    let (hit, ops) = prefill(&mut m, &mut r2, 23);
    assert_eq!(hit, 20);
    assert_eq!(ops.len(), 1);
    // exactly the block's sub-blocks, unreferenced -> adopted (the copy r2 made holds only 1)
    let mut r3 = seq(&m, &cat(&[&t, &[4, 5]]));
    let (hit, ops) = prefill(&mut m, &mut r3, 26);
    assert_eq!(hit, 24);
    assert!(ops.is_empty());
    m.check_invariants([&r2, &r3]).unwrap();
    m.free(r2);
    m.free(r3);
}

#[test]
fn speculative_preallocation_never_indexes_uncomputed_slots() {
    // SB-17: blocks allocated ahead are indexed only up to what the step computed.
    let mut m = full_mgr(8, 4, 16);
    let t: Vec<u32> = (0..24).collect();
    let mut r = seq(&m, &t);
    admit(&mut m, &mut r, 24).unwrap();
    m.commit_computed(&mut r, 10);
    assert_eq!(m.num_indexed_hashes(0), 2);
    assert!(m.indexed_hashes(0, r.table(0)[2]).is_empty());
    m.free(r);
    assert_eq!(
        m.num_indexed_hashes(0),
        2,
        "free indexes only committed tokens"
    );
}

#[test]
fn design_worked_example_reuses_2944_of_3000_tokens_by_copy_on_match() {
    // DESIGN.md §1: block 4096, sub-block 128, a cached 3000-token prefix shared by a longer prompt.
    // The cached request continued past the shared prefix (its block holds more sub-blocks than
    // match), so the 23 matching sub-blocks are copied: 2944 reused, 56 recomputed.
    let prefix: Vec<u32> = (0..3000).map(|i| i % 1000).collect();
    let a = cat(&[&prefix, &run(7, 1000)]);
    let b = cat(&[&prefix, &run(8, 2000)]);
    let mut m = full_mgr(4096, 128, 8);
    let mut ra = seq(&m, &a);
    prefill(&mut m, &mut ra, a.len());
    m.free(ra);
    let mut rb = seq(&m, &b);
    let (hit, ops) = prefill(&mut m, &mut rb, b.len());
    assert_eq!(hit, 2944);
    assert_eq!(3000 - hit, 56);
    assert_eq!(
        ops,
        vec![CopyOp {
            group: 0,
            src: 1,
            dst: rb.table(0)[0],
            num_tokens: 2944
        }]
    );
    m.free(rb);
    // upstream full-block matching reuses nothing
    let mut up = full_mgr(4096, 4096, 8);
    let mut ra = seq(&up, &a);
    prefill(&mut up, &mut ra, a.len());
    up.free(ra);
    let rb = seq(&up, &b);
    assert!(up.lookup(&rb, b.len()).is_none());
    up.free(rb);
    // and when the cached request ended exactly at the prefix, its tail is adopted: no copy at all
    let mut m = full_mgr(4096, 128, 8);
    let mut ra = seq(&m, &prefix);
    prefill(&mut m, &mut ra, 3000);
    m.free(ra);
    let mut rb = seq(&m, &b);
    let (hit, ops) = prefill(&mut m, &mut rb, b.len());
    assert_eq!((hit, ops.len(), m.metrics().adoptions), (2944, 0, 1));
    m.free(rb);
}
