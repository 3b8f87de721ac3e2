//! Introspection for tests, benches and debugging: ref counts, LRU order, index contents, and the
//! full structural invariant check.

use super::hashing::BlockHash;
use super::manager::KvManager;
use super::seq::SeqKv;
use super::{AttnKind, BlockId, NULL_BLOCK};

impl KvManager {
    /// Reference count of block `b` of group `g` (request tables plus pinned copy sources).
    pub fn ref_count(&self, g: usize, b: BlockId) -> u32 {
        self.pools[g].ref_count(b)
    }

    /// Free blocks of group `g` in eviction order (head, reused first, to tail).
    pub fn free_block_ids(&self, g: usize) -> Vec<BlockId> {
        self.pools[g].free_ids().collect()
    }

    /// The sub-block hashes block `b` of group `g` holds in the prefix index (its first k
    /// sub-blocks; empty when not indexed).
    pub fn indexed_hashes(&self, g: usize, b: BlockId) -> &[BlockHash] {
        self.indexes[g].list(b)
    }

    /// Blocks of group `g` holding the sub-block named `h`.
    pub fn holders(&self, g: usize, h: &BlockHash) -> &[BlockId] {
        self.indexes[g].holders(h)
    }

    /// Distinct sub-block hashes indexed in group `g`.
    pub fn num_indexed_hashes(&self, g: usize) -> usize {
        self.indexes[g].num_hashes()
    }

    /// Checks every structural invariant (ref counts equal holders, no block both free and
    /// referenced, index entries agree with the requests' hash chains, free-list links). `seqs` are
    /// all live requests' states. For tests; O(pool + index + tables).
    pub fn check_invariants<'a>(
        &self,
        seqs: impl IntoIterator<Item = &'a SeqKv>,
    ) -> std::result::Result<(), String> {
        let seqs: Vec<&SeqKv> = seqs.into_iter().collect();
        for (si, seq) in seqs.iter().enumerate() {
            let limits = (seq.fast_total, seq.fast_computed);
            if limits != (0, 0) && limits != self.fast_limits(seq) {
                return Err(format!(
                    "seq {si}: allocation fast-path limits {limits:?} are stale (tables say {:?})",
                    self.fast_limits(seq)
                ));
            }
        }
        for g in 0..self.groups.len() {
            let (pool, idx) = (&self.pools[g], &self.indexes[g]);
            pool.queue()
                .check()
                .map_err(|e| format!("group {g}: {e}"))?;
            idx.check().map_err(|e| format!("group {g}: {e}"))?;
            let n = pool.num_blocks() as usize;
            let mut refs = vec![0u32; n];
            for (si, seq) in seqs.iter().enumerate() {
                let t = &seq.tables[g];
                let nn = seq.num_null[g] as usize;
                if nn > t.len()
                    || t[..nn].iter().any(|&b| b != NULL_BLOCK)
                    || t[nn..].contains(&NULL_BLOCK)
                {
                    return Err(format!(
                        "group {g} seq {si}: table {t:?} is not nulls then blocks ({nn} nulls)"
                    ));
                }
                if self.groups[g].kind == AttnKind::Full && nn > 0 {
                    return Err(format!(
                        "group {g} seq {si}: full-attention table has null entries"
                    ));
                }
                for (pos, &b) in t.iter().enumerate().skip(nn) {
                    if b as usize >= n {
                        return Err(format!("group {g} seq {si}: block {b} out of range"));
                    }
                    refs[b as usize] += 1;
                    for (i, h) in idx.list(b).iter().enumerate() {
                        if seq.hashes.get(pos * self.spb + i) != Some(h) {
                            return Err(format!(
                                "group {g} seq {si}: block {b} at table position {pos} is indexed with \
                                 sub-block {i} = {h:?}, which is not the request's"
                            ));
                        }
                    }
                }
            }
            for &(pg, b) in self.queued_pins.iter().chain(&self.inflight_pins) {
                if pg as usize == g {
                    refs[b as usize] += 1;
                    if !idx.is_indexed(b) {
                        return Err(format!("group {g}: pinned copy source {b} is not indexed"));
                    }
                }
            }
            if refs[0] != 0 || pool.ref_count(0) != 0 || pool.is_free(0) {
                return Err(format!("group {g}: the null block is referenced or free"));
            }
            let mut cached = 0;
            for b in 1..n as BlockId {
                let r = pool.ref_count(b);
                if r != refs[b as usize] {
                    return Err(format!(
                        "group {g}: block {b} has ref count {r} but {} holders",
                        refs[b as usize]
                    ));
                }
                if (r == 0) != pool.is_free(b) {
                    return Err(format!(
                        "group {g}: block {b} ref {r} but free = {}",
                        pool.is_free(b)
                    ));
                }
                if r == 0 && idx.is_indexed(b) {
                    cached += 1;
                }
            }
            if cached != self.cached_free[g] {
                return Err(format!(
                    "group {g}: {cached} cached free blocks, counter says {}",
                    self.cached_free[g]
                ));
            }
            if !self.config.enable_prefix_caching && idx.num_indexed_blocks() > 0 {
                return Err(format!("group {g}: indexed blocks with prefix caching off"));
            }
        }
        Ok(())
    }
}
