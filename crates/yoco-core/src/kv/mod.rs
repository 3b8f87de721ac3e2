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

mod events;
mod groups;
mod hashing;
mod index;
mod lookup;
mod manager;
mod pool;
mod seq;

pub use events::KvEvent;
pub use groups::{kv_groups, AttnKind, KvGroup, LayerKind};
pub use hashing::{root_hash, BlockHash, DEFAULT_HASH_SEED};
pub use manager::KvManager;
pub use seq::SeqKv;

/// Index of a block inside its group's pool.
pub type BlockId = u32;
/// The reserved block: padding tokens write here, skipped (out-of-window) table entries point here.
pub const NULL_BLOCK: BlockId = 0;

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

impl KvConfig {
    /// Defaults: `sub_block_size = block_size`, prefix caching on, events off, vLLM's hash seed,
    /// a step budget of 8192 tokens.
    pub fn new(block_size: u32, num_blocks: Vec<u32>) -> Self {
        KvConfig {
            block_size,
            sub_block_size: block_size,
            num_blocks,
            enable_prefix_caching: true,
            enable_events: false,
            hash_seed: None,
            max_num_batched_tokens: 8192,
        }
    }
}

/// Namespaces of the hash chain (tagged extra keys, so a salt never collides with a LoRA name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct HashExtras {
    /// Only hashed into the first sub-block.
    pub cache_salt: Option<String>,
    /// `(name, path)` of the LoRA adapter, hashed into every sub-block.
    pub lora: Option<(String, String)>,
}

/// A prefix-cache hit found by [`KvManager::lookup`]. Pins nothing; valid until the manager is
/// mutated (pass it to [`KvManager::allocate`] in the same scheduling pass; `allocate` panics on a
/// hit whose blocks were evicted meanwhile).
#[derive(Debug, Clone)]
pub struct PrefixHit {
    /// Tokens whose KV will be reused: a multiple of `sub_block_size`, at most `num_tokens - 1`,
    /// servable by every group. Of these, full blocks are shared and a trailing partial block is
    /// copied (copy-on-match) or adopted.
    pub num_tokens: u32,
    /// Per group: the blocks to share and the partial block's source.
    pub(crate) groups: Vec<lookup::GroupHit>,
}

impl PrefixHit {
    /// Tokens of the hit that lie in full, shared blocks (the rest is copied or adopted).
    pub fn num_shared_tokens(&self, block_size: u32) -> u32 {
        self.num_tokens / block_size * block_size
    }
}

/// What a successful [`KvManager::allocate`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocation {
    /// Blocks newly placed in the request's tables from the free pools, all groups: fresh blocks
    /// (copy destinations included) and adopted blocks. Shared hit blocks are not counted.
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

/// Counters and gauges the engine exports (tokens unless named otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvMetrics {
    /// Usable blocks, all groups (block 0 of each pool excluded).
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub blocks_used: u64,
    /// Free blocks that still carry cached KV (evictable, matchable).
    pub blocks_cached: u64,
    /// Prompt tokens of admitted requests that could read the cache (counted once per admission).
    pub prefix_query_tokens: u64,
    /// Of those, tokens served from the cache.
    pub prefix_hit_tokens: u64,
    /// Copy-on-match operations queued (one per group per partial hit).
    pub copies: u64,
    pub copied_tokens: u64,
    /// Partial blocks adopted instead of copied.
    pub adoptions: u64,
}
