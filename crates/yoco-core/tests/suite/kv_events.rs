//! KV events (scheduler.md §8, §10.4 PC-13/15, §10.3 MAP-5, §11.6 SB-19): sub-block granularity,
//! emitted on a hash's 0->1 and 1->0 holder transitions only, chain-safe `Stored` runs.

use crate::kv_common;
use kv_common::*;
use yoco_core::kv::*;

fn evm(bs: u32, sbs: u32, blocks: u32) -> KvManager {
    let mut c = KvConfig::new(bs, vec![blocks]);
    c.sub_block_size = sbs;
    c.enable_events = true;
    mgr_with(&[LayerKind::Full], c)
}

fn u64s(s: &SeqKv) -> Vec<u64> {
    s.sub_block_hashes().iter().map(|h| h.to_u64()).collect()
}

#[test]
fn events_are_off_by_default() {
    let mut m = full_mgr(8, 4, 8);
    let mut r = seq(&m, &(0..16).collect::<Vec<u32>>());
    prefill(&mut m, &mut r, 16);
    m.free(r);
    m.reset_prefix_cache();
    assert!(m.take_events().is_empty());
}

#[test]
fn storing_evicting_and_resetting_full_blocks() {
    // PC-13 (pool = k + 1)
    for k in [2usize, 3, 10] {
        let mut m = evm(16, 16, k as u32 + 1);
        let t: Vec<u32> = (0..16 * k as u32).collect();
        let mut r = seq(&m, &t);
        prefill(&mut m, &mut r, 16 * k);
        let ev = m.take_events();
        assert_eq!(
            ev.last(),
            Some(&KvEvent::Stored {
                group: 0,
                parent: None,
                hashes: u64s(&r),
                token_ids: t.clone(),
                block_size: 16
            })
        );
        assert!(m.take_events().is_empty(), "take_events drains");
        let first = u64s(&r);
        m.free(r);
        // identical request allocated without a lookup: k evictions, then one store of k hashes
        let mut r2 = seq(&m, &t);
        m.allocate(&mut r2, None, 0, 16 * k, 16 * k).unwrap();
        m.commit_computed(&mut r2, 16 * k);
        let ev = m.take_events();
        assert_eq!(ev.len(), k + 1);
        let mut removed: Vec<u64> = ev[..k]
            .iter()
            .map(|e| match e {
                KvEvent::Removed { group: 0, hashes } if hashes.len() == 1 => hashes[0],
                other => panic!("{other:?}"),
            })
            .collect();
        removed.sort();
        let mut want = first.clone();
        want.sort();
        assert_eq!(removed, want);
        assert!(matches!(&ev[k], KvEvent::Stored { hashes, .. } if *hashes == first));
        m.free(r2);
        assert!(m.reset_prefix_cache());
        assert_eq!(m.take_events().last(), Some(&KvEvent::AllCleared));
        assert_eq!(m.num_indexed_hashes(0), 0);
    }
}

#[test]
fn a_big_block_stores_one_event_per_run_at_sub_block_size() {
    // SB-19: one Stored with spb hashes and block_size = sub-block size; the chain is reproducible.
    let mut m = evm(16, 4, 8);
    let t: Vec<u32> = (100..132).collect();
    let mut r = seq(&m, &t);
    prefill(&mut m, &mut r, 32);
    let ev = m.take_events();
    assert_eq!(
        ev,
        vec![KvEvent::Stored {
            group: 0,
            parent: None,
            hashes: u64s(&r),
            token_ids: t.clone(),
            block_size: 4
        }]
    );
    // partial, then full: only the new suffix is stored, with the previous hash as parent
    let mut toks: Vec<u32> = (0..6).collect();
    let mut r2 = seq(&m, &toks);
    prefill(&mut m, &mut r2, 6);
    let ev = m.take_events();
    assert_eq!(
        ev,
        vec![KvEvent::Stored {
            group: 0,
            parent: None,
            hashes: u64s(&r2),
            token_ids: toks[..4].to_vec(),
            block_size: 4
        }]
    );
    toks.extend(6..16);
    m.hash_tokens(&mut r2, &toks);
    m.allocate(&mut r2, None, 6, 10, 0).unwrap();
    m.commit_computed(&mut r2, 16);
    let h = u64s(&r2);
    assert_eq!(
        m.take_events(),
        vec![KvEvent::Stored {
            group: 0,
            parent: Some(h[0]),
            hashes: h[1..].to_vec(),
            token_ids: toks[4..16].to_vec(),
            block_size: 4
        }]
    );
    m.free(r);
    m.free(r2);
}

#[test]
fn duplicate_holders_store_once_and_remove_at_the_last_holder() {
    // SB-19 / vLLM PRs #55092, #48933: a second block caching identical bytes emits nothing; Remove
    // fires only when the last holder is evicted.
    let mut m = evm(8, 4, 4);
    let t: Vec<u32> = (0..8).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 8);
    m.take_events();
    let mut r1 = m.new_seq(HashExtras::default(), true); // never reads: writes a duplicate block
    m.hash_tokens(&mut r1, &t);
    prefill(&mut m, &mut r1, 8);
    assert!(m.take_events().is_empty(), "no new hash, no event");
    assert_eq!(m.holders(0, &r0.sub_block_hashes()[1]).len(), 2);
    m.free(r0);
    m.free(r1);
    // evict one holder, then the other
    let mut x = seq(&m, &run(50, 9));
    admit(&mut m, &mut x, 9).unwrap(); // 2 blocks: the never-used one and one cached holder
    assert!(
        m.take_events().is_empty(),
        "the other holder still has the hashes"
    );
    let mut y = seq(&m, &run(51, 3));
    admit(&mut m, &mut y, 3).unwrap();
    let h = u64s(&seq(&m, &t));
    assert_eq!(
        m.take_events(),
        vec![KvEvent::Removed {
            group: 0,
            hashes: h
        }]
    );
    m.free(x);
    m.free(y);
}

#[test]
fn stored_parent_is_the_logical_chain_hash_even_behind_null_entries() {
    // MAP-5: a sliding request whose early entries are null stores its new sub-blocks with the
    // previous logical hash as parent. PC-15: each group emits its own events, tagged.
    let mut c = KvConfig::new(4, vec![16, 16]);
    c.enable_events = true;
    let mut m = mgr_with(&[LayerKind::Full, LayerKind::Sliding { window: 4 }], c);
    let t: Vec<u32> = (0..16).collect();
    let mut r0 = seq(&m, &t[..12]);
    prefill(&mut m, &mut r0, 12);
    let ev = m.take_events();
    assert_eq!(ev.len(), 2);
    assert!(
        matches!(&ev[0], KvEvent::Stored { group: 0, parent: None, hashes, .. } if hashes.len() == 3)
    );
    assert!(
        matches!(&ev[1], KvEvent::Stored { group: 1, parent: None, hashes, .. } if hashes.len() == 3)
    );
    let mut r1 = seq(&m, &t);
    let (hit, _) = prefill(&mut m, &mut r1, 16);
    assert_eq!(hit, 12);
    assert_eq!(r1.table(1)[..2], [NULL_BLOCK, NULL_BLOCK]);
    let h = u64s(&r1);
    for (g, e) in m.take_events().iter().enumerate() {
        assert_eq!(
            e,
            &KvEvent::Stored {
                group: g as u32,
                parent: Some(h[2]),
                hashes: vec![h[3]],
                token_ids: t[12..].to_vec(),
                block_size: 4
            }
        );
    }
    m.free(r0);
    m.free(r1);
}

#[test]
fn explicit_eviction_emits_removed_for_orphaned_hashes() {
    let mut m = evm(8, 4, 8);
    let t: Vec<u32> = (0..8).collect();
    let mut r = seq(&m, &t);
    prefill(&mut m, &mut r, 8);
    m.take_events();
    m.evict_cached_blocks(0, &[r.table(0)[0]]);
    assert_eq!(
        m.take_events(),
        vec![KvEvent::Removed {
            group: 0,
            hashes: u64s(&r)
        }]
    );
    m.free(r);
    assert_eq!(
        m.free_block_ids(0)[0],
        1,
        "an evicted block is reused first"
    );
}
