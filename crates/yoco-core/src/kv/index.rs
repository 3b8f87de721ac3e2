//! One group's sub-block prefix index: `hash -> holder blocks` plus `block -> ordered sub-block
//! hashes` (RBLN's `SubBlockIndex`).
//!
//! A block's list is always the hashes of its *first* k sub-blocks (KV is written from slot 0 on),
//! and a hash names a whole prefix, so it also fixes the slot: sub-block `i` of a request sits in
//! slot `i % spb` of table entry `i / spb`. A holder of `h_i` therefore holds every earlier sub-block
//! of the same block, which makes the flat map an implicit trie: the longest match inside a block is
//! a walk of successive hashes that stops at the first one without holders.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::hashing::BlockHash;
use super::BlockId;

type Holders = SmallVec<[BlockId; 2]>;

/// Blocks per chunk of list storage (chunks are allocated on first use).
const CHUNK_BLOCKS: usize = 64;

/// The index of one group.
///
/// Storage is laid out for the decode hot path: block `b`'s list lives in a flat slice of `spb`
/// slots (chunk `b / CHUNK_BLOCKS`, slots `(b % CHUNK_BLOCKS) * spb ..`, the first `lens[b]` used),
/// so indexing a block allocates nothing after its chunk exists. The map grows with its content
/// (sizing it for a full pool up front was measured: with a pool much larger than what is indexed,
/// e.g. heavy prefix sharing, its sparse inserts touch every page of the big table and page faults
/// dominate the steps).
#[derive(Debug, Clone, Default)]
pub(crate) struct SubBlockIndex {
    map: FxHashMap<BlockHash, Holders>,
    /// Sub-blocks per block (slots per list).
    spb: usize,
    /// List storage, `CHUNK_BLOCKS * spb` hashes per chunk; empty until first used.
    chunks: Vec<Box<[BlockHash]>>,
    /// Used slots of each block's list.
    lens: Vec<u32>,
    /// Blocks whose list is non-empty.
    num_indexed_blocks: u32,
}

impl SubBlockIndex {
    /// An empty index for blocks `0..num_blocks` holding up to `spb` sub-blocks each.
    pub fn new(num_blocks: u32, spb: usize) -> Self {
        let n = num_blocks as usize;
        SubBlockIndex {
            map: FxHashMap::default(),
            spb,
            chunks: vec![Box::default(); n.div_ceil(CHUNK_BLOCKS)],
            lens: vec![0; n],
            num_indexed_blocks: 0,
        }
    }

    /// Blocks holding the sub-block named `h` (empty when none).
    pub fn holders(&self, h: &BlockHash) -> &[BlockId] {
        self.map.get(h).map_or(&[], |v| v.as_slice())
    }

    pub fn has(&self, h: &BlockHash) -> bool {
        self.map.contains_key(h)
    }

    /// The ordered sub-block hashes held by block `b` (its first `len` sub-blocks).
    pub fn list(&self, b: BlockId) -> &[BlockHash] {
        let (b, len) = (b as usize, self.lens[b as usize] as usize);
        if len == 0 {
            return &[];
        }
        let off = (b % CHUNK_BLOCKS) * self.spb;
        &self.chunks[b / CHUNK_BLOCKS][off..off + len]
    }

    pub fn is_indexed(&self, b: BlockId) -> bool {
        self.lens[b as usize] != 0
    }

    pub fn num_hashes(&self) -> usize {
        self.map.len()
    }

    pub fn num_indexed_blocks(&self) -> u32 {
        self.num_indexed_blocks
    }

    /// How many leading hashes of `query` have a holder (walk stops at the first miss).
    pub fn match_depth(&self, query: &[BlockHash]) -> usize {
        query
            .iter()
            .take_while(|h| self.map.contains_key(h))
            .count()
    }

    /// RBLN's `longest_match` (the manager walks per block with [`Self::match_depth`]).
    #[cfg(test)]
    /// RBLN's `longest_match`: `(some holder of the last matched hash, depth)`.
    pub fn longest_match(&self, query: &[BlockHash]) -> (Option<BlockId>, usize) {
        let d = self.match_depth(query);
        if d == 0 {
            (None, 0)
        } else {
            (self.holders(&query[d - 1]).first().copied(), d)
        }
    }

    /// Idempotently extends block `b`'s list to `hashes` (the block's hashes from slot 0, at most
    /// `spb`). Returns the position of the first hash that had no holder before (`hashes.len()`
    /// when none did): those newly held hashes are a contiguous suffix, because a holder of `h_i`
    /// holds `h_{i-1}` too.
    pub fn extend(&mut self, b: BlockId, hashes: &[BlockHash]) -> usize {
        assert!(
            hashes.len() <= self.spb,
            "block {b}: {} sub-blocks, at most {} fit",
            hashes.len(),
            self.spb
        );
        let cur = self.lens[b as usize] as usize;
        debug_assert_eq!(
            &self.list(b)[..cur.min(hashes.len())],
            &hashes[..cur.min(hashes.len())],
            "block {b} holds other sub-blocks"
        );
        if hashes.len() <= cur {
            return hashes.len();
        }
        if cur == 0 {
            self.num_indexed_blocks += 1;
        }
        let chunk = &mut self.chunks[b as usize / CHUNK_BLOCKS];
        if chunk.is_empty() {
            *chunk = vec![BlockHash([0; 32]); CHUNK_BLOCKS * self.spb].into_boxed_slice();
        }
        let off = (b as usize % CHUNK_BLOCKS) * self.spb;
        let slots = &mut chunk[off..off + hashes.len()];
        let mut first_fresh = hashes.len();
        for (i, h) in hashes.iter().enumerate().skip(cur) {
            slots[i] = *h;
            let holders = self.map.entry(*h).or_default();
            if holders.is_empty() && first_fresh == hashes.len() {
                first_fresh = i;
            }
            debug_assert!(
                holders.is_empty() || first_fresh == hashes.len(),
                "fresh hashes must form a suffix"
            );
            holders.push(b);
        }
        self.lens[b as usize] = hashes.len() as u32;
        first_fresh
    }

    /// Removes block `b` from the index; appends to `orphaned` the hashes that lost their last
    /// holder (in slot order). Unknown / unindexed blocks are a no-op.
    pub fn pop(&mut self, b: BlockId, orphaned: &mut Vec<BlockHash>) {
        let len = self.lens[b as usize] as usize;
        if len == 0 {
            return;
        }
        self.lens[b as usize] = 0;
        self.num_indexed_blocks -= 1;
        let off = (b as usize % CHUNK_BLOCKS) * self.spb;
        for h in &self.chunks[b as usize / CHUNK_BLOCKS][off..off + len] {
            let Entry::Occupied(mut e) = self.map.entry(*h) else {
                panic!("indexed hash {h:?} has no holders")
            };
            let holders = e.get_mut();
            let pos = holders
                .iter()
                .position(|&x| x == b)
                .expect("block is a holder of its hashes");
            holders.swap_remove(pos);
            if holders.is_empty() {
                e.remove();
                orphaned.push(*h);
            }
        }
    }

    /// Drops everything (list storage is kept).
    pub fn clear(&mut self) {
        self.map.clear();
        self.lens.fill(0);
        self.num_indexed_blocks = 0;
    }

    /// Map and lists agree: every listed hash has the block as holder exactly once and vice versa.
    pub fn check(&self) -> Result<(), String> {
        let mut pairs = 0usize;
        let mut indexed = 0u32;
        for b in 0..self.lens.len() {
            let list = self.list(b as BlockId);
            if !list.is_empty() {
                indexed += 1;
            }
            if b == 0 && !list.is_empty() {
                return Err("null block is indexed".into());
            }
            for h in list {
                let hs = self.holders(h);
                if hs.iter().filter(|&&x| x == b as BlockId).count() != 1 {
                    return Err(format!(
                        "block {b} lists {h:?} but is not its holder exactly once"
                    ));
                }
                pairs += 1;
            }
        }
        let total: usize = self.map.values().map(|v| v.len()).sum();
        if total != pairs {
            return Err(format!(
                "index: {total} holder entries but {pairs} listed sub-blocks"
            ));
        }
        if self.map.values().any(|v| v.is_empty()) {
            return Err("index: hash without holders".into());
        }
        if indexed != self.num_indexed_blocks {
            return Err("index: indexed-block count drifted".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! scheduler.md §11.6 SB-2 (sub-block size 2, hashes of sub-blocks [1,2],[3,4],[5,6]).
    use super::super::hashing::{extend_chain, root_hash, EncodedExtras, DEFAULT_HASH_SEED};
    use super::super::HashExtras;
    use super::*;

    fn hashes() -> Vec<BlockHash> {
        let mut h = Vec::new();
        extend_chain(
            &root_hash(DEFAULT_HASH_SEED),
            &EncodedExtras::new(&HashExtras::default()),
            2,
            &[1, 2, 3, 4, 5, 6],
            &mut h,
        );
        h
    }

    #[test]
    fn longest_match_walks_until_the_first_miss() {
        let h = hashes();
        let mut idx = SubBlockIndex::new(32, 3);
        assert_eq!(idx.longest_match(&h), (None, 0));
        assert_eq!(idx.extend(10, &h), 0);
        assert_eq!(idx.longest_match(&h), (Some(10), 3));
        assert_eq!(idx.longest_match(&h[..2]), (Some(10), 2));
        assert_eq!(idx.longest_match(&[]), (None, 0));
        idx.check().unwrap();
    }

    #[test]
    fn popping_one_of_two_holders_keeps_the_other() {
        let h = hashes();
        let mut idx = SubBlockIndex::new(32, 3);
        idx.extend(10, &h);
        assert_eq!(
            idx.extend(20, &h[..2]),
            2,
            "nothing new: both hashes already held"
        );
        let (b, d) = idx.longest_match(&h);
        assert!(b == Some(10) || b == Some(20));
        assert_eq!(d, 3);
        let mut orphaned = Vec::new();
        idx.pop(10, &mut orphaned);
        assert_eq!(
            orphaned,
            vec![h[2]],
            "only the hash no one else holds is orphaned"
        );
        assert_eq!(idx.longest_match(&h), (Some(20), 2));
        idx.pop(7, &mut orphaned); // unknown id: no-op
        assert_eq!(orphaned.len(), 1);
        idx.pop(20, &mut orphaned);
        assert_eq!(idx.longest_match(&h), (None, 0));
        assert_eq!(orphaned, vec![h[2], h[0], h[1]]);
        idx.check().unwrap();
    }

    #[test]
    fn extension_is_idempotent_and_reports_the_fresh_suffix() {
        let h = hashes();
        let mut idx = SubBlockIndex::new(32, 3);
        assert_eq!(idx.extend(3, &h[..1]), 0);
        assert_eq!(idx.extend(3, &h[..1]), 1, "re-extending adds nothing");
        assert_eq!(idx.extend(3, &h), 1, "only h1, h2 are new");
        assert_eq!(idx.list(3), &h[..]);
        assert_eq!(idx.extend(4, &h), 3, "a second holder adds no fresh hash");
        idx.check().unwrap();
    }
}
