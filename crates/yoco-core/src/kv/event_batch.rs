//! A batch of KV events in flat, reusable buffers: what the step loop records and hands to the
//! publisher without allocating per event (see `events.rs` for the events' meaning).

use super::events::KvEvent;

/// One event of a [`KvEventBatch`], borrowing its arenas (same meaning as [`KvEvent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEventRef<'a> {
    /// See [`KvEvent::Stored`].
    Stored {
        /// KV group whose index now holds the hashes.
        group: u32,
        /// Hash just before `hashes[0]` in the chain (`None` at the chain's start).
        parent: Option<u64>,
        /// The new hashes, in chain order.
        hashes: &'a [u64],
        /// The tokens those hashes cover, `block_size` per hash.
        token_ids: &'a [u32],
        /// Tokens per hashed unit (the sub-block size).
        block_size: u32,
    },
    /// See [`KvEvent::Removed`].
    Removed {
        /// KV group that lost the hashes.
        group: u32,
        /// The hashes without a holder now.
        hashes: &'a [u64],
    },
    /// See [`KvEvent::AllCleared`].
    AllCleared,
}

impl KvEventRef<'_> {
    /// The KV group the event concerns (`None` for `AllCleared`, which concerns them all).
    pub fn group(&self) -> Option<u32> {
        match self {
            KvEventRef::Stored { group, .. } | KvEventRef::Removed { group, .. } => Some(*group),
            KvEventRef::AllCleared => None,
        }
    }

    /// The owned form.
    pub fn to_owned(&self) -> KvEvent {
        match *self {
            KvEventRef::Stored {
                group,
                parent,
                hashes,
                token_ids,
                block_size,
            } => KvEvent::Stored {
                group,
                parent,
                hashes: hashes.to_vec(),
                token_ids: token_ids.to_vec(),
                block_size,
            },
            KvEventRef::Removed { group, hashes } => KvEvent::Removed {
                group,
                hashes: hashes.to_vec(),
            },
            KvEventRef::AllCleared => KvEvent::AllCleared,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    AllCleared,
}

/// One event's fixed part; its hashes and tokens are the arena slices that end at `hashes_end` /
/// `tokens_end` and start where the previous record's end (records are appended in order).
#[derive(Debug, Clone, Copy)]
struct Rec {
    kind: Kind,
    group: u32,
    block_size: u32,
    parent: Option<u64>,
    hashes_end: u32,
    tokens_end: u32,
}

/// A sequence of KV events in flat buffers: one small record per event, all hashes in one arena
/// and all token ids in another. Appending copies into the arenas (amortized, no per-event
/// allocation); a `Stored` that continues the previous `Stored` of the same group (its parent is
/// that run's last hash) extends it in place, as vLLM merges a request's blocks into one event.
#[derive(Debug, Clone, Default)]
pub struct KvEventBatch {
    recs: Vec<Rec>,
    hashes: Vec<u64>,
    tokens: Vec<u32>,
}

impl KvEventBatch {
    /// An empty batch (buffers grow on first use, then are reused).
    pub fn new() -> Self {
        Self::default()
    }

    /// A batch holding `events` (tests, and callers that build events by hand).
    pub fn from_events(events: &[KvEvent]) -> Self {
        let mut b = Self::new();
        for e in events {
            match e {
                KvEvent::Stored {
                    group,
                    parent,
                    hashes,
                    token_ids,
                    block_size,
                } => b.push_stored(
                    *group,
                    *parent,
                    hashes.iter().copied(),
                    token_ids,
                    *block_size,
                    false,
                ),
                KvEvent::Removed { group, hashes } => {
                    b.push_removed(*group, hashes.iter().copied())
                }
                KvEvent::AllCleared => b.push_all_cleared(),
            }
        }
        b
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.recs.len()
    }

    /// Whether the batch holds no event.
    pub fn is_empty(&self) -> bool {
        self.recs.is_empty()
    }

    /// Hashes plus token ids held (what bounds the event log).
    pub fn entries(&self) -> usize {
        self.hashes.len() + self.tokens.len()
    }

    /// Empties the batch, keeping its buffers for reuse.
    pub fn clear(&mut self) {
        self.recs.clear();
        self.hashes.clear();
        self.tokens.clear();
    }

    /// The events in order.
    pub fn iter(&self) -> impl Iterator<Item = KvEventRef<'_>> + '_ {
        let (mut h0, mut t0) = (0usize, 0usize);
        self.recs.iter().map(move |r| {
            let (h1, t1) = (r.hashes_end as usize, r.tokens_end as usize);
            let (hashes, tokens) = (&self.hashes[h0..h1], &self.tokens[t0..t1]);
            (h0, t0) = (h1, t1);
            match r.kind {
                Kind::Stored => KvEventRef::Stored {
                    group: r.group,
                    parent: r.parent,
                    hashes,
                    token_ids: tokens,
                    block_size: r.block_size,
                },
                Kind::Removed => KvEventRef::Removed {
                    group: r.group,
                    hashes,
                },
                Kind::AllCleared => KvEventRef::AllCleared,
            }
        })
    }

    /// The events in their owned form.
    pub fn to_events(&self) -> Vec<KvEvent> {
        self.iter().map(|e| e.to_owned()).collect()
    }

    fn push_rec(&mut self, kind: Kind, group: u32, parent: Option<u64>, block_size: u32) {
        self.recs.push(Rec {
            kind,
            group,
            block_size,
            parent,
            hashes_end: self.hashes.len() as u32,
            tokens_end: self.tokens.len() as u32,
        });
    }

    pub(crate) fn push_stored(
        &mut self,
        group: u32,
        parent: Option<u64>,
        hashes: impl IntoIterator<Item = u64>,
        token_ids: &[u32],
        block_size: u32,
        merge: bool,
    ) {
        let continues = merge
            && parent.is_some()
            && matches!(self.recs.last(), Some(r) if r.kind == Kind::Stored
                && r.group == group && r.block_size == block_size)
            && self.hashes.last().copied() == parent;
        if !continues {
            self.push_rec(Kind::Stored, group, parent, block_size);
        }
        self.hashes.extend(hashes);
        self.tokens.extend_from_slice(token_ids);
        let last = self
            .recs
            .last_mut()
            .expect("a record was pushed or continued");
        last.hashes_end = self.hashes.len() as u32;
        last.tokens_end = self.tokens.len() as u32;
    }

    pub(crate) fn push_removed(&mut self, group: u32, hashes: impl IntoIterator<Item = u64>) {
        self.hashes.extend(hashes);
        self.push_rec(Kind::Removed, group, None, 0);
    }

    pub(crate) fn push_all_cleared(&mut self) {
        self.push_rec(Kind::AllCleared, 0, None, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(group: u32, parent: Option<u64>, hashes: &[u64], bs: u32) -> KvEvent {
        KvEvent::Stored {
            group,
            parent,
            hashes: hashes.to_vec(),
            token_ids: (0..hashes.len() as u32 * bs).collect(),
            block_size: bs,
        }
    }

    #[test]
    fn a_batch_gives_back_the_events_it_was_built_from_in_order() {
        let events = vec![
            stored(0, None, &[1, 2], 2),
            KvEvent::Removed {
                group: 1,
                hashes: vec![5, 6, 7],
            },
            KvEvent::AllCleared,
            stored(0, Some(2), &[3], 2), // continues the first run, but from_events keeps events apart
            KvEvent::Removed {
                group: 0,
                hashes: vec![],
            },
        ];
        let b = KvEventBatch::from_events(&events);
        assert_eq!(b.len(), 5);
        assert_eq!(b.entries(), (2 + 4) + 3 + (1 + 2));
        assert_eq!(b.to_events(), events);
    }

    #[test]
    fn a_stored_run_continuing_the_last_one_extends_it_in_place() {
        let mut b = KvEventBatch::new();
        b.push_stored(0, None, [1, 2], &[1, 2, 3, 4], 2, true);
        b.push_stored(0, Some(2), [3], &[5, 6], 2, true);
        b.push_stored(1, Some(3), [4], &[7, 8], 2, true); // another group: a new event
        b.push_stored(1, Some(9), [5], &[9, 10], 2, true); // not the run's last hash: a new event
        assert_eq!(
            b.to_events(),
            vec![
                KvEvent::Stored {
                    group: 0,
                    parent: None,
                    hashes: vec![1, 2, 3],
                    token_ids: vec![1, 2, 3, 4, 5, 6],
                    block_size: 2
                },
                KvEvent::Stored {
                    group: 1,
                    parent: Some(3),
                    hashes: vec![4],
                    token_ids: vec![7, 8],
                    block_size: 2
                },
                KvEvent::Stored {
                    group: 1,
                    parent: Some(9),
                    hashes: vec![5],
                    token_ids: vec![9, 10],
                    block_size: 2
                },
            ]
        );
    }

    #[test]
    fn a_cleared_batch_reuses_its_buffers() {
        let mut b = KvEventBatch::new();
        for i in 0..64 {
            b.push_stored(0, None, [i], &[0; 16], 16, true);
        }
        let ptrs = (b.recs.as_ptr(), b.hashes.as_ptr(), b.tokens.as_ptr());
        b.clear();
        assert!(b.is_empty());
        for i in 0..64 {
            b.push_stored(0, None, [i], &[0; 16], 16, true);
            b.push_removed(0, [i]);
        }
        assert_eq!(b.len(), 128);
        assert_eq!(
            (b.recs.as_ptr(), b.tokens.as_ptr()),
            (ptrs.0, ptrs.2),
            "records and tokens fit the buffers of the first use: no allocation"
        );
        let _ = ptrs.1;
    }
}
