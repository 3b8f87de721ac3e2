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

/// Entries (hashes plus token ids) the log holds before it overflows: about 8 MiB. An engine whose
/// events nobody takes (or whose publisher fell behind) stays bounded by this.
pub const DEFAULT_EVENT_LOG_CAPACITY: usize = 1 << 20;

/// Collects events, merging a `Stored` that continues the previous `Stored` of the same group.
///
/// Bounded: when the pending events would exceed `capacity` entries (hashes + token ids), the log
/// collapses to a single [`KvEvent::AllCleared`] and counts the events it dropped. That keeps every
/// consumer *sound*: it forgets blocks this engine may still hold (a missed routing opportunity),
/// but never believes in a block that is gone, and the events that follow are valid deltas again.
#[derive(Debug)]
pub(crate) struct EventLog {
    events: Vec<KvEvent>,
    /// Hashes + token ids held by `events`.
    len: usize,
    capacity: usize,
    /// Events discarded by overflows since the log was made.
    dropped: u64,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog::with_capacity(DEFAULT_EVENT_LOG_CAPACITY)
    }
}

impl EventLog {
    pub fn with_capacity(capacity: usize) -> Self {
        EventLog {
            events: Vec::new(),
            len: 0,
            capacity: capacity.max(1),
            dropped: 0,
        }
    }

    /// Makes room for `n` more entries, collapsing the log to `AllCleared` if they do not fit.
    fn reserve(&mut self, n: usize) {
        if self.len + n > self.capacity {
            let n_dropped = self.events.len() as u64 + 1;
            self.dropped += n_dropped;
            self.events.clear();
            self.events.push(KvEvent::AllCleared);
            self.len = 0;
        }
    }

    pub fn stored(
        &mut self,
        group: u32,
        parent: Option<u64>,
        hashes: &[u64],
        token_ids: &[u32],
        block_size: u32,
    ) {
        let n = hashes.len() + token_ids.len();
        if n > self.capacity {
            // Larger than the whole log: announce nothing of it (sound, see the type's docs).
            self.reserve(self.capacity + 1);
            return;
        }
        self.reserve(n);
        self.len += n;
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
        if hashes.is_empty() {
            return;
        }
        if hashes.len() > self.capacity {
            self.reserve(self.capacity + 1);
            return;
        }
        self.reserve(hashes.len());
        self.len += hashes.len();
        self.events.push(KvEvent::Removed { group, hashes });
    }

    pub fn cleared(&mut self) {
        // Everything pending is superseded: the consumer forgets it all anyway.
        self.events.clear();
        self.len = 0;
        self.events.push(KvEvent::AllCleared);
    }

    pub fn take(&mut self) -> Vec<KvEvent> {
        self.len = 0;
        std::mem::take(&mut self.events)
    }

    /// Events discarded by overflows so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    #[cfg(test)]
    pub fn pending_entries(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_collapses_to_all_cleared_when_nobody_takes_events() {
        let mut log = EventLog::with_capacity(100);
        for i in 0..1000u64 {
            // 1 hash + 4 tokens per event, chains broken so nothing merges.
            log.stored(0, None, &[i], &[1, 2, 3, 4], 4);
        }
        assert!(log.pending_entries() <= 100);
        assert!(log.events.len() <= 21, "{}", log.events.len());
        assert!(log.dropped() > 900);
        let evs = log.take();
        assert_eq!(
            evs[0],
            KvEvent::AllCleared,
            "an overflow is announced as a reset"
        );
        assert!(evs[1..].iter().all(|e| matches!(e, KvEvent::Stored { .. })));
        assert_eq!(log.pending_entries(), 0);
    }

    #[test]
    fn log_keeps_every_event_below_capacity() {
        let mut log = EventLog::with_capacity(100);
        log.stored(0, None, &[1], &[1, 2], 2);
        log.stored(0, Some(1), &[2], &[3, 4], 2);
        log.removed(1, vec![7, 8]);
        assert_eq!(log.dropped(), 0);
        assert_eq!(
            log.take(),
            vec![
                KvEvent::Stored {
                    group: 0,
                    parent: None,
                    hashes: vec![1, 2],
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2
                },
                KvEvent::Removed {
                    group: 1,
                    hashes: vec![7, 8]
                },
            ]
        );
    }

    #[test]
    fn reset_supersedes_pending_events() {
        let mut log = EventLog::with_capacity(100);
        log.stored(0, None, &[1], &[1, 2], 2);
        log.cleared();
        assert_eq!(log.take(), vec![KvEvent::AllCleared]);
    }
}
