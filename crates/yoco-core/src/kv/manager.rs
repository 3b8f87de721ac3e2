//! The block manager: pools + indexes per group, allocation, deferred indexing, copy ops, frees.

use smallvec::SmallVec;

use super::events::EventLog;
use super::hashing::{extend_chain, root_hash, BlockHash, EncodedExtras, DEFAULT_HASH_SEED};
use super::index::SubBlockIndex;
use super::lookup::{self, GroupHit};
use super::pool::BlockPool;
use super::seq::SeqKv;
use super::{
    Allocation, BlockId, CopyOp, HashExtras, KvConfig, KvEvent, KvGroup, KvMetrics, NoSpace,
    PrefixHit, NULL_BLOCK,
};
use crate::error::{Error, Result};

/// Cumulative counters (tokens unless named otherwise).
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    prefix_query_tokens: u64,
    prefix_hit_tokens: u64,
    copies: u64,
    copied_tokens: u64,
    adoptions: u64,
}

/// The block manager. One per engine; only the scheduler mutates it.
pub struct KvManager {
    pub(crate) groups: Vec<KvGroup>,
    pub(crate) config: KvConfig,
    pub(crate) bs: usize,
    pub(crate) sbs: usize,
    /// Sub-blocks per block.
    pub(crate) spb: usize,
    /// Sliding window per group (`None`: full attention).
    pub(crate) windows: Vec<Option<usize>>,
    root: BlockHash,
    pub(crate) pools: Vec<BlockPool>,
    pub(crate) indexes: Vec<SubBlockIndex>,
    /// Free blocks that hold indexed sub-blocks, per group.
    pub(crate) cached_free: Vec<u32>,
    queued_ops: Vec<CopyOp>,
    /// Pins of `queued_ops` (not yet taken).
    pub(crate) queued_pins: Vec<(u32, BlockId)>,
    /// Pins of ops taken for the step in flight.
    pub(crate) inflight_pins: Vec<(u32, BlockId)>,
    events: EventLog,
    counters: Counters,
    orphans: Vec<BlockHash>,
    heads: Vec<BlockId>,
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

impl KvManager {
    /// Builds the pools (one per group, `config.num_blocks[g]` blocks each, block 0 reserved).
    /// `Error::Config` names the offending field and what would work.
    pub fn new(groups: Vec<KvGroup>, config: KvConfig) -> Result<Self> {
        let err = |m: String| Err(Error::Config(m));
        if groups.is_empty() {
            return err("kv groups: at least one group is needed".into());
        }
        if config.num_blocks.len() != groups.len() {
            return err(format!(
                "kv.num_blocks has {} entries but the model has {} KV groups (one pool per group)",
                config.num_blocks.len(),
                groups.len()
            ));
        }
        if config.block_size == 0 {
            return err("kv.block_size must be >= 1 (got 0)".into());
        }
        if config.sub_block_size == 0 || config.block_size % config.sub_block_size != 0 {
            return err(format!(
                "kv.sub_block_size must divide kv.block_size {} (got {}; e.g. {})",
                config.block_size, config.sub_block_size, config.block_size
            ));
        }
        for (g, &n) in config.num_blocks.iter().enumerate() {
            if n < 2 {
                return err(format!(
                    "kv.num_blocks[{g}] must be >= 2: block 0 is reserved (got {n})"
                ));
            }
        }
        if config.max_num_batched_tokens == 0 {
            return err("kv.max_num_batched_tokens must be >= 1 (got 0)".into());
        }
        let root = root_hash(config.hash_seed.as_deref().unwrap_or(DEFAULT_HASH_SEED));
        let windows = groups
            .iter()
            .map(|g| g.kind.window().map(|w| w as usize))
            .collect();
        let pools = config
            .num_blocks
            .iter()
            .map(|&n| BlockPool::new(n))
            .collect();
        let (bs, sbs) = (config.block_size as usize, config.sub_block_size as usize);
        let indexes = config
            .num_blocks
            .iter()
            .map(|&n| SubBlockIndex::new(n, bs / sbs))
            .collect();
        Ok(KvManager {
            cached_free: vec![0; groups.len()],
            groups,
            bs,
            sbs,
            spb: bs / sbs,
            windows,
            root,
            pools,
            indexes,
            config,
            queued_ops: Vec::new(),
            queued_pins: Vec::new(),
            inflight_pins: Vec::new(),
            events: EventLog::default(),
            counters: Counters::default(),
            orphans: Vec::new(),
            heads: Vec::new(),
        })
    }

    pub fn groups(&self) -> &[KvGroup] {
        &self.groups
    }

    pub fn config(&self) -> &KvConfig {
        &self.config
    }

    /// Fresh per-request state. `skip_prefix_read`: never reuse cached KV (prompt logprobs need every
    /// prompt row computed); the request's own KV is still indexed for others.
    pub fn new_seq(&self, extras: HashExtras, skip_prefix_read: bool) -> SeqKv {
        let n = self.groups.len();
        SeqKv {
            tables: vec![Vec::new(); n],
            num_null: vec![0; n],
            hashes: Vec::new(),
            extras: EncodedExtras::new(&extras),
            skip_prefix_read,
            num_tokens: 0,
            tokens: Vec::new(),
            num_committed: 0,
            num_indexed_sub: 0,
            admitted: false,
            fast_total: 0,
            fast_computed: 0,
        }
    }

    /// Extends `seq`'s hash chain over the complete sub-blocks of `tokens` (the request's whole token
    /// list so far; incremental: only the unhashed suffix is hashed). Never pass draft tokens.
    pub fn hash_tokens(&self, seq: &mut SeqKv, tokens: &[u32]) {
        debug_assert!(
            tokens.len() >= seq.tokens.len(),
            "hash_tokens: the token list only grows"
        );
        seq.num_tokens = tokens.len();
        if !self.config.enable_prefix_caching {
            return;
        }
        if self.config.enable_events && tokens.len() > seq.tokens.len() {
            seq.tokens.extend_from_slice(&tokens[seq.tokens.len()..]);
        }
        // Most calls (one decode token) complete no sub-block: skip the chain walk.
        if tokens.len() >= (seq.hashes.len() + 1) * self.sbs {
            extend_chain(&self.root, &seq.extras, self.sbs, tokens, &mut seq.hashes);
        }
    }

    /// Longest reusable prefix of a request with `num_tokens` tokens whose chain is hashed. No side
    /// effects. `None` when caching is off, the request skips reading, or nothing matches.
    pub fn lookup(&self, seq: &SeqKv, num_tokens: usize) -> Option<PrefixHit> {
        if !self.config.enable_prefix_caching || seq.skip_prefix_read {
            return None;
        }
        lookup::find_longest_hit(self, &seq.hashes, num_tokens)
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

    /// Releases leading blocks of a sliding group that no token from `num_computed` on can see.
    fn release_out_of_window(&mut self, seq: &mut SeqKv, g: usize, num_computed: usize) {
        let skip_blocks = (self.skipped_tokens(g, num_computed) / self.bs).min(seq.tables[g].len());
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
                let hs = self.orphans.iter().map(|h| h.to_u64()).collect();
                self.events.removed(g as u32, hs);
            }
        }
        b
    }

    /// Drops one reference of each block, `blocks` given head of the request first: they are
    /// released in reverse (eviction-priority order). Blocks reaching 0 go to the LRU tail when
    /// they hold indexed sub-blocks (kept longest), to the head otherwise (reused first, in the
    /// order released).
    fn release_rev(&mut self, g: usize, blocks: &[BlockId]) {
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
    fn index_seq(&mut self, seq: &mut SeqKv, upto: usize) {
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
                    let hs: SmallVec<[u64; 32]> =
                        seq.hashes[fresh..hi].iter().map(|h| h.to_u64()).collect();
                    self.events.stored(
                        g as u32,
                        parent,
                        &hs,
                        &seq.tokens[fresh * sbs..hi * sbs],
                        sbs as u32,
                    );
                }
            }
        }
        seq.num_indexed_sub = upto;
    }

    /// Copy ops queued since the last call, for this step's plan. Their sources stay pinned until
    /// [`KvManager::release_copy_sources`].
    pub fn take_copy_ops(&mut self) -> Vec<CopyOp> {
        self.inflight_pins.append(&mut self.queued_pins);
        std::mem::take(&mut self.queued_ops)
    }

    /// Unpins the sources of the copy ops taken for the step that just executed (called from the
    /// scheduler's update, never earlier: an early release lets the next allocation evict and
    /// reuse a source before the executor copied it).
    pub fn release_copy_sources(&mut self) {
        let pins = std::mem::take(&mut self.inflight_pins);
        for &(g, b) in &pins {
            self.release_rev(g as usize, &[b]);
        }
        self.inflight_pins = pins;
        self.inflight_pins.clear();
    }

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
                let hs = self.orphans.iter().map(|h| h.to_u64()).collect();
                self.events.removed(g as u32, hs);
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

    /// Events collected since the last call (always empty unless `enable_events`).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.take()
    }

    pub fn metrics(&self) -> KvMetrics {
        let total: u64 = self.pools.iter().map(|p| p.num_blocks() as u64 - 1).sum();
        let free: u64 = self.pools.iter().map(|p| p.num_free() as u64).sum();
        let c = &self.counters;
        KvMetrics {
            blocks_total: total,
            blocks_free: free,
            blocks_used: total - free,
            blocks_cached: self.cached_free.iter().map(|&c| c as u64).sum(),
            prefix_query_tokens: c.prefix_query_tokens,
            prefix_hit_tokens: c.prefix_hit_tokens,
            copies: c.copies,
            copied_tokens: c.copied_tokens,
            adoptions: c.adoptions,
        }
    }

    /// Free blocks in group `g` (evictable cached blocks count as free).
    pub fn num_free_blocks(&self, g: usize) -> u32 {
        self.pools[g].num_free()
    }
}
