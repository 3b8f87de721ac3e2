//! KV events as data (vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`, at sub-block
//! granularity as in RBLN PR #553). Publishing them on the wire is the engine's business.
//!
//! Collection sits on the step loop, so it is kept to copies into flat, reused buffers (a
//! [`KvEventBatch`], `event_batch.rs`); nothing is allocated per event, and the publisher hands
//! emptied batches back for reuse. Wire conversion, hash derivation and encoding happen on the
//! publisher thread.

use super::event_batch::{KvEventBatch, KvEventRef};

/// KV events at sub-block granularity (vLLM's shapes), emitted on a hash's 0->1 / 1->0 holder
/// transitions only. Hashes are the low 64 bits of the SHA-256 digest (vLLM's int form).
///
/// `Stored` covers a contiguous run of a request's hash chain: `parent` is the hash just before
/// `hashes[0]` (`None` at the chain's start), `token_ids` are the tokens of those sub-blocks, and
/// `block_size` is the sub-block size, so a consumer can re-hash `token_ids` from `parent` and
/// reproduce every hash.
///
/// The owned form, for tests and the Python face; the step loop records [`KvEventBatch`]es.
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

impl KvEvent {
    /// The borrowed form ([`KvEventRef`]), as a [`KvEventBatch`] yields it.
    pub fn as_ref(&self) -> KvEventRef<'_> {
        match self {
            KvEvent::Stored {
                group,
                parent,
                hashes,
                token_ids,
                block_size,
            } => KvEventRef::Stored {
                group: *group,
                parent: *parent,
                hashes,
                token_ids,
                block_size: *block_size,
            },
            KvEvent::Removed { group, hashes } => KvEventRef::Removed {
                group: *group,
                hashes,
            },
            KvEvent::AllCleared => KvEventRef::AllCleared,
        }
    }
}

/// Entries (hashes plus token ids) the log holds before it overflows: about 6 MiB. An engine whose
/// events nobody takes (or whose publisher fell behind) stays bounded by this.
pub const DEFAULT_EVENT_LOG_CAPACITY: usize = 1 << 20;

/// Collects events into a [`KvEventBatch`] (merging a `Stored` that continues the previous one).
///
/// Bounded: when the pending events would exceed `capacity` entries (hashes + token ids), the log
/// collapses to a single [`KvEvent::AllCleared`] and counts the events it dropped. That keeps every
/// consumer *sound*: it forgets blocks this engine may still hold (a missed routing opportunity),
/// but never believes in a block that is gone, and the events that follow are valid deltas again.
#[derive(Debug)]
pub(crate) struct EventLog {
    batch: KvEventBatch,
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
            batch: KvEventBatch::new(),
            capacity: capacity.clamp(1, u32::MAX as usize / 2),
            dropped: 0,
        }
    }

    /// Makes room for `n` more entries, collapsing the log to `AllCleared` if they do not fit.
    /// False when `n` alone exceeds the capacity (the caller then announces nothing of it: sound,
    /// see the type's docs).
    fn reserve(&mut self, n: usize) -> bool {
        if self.batch.entries() + n > self.capacity {
            self.dropped += self.batch.len() as u64 + 1;
            self.batch.clear();
            self.batch.push_all_cleared();
        }
        n <= self.capacity
    }

    /// Records that `hashes` (chain order, covering `token_ids`) gained their first holder.
    #[inline]
    pub fn stored(
        &mut self,
        group: u32,
        parent: Option<u64>,
        hashes: impl ExactSizeIterator<Item = u64>,
        token_ids: &[u32],
        block_size: u32,
    ) {
        if self.reserve(hashes.len() + token_ids.len()) {
            self.batch
                .push_stored(group, parent, hashes, token_ids, block_size, true);
        }
    }

    /// Records that `hashes` lost their last holder in `group`.
    #[inline]
    pub fn removed(&mut self, group: u32, hashes: impl ExactSizeIterator<Item = u64>) {
        if hashes.len() > 0 && self.reserve(hashes.len()) {
            self.batch.push_removed(group, hashes);
        }
    }

    pub fn cleared(&mut self) {
        // Everything pending is superseded: the consumer forgets it all anyway.
        self.batch.clear();
        self.batch.push_all_cleared();
    }

    /// Whether any event is pending.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// The pending events, owned (tests, the Python face).
    pub fn take(&mut self) -> Vec<KvEvent> {
        let events = self.batch.to_events();
        self.batch.clear();
        events
    }

    /// Hands the pending events over and continues into `spare` (emptied first): the step loop's
    /// path, which swaps buffers instead of copying or allocating.
    pub fn swap(&mut self, mut spare: KvEventBatch) -> KvEventBatch {
        spare.clear();
        std::mem::replace(&mut self.batch, spare)
    }

    /// Events discarded by overflows so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    #[cfg(test)]
    pub fn pending_entries(&self) -> usize {
        self.batch.entries()
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
            log.stored(0, None, [i].into_iter(), &[1, 2, 3, 4], 4);
        }
        assert!(log.pending_entries() <= 100);
        assert!(log.batch.len() <= 21, "{}", log.batch.len());
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
        log.stored(0, None, [1].into_iter(), &[1, 2], 2);
        log.stored(0, Some(1), [2].into_iter(), &[3, 4], 2);
        log.removed(1, [7, 8].into_iter());
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
    fn swapping_hands_over_the_pending_events_and_continues_into_the_spare() {
        let mut log = EventLog::with_capacity(100);
        log.stored(0, None, [1].into_iter(), &[1, 2], 2);
        let stale = KvEventBatch::from_events(&[KvEvent::AllCleared]);
        let got = log.swap(stale);
        assert_eq!(got.to_events().len(), 1);
        assert!(log.is_empty(), "the spare was emptied before use");
        log.removed(0, [1].into_iter());
        assert_eq!(
            log.swap(got).to_events(),
            vec![KvEvent::Removed {
                group: 0,
                hashes: vec![1]
            }]
        );
        assert_eq!(log.pending_entries(), 0);
    }

    #[test]
    fn reset_supersedes_pending_events() {
        let mut log = EventLog::with_capacity(100);
        log.stored(0, None, [1].into_iter(), &[1, 2], 2);
        log.cleared();
        assert_eq!(log.take(), vec![KvEvent::AllCleared]);
    }
}
