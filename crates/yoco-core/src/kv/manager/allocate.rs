//! Admission and growth of a request's block tables: capacity checks across all pools before
//! anything changes, sharing a hit's full blocks, copy-on-match or zero-copy adoption for its
//! partial block, fresh blocks from the LRU head (evicting their cached sub-blocks), and the
//! O(1) decode fast path.

use smallvec::SmallVec;

use super::{cdiv, KvManager};
use crate::kv::lookup::GroupHit;
use crate::kv::seq::SeqKv;
use crate::kv::{Allocation, BlockHash, BlockId, CopyOp, NoSpace, PrefixHit, NULL_BLOCK};

impl KvManager {
    /// Makes `seq`'s tables cover `num_computed + num_new` tokens, where `num_computed` already
    /// includes `hit.num_tokens` when a hit is given (admission). Frees sliding-window blocks that
    /// tokens from `num_computed` on can no longer reach (even when the allocation then fails: they
    /// can never be read again). Requires, beyond what it allocates now, free capacity for
    /// `reserve_tokens` tokens in total (admission passes the whole prompt, so a request that cannot
    /// finish its prefill is not admitted; running requests pass 0); a sliding group's reservation is
    /// capped at the blocks its window plus one step can reach. With a hit: shares its full blocks,
    /// and for a trailing partial match allocates a private block and queues a [`CopyOp`] (or adopts
    /// an unreferenced source block whose sub-blocks are exactly the request's). On `Err(NoSpace)`
    /// nothing else changed, hit ref counts included.
    ///
    /// Panics if a hit is given for a request that already holds blocks, if `num_computed` differs
    /// from `hit.num_tokens`, or if the hit went stale (a block it names was evicted since
    /// [`KvManager::lookup`]).
    #[inline]
    pub fn allocate(
        &mut self,
        seq: &mut SeqKv,
        hit: Option<&PrefixHit>,
        num_computed: usize,
        num_new: usize,
        reserve_tokens: usize,
    ) -> std::result::Result<Allocation, NoSpace> {
        // Fast path: a running request whose tables already cover the new tokens and whose
        // sliding windows release nothing (most decode steps); exact, see `SeqKv::fast_total`.
        if hit.is_none()
            && reserve_tokens == 0
            && num_computed + num_new <= seq.fast_total
            && num_computed < seq.fast_computed
        {
            debug_assert!(seq.admitted);
            return Ok(Allocation { num_new_blocks: 0 });
        }
        self.allocate_full(seq, hit, num_computed, num_new, reserve_tokens)
    }

    /// [`Self::allocate`] when the fast path does not apply (kept out of line so the fast path
    /// inlines into the scheduler's loop).
    #[inline(never)]
    fn allocate_full(
        &mut self,
        seq: &mut SeqKv,
        hit: Option<&PrefixHit>,
        num_computed: usize,
        num_new: usize,
        reserve_tokens: usize,
    ) -> std::result::Result<Allocation, NoSpace> {
        let ng = self.groups.len();
        let total = num_computed + num_new;
        // The full path may change the tables: the limits are recomputed on success.
        seq.fast_total = 0;
        seq.fast_computed = 0;
        if let Some(hit) = hit {
            assert!(
                seq.tables.iter().all(|t| t.is_empty()),
                "allocate: a PrefixHit can only be applied at admission (the request already has blocks)"
            );
            assert_eq!(
                num_computed, hit.num_tokens as usize,
                "allocate: num_computed must equal hit.num_tokens"
            );
            assert_eq!(
                hit.groups.len(),
                ng,
                "allocate: PrefixHit from another manager"
            );
            self.validate_hit(seq, hit);
        }
        // 1. Sliding groups drop what the window can no longer reach.
        for g in 0..ng {
            if self.windows[g].is_some() {
                self.release_out_of_window(seq, g, num_computed);
            }
        }
        // 2. Capacity, per pool, before touching anything.
        for g in 0..ng {
            let gh = hit.map(|h| &h.groups[g]);
            let need = self.blocks_needed(seq, g, gh, num_computed, total, reserve_tokens);
            if need > self.pools[g].num_free() as usize {
                return Err(NoSpace);
            }
        }
        // 3. Hits: touch/pin every group's hit blocks before any new allocation can evict them.
        let mut fresh = 0u32;
        let mut copies: SmallVec<[(usize, BlockId, usize, usize); 4]> = SmallVec::new();
        if let Some(hit) = hit {
            for (g, gh) in hit.groups.iter().enumerate() {
                for &b in &gh.entries {
                    if b == NULL_BLOCK {
                        seq.num_null[g] += 1;
                    } else {
                        self.touch(g, b);
                    }
                    seq.tables[g].push(b);
                }
                if let Some(p) = gh.partial {
                    let adopt = self.adoptable(g, p.src, p.num_sub as usize);
                    self.touch(g, p.src);
                    if adopt {
                        seq.tables[g].push(p.src);
                        self.counters.adoptions += 1;
                        fresh += 1;
                    } else {
                        self.queued_pins.push((g as u32, p.src));
                        copies.push((g, p.src, p.num_sub as usize, seq.tables[g].len()));
                        seq.tables[g].push(NULL_BLOCK); // the destination, allocated below
                    }
                }
            }
            let full_sub = (hit.num_tokens as usize / self.bs) * self.spb;
            seq.num_indexed_sub = full_sub;
            seq.num_committed = full_sub * self.sbs;
        }
        // 4. New blocks: copy destinations first, then the rest of the range.
        for (g, src, num_sub, pos) in copies {
            let dst = self.take_block(g);
            seq.tables[g][pos] = dst;
            let n = (num_sub * self.sbs) as u32;
            self.queued_ops.push(CopyOp {
                group: g as u32,
                src,
                dst,
                num_tokens: n,
            });
            self.counters.copies += 1;
            self.counters.copied_tokens += n as u64;
            fresh += 1;
        }
        let target = cdiv(total, self.bs);
        for g in 0..ng {
            let skip_blocks = self.skipped_tokens(g, num_computed) / self.bs;
            while seq.tables[g].len() < target {
                if seq.tables[g].len() < skip_blocks
                    && seq.tables[g].len() == seq.num_null[g] as usize
                {
                    seq.tables[g].push(NULL_BLOCK);
                    seq.num_null[g] += 1;
                } else {
                    let b = self.take_block(g);
                    seq.tables[g].push(b);
                    fresh += 1;
                }
            }
        }
        if !seq.admitted {
            seq.admitted = true;
            if self.config.enable_prefix_caching && !seq.skip_prefix_read {
                self.counters.prefix_query_tokens += seq.num_tokens.max(total) as u64;
                self.counters.prefix_hit_tokens += hit.map_or(0, |h| h.num_tokens as u64);
            }
        }
        (seq.fast_total, seq.fast_computed) = self.fast_limits(seq);
        Ok(Allocation {
            num_new_blocks: fresh,
        })
    }

    /// `seq`'s allocation fast-path limits `(fast_total, fast_computed)`, from its tables. Tokens
    /// up to `min_g len_g * block_size` have slots in every group; a sliding group with `n` leading
    /// nulls and live blocks releases its next block once `floor((num_computed - (W - 1)) /
    /// block_size) > n` (see [`Self::release_out_of_window`]), i.e. from `num_computed = (n + 1) *
    /// block_size + W - 1` on.
    pub(crate) fn fast_limits(&self, seq: &SeqKv) -> (usize, usize) {
        let (mut total, mut computed) = (usize::MAX, usize::MAX);
        for (g, table) in seq.tables.iter().enumerate() {
            total = total.min(table.len() * self.bs);
            if let Some(w) = self.windows[g] {
                let nulls = seq.num_null[g] as usize;
                if table.len() > nulls {
                    computed = computed.min((nulls + 1) * self.bs + w - 1);
                }
            }
        }
        (total, computed)
    }

    /// Free blocks group `g` needs for this allocation plus the reservation.
    fn blocks_needed(
        &self,
        seq: &SeqKv,
        g: usize,
        gh: Option<&GroupHit>,
        num_computed: usize,
        total: usize,
        reserve_tokens: usize,
    ) -> usize {
        let pool = &self.pools[g];
        let mut len = seq.tables[g].len();
        let mut live = len - seq.num_null[g] as usize;
        let mut need = 0usize;
        if let Some(gh) = gh {
            for &b in &gh.entries {
                if b != NULL_BLOCK {
                    need += (pool.ref_count(b) == 0) as usize;
                    live += 1;
                }
            }
            len += gh.entries.len();
            if let Some(p) = gh.partial {
                // destination (or the adopted block, which leaves the free queue)
                need += 1;
                live += 1;
                len += 1;
                if !self.adoptable(g, p.src, p.num_sub as usize) && pool.ref_count(p.src) == 0 {
                    need += 1; // pinning a free source takes it off the free queue until released
                }
            }
        }
        let skip_blocks = self.skipped_tokens(g, num_computed) / self.bs;
        let target = cdiv(total, self.bs);
        if target > len {
            let n = target - len.max(skip_blocks).min(target);
            need += n;
            live += n;
            len = target;
        }
        let mut future = cdiv(reserve_tokens, self.bs).saturating_sub(len);
        if let Some(w) = self.windows[g] {
            future = future.min(self.sliding_cap_blocks(w).saturating_sub(live));
        }
        need + future
    }

    /// Panics with a clear message when `hit` no longer describes the pool.
    fn validate_hit(&self, seq: &SeqKv, hit: &PrefixHit) {
        let spb = self.spb;
        for (g, gh) in hit.groups.iter().enumerate() {
            let idx = &self.indexes[g];
            for (i, &b) in gh.entries.iter().enumerate() {
                if b != NULL_BLOCK {
                    let l = idx.list(b);
                    assert!(
                        l.len() == spb && seq.hashes.get((i + 1) * spb - 1) == Some(&l[spb - 1]),
                        "allocate: stale PrefixHit (group {g} block {b} was evicted since lookup); \
                         pass a hit to allocate before anything else mutates the manager"
                    );
                }
            }
            if let Some(p) = gh.partial {
                let (k, l) = (p.num_sub as usize, idx.list(p.src));
                let want = seq.hashes.get(gh.entries.len() * spb + k - 1);
                assert!(
                    l.len() >= k && want == Some(&l[k - 1]),
                    "allocate: stale PrefixHit (group {g} copy source {} was evicted since lookup)",
                    p.src
                );
            }
        }
    }

    /// Tokens group `g` no longer needs once position `num_computed` is the first to compute.
    pub(crate) fn skipped_tokens(&self, g: usize, num_computed: usize) -> usize {
        match self.windows[g] {
            Some(w) => num_computed.saturating_sub(w - 1),
            None => 0,
        }
    }

    /// Blocks a sliding group may hold at once: the window plus one step's tokens, +1 because the
    /// window need not start at a block boundary (vLLM's admission cap, issue #39734).
    fn sliding_cap_blocks(&self, w: usize) -> usize {
        cdiv(w - 1 + self.config.max_num_batched_tokens as usize, self.bs) + 1
    }

    pub(crate) fn adoptable(&self, g: usize, src: BlockId, num_sub: usize) -> bool {
        self.pools[g].ref_count(src) == 0 && self.indexes[g].list(src).len() == num_sub
    }

    /// Adds a reference (a free block leaves the LRU).
    fn touch(&mut self, g: usize, b: BlockId) {
        if self.pools[g].touch(b) && self.indexes[g].is_indexed(b) {
            self.cached_free[g] -= 1;
        }
    }

    /// Takes the LRU head of group `g`, evicting its cached sub-blocks.
    fn take_block(&mut self, g: usize) -> BlockId {
        let b = self.pools[g].take_front().expect("capacity was checked");
        if self.indexes[g].is_indexed(b) {
            self.cached_free[g] -= 1;
            self.orphans.clear();
            self.indexes[g].pop(b, &mut self.orphans);
            if self.config.enable_events {
                self.events
                    .removed(g as u32, self.orphans.iter().map(BlockHash::to_u64));
            }
        }
        b
    }
}
