//! Where the step loop's events go out: on its own thread, or handed to a task on the front end's
//! tokio runtime once per step.
//!
//! Each event wakes the task serving its request. Woken from a thread outside the runtime (the
//! step loop), every wake goes through the runtime's shared queue and may unpark a worker: at 256
//! streams that was most of the loop thread's CPU per step (~0.4 ms of ~0.6 ms measured). Handed
//! to a task on the runtime, the step's events cost the loop one channel send, and the wakes are
//! cheap local ones on a worker thread. The loop still notices closed channels itself
//! (`reap_closed`), so the task ignores failed sends.

use std::sync::mpsc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::output::Event;

/// One step's events with their channels.
pub(crate) type Batch = Vec<(Event, UnboundedSender<Event>)>;

/// A delivery task on a tokio runtime.
pub(crate) struct RuntimeDelivery {
    tx: UnboundedSender<Batch>,
    /// Emptied batches coming back, reused.
    spare: mpsc::Receiver<Batch>,
}

impl RuntimeDelivery {
    /// Spawns the delivery task on `rt`.
    pub(crate) fn spawn(rt: &tokio::runtime::Handle) -> Self {
        let (tx, mut rx) = unbounded_channel::<Batch>();
        let (back, spare) = mpsc::channel();
        rt.spawn(async move {
            while let Some(mut batch) = rx.recv().await {
                for (ev, to) in batch.drain(..) {
                    let _ = to.send(ev);
                }
                let _ = back.send(batch);
            }
        });
        Self { tx, spare }
    }

    /// An empty batch (a returned one when there is one).
    pub(crate) fn batch(&self) -> Batch {
        self.spare.try_recv().unwrap_or_default()
    }

    /// Hands a batch to the task; gives it back when the task is gone (the runtime shut down), for
    /// the caller to deliver itself.
    pub(crate) fn send(&self, batch: Batch) -> Result<(), Batch> {
        self.tx.send(batch).map_err(|e| e.0)
    }
}
