//! [`EngineHandle`]: how the front end (and anything else) talks to a running step loop: submit,
//! abort, read its figures, stop it. Cloneable and thread-safe; commands reach the loop's thread
//! through a channel and take effect at its next step boundary.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use yoco_core::sched::SchedulerConfig;
use yoco_text::Tokenizer;

use crate::executor::Executor;
use crate::kv_events::KvEventSink;
use crate::output::Event;
use crate::params::GenParams;
use crate::stats::Stats;
use crate::step_loop::{Command, StepLoop};

/// What the loop is built from.
pub struct LoopConfig {
    /// The scheduler's limits and KV layout.
    pub scheduler: SchedulerConfig,
    /// Decodes outputs (the checkpoint's `tokenizer.json`).
    pub tokenizer: Tokenizer,
    /// End-of-sequence ids (a request stops on them unless `ignore_eos`).
    pub eos_token_ids: Vec<u32>,
    /// Failed steps in a row after which the loop stops.
    pub max_consecutive_failures: u32,
    /// Plan step N+1 while step N runs, its decodes on placeholders (vLLM's
    /// `--async-scheduling`; `yoco-serve --no-async-scheduling` turns it off). Stop strings then
    /// end a request one step late (the extra token is computed, not emitted).
    pub async_scheduling: bool,
    /// Where the loop publishes its KV events (`--kv-events-config`; the scheduler config must
    /// enable them), or None.
    pub kv_events: Option<KvEventSink>,
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The loop has stopped (shut down, or its executor failed too often).
    #[error("the engine is not running")]
    Closed,
}

/// A cloneable handle to a running loop: submit, abort, read its figures, stop it.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    tx: Mutex<Sender<Command>>,
    next_id: AtomicU64,
    stats: Arc<Stats>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl EngineHandle {
    /// Starts the loop on its own thread; it sends each request's events itself.
    pub fn start(config: LoopConfig, executor: Box<dyn Executor>) -> Result<Self, String> {
        Self::start_with(config, executor, None)
    }

    /// Starts the loop on its own thread, its events delivered by a task on `rt` (the front end's
    /// runtime): the step's wakes of the requests' tasks then cost the loop thread one send
    /// instead of one cross-thread wake per request (see `delivery.rs`).
    pub fn start_delivering_on(
        config: LoopConfig,
        executor: Box<dyn Executor>,
        rt: &tokio::runtime::Handle,
    ) -> Result<Self, String> {
        Self::start_with(config, executor, Some(rt.clone()))
    }

    fn start_with(
        config: LoopConfig,
        executor: Box<dyn Executor>,
        rt: Option<tokio::runtime::Handle>,
    ) -> Result<Self, String> {
        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::channel();
        let mut state = StepLoop::new(config, executor, rx, stats.clone(), rt)?;
        let thread = std::thread::Builder::new()
            .name("yoco-step-loop".into())
            .spawn(move || state.run())
            .map_err(|e| e.to_string())?;
        Ok(Self {
            inner: Arc::new(HandleInner {
                tx: Mutex::new(tx),
                next_id: AtomicU64::new(1),
                stats,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// Queues a request; its events arrive on the returned channel, the last one `Finished`.
    /// Dropping the receiver aborts the request.
    pub fn submit(
        &self,
        params: GenParams,
    ) -> Result<(u64, UnboundedReceiver<Event>), SubmitError> {
        if self.inner.stats.dead.load(Relaxed) {
            return Err(SubmitError::Closed);
        }
        let id = self.inner.next_id.fetch_add(1, Relaxed);
        let (tx, rx) = unbounded_channel();
        let cmd = Command::Submit {
            id,
            params,
            tx,
            arrival: Instant::now(),
        };
        self.send(cmd).map_err(|_| SubmitError::Closed)?;
        Ok((id, rx))
    }

    /// Aborts a request in any state (unknown ids are ignored). Its channel gets `Finished(abort)`.
    pub fn abort(&self, id: u64) {
        let _ = self.send(Command::Abort(id));
    }

    /// The loop's live figures.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.inner.stats
    }

    /// Aborts everything, stops the loop and waits for its thread.
    pub fn shutdown(&self) {
        let _ = self.send(Command::Shutdown);
        if let Some(t) = self.inner.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }

    fn send(&self, cmd: Command) -> Result<(), ()> {
        self.inner.tx.lock().unwrap().send(cmd).map_err(|_| ())
    }
}
