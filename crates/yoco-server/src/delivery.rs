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
use crate::step_loop::StepLoop;

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

impl StepLoop {
    /// Sends the outbox; a closed channel (client gone) aborts its request (here, or at the next
    /// `reap_closed` when a runtime task delivers).
    pub(crate) fn deliver(&mut self) {
        if self.outbox.is_empty() || self.keep_outbox {
            return;
        }
        if let Some(d) = &self.delivery {
            let mut batch = d.batch();
            for (id, ev, last) in self.outbox.drain(..) {
                let tx = match last {
                    Some(tx) => tx,
                    None => match self.live.get(&id) {
                        Some(l) => l.tx.clone(),
                        None => continue, // ended since; its last event carries the sender
                    },
                };
                batch.push((ev, tx));
            }
            if let Err(batch) = d.send(batch) {
                // The runtime is gone (shutdown): deliver from here from now on.
                for (ev, tx) in batch {
                    let _ = tx.send(ev);
                }
                self.delivery = None;
            }
            return;
        }
        for (id, ev, last) in self.outbox.drain(..) {
            let sent = match &last {
                Some(tx) => tx.send(ev).is_ok(),
                None => match self.live.get(&id) {
                    Some(l) => l.tx.send(ev).is_ok(),
                    None => true, // ended since; its last event carries the sender
                },
            };
            if !sent && last.is_none() {
                self.aborts.push(id);
            }
        }
    }

    /// Requests whose receiver is gone (a client that disconnected while waiting for a
    /// non-streaming answer) are aborted: O(live) atomic loads per step.
    pub(crate) fn reap_closed(&mut self) {
        for (&id, l) in &self.live {
            if l.tx.is_closed() {
                self.aborts.push(id);
            }
        }
    }
}
