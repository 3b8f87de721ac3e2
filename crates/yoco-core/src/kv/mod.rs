//! The paged KV block manager: block pools, KV groups, the sub-block prefix index, copy-on-match.
//!
//! The scheduler calls this API (the names were fixed first as a contract; see the change notes at
//! the end). Semantics follow vLLM V1's block pool and prefix caching and RBLN's sub-block overlay
//! (`shared/docs/scheduler.md` §5-7, §11), taking the better of the two where they differ.
//!
//! # Model of memory
//!
//! Each KV group (the producing layers of one attention type, [`kv_groups`]) has its own pool of
//! `num_blocks[g]` blocks, ids `0..num_blocks[g]`, block 0 reserved (the padding target, never handed
//! out). A block id means the same token range in every layer of its group:
//! `slot = block_id * block_size + offset`. Shared (KV-reusing) layers own no blocks. Each request
//! ([`SeqKv`]) has one block table per group; sliding groups put [`NULL_BLOCK`] where the window no
//! longer reaches.
//!
//! # The prefix index
//!
//! `block_size` is the allocation unit, `sub_block_size` (divides it) the match unit. A request's
//! sub-blocks are hashed in a chain, `h_i = SHA-256(CBOR([h_{i-1}, tokens_i, extras]))` (vLLM's
//! `sha256_cbor`, so hashes and events interoperate). The chain is per request and the same for all
//! groups; the index is per group:
//!
//! ```text
//!   request tokens  |t0..t3|t4..t7|t8..tB|tC..tF|tG..tJ|        sub-block 4, block 8
//!   hash chain       h0 --> h1 --> h2 --> h3 --> h4            (each h_i names the whole prefix)
//!   block table     [   blk 7     |   blk 3     |  blk 9 ...]
//!
//!   index (group g):  hash -> holders          block -> ordered sub-block hashes (first k slots)
//!                     h0 -> {7, 12}            7  -> [h0, h1]
//!                     h1 -> {7}                12 -> [h0]          (a copy holding 1 sub-block)
//!                     h2 -> {3}                3  -> [h2, h3]
//!                     h3 -> {3}                9  -> [h4]          (a partial tail)
//!                     h4 -> {9}
//! ```
//!
//! A hash fixes its slot (sub-block `i` sits in slot `i % spb` of table entry `i / spb`) and a holder
//! of `h_i` holds every earlier sub-block of its block, so the flat map is an implicit trie: a full
//! block `b` is cached iff its last hash has a holder; the longest match inside a block is a walk of
//! successive hashes that stops at the first miss.
//!
//! # A request's life (what the scheduler calls)
//!
//! 1. [`KvManager::new_seq`] + [`KvManager::hash_tokens`] (incremental; call again as tokens are
//!    appended, never with draft tokens).
//! 2. Admission: [`KvManager::lookup`] (no side effects) then [`KvManager::allocate`] with the hit,
//!    right away. Full matched blocks are shared (ref + 1). A match ending inside a block gets a
//!    private block plus a [`CopyOp`] (copy-on-match), or the source block itself when it is
//!    unreferenced and holds exactly the matched sub-blocks (zero-copy *adoption*). Copy sources are
//!    pinned. Running requests call `allocate` with `hit = None` for each new chunk / decode token.
//! 3. [`KvManager::take_copy_ops`] for the step plan; the executor copies before the forward.
//! 4. After execution: [`KvManager::commit_computed`] (indexes the newly computed sub-blocks, the
//!    partial tail included), then [`KvManager::release_copy_sources`].
//! 5. [`KvManager::free`] on finish / abort: tail first; blocks holding indexed sub-blocks go to the
//!    LRU tail (kept longest), others to the head (reused first). Preemption calls
//!    [`KvManager::free_blocks`] instead: the same release, but the request keeps its hash chain,
//!    so resuming it does not rehash its history.
//!
//! # Decisions (where vLLM and RBLN differ, and why)
//!
//! * **Per-group pools** (vLLM: one id space for all groups). Groups differ in what they keep (a
//!   sliding group holds ~window/block blocks per request, a full group the whole history), so each
//!   pool is sized on its own and a sliding group's churn never evicts full-attention cache.
//! * **Deferred indexing** (RBLN; vLLM registers at schedule time). Copies run *before* the forward,
//!   so a same-step sibling must not copy sub-blocks that are not written yet. Cost: two identical
//!   prompts admitted in the same step do not share (vLLM's "prefill dedup"); the next step does.
//! * **Pins held until the update after execution** (RBLN; vLLM drops them at the end of
//!   `schedule()`). Correct even when steps overlap or copies run off the compute stream.
//! * **Every complete sub-block is indexed**, interior and tail, running or finished (RBLN's eager
//!   indexing; vLLM registers only prompt tails as partial entries), so decode progress and
//!   multi-turn histories are matchable.
//! * **Retained partial tails** are first-class: "holds indexed sub-blocks" is what sends a freed
//!   block to the LRU tail (RBLN needed a synthetic hash for this).
//! * **Zero-copy adoption** (RBLN page-layout RFC, I5b; not in RBLN's default overlay): a partial
//!   match whose source is unreferenced and holds exactly the matched sub-blocks takes that block,
//!   so multi-turn chat copies nothing. A source holding *more* sub-blocks is copied, never
//!   truncated (adopting it would overwrite indexed KV).
//! * **Holder choice**: shared blocks and copy sources prefer already-referenced holders (no free
//!   block is consumed); a partial match prefers an adoptable holder.
//! * **LRU order exactly as vLLM** (unhashed to the head since vLLM PR #42656, hashed to the tail,
//!   tail first per request, lazy eviction at allocation, duplicates allowed).
//! * **Events deduplicated by holder count** (RBLN PR #553; vLLM emits one `Removed` per physical
//!   copy, which makes routers drop hashes still resident elsewhere), tagged with the group (vLLM),
//!   at sub-block granularity, consecutive `Stored` runs merged.
//! * **Sliding windows at sub-block granularity**: a hit of L tokens needs the blocks holding
//!   `[L - W + 1, L)` (vLLM needs whole blocks); hybrid hits use vLLM's fixed point. Out-of-window
//!   blocks are released by the next `allocate`, even one that then fails (vLLM does the same: they
//!   can never be read again). Admission reserves at most `ceil((W - 1 + max_num_batched_tokens) /
//!   block_size) + 1` blocks per sliding group (vLLM's cap, issue #39734). Retention is dense (every
//!   released sliding block stays cached in LRU order); vLLM's sparse retention is not implemented.
//! * **Hash keys** are the full 32-byte SHA-256 digests, so no token verification is needed on hit;
//!   the map hashes 8 bytes of the digest (already uniform).
//! * **The full-hit corner case** (a block-aligned fully cached prompt): vLLM recomputes the whole
//!   last block, here only the last sub-block (hits are capped at `num_tokens - 1`, then floored to a
//!   sub-block).
//!
//! # Cost (n = blocks touched, s = sub-blocks per block, H = hash probes)
//!
//! | operation | cost |
//! |---|---|
//! | free-list pop / remove / append / prepend | O(1), no allocation |
//! | `hash_tokens` | O(1) unless a sub-block completes; then O(new tokens) SHA-256 (~11 ns/token measured) |
//! | `lookup`, full attention | O(blocks of the hit + s) probes |
//! | `lookup`, sliding window | O(blocks scanned) probes, each block probed once (memo) |
//! | `allocate` | O(1) fast path for a running request whose tables cover the new tokens and whose windows release nothing (most decode steps); else O(groups + new table entries) + O(s) per evicted block |
//! | `commit_computed` | O(1) unless a sub-block completes; then O(newly computed sub-blocks) hash-map inserts |
//! | `free`, `free_blocks` | O(table length) |
//! | `take_copy_ops` / `release_copy_sources` | O(ops) |
//! | `reset_prefix_cache` | O(pool) |
//! | `check_invariants` | O(pool + index + tables), tests only |
//!
//! Measured figures: `benches/RESULTS.md`, "KV block manager".
//!
//! # Files
//!
//! `groups.rs` (layers to groups), `pool.rs` (ref counts + intrusive LRU), `hashing.rs` (the chain),
//! `index.rs` (the per-group trie), `lookup.rs` (longest servable hit), `manager.rs` (the manager's
//! state, construction, hashing, lookup, metrics) with `manager/allocate.rs` (admission, growth,
//! copy-on-match, adoption), `manager/commit.rs` (deferred indexing, copy-op hand-off) and
//! `manager/release.rs` (frees, window release, eviction, reset), `inspect.rs` (introspection,
//! `check_invariants`), `seq.rs` (per-request state), `events.rs` (KV events and their bounded
//! log), `event_batch.rs` (the flat buffers events are recorded into).
//!
//! # Changes to the contract
//!
//! Additive only, except: [`PrefixHit`] now carries a private plan (it can only come from
//! [`KvManager::lookup`]); `allocate` releases out-of-window sliding blocks even when it returns
//! `NoSpace`, and panics on a hit for a request that already holds blocks or on a stale hit.
//! Added later: [`KvManager::free_blocks`] (preemption keeping the chain) and
//! [`SeqKv::num_null_blocks`].
//!
//! # Hot path
//!
//! A steady decode step costs per request O(1) checks here: `allocate`, `commit_computed` and
//! `hash_tokens` each compare against limits kept in [`SeqKv`] and return at once unless a block
//! boundary (new block, window release) or a sub-block boundary (hash, index) is crossed. Those
//! boundary steps pay the real cost: one SHA-256 per sub-block, one hash-map insert per group,
//! a pool pop / push. Index lists live in flat, lazily allocated chunks (no allocation per block).
//! `benches/RESULTS.md`, "Scheduler", has the before/after figures.

mod event_batch;
mod events;
mod groups;
mod hashing;
mod index;
mod inspect;
mod lookup;
mod manager;
mod mm_keys;
mod pool;
mod seq;

pub use event_batch::{KvEventBatch, KvEventRef};
pub use events::{KvEvent, DEFAULT_EVENT_LOG_CAPACITY};
pub use groups::{kv_groups, AttnKind, KvGroup, LayerKind};
pub use hashing::{root_hash, BlockHash, DEFAULT_HASH_SEED};
pub use manager::KvManager;
pub use mm_keys::MmPlaceholder;
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
    /// Index computed sub-blocks and serve later requests from them. Off: every block is plain
    /// scratch, freed blocks are reused at once and `lookup` never hits.
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
    /// KV group (the executor's tensor) both blocks belong to.
    pub group: u32,
    /// Cached block holding the matched sub-blocks; pinned until
    /// [`KvManager::release_copy_sources`], so it cannot be reused before the copy ran.
    pub src: BlockId,
    /// The request's private block, fresh from the pool; the request computes into it after the
    /// copied slots.
    pub dst: BlockId,
    /// Leading token slots to copy: the matched sub-blocks, a multiple of `sub_block_size` below
    /// `block_size`.
    pub num_tokens: u32,
}

/// Counters and gauges the engine exports (tokens unless named otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvMetrics {
    /// Usable blocks, all groups (block 0 of each pool excluded).
    pub blocks_total: u64,
    /// Blocks no request or pinned copy source references, all groups; cached blocks count as
    /// free (they are reused, evicting their cache, when nothing uncached is left).
    pub blocks_free: u64,
    /// `blocks_total - blocks_free`: blocks held by requests or pinned as copy sources.
    pub blocks_used: u64,
    /// Free blocks that still carry cached KV (evictable, matchable).
    pub blocks_cached: u64,
    /// Prompt tokens of admitted requests that could read the cache (counted once per admission).
    pub prefix_query_tokens: u64,
    /// Of those, tokens served from the cache.
    pub prefix_hit_tokens: u64,
    /// Copy-on-match operations queued (one per group per partial hit).
    pub copies: u64,
    /// Token slots those copies move (per group, so a hybrid model counts a copy once per group).
    pub copied_tokens: u64,
    /// Partial blocks adopted instead of copied.
    pub adoptions: u64,
}
