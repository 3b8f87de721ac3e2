//! Giving blocks back: a request's free (finish, abort) or preemption, sliding-window blocks the
//! window no longer reaches, external invalidation of cached blocks, and the whole-cache reset.
//! Where a freed block lands in the LRU (tail when it holds indexed sub-blocks, head otherwise) is
//! decided here.

use smallvec::SmallVec;

use super::KvManager;
use crate::kv::seq::SeqKv;
use crate::kv::{BlockHash, BlockId, NULL_BLOCK};

impl KvManager {
    /// Returns all of `seq`'s blocks (finish, preemption, abort), tail first; a partial tail that
    /// holds indexed sub-blocks is retained in the LRU rather than reused first.
    pub fn free(&mut self, mut seq: SeqKv) {
        self.free_blocks(&mut seq);
    }

    /// Returns all of `seq`'s blocks exactly as [`Self::free`] does but keeps `seq` itself: it is
    /// left as a request that was never admitted (no blocks, nothing committed, prefix metrics to
    /// be counted at its next admission) whose hash chain stays computed. Recompute preemption
    /// uses it, so a resumed request does not rehash its whole history (`hash_tokens` then only
    /// extends the chain over tokens appended since).
    pub fn free_blocks(&mut self, seq: &mut SeqKv) {
        if self.config.enable_prefix_caching {
            let upto = (seq.num_committed / self.sbs).min(seq.hashes.len());
            self.index_seq(seq, upto);
        }
        for g in 0..self.groups.len() {
            let nulls = seq.num_null[g] as usize;
            self.release_rev(g, &seq.tables[g][nulls..]);
            seq.tables[g].clear();
            seq.num_null[g] = 0;
        }
        seq.num_committed = 0;
        seq.num_indexed_sub = 0;
        seq.admitted = false;
        seq.fast_total = 0;
        seq.fast_computed = 0;
    }

    /// Releases leading blocks of a sliding group that no token from `num_computed` on can see.
    ///
    /// With prefix caching, only blocks whose KV is committed go: with async scheduling the step
    /// that wrote the others awaits its update (the next plan is built first), and releasing them
    /// now would free them before their sub-blocks are indexed, so no later request could hit
    /// that part of the prefix in this group (and so in any). They go at the first allocation
    /// after the update, indexed, as in synchronous mode, where the limit never binds (`update`
    /// commits everything computed before the next `schedule`).
    pub(super) fn release_out_of_window(&mut self, seq: &mut SeqKv, g: usize, num_computed: usize) {
        let mut skip_blocks =
            (self.skipped_tokens(g, num_computed) / self.bs).min(seq.tables[g].len());
        if self.config.enable_prefix_caching {
            skip_blocks = skip_blocks.min(seq.num_committed / self.bs);
        }
        let first = seq.num_null[g] as usize;
        if skip_blocks <= first {
            return;
        }
        let mut gone: SmallVec<[BlockId; 8]> = SmallVec::new();
        for e in &mut seq.tables[g][first..skip_blocks] {
            gone.push(std::mem::replace(e, NULL_BLOCK));
        }
        seq.num_null[g] = skip_blocks as u32;
        // the highest block (longest prefix) first, like a request's free
        self.release_rev(g, &gone);
    }

    /// Drops one reference of each block, `blocks` given head of the request first: they are
    /// released in reverse (eviction-priority order). Blocks reaching 0 go to the LRU tail when
    /// they hold indexed sub-blocks (kept longest), to the head otherwise (reused first, in the
    /// order released).
    pub(super) fn release_rev(&mut self, g: usize, blocks: &[BlockId]) {
        self.heads.clear();
        for &b in blocks.iter().rev() {
            if b == NULL_BLOCK {
                continue;
            }
            if self.pools[g].unref(b) {
                if self.indexes[g].is_indexed(b) {
                    self.pools[g].push_free_back(b);
                    self.cached_free[g] += 1;
                } else {
                    self.heads.push(b);
                }
            }
        }
        for i in (0..self.heads.len()).rev() {
            let b = self.heads[i];
            self.pools[g].push_free_front(b);
        }
    }

    /// Drops the cached sub-blocks of `blocks` in group `g` (vLLM's `evict_blocks`, e.g. for an
    /// external invalidation). Free blocks among them become plain free blocks at the LRU head;
    /// blocks in use stay in their tables, unindexed. Emits `Removed` for hashes left without holder.
    pub fn evict_cached_blocks(&mut self, g: usize, blocks: &[BlockId]) {
        for &b in blocks {
            if b == NULL_BLOCK || !self.indexes[g].is_indexed(b) {
                continue;
            }
            self.orphans.clear();
            self.indexes[g].pop(b, &mut self.orphans);
            if self.config.enable_events {
                self.events
                    .removed(g as u32, self.orphans.iter().map(BlockHash::to_u64));
            }
            if self.pools[g].ref_count(b) == 0 {
                self.cached_free[g] -= 1;
                self.pools[g].move_to_front(b);
            }
        }
    }

    /// Drops every cached entry; fails (returns false) while any block is referenced (by a request
    /// or a pinned copy source).
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.pools.iter().any(|p| p.any_referenced()) {
            return false;
        }
        for idx in &mut self.indexes {
            idx.clear();
        }
        self.cached_free.iter_mut().for_each(|c| *c = 0);
        if self.config.enable_events {
            self.events.cleared();
        }
        true
    }
}
