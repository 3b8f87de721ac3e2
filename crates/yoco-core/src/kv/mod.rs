//! The paged KV block manager: block pools, KV groups, the sub-block prefix index, copy-on-match.
//!
//! CONTRACT (written before the implementation; the scheduler is built against it). The names and
//! signatures below are what `sched` calls. The implementation may add items, split this module into
//! files (`pool.rs`, `hash.rs`, `index.rs`, `groups.rs`, `manager.rs`, `events.rs`, ...) and re-export
//! from here, but keeps these public names and their meaning.
//!
//! Model of memory: each KV group (producing layers of one attention type) has its own pool of
//! `num_blocks[g]` blocks, ids `0..num_blocks[g]`, block 0 reserved (the padding target, never handed
//! out). A block id means the same token range in every layer of its group:
//! `slot = block_id * block_size + offset`. Shared (KV-reusing) layers own no blocks.

use crate::error::Result;

/// Index of a block inside its group's pool.
pub type BlockId = u32;
/// The reserved block: padding tokens write here, skipped (out-of-window) table entries point here.
pub const NULL_BLOCK: BlockId = 0;

/// How one decoder layer relates to the KV cache, as the model config describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Causal attention over the whole history; owns KV.
    Full,
    /// Sliding-window attention: key k visible from query q iff `q - window < k <= q`; owns KV.
    Sliding { window: u32 },
    /// Computes no K/V: attends to the KV of layer `donor` (an earlier producing layer).
    SharesKv { donor: usize },
}

/// Attention type of a KV group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnKind {
    Full,
    Sliding { window: u32 },
}

/// One KV group: the producing layers of one attention type, which share block tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGroup {
    pub kind: AttnKind,
    /// Producing layers of this group, ascending. Layer `layers[i]` is slice `i` of the group's
    /// KV tensor on the executor side.
    pub layers: Vec<usize>,
    /// Shared layers that read this group's KV, with their donor: `(layer, donor)`.
    pub readers: Vec<(usize, usize)>,
}

/// Groups producing layers by attention type, in order of first appearance. Rejects a shared layer
/// whose donor is not an earlier producing layer.
pub fn kv_groups(layers: &[LayerKind]) -> Result<Vec<KvGroup>> {
    let _ = layers;
    todo!("kv: group layers")
}

/// Static configuration of the block manager.
#[derive(Debug, Clone)]
pub struct KvConfig {
    /// Allocation unit, tokens per block.
    pub block_size: u32,
    /// Match unit for the prefix index; divides `block_size` (equal by default).
    pub sub_block_size: u32,
    /// Blocks per group pool, block 0 included (so `num_blocks[g] - 1` are usable).
    pub num_blocks: Vec<u32>,
    pub enable_prefix_caching: bool,
    /// Collect [`KvEvent`]s (off by default: costs a little per indexed sub-block).
    pub enable_events: bool,
    /// Root seed of the hash chain. `None`: vLLM's default `"vllm-none-hash"`, so hashes interoperate.
    pub hash_seed: Option<Vec<u8>>,
    /// Tokens one request may have in flight per step (the step token budget); bounds the blocks a
    /// sliding-window group must reserve.
    pub max_num_batched_tokens: u32,
}

/// Namespaces of the hash chain (tagged extra keys, so a salt never collides with a LoRA name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct HashExtras {
    /// Only hashed into the first sub-block.
    pub cache_salt: Option<String>,
    /// `(name, path)` of the LoRA adapter, hashed into every sub-block.
    pub lora: Option<(String, String)>,
}

/// Per-request KV state, owned by the request: one block table per group and the chained sub-block
/// hashes of its tokens. Give it back with [`KvManager::free`] (by value, so a double free cannot
/// be written); dropping one that still holds blocks is a bug (asserted in debug builds).
#[derive(Debug)]
pub struct SeqKv {
    _private: (),
}

impl SeqKv {
    /// The block table of group `g` (skipped sliding-window entries are [`NULL_BLOCK`]).
    pub fn table(&self, g: usize) -> &[BlockId] {
        let _ = g;
        todo!()
    }
}

/// A prefix-cache hit found by [`KvManager::lookup`]. Pins nothing; valid until the manager is
/// mutated (pass it to [`KvManager::allocate`] in the same scheduling pass).
#[derive(Debug, Clone)]
pub struct PrefixHit {
    /// Tokens whose KV will be reused: a multiple of `sub_block_size`, at most `num_tokens - 1`,
    /// servable by every group. Of these, full blocks are shared and a trailing partial block is
    /// copied (copy-on-match) or adopted.
    pub num_tokens: u32,
}

/// What a successful [`KvManager::allocate`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocation {
    /// Blocks newly taken from the pools (all groups).
    pub num_new_blocks: u32,
}

/// The pools cannot satisfy an allocation right now (nothing was changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSpace;

/// A copy the executor must run before this step's forward: the first `num_tokens` token slots of
/// block `src` into block `dst`, in every layer of `group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOp {
    pub group: u32,
    pub src: BlockId,
    pub dst: BlockId,
    pub num_tokens: u32,
}

/// KV events at sub-block granularity (vLLM's shapes), emitted on a hash's 0->1 / 1->0 holder
/// transitions only. Hashes are the low 64 bits of the SHA-256 digest (vLLM's int form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    Stored { group: u32, parent: Option<u64>, hashes: Vec<u64>, token_ids: Vec<u32>, block_size: u32 },
    Removed { group: u32, hashes: Vec<u64> },
    AllCleared,
}

/// Counters and gauges the engine exports (tokens unless named otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvMetrics {
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub blocks_used: u64,
    /// Free blocks that still carry cached KV (evictable, matchable).
    pub blocks_cached: u64,
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub copies: u64,
    pub copied_tokens: u64,
    pub adoptions: u64,
}

/// The block manager. One per engine; only the scheduler mutates it.
pub struct KvManager {
    _private: (),
}

impl KvManager {
    pub fn new(groups: Vec<KvGroup>, config: KvConfig) -> Result<Self> {
        let _ = (groups, config);
        todo!()
    }
    pub fn groups(&self) -> &[KvGroup] {
        todo!()
    }
    pub fn config(&self) -> &KvConfig {
        todo!()
    }
    /// Fresh per-request state. `skip_prefix_read`: never reuse cached KV (prompt logprobs need every
    /// prompt row computed); the request's own KV is still indexed for others.
    pub fn new_seq(&self, extras: HashExtras, skip_prefix_read: bool) -> SeqKv {
        let _ = (extras, skip_prefix_read);
        todo!()
    }
    /// Extends `seq`'s hash chain over the complete sub-blocks of `tokens` (the request's whole token
    /// list so far; incremental: only the unhashed suffix is hashed).
    pub fn hash_tokens(&self, seq: &mut SeqKv, tokens: &[u32]) {
        let _ = (seq, tokens);
        todo!()
    }
    /// Longest reusable prefix of a request with `num_tokens` tokens whose chain is hashed. No side
    /// effects. `None` when caching is off, the request skips reading, or nothing matches.
    pub fn lookup(&self, seq: &SeqKv, num_tokens: usize) -> Option<PrefixHit> {
        let _ = (seq, num_tokens);
        todo!()
    }
    /// Makes `seq`'s tables cover `num_computed + num_new` tokens, where `num_computed` already
    /// includes `hit.num_tokens` when a hit is given (admission). Frees sliding-window blocks that
    /// tokens from `num_computed` on can no longer reach. Requires, beyond what it allocates now,
    /// free capacity for `reserve_tokens` tokens in total (admission passes the whole prompt, so a
    /// request that cannot finish its prefill is not admitted; running requests pass 0). With a hit:
    /// shares its full blocks, and for a trailing partial match allocates a private block and queues
    /// a [`CopyOp`] (or adopts an unreferenced source block whose sub-blocks are exactly the
    /// request's). On `Err(NoSpace)` nothing changed, hit ref counts included.
    pub fn allocate(
        &mut self,
        seq: &mut SeqKv,
        hit: Option<&PrefixHit>,
        num_computed: usize,
        num_new: usize,
        reserve_tokens: usize,
    ) -> std::result::Result<Allocation, NoSpace> {
        let _ = (seq, hit, num_computed, num_new, reserve_tokens);
        todo!()
    }
    /// After the step executed: `seq` now has KV for its first `num_computed` tokens. Indexes newly
    /// complete sub-blocks (deferred indexing, so a same-step sibling never copies unwritten KV),
    /// including the partial tail block.
    pub fn commit_computed(&mut self, seq: &mut SeqKv, num_computed: usize) {
        let _ = (seq, num_computed);
        todo!()
    }
    /// Copy ops queued since the last call, for this step's plan. Their sources stay pinned until
    /// [`KvManager::release_copy_sources`].
    pub fn take_copy_ops(&mut self) -> Vec<CopyOp> {
        todo!()
    }
    /// Unpins the sources of the copy ops taken for the step that just executed (called from the
    /// scheduler's update, never earlier).
    pub fn release_copy_sources(&mut self) {
        todo!()
    }
    /// Returns all of `seq`'s blocks (finish, preemption, abort), tail first; a partial tail that
    /// holds indexed sub-blocks is retained in the LRU rather than reused first.
    pub fn free(&mut self, seq: SeqKv) {
        let _ = seq;
        todo!()
    }
    /// Drops every cached entry; fails (returns false) while any block is referenced.
    pub fn reset_prefix_cache(&mut self) -> bool {
        todo!()
    }
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        todo!()
    }
    pub fn metrics(&self) -> KvMetrics {
        todo!()
    }
    /// Free blocks in group `g` (evictable cached blocks count as free).
    pub fn num_free_blocks(&self, g: usize) -> u32 {
        let _ = g;
        todo!()
    }
    /// Checks every structural invariant (ref counts equal holders, no block both free and
    /// referenced, index entries point at blocks that hold those tokens). `seqs` are all live
    /// requests' states. For tests; O(pool).
    pub fn check_invariants<'a>(&self, seqs: impl IntoIterator<Item = &'a SeqKv>) -> std::result::Result<(), String> {
        let _ = seqs.into_iter();
        todo!()
    }
}
