//! From the core's sub-block events to vLLM's wire events at the wire block size.
//!
//! Every consumer (vllm-router, llm-d's indexer, Dynamo) indexes whole blocks of one fixed size, so
//! events leave the engine at a configurable `block_size` (default 16, llm-d's `blockSizeTokens`),
//! whatever the engine's allocation block is. The core indexes *sub-blocks*; a wire block size that
//! divides the sub-block size is obtained exactly from that index: each sub-block of `S` tokens is
//! `k = S / W` wire blocks. Their hashes (opaque keys to every consumer, which re-hash `token_ids`
//! themselves) are derived from the sub-block's chain hash: the last one *is* the sub-block hash,
//! the others are `mix(h, j)`. So a run's parent is simply the previous sub-block's hash, and a
//! sub-block's removal names exactly the wire hashes its storage announced.
//!
//! YOCO: only the self-decoder layers own KV (the cross-decoder reuses it), so one event describes
//! one logical token block for all self-decoder layers. With several KV groups (sliding and full
//! attention), one group is published (the first full-attention group by default): its index is
//! what bounds a servable prefix, and a consumer that saw every group would count each block twice.

use yoco_core::kv::KvEventRef;

/// One event as vLLM defines it (`vllm/distributed/kv_events.py`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireEvent {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        group_idx: Option<u32>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        group_idx: Option<u32>,
    },
    AllBlocksCleared,
}

/// The wire block size cannot be derived from this engine's sub-block index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kv-events block_size {wire} must divide the prefix-cache sub-block size {sub} (e.g. {sub} or 16 when 16 divides it)")]
pub struct GrainError {
    pub wire: u32,
    pub sub: u32,
}

/// Converts core events (sub-block grain, all groups) into wire events.
#[derive(Debug, Clone)]
pub struct Regrain {
    wire: u32,
    per_sub: u32,
    /// Publish only this group (and leave `group_idx` out), or every group with its `group_idx`.
    group: Option<u32>,
}

/// Wire hash `j` (`0 <= j < k - 1`) of a sub-block with chain hash `h` (splitmix64 finaliser).
pub fn derived_hash(h: u64, j: u32) -> u64 {
    let mut z = h ^ (u64::from(j) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Regrain {
    /// `group`: `Some(g)` publishes group `g` only, `None` every group (tagged with `group_idx`).
    pub fn new(
        sub_block_size: u32,
        wire_block_size: u32,
        group: Option<u32>,
    ) -> Result<Self, GrainError> {
        if wire_block_size == 0 || sub_block_size == 0 || sub_block_size % wire_block_size != 0 {
            return Err(GrainError {
                wire: wire_block_size,
                sub: sub_block_size,
            });
        }
        Ok(Regrain {
            wire: wire_block_size,
            per_sub: sub_block_size / wire_block_size,
            group,
        })
    }

    pub fn wire_block_size(&self) -> u32 {
        self.wire
    }

    /// Whether events of `group` are published at all (checked before queueing, so the step
    /// thread does not ship events the publisher would discard).
    pub fn wants(&self, event: &KvEventRef<'_>) -> bool {
        match (event.group(), self.group) {
            (Some(group), Some(g)) => group == g,
            _ => true,
        }
    }

    fn expand(&self, hashes: &[u64], out: &mut Vec<u64>) {
        let k = self.per_sub;
        out.reserve(hashes.len() * k as usize);
        for &h in hashes {
            out.extend((0..k - 1).map(|j| derived_hash(h, j)));
            out.push(h);
        }
    }

    /// Appends the wire form of `event` to `out` (nothing for a group that is not published).
    pub fn convert(&self, event: &KvEventRef<'_>, out: &mut Vec<WireEvent>) {
        if !self.wants(event) {
            return;
        }
        let group_idx = |g: u32| if self.group.is_some() { None } else { Some(g) };
        match *event {
            KvEventRef::Stored {
                group,
                parent,
                hashes,
                token_ids,
                ..
            } => {
                let mut block_hashes = Vec::new();
                self.expand(hashes, &mut block_hashes);
                out.push(WireEvent::BlockStored {
                    block_hashes,
                    parent_block_hash: parent,
                    token_ids: token_ids.to_vec(),
                    block_size: self.wire,
                    group_idx: group_idx(group),
                });
            }
            KvEventRef::Removed { group, hashes } => {
                let mut block_hashes = Vec::new();
                self.expand(hashes, &mut block_hashes);
                out.push(WireEvent::BlockRemoved {
                    block_hashes,
                    group_idx: group_idx(group),
                });
            }
            KvEventRef::AllCleared => out.push(WireEvent::AllBlocksCleared),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yoco_core::kv::KvEvent;

    fn stored(group: u32, parent: Option<u64>, hashes: Vec<u64>, block_size: u32) -> KvEvent {
        let n = hashes.len() as u32 * block_size;
        KvEvent::Stored {
            group,
            parent,
            hashes,
            token_ids: (0..n).collect(),
            block_size,
        }
    }

    #[test]
    fn equal_grains_pass_hashes_through() {
        let r = Regrain::new(16, 16, Some(0)).unwrap();
        let mut out = Vec::new();
        r.convert(&stored(0, Some(9), vec![1, 2], 16).as_ref(), &mut out);
        assert_eq!(
            out,
            vec![WireEvent::BlockStored {
                block_hashes: vec![1, 2],
                parent_block_hash: Some(9),
                token_ids: (0..32).collect(),
                block_size: 16,
                group_idx: None
            }]
        );
    }

    #[test]
    fn a_sub_block_of_128_becomes_8_wire_blocks_of_16_ending_in_its_own_hash() {
        let r = Regrain::new(128, 16, Some(0)).unwrap();
        let mut out = Vec::new();
        r.convert(&stored(0, Some(7), vec![100, 200], 128).as_ref(), &mut out);
        let WireEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            ..
        } = out[0].clone()
        else {
            panic!()
        };
        assert_eq!(
            (block_hashes.len(), block_size, token_ids.len()),
            (16, 16, 256)
        );
        assert_eq!(block_hashes[7], 100);
        assert_eq!(block_hashes[15], 200);
        assert_eq!(
            parent_block_hash,
            Some(7),
            "the previous sub-block's hash is its last wire hash"
        );
        let mut uniq = block_hashes.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 16);
        // Removing the sub-blocks names exactly the announced wire hashes.
        r.convert(
            &KvEvent::Removed {
                group: 0,
                hashes: vec![200, 100],
            }
            .as_ref(),
            &mut out,
        );
        let WireEvent::BlockRemoved {
            block_hashes: removed,
            ..
        } = &out[1]
        else {
            panic!()
        };
        let (mut a, mut b) = (block_hashes.clone(), removed.clone());
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }

    #[test]
    fn only_the_published_group_goes_out_and_without_a_group_tag() {
        let r = Regrain::new(4, 4, Some(1)).unwrap();
        let mut out = Vec::new();
        r.convert(&stored(0, None, vec![1], 4).as_ref(), &mut out);
        r.convert(
            &KvEvent::Removed {
                group: 0,
                hashes: vec![1],
            }
            .as_ref(),
            &mut out,
        );
        assert!(out.is_empty());
        r.convert(&stored(1, None, vec![1], 4).as_ref(), &mut out);
        r.convert(&KvEventRef::AllCleared, &mut out);
        assert!(matches!(
            out[0],
            WireEvent::BlockStored {
                group_idx: None,
                ..
            }
        ));
        assert_eq!(out[1], WireEvent::AllBlocksCleared);
        let all = Regrain::new(4, 4, None).unwrap();
        out.clear();
        all.convert(&stored(3, None, vec![1], 4).as_ref(), &mut out);
        assert!(matches!(
            out[0],
            WireEvent::BlockStored {
                group_idx: Some(3),
                ..
            }
        ));
    }

    #[test]
    fn a_wire_block_larger_than_a_sub_block_is_refused_with_both_sizes() {
        let e = Regrain::new(4, 16, None).unwrap_err();
        assert_eq!(e, GrainError { wire: 16, sub: 4 });
        assert!(e.to_string().contains("16") && e.to_string().contains("4"));
        assert!(Regrain::new(48, 32, None).is_err());
    }
}
