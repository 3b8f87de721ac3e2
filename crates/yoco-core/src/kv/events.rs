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
    Stored {
        group: u32,
        parent: Option<u64>,
        hashes: Vec<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
    },
    Removed {
        group: u32,
        hashes: Vec<u64>,
    },
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
