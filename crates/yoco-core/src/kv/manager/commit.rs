//! After a step executed: deferred indexing of newly computed sub-blocks (so a same-step sibling
//! never copies KV that is not written yet), and the copy ops' hand-off to the plan and unpinning
//! once the executor ran them.

use super::{cdiv, KvManager};
use crate::kv::seq::SeqKv;
use crate::kv::{BlockHash, CopyOp, NULL_BLOCK};

impl KvManager {
    /// After the step executed: `seq` now has KV for its first `num_computed` tokens. Indexes newly
    /// complete sub-blocks (deferred indexing, so a same-step sibling never copies unwritten KV),
    /// including the partial tail block.
    #[inline]
    pub fn commit_computed(&mut self, seq: &mut SeqKv, num_computed: usize) {
        // (`fast_total` <= every table's slots: the common case skips reading the table.)
        assert!(
            num_computed <= seq.fast_total || num_computed <= seq.tables[0].len() * self.bs,
            "commit_computed: {num_computed} tokens computed but only {} have slots",
            seq.tables[0].len() * self.bs
        );
        seq.num_committed = num_computed;
        // Most calls (one decode token) complete no new hashed sub-block: nothing to index.
        let next = seq.num_indexed_sub + 1;
        if self.config.enable_prefix_caching
            && num_computed >= next * self.sbs
            && seq.hashes.len() >= next
        {
            let upto = (num_computed / self.sbs).min(seq.hashes.len());
            self.index_seq(seq, upto);
        }
    }

    /// Indexes `seq`'s sub-blocks `[num_indexed_sub, upto)` in every group that still holds them.
    #[inline(never)]
    pub(super) fn index_seq(&mut self, seq: &mut SeqKv, upto: usize) {
        if upto <= seq.num_indexed_sub {
            return;
        }
        let (spb, sbs) = (self.spb, self.sbs);
        let first_b = seq.num_indexed_sub / spb;
        let end_b = cdiv(upto, spb);
        for g in 0..self.groups.len() {
            for b in first_b..end_b {
                let blk = seq.tables[g][b];
                if blk == NULL_BLOCK {
                    continue;
                }
                let lo = b * spb;
                let hi = (lo + spb).min(upto);
                let fresh = lo + self.indexes[g].extend(blk, &seq.hashes[lo..hi]);
                if self.config.enable_events && fresh < hi {
                    let parent = (fresh > 0).then(|| seq.hashes[fresh - 1].to_u64());
                    self.events.stored(
                        g as u32,
                        parent,
                        seq.hashes[fresh..hi].iter().map(BlockHash::to_u64),
                        &seq.tokens[fresh * sbs..hi * sbs],
                        sbs as u32,
                    );
                }
            }
        }
        seq.num_indexed_sub = upto;
    }

    /// Copy ops queued since the last call, for this step's plan. Their sources stay pinned until
    /// [`KvManager::release_copy_sources`] (or, per step, [`KvManager::release_oldest_copy_sources`]).
    pub fn take_copy_ops(&mut self) -> Vec<CopyOp> {
        self.inflight_counts.push_back(self.queued_pins.len());
        self.inflight_pins.append(&mut self.queued_pins);
        std::mem::take(&mut self.queued_ops)
    }

    /// Unpins the sources of every copy op taken so far (the step that just executed, when steps
    /// do not overlap; called from the scheduler's update, never earlier: an early release lets the
    /// next allocation evict and reuse a source before the executor copied it).
    pub fn release_copy_sources(&mut self) {
        let pins = std::mem::take(&mut self.inflight_pins);
        for &(g, b) in &pins {
            self.release_rev(g as usize, &[b]);
        }
        self.inflight_pins = pins;
        self.inflight_pins.clear();
        self.inflight_counts.clear();
    }

    /// Unpins the sources of the oldest [`KvManager::take_copy_ops`] batch only: with async
    /// scheduling the next step's batch is already taken (and its copies not yet run) when the
    /// previous step's update releases its own.
    pub fn release_oldest_copy_sources(&mut self) {
        let Some(n) = self.inflight_counts.pop_front() else {
            return;
        };
        if n == 0 {
            return;
        }
        let mut pins = std::mem::take(&mut self.inflight_pins);
        for &(g, b) in &pins[..n] {
            self.release_rev(g as usize, &[b]);
        }
        pins.drain(..n);
        self.inflight_pins = pins;
    }
}
