//! Prefix lookup: the longest hit, in sub-blocks, that every group can serve.
//!
//! * Full attention needs every block before the hit: full blocks left to right (probe the hash of
//!   each block's last sub-block), then a walk of sub-blocks inside the first block that is not
//!   fully cached. Servable lengths are downward-closed, so one pass gives the group's maximum.
//! * Sliding window W needs only the tokens `[L - W + 1, L)` before a hit of length L: the blocks
//!   holding them (earlier entries become [`NULL_BLOCK`]). Servable lengths are *not*
//!   downward-closed (vLLM's right-to-left run search), so the group answers "the largest servable
//!   length <= L" by scanning candidates downwards; a missing full block b rules out every
//!   candidate whose window covers b, so the scan jumps below it and probes each block at most once.
//! * The coordinator (vLLM's fixed point, scheduler.md §6.3): start at the cap, let each sliding
//!   group lower L to what it can serve, repeat until no group lowers it.

use super::hashing::BlockHash;
use super::manager::KvManager;
use super::{BlockId, PrefixHit, NULL_BLOCK};

/// A trailing partial-block match: the first `num_sub` sub-blocks of `src`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartialHit {
    pub src: BlockId,
    pub num_sub: u32,
}

/// One group's part of a hit: table entries for the full blocks (null where the window does not
/// reach) and the partial block's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupHit {
    pub entries: Vec<BlockId>,
    pub partial: Option<PartialHit>,
}

pub(crate) fn find_longest_hit(
    m: &KvManager,
    hashes: &[BlockHash],
    num_tokens: usize,
) -> Option<PrefixHit> {
    if num_tokens == 0 {
        return None;
    }
    // A hit never covers the last token: its logits are needed.
    let max_sub = ((num_tokens - 1) / m.sbs).min(hashes.len());
    let mut l = max_sub;
    for g in 0..m.groups.len() {
        if m.windows[g].is_none() && l > 0 {
            l = full_hit(m, g, hashes, l);
        }
    }
    let sliding: Vec<usize> = (0..m.groups.len())
        .filter(|&g| m.windows[g].is_some())
        .collect();
    let mut memos: Vec<Vec<u8>> = sliding
        .iter()
        .map(|_| vec![0u8; max_sub / m.spb + 1])
        .collect();
    loop {
        let before = l;
        for (i, &g) in sliding.iter().enumerate() {
            if l > 0 {
                l = sliding_hit(m, g, hashes, l, &mut memos[i]);
            }
        }
        if l == before {
            break;
        }
    }
    if l == 0 {
        return None;
    }
    Some(build(m, hashes, l))
}

/// Full attention: longest servable prefix `<= lim` sub-blocks.
fn full_hit(m: &KvManager, g: usize, hashes: &[BlockHash], lim: usize) -> usize {
    let (idx, spb) = (&m.indexes[g], m.spb);
    let mut b = 0;
    while (b + 1) * spb <= lim && idx.has(&hashes[(b + 1) * spb - 1]) {
        b += 1;
    }
    let start = b * spb;
    let room = (lim - start).min(spb - 1);
    start + idx.match_depth(&hashes[start..start + room])
}

/// Sliding window: largest servable length `<= cur` sub-blocks. `memo[b]`: 0 unknown, 1 block b
/// fully cached, 2 not.
fn sliding_hit(
    m: &KvManager,
    g: usize,
    hashes: &[BlockHash],
    mut cur: usize,
    memo: &mut [u8],
) -> usize {
    let w = m.windows[g].expect("sliding group");
    let (idx, bs, sbs, spb) = (&m.indexes[g], m.bs, m.sbs, m.spb);
    'candidates: while cur > 0 {
        let tokens = cur * sbs;
        let skipped = tokens.saturating_sub(w - 1);
        if skipped >= tokens {
            return cur; // window 1: no cached token is ever read
        }
        let nfb = tokens / bs;
        if cur > nfb * spb {
            let d = idx.match_depth(&hashes[nfb * spb..cur]);
            if nfb * spb + d < cur {
                cur = nfb * spb + d;
                continue;
            }
        }
        for b in (skipped / bs..nfb).rev() {
            if memo[b] == 0 {
                memo[b] = if idx.has(&hashes[(b + 1) * spb - 1]) {
                    1
                } else {
                    2
                };
            }
            if memo[b] == 2 {
                cur = (b + 1) * spb - 1;
                continue 'candidates;
            }
        }
        return cur;
    }
    0
}

/// Picks holders for a hit of `l` sub-blocks that every group can serve.
fn build(m: &KvManager, hashes: &[BlockHash], l: usize) -> PrefixHit {
    let (bs, sbs, spb) = (m.bs, m.sbs, m.spb);
    let tokens = l * sbs;
    let nfb = tokens / bs;
    let k = l - nfb * spb;
    let groups = (0..m.groups.len())
        .map(|g| {
            let skipped = m.skipped_tokens(g, tokens);
            let skip_blocks = skipped / bs;
            let entries = (0..nfb)
                .map(|b| {
                    if b < skip_blocks {
                        NULL_BLOCK
                    } else {
                        pick_shared(m, g, &hashes[(b + 1) * spb - 1])
                    }
                })
                .collect();
            let partial =
                (k > 0 && skipped < tokens).then(|| pick_partial(m, g, &hashes[l - 1], k));
            super::lookup::GroupHit { entries, partial }
        })
        .collect();
    PrefixHit {
        num_tokens: tokens as u32,
        groups,
    }
}

/// A holder to share: one already referenced if any (sharing it costs no free block).
fn pick_shared(m: &KvManager, g: usize, h: &BlockHash) -> BlockId {
    let hs = m.indexes[g].holders(h);
    debug_assert!(!hs.is_empty());
    hs.iter()
        .copied()
        .find(|&b| m.pools[g].ref_count(b) > 0)
        .unwrap_or(hs[0])
}

/// The partial block's source: an adoptable block if any (zero copy), else a referenced holder
/// (pinning it costs no free block), else any.
fn pick_partial(m: &KvManager, g: usize, h: &BlockHash, k: usize) -> PartialHit {
    let hs = m.indexes[g].holders(h);
    debug_assert!(!hs.is_empty());
    let src = hs
        .iter()
        .copied()
        .find(|&b| m.adoptable(g, b, k))
        .or_else(|| hs.iter().copied().find(|&b| m.pools[g].ref_count(b) > 0))
        .unwrap_or(hs[0]);
    PartialHit {
        src,
        num_sub: k as u32,
    }
}
