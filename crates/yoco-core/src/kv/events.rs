//! KV events as data (vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`, at sub-block
//! granularity as in RBLN PR #553). Publishing them on the wire is the engine's business.

/// KV events at sub-block granularity (vLLM's shapes), emitted on a hash's 0->1 / 1->0 holder
/// transitions only. Hashes are the low 64 bits of the SHA-256 digest (vLLM's int form).
///
/// `Stored` covers a contiguous run of a request's hash chain: `parent` is the hash just before
/// `hashes[0]` (`None` at the chain's start), `token_ids` are the tokens of those sub-blocks, and
/// `block_size` is the sub-block size, so a consumer can re-hash `token_ids` from `parent` and
/// reproduce every hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Sub-block hashes that gained their first holder: a router may now send matching prompts
    /// here.
    Stored {
        /// KV group whose index now holds the hashes (each group caches independently, so a
        /// prefix is only servable where every group holds it).
        group: u32,
        /// Hash of the sub-block just before `hashes[0]` in the request's chain, the seed a
        /// consumer re-hashes from; `None` when `hashes[0]` is the chain's first sub-block.
        parent: Option<u64>,
        /// The new hashes, in chain order (a contiguous run: each one extends the previous).
        hashes: Vec<u64>,
        /// The tokens those hashes cover, `block_size` per hash, so the run can be verified.
        token_ids: Vec<u32>,
        /// Tokens per hashed unit: the manager's `sub_block_size`, not its allocation block size.
        block_size: u32,
    },
    /// Hashes whose last holder was evicted or invalidated in `group`: the prefix is no longer
    /// servable from here. Hashes still held by another block are not reported.
    Removed {
        /// KV group that lost the hashes.
        group: u32,
        /// The hashes without a holder now (order unspecified).
        hashes: Vec<u64>,
    },
    /// The whole prefix cache was dropped (`reset_prefix_cache`): forget every hash of this engine.
    AllCleared,
}

/// Collects events, merging a `Stored` that continues the previous `Stored` of the same group.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    pub events: Vec<KvEvent>,
}

impl EventLog {
    pub fn stored(
        &mut self,
        group: u32,
        parent: Option<u64>,
        hashes: &[u64],
        token_ids: &[u32],
        block_size: u32,
    ) {
        if let (
            Some(KvEvent::Stored {
                group: g,
                hashes: hs,
                token_ids: ts,
                block_size: bs,
                ..
            }),
            Some(p),
        ) = (self.events.last_mut(), parent)
        {
            if *g == group && *bs == block_size && hs.last() == Some(&p) {
                hs.extend_from_slice(hashes);
                ts.extend_from_slice(token_ids);
                return;
            }
        }
        self.events.push(KvEvent::Stored {
            group,
            parent,
            hashes: hashes.to_vec(),
            token_ids: token_ids.to_vec(),
            block_size,
        });
    }

    pub fn removed(&mut self, group: u32, hashes: Vec<u64>) {
        if !hashes.is_empty() {
            self.events.push(KvEvent::Removed { group, hashes });
        }
    }

    pub fn cleared(&mut self) {
        self.events.push(KvEvent::AllCleared);
    }

    pub fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }
}
