//! Sliding-window groups (scheduler.md §6.2-6.3, §10.5): which blocks a hit needs, which blocks a
//! running request releases, the admission cap, and hybrid (full + sliding) hits. Each group has its
//! own pool here, so block ids are per group (vLLM shares one id space).

use crate::kv_common;
use kv_common::*;
use yoco_core::kv::*;

/// One sliding group, W 4, block 2 = sub-block 2, with the blocks of a cached `pattern.len()`-block
/// prefix present where `pattern` is true. Returns the manager, the prompt tokens and the ids the
/// prefix's blocks had.
fn swa_pattern(pattern: &[bool]) -> (KvManager, Vec<u32>, Vec<BlockId>) {
    let c = KvConfig::new(2, vec![64]);
    let mut m = mgr_with(&[LayerKind::Sliding { window: 4 }], c);
    let n = pattern.len() * 2;
    let t: Vec<u32> = (0..n as u32).collect();
    let mut r = seq(&m, &t);
    prefill(&mut m, &mut r, n);
    let ids = r.table(0).to_vec();
    m.free(r);
    let gone: Vec<BlockId> = ids
        .iter()
        .zip(pattern)
        .filter(|(_, &p)| !p)
        .map(|(&b, _)| b)
        .collect();
    m.evict_cached_blocks(0, &gone);
    (m, t, ids)
}

#[test]
fn sliding_hits_need_only_the_blocks_in_the_window_before_the_hit() {
    // ST-1 (bs 2, W 4: a hit needs the 2 blocks before it)
    const T: bool = true;
    const F: bool = false;
    let cases: Vec<(Vec<bool>, usize)> = vec![
        (vec![F; 10], 0),
        (vec![T], 1),
        (vec![T, F], 1),
        (vec![T, T], 2),
        (vec![T, T, F], 2),
        (vec![T, T, T], 3),
        (vec![T, T, T, F], 3),
        (vec![T, T, F, T, F, F, T, T, F, T, T, T], 12),
        (vec![T, T, F, T, F, F, T, T, F, F, F], 8),
    ];
    for (pattern, want_blocks) in cases {
        let (mut m, mut t, ids) = swa_pattern(&pattern);
        t.push(9999); // room for the whole pattern under the num_tokens - 1 cap
        let mut r = seq(&m, &t);
        let hit = m.lookup(&r, t.len());
        assert_eq!(
            hit.as_ref().map_or(0, |h| h.num_tokens as usize),
            want_blocks * 2,
            "{pattern:?}"
        );
        if let Some(hit) = hit {
            m.allocate(&mut r, Some(&hit), hit.num_tokens as usize, 1, t.len())
                .unwrap();
            let tab = r.table(0);
            let skip = want_blocks.saturating_sub(2);
            assert!(
                tab[..skip].iter().all(|&b| b == NULL_BLOCK),
                "{pattern:?}: {tab:?}"
            );
            assert_eq!(
                &tab[skip..want_blocks],
                &ids[skip..want_blocks],
                "{pattern:?}"
            );
        }
        m.check_invariants([&r]).unwrap();
        m.free(r);
    }
}

#[test]
fn running_requests_release_blocks_the_window_can_no_longer_reach() {
    // ST-4 (bs 2, W 4): computed 4 -> nothing; 5 -> block 0; 6 -> block 0; 7 -> blocks 0-1;
    // 11 -> blocks 0-3.
    let c = KvConfig::new(2, vec![32]);
    let mut m = mgr_with(&[LayerKind::Sliding { window: 4 }], c);
    let t: Vec<u32> = (0..12).collect();
    let mut r = seq(&m, &t);
    m.allocate(&mut r, None, 0, 4, 12).unwrap();
    m.commit_computed(&mut r, 4);
    let mut ids = r.table(0).to_vec();
    for (computed, nulls) in [(4, 0), (5, 1), (6, 1), (7, 2), (11, 4)] {
        ids.resize(r.table(0).len(), NULL_BLOCK);
        for (i, &b) in r.table(0).iter().enumerate() {
            if b != NULL_BLOCK {
                ids[i] = b;
            }
        }
        m.allocate(&mut r, None, computed, 1, 0).unwrap();
        m.commit_computed(&mut r, computed + 1);
        let tab = r.table(0);
        let n = tab.iter().take_while(|&&b| b == NULL_BLOCK).count();
        assert_eq!(n, nulls, "computed {computed}: {tab:?}");
        m.check_invariants([&r]).unwrap();
    }
    // the released blocks are cached (indexed), so they went to the LRU tail in release order:
    // block 0 (at 5), block 1 (at 7), then blocks 3 and 2 together (at 11), longer prefix first
    let free = m.free_block_ids(0);
    assert_eq!(&free[free.len() - 4..], &[ids[0], ids[1], ids[3], ids[2]]);
    m.free(r);
}

#[test]
fn window_release_frees_the_longer_prefix_first() {
    let c = KvConfig::new(2, vec![32]);
    let mut m = mgr_with(&[LayerKind::Sliding { window: 4 }], c);
    let t: Vec<u32> = (0..8).collect();
    let mut r = seq(&m, &t);
    prefill(&mut m, &mut r, 7);
    let ids = r.table(0).to_vec();
    m.allocate(&mut r, None, 7, 1, 0).unwrap(); // skips 4 tokens: blocks 0 and 1 at once
    let free = m.free_block_ids(0);
    assert_eq!(
        &free[free.len() - 2..],
        &[ids[1], ids[0]],
        "block 1 (longer prefix) is evicted first"
    );
    m.free(r);
}

#[test]
fn an_evictable_hit_block_consumes_free_capacity_once() {
    // ST-6: a free cached hit block costs one free block (touching it takes it off the queue), the
    // new block another; after allocation the table has 2 entries, 1 of them newly allocated.
    let mut m = full_mgr(16, 16, 3);
    let t: Vec<u32> = (0..32).collect();
    let mut r0 = seq(&m, &t[..16]);
    prefill(&mut m, &mut r0, 16);
    m.free(r0);
    let mut other = seq(&m, &run(5, 3));
    prefill(&mut m, &mut other, 3);
    assert_eq!(m.num_free_blocks(0), 1);
    let mut r1 = seq(&m, &t[..20]);
    assert_eq!(admit(&mut m, &mut r1, 20), Err(NoSpace));
    m.free(other);
    let hit = m.lookup(&r1, 20).unwrap();
    let a = m.allocate(&mut r1, Some(&hit), 16, 4, 20).unwrap();
    assert_eq!(a.num_new_blocks, 1);
    assert_eq!(r1.table(0).len(), 2);
    assert_eq!(m.num_free_blocks(0), 0);
    m.free(r1);
}

#[test]
fn null_entries_and_live_hit_blocks_cost_no_free_blocks() {
    // ST-5 adapted: a sliding hit whose out-of-window entries are null and whose in-window blocks
    // are held by a running request needs free blocks only for the new tokens.
    let c = KvConfig::new(2, vec![8]);
    let mut m = mgr_with(&[LayerKind::Sliding { window: 4 }], c);
    let t: Vec<u32> = (0..20).collect();
    let mut r0 = seq(&m, &t[..12]);
    // prefill in chunks of 4 so the early blocks are released and only 3 stay live
    for c0 in (0..12).step_by(4) {
        m.allocate(&mut r0, None, c0, 4, if c0 == 0 { 12 } else { 0 })
            .unwrap();
        m.commit_computed(&mut r0, c0 + 4);
    }
    let live = r0.num_live_blocks(0);
    let mut r1 = seq(&m, &t[..13]);
    let hit = m.lookup(&r1, 13).unwrap();
    assert_eq!(hit.num_tokens, 12);
    let free = m.num_free_blocks(0);
    m.allocate(&mut r1, Some(&hit), 12, 1, 13).unwrap();
    assert_eq!(
        free - m.num_free_blocks(0),
        1,
        "only the block for token 12 ({live} live blocks shared)"
    );
    assert!(r1.table(0)[..4].iter().all(|&b| b == NULL_BLOCK));
    m.check_invariants([&r0, &r1]).unwrap();
    m.free(r0);
    m.free(r1);
}

#[test]
fn long_prompts_are_admitted_on_pools_sized_for_the_window() {
    // ST-7 / issue #39734: W 8, block 4, 8 tokens per step -> at most ceil((7 + 8) / 4) + 1 = 5
    // live blocks; a 64-token prompt is admitted on a 5-block pool and prefills chunk by chunk.
    let mut c = KvConfig::new(4, vec![6]);
    c.max_num_batched_tokens = 8;
    let mut m = mgr_with(&[LayerKind::Sliding { window: 8 }], c.clone());
    let t: Vec<u32> = (0..64).collect();
    let mut r = seq(&m, &t);
    for c0 in (0..64).step_by(8) {
        m.allocate(&mut r, None, c0, 8, if c0 == 0 { 64 } else { 0 })
            .expect("fits within the window cap");
        assert!(r.num_live_blocks(0) <= 5);
        m.commit_computed(&mut r, c0 + 8);
        m.check_invariants([&r]).unwrap();
    }
    m.free(r);
    // the same pool for full attention cannot admit it (16 blocks needed)
    let mut full = mgr_with(&[LayerKind::Full], c);
    let mut r = seq(&full, &t);
    assert_eq!(full.allocate(&mut r, None, 0, 8, 64), Err(NoSpace));
    full.free(r);
}

#[test]
fn hybrid_hits_are_the_longest_length_every_group_serves() {
    // PC-18 / §6.3 worked example adapted: full + sliding (W 32), bs 16, a cached 48-token prefix.
    let build = || {
        let c = KvConfig::new(16, vec![21, 21]);
        let mut m = mgr_with(&[LayerKind::Full, LayerKind::Sliding { window: 32 }], c);
        let t: Vec<u32> = (0..53).collect();
        let mut r0 = seq(&m, &t);
        prefill(&mut m, &mut r0, 53);
        (m, t, r0)
    };
    let probe = |m: &KvManager, t: &[u32]| {
        let s = seq(m, &cat(&[&t[..48], &[999; 4]]));
        let h = m.lookup(&s, 52).map(|h| h.num_tokens);
        (s, h)
    };
    // r0 alive: full [1,2,3] shared, sliding [null, 2, 3]
    let (mut m, t, r0) = build();
    let (mut r1, h) = probe(&m, &t);
    assert_eq!(h, Some(48));
    let hit = m.lookup(&r1, 52).unwrap();
    m.allocate(&mut r1, Some(&hit), 48, 4, 52).unwrap();
    assert_eq!(&r1.table(0)[..3], &[1, 2, 3]);
    assert_eq!(&r1.table(1)[..3], &[NULL_BLOCK, 2, 3]);
    for b in 1..=3 {
        assert_eq!(m.ref_count(0, b), 2);
    }
    assert_eq!(
        m.ref_count(1, 1),
        1,
        "the out-of-window block is not shared"
    );
    assert_eq!(m.ref_count(1, 2), 2);
    m.check_invariants([&r0, &r1]).unwrap();
    m.free(r1);
    m.free(r0);
    // (evicted group, evicted positions) -> hit
    type Evicted<'a> = &'a [(usize, usize)];
    let cases: [(Evicted, Option<u32>); 5] = [
        (&[(1, 0)], Some(48)),     // sliding block outside the window: no change
        (&[(0, 0)], None),         // full block 0: nothing
        (&[(0, 2)], Some(32)),     // last full block
        (&[(1, 2)], Some(32)),     // last sliding block
        (&[(0, 2), (1, 0)], None), // full limits to 32; at 32 sliding needs block 0: total miss
    ];
    for (evict, want) in cases {
        let (mut m, t, r0) = build();
        let tables = [r0.table(0).to_vec(), r0.table(1).to_vec()];
        m.free(r0);
        for &(g, pos) in evict {
            m.evict_cached_blocks(g, &[tables[g][pos]]);
        }
        let (s, h) = probe(&m, &t);
        assert_eq!(h, want, "evicted {evict:?}");
        m.free(s);
    }
}

#[test]
fn null_entries_are_stripped_when_a_sliding_request_is_freed() {
    // ST-9: freeing a table with leading nulls frees only real blocks, once.
    let c = KvConfig::new(2, vec![16]);
    let mut m = mgr_with(&[LayerKind::Sliding { window: 2 }], c);
    let t: Vec<u32> = (0..10).collect();
    let mut r = seq(&m, &t);
    prefill(&mut m, &mut r, 6);
    m.allocate(&mut r, None, 6, 4, 0).unwrap();
    assert!(r.table(0)[0] == NULL_BLOCK);
    m.commit_computed(&mut r, 10);
    m.free(r);
    assert_eq!(m.num_free_blocks(0), 15);
    m.check_invariants([]).unwrap();
}

#[test]
fn sliding_hits_work_at_a_finer_match_unit() {
    // ST-3 (sub-block 2, block 4, W 8): a cached 2-block prefix serves an 8-token hit with both
    // blocks; a hit may also end inside a block (copy-on-match in a sliding group).
    let mut c = KvConfig::new(4, vec![16]);
    c.sub_block_size = 2;
    let mut m = mgr_with(&[LayerKind::Sliding { window: 8 }], c);
    let t: Vec<u32> = (0..8).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 8);
    let ids = r0.table(0).to_vec();
    m.free(r0);
    let mut r1 = seq(&m, &cat(&[&t, &[50]]));
    let hit = m.lookup(&r1, 9).unwrap();
    assert_eq!(hit.num_tokens, 8);
    m.allocate(&mut r1, Some(&hit), 8, 1, 9).unwrap();
    assert_eq!(&r1.table(0)[..2], &ids[..]);
    m.free(r1);
    let mut r2 = seq(&m, &cat(&[&t[..6], &[51, 52]]));
    let (hit, ops) = prefill(&mut m, &mut r2, 8);
    assert_eq!(hit, 6);
    assert_eq!(
        ops,
        vec![CopyOp {
            group: 0,
            src: ids[1],
            dst: r2.table(0)[1],
            num_tokens: 2
        }]
    );
    m.free(r2);
}
