//! Per-request KV state: one block table per group and the request's sub-block hash chain.

use super::hashing::{BlockHash, EncodedExtras};
use super::{BlockId, NULL_BLOCK};

/// Per-request KV state, owned by the request: one block table per group and the chained sub-block
/// hashes of its tokens. Give it back with [`KvManager::free`](super::KvManager::free) (by value, so
/// a double free cannot be written); dropping one that still holds blocks is a bug (asserted in
/// debug builds).
#[derive(Debug)]
pub struct SeqKv {
    /// Block table per group; sliding groups hold [`NULL_BLOCK`] for released leading entries.
    pub(crate) tables: Vec<Vec<BlockId>>,
    /// Leading [`NULL_BLOCK`] entries per group (released or skipped).
    pub(crate) num_null: Vec<u32>,
    /// Chained hashes of the complete sub-blocks seen by `hash_tokens`.
    pub(crate) hashes: Vec<BlockHash>,
    pub(crate) extras: EncodedExtras,
    pub(crate) skip_prefix_read: bool,
    /// Length of the token list last passed to `hash_tokens`.
    pub(crate) num_tokens: usize,
    /// The tokens of the hashed sub-blocks, `hashes.len() * sub_block_size` of them (kept only when
    /// events are on: `Stored` carries token ids).
    pub(crate) tokens: Vec<u32>,
    /// Tokens with KV, as of the last `commit_computed`.
    pub(crate) num_committed: usize,
    /// Leading sub-blocks already indexed (in every group where the entry is not null).
    pub(crate) num_indexed_sub: usize,
    /// Has a first allocation succeeded (prefix-query metrics count once per admission).
    pub(crate) admitted: bool,
    /// Allocation fast path ([`KvManager::allocate`](super::KvManager::allocate)): while
    /// `num_computed + num_new <= fast_total` and `num_computed < fast_computed`, a running
    /// request's allocation (no hit, no reservation) would change nothing: every table already
    /// covers the tokens and no sliding window has left a block behind. Both limits are exact
    /// consequences of the tables, recomputed by every full allocation; 0 (the initial value, and
    /// after a failed allocation or a free) sends the next call down the full path.
    pub(crate) fast_total: usize,
    pub(crate) fast_computed: usize,
}

impl SeqKv {
    /// The block table of group `g` (skipped sliding-window entries are [`NULL_BLOCK`]).
    pub fn table(&self, g: usize) -> &[BlockId] {
        &self.tables[g]
    }

    /// Chained hashes of the complete sub-blocks hashed so far.
    pub fn sub_block_hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Tokens with KV as of the last [`KvManager::commit_computed`](super::KvManager::commit_computed).
    pub fn num_committed_tokens(&self) -> usize {
        self.num_committed
    }

    /// Whether any group's table holds a real block.
    pub fn holds_blocks(&self) -> bool {
        self.tables
            .iter()
            .zip(&self.num_null)
            .any(|(t, &n)| t.len() > n as usize)
    }

    /// Leading [`NULL_BLOCK`] entries of group `g`'s table (sliding-window blocks released or
    /// skipped); every later entry is a real block.
    pub fn num_null_blocks(&self, g: usize) -> usize {
        self.num_null[g] as usize
    }

    /// Real (non-null) blocks held in group `g`.
    pub fn num_live_blocks(&self, g: usize) -> usize {
        self.tables[g].len() - self.num_null[g] as usize
    }
}

impl Drop for SeqKv {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            debug_assert!(
                self.tables
                    .iter()
                    .all(|t| t.iter().all(|&b| b == NULL_BLOCK)),
                "SeqKv dropped while holding blocks: give it back with KvManager::free"
            );
        }
    }
}
