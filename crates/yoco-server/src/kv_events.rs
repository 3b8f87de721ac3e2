//! KV events from the Rust step loop (`--kv-events-config`): after every `update` the loop hands
//! the core's collected events to a [`yoco_events::Publisher`] (vLLM's ZMQ wire format; a bounded
//! queue drained by the publisher's own thread, so publishing never blocks the loop).
//!
//! The publisher is started by whoever builds the loop (the bindings start it from the Python
//! `KVEventsConfig` exactly as the default server does, then move it here); the loop only feeds it
//! and counts what it sent and dropped for `/metrics`.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use yoco_core::kv::KvEventBatch;
use yoco_core::sched::Scheduler;
use yoco_events::Publisher;

use crate::stats::Stats;

/// A running publisher and the spare batch the core collects into next.
pub struct KvEventSink {
    publisher: Publisher,
    spare: KvEventBatch,
}

impl KvEventSink {
    /// Feeds `publisher` from the loop (its scheduler must have KV events enabled).
    pub fn new(publisher: Publisher) -> Self {
        Self {
            publisher,
            spare: KvEventBatch::default(),
        }
    }

    /// Hands the events collected since the last call to the publisher (one swap of buffers, no
    /// copy) and updates the loop's counters.
    pub(crate) fn drain(&mut self, sched: &mut Scheduler, stats: &Stats) {
        if sched.has_kv_events() {
            let spare = std::mem::take(&mut self.spare);
            self.spare = self.publisher.publish(sched.swap_kv_events(spare));
        }
        stats
            .kv_events_published
            .store(self.publisher.published(), Relaxed);
        stats.kv_events_dropped.store(
            self.publisher.dropped() + sched.kv_events_dropped(),
            Relaxed,
        );
    }

    /// Sends what is queued (at most `timeout`) and closes the sockets (the loop's end).
    pub(crate) fn shutdown(&mut self, timeout: Duration) {
        self.publisher.shutdown(timeout);
    }
}
