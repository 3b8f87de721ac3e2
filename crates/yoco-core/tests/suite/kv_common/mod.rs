//! Helpers shared by the `kv_*` integration tests: build managers, drive a request through
//! admission / execution / free the way the scheduler does.
#![allow(dead_code)]

pub mod fuzz;

use yoco_core::kv::*;

/// One full-attention group.
pub fn full_mgr(bs: u32, sbs: u32, num_blocks: u32) -> KvManager {
    let mut c = KvConfig::new(bs, vec![num_blocks]);
    c.sub_block_size = sbs;
    KvManager::new(kv_groups(&[LayerKind::Full]).unwrap(), c).unwrap()
}

pub fn mgr_with(layers: &[LayerKind], c: KvConfig) -> KvManager {
    KvManager::new(kv_groups(layers).unwrap(), c).unwrap()
}

/// A request whose chain covers `tokens`.
pub fn seq(m: &KvManager, tokens: &[u32]) -> SeqKv {
    let mut s = m.new_seq(HashExtras::default(), false);
    m.hash_tokens(&mut s, tokens);
    s
}

/// Admission as the scheduler does it: lookup, then allocate the whole prompt (reserve = prompt).
/// Returns the hit length.
pub fn admit(m: &mut KvManager, s: &mut SeqKv, num_tokens: usize) -> Result<u32, NoSpace> {
    let hit = m.lookup(s, num_tokens);
    let nc = hit.as_ref().map_or(0, |h| h.num_tokens as usize);
    m.allocate(s, hit.as_ref(), nc, num_tokens - nc, num_tokens)?;
    Ok(nc as u32)
}

/// The step executed: take the copy ops (returned), commit `num_computed`, release sources.
pub fn execute(m: &mut KvManager, s: &mut SeqKv, num_computed: usize) -> Vec<CopyOp> {
    let ops = m.take_copy_ops();
    m.commit_computed(s, num_computed);
    m.release_copy_sources();
    ops
}

/// Admit + execute the whole prompt in one step. Returns (hit tokens, copy ops).
pub fn prefill(m: &mut KvManager, s: &mut SeqKv, num_tokens: usize) -> (u32, Vec<CopyOp>) {
    let hit = admit(m, s, num_tokens).expect("fits");
    let ops = execute(m, s, num_tokens);
    (hit, ops)
}

/// `n` tokens of constant value `v`.
pub fn run(v: u32, n: usize) -> Vec<u32> {
    vec![v; n]
}

pub fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}
