//! The block manager: pools + indexes per group, its state and its read-only face (construction,
//! hashing, lookup, metrics). What mutates it lives beside it, one concern per file:
//! `manager/allocate.rs` (admission and growth: capacity checks, hit sharing, copy-on-match,
//! adoption, eviction on take), `manager/commit.rs` (after a step: deferred indexing, copy-op
//! hand-off and unpinning), `manager/release.rs` (frees, sliding-window release, invalidation,
//! cache reset).

use super::events::EventLog;
use super::hashing::{extend_chain, root_hash, BlockHash, EncodedExtras, DEFAULT_HASH_SEED};
use super::index::SubBlockIndex;
use super::lookup;
use super::pool::BlockPool;
use super::seq::SeqKv;
use super::{
    BlockId, CopyOp, HashExtras, KvConfig, KvEvent, KvEventBatch, KvGroup, KvMetrics,
    MmPlaceholder, PrefixHit,
};
use crate::error::{Error, Result};

mod allocate;
mod commit;
mod release;

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

    /// The KV groups this manager was built for, in pool order (group `g` is pool `g`, table `g`
    /// of every [`SeqKv`], and the executor's KV tensor `g`).
    pub fn groups(&self) -> &[KvGroup] {
        &self.groups
    }

    /// The configuration the manager was built with (as validated by [`KvManager::new`]).
    pub fn config(&self) -> &KvConfig {
        &self.config
    }

    /// Fresh per-request state. `skip_prefix_read`: never reuse cached KV (prompt logprobs need every
    /// prompt row computed); the request's own KV is still indexed for others.
    pub fn new_seq(&self, extras: HashExtras, skip_prefix_read: bool) -> SeqKv {
        self.new_seq_mm(extras, Vec::new(), skip_prefix_read)
    }

    /// [`KvManager::new_seq`] for a prompt with multimodal items: the sub-blocks overlapping an
    /// item's placeholder run also hash the item's identifier (`mm` sorted and disjoint; the
    /// scheduler validates it).
    pub fn new_seq_mm(
        &self,
        extras: HashExtras,
        mm: Vec<MmPlaceholder>,
        skip_prefix_read: bool,
    ) -> SeqKv {
        let n = self.groups.len();
        SeqKv {
            tables: vec![Vec::new(); n],
            num_null: vec![0; n],
            hashes: Vec::new(),
            extras: EncodedExtras::with_mm(&extras, mm),
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
        // Most calls (one decode token) complete no sub-block: skip the chain walk.
        if tokens.len() >= (seq.hashes.len() + 1) * self.sbs {
            extend_chain(&self.root, &seq.extras, self.sbs, tokens, &mut seq.hashes);
            // Events name the tokens of hashed sub-blocks only: copy them as sub-blocks complete,
            // not per decode token.
            let hashed = seq.hashes.len() * self.sbs;
            if self.config.enable_events && hashed > seq.tokens.len() {
                seq.tokens
                    .extend_from_slice(&tokens[seq.tokens.len()..hashed]);
            }
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

    /// Events collected since the last call (always empty unless `enable_events`), owned.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.take()
    }

    /// Events collected since the last call, handed over by swapping buffers: collection
    /// continues into `spare` (emptied first), so a publisher that returns the batches it has sent
    /// keeps the step loop free of allocation.
    pub fn swap_events(&mut self, spare: KvEventBatch) -> KvEventBatch {
        self.events.swap(spare)
    }

    /// Whether events are pending (cheap: lets the caller skip a hand-over).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Events the bounded event log discarded because nobody took them in time (it then reports
    /// `AllCleared`, see `DEFAULT_EVENT_LOG_CAPACITY`).
    pub fn dropped_events(&self) -> u64 {
        self.events.dropped()
    }

    /// A snapshot of the pool gauges and the cumulative prefix-cache counters, for the engine's
    /// metrics export (O(groups)).
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
