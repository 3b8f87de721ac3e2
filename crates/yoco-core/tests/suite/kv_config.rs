//! Construction errors name the field and what would work; misuse that would corrupt KV panics.

use crate::kv_common;
use kv_common::*;
use yoco_core::kv::*;

fn err(c: KvConfig) -> String {
    match KvManager::new(kv_groups(&[LayerKind::Full]).unwrap(), c) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_configs_are_rejected_with_the_field_named() {
    assert!(err(KvConfig::new(0, vec![4])).contains("kv.block_size"));
    let mut c = KvConfig::new(16, vec![4]);
    c.sub_block_size = 5;
    let e = err(c);
    assert!(
        e.contains("kv.sub_block_size") && e.contains("got 5"),
        "{e}"
    );
    let e = err(KvConfig::new(16, vec![1]));
    assert!(
        e.contains("kv.num_blocks[0]") && e.contains("reserved"),
        "{e}"
    );
    let e = err(KvConfig::new(16, vec![8, 8]));
    assert!(e.contains("2 entries") && e.contains("1 KV groups"), "{e}");
    let mut c = KvConfig::new(16, vec![8]);
    c.max_num_batched_tokens = 0;
    assert!(err(c).contains("kv.max_num_batched_tokens"));
}

#[test]
fn a_configured_seed_changes_every_hash() {
    let m = full_mgr(4, 4, 8);
    let mut c = KvConfig::new(4, vec![8]);
    c.hash_seed = Some(b"42".to_vec());
    let m2 = mgr_with(&[LayerKind::Full], c);
    let t = [1, 2, 3, 4];
    let (a, b) = (seq(&m, &t), seq(&m2, &t));
    assert_ne!(a.sub_block_hashes(), b.sub_block_hashes());
    assert_eq!(root_hash(DEFAULT_HASH_SEED), root_hash(b"vllm-none-hash"));
}

#[test]
fn gemma3n_layers_make_one_sliding_and_one_full_group() {
    // E2B: 30 layers, (4 sliding + 1 full) x 6, the last 10 share KV with the last sliding (18) and
    // the last full (19) layer before them.
    let mut layers = Vec::new();
    for i in 0..30 {
        let full = i % 5 == 4;
        layers.push(if i >= 20 {
            LayerKind::SharesKv {
                donor: if full { 19 } else { 18 },
            }
        } else if full {
            LayerKind::Full
        } else {
            LayerKind::Sliding { window: 512 }
        });
    }
    let g = kv_groups(&layers).unwrap();
    assert_eq!(g.len(), 2);
    assert_eq!(g[0].kind, AttnKind::Sliding { window: 512 });
    assert_eq!(g[0].layers.len(), 16);
    assert_eq!(g[1].layers, vec![4, 9, 14, 19]);
    assert_eq!(g[0].readers.len() + g[1].readers.len(), 10);
    assert!(g[1].readers.iter().all(|&(_, d)| d == 19));
}

#[test]
#[should_panic(expected = "stale PrefixHit")]
fn a_hit_whose_blocks_were_evicted_meanwhile_is_refused() {
    let mut m = full_mgr(4, 4, 3);
    let t: Vec<u32> = (0..8).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 8);
    m.free(r0);
    let mut r1 = seq(&m, &cat(&[&t, &[9]]));
    let hit = m.lookup(&r1, 9).unwrap();
    let mut other = seq(&m, &run(7, 8));
    admit(&mut m, &mut other, 8).unwrap(); // evicts both cached blocks
    let _ = m.allocate(&mut r1, Some(&hit), 8, 1, 9);
}

#[test]
#[should_panic(expected = "only be applied at admission")]
fn a_hit_cannot_be_applied_to_a_running_request() {
    let mut m = full_mgr(4, 4, 8);
    let t: Vec<u32> = (0..8).collect();
    let mut r0 = seq(&m, &t);
    prefill(&mut m, &mut r0, 8);
    let mut r1 = seq(&m, &cat(&[&t, &[9]]));
    admit(&mut m, &mut r1, 9).unwrap();
    let hit = m.lookup(&r1, 9).unwrap();
    let _ = m.allocate(&mut r1, Some(&hit), 8, 1, 0);
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "dropped while holding blocks")]
fn dropping_a_request_that_holds_blocks_is_caught_in_debug_builds() {
    let mut m = full_mgr(4, 4, 8);
    let mut r = seq(&m, &[1, 2, 3]);
    admit(&mut m, &mut r, 3).unwrap();
    drop(r);
}
