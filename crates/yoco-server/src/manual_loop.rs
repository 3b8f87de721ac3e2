//! [`ManualLoop`]: the step loop without a thread of its own, stepped by its owner: one call, one
//! synchronous step (schedule, launch, collect, update, text, events). The Python `Engine` runs
//! on it, so `Engine.step()` is the same Rust loop `yoco-serve` and `AsyncEngine` run, with the
//! determinism a caller stepping by hand expects: what it submitted before a step is in that step,
//! and the step's events are handed back when it returns.
//!
//! The differences from the threaded loop ([`crate::EngineHandle`]) are only in who drives it:
//! submissions and aborts take effect at once rather than at the next step boundary (an abort
//! frees the request's blocks before `abort` returns), events are taken in order from the loop's
//! outbox rather than sent on per-request channels, and the scheduler is reachable between steps
//! (invariants, prefix-cache reset, KV events). Steps run in the synchronous order: with nothing
//! else on the thread, a plan made ahead would only delay each token by one step.

use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::unbounded_channel;
use yoco_core::kv::KvEvent;

use crate::executor::Executor;
use crate::handle::LoopConfig;
use crate::output::{Event, Finished, RequestError};
use crate::params::GenParams;
use crate::stats::Stats;
use crate::step_loop::{Command, StepLoop};

/// What one [`ManualLoop::step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepReport {
    /// A plan ran (false: nothing was runnable).
    pub ran: bool,
    /// Why the step failed (its requests ended with an error event), or None.
    pub error: Option<String>,
}

/// A step loop its owner steps (see the module docs).
pub struct ManualLoop {
    state: StepLoop,
    /// Events not yet taken, in the order the loop made them.
    events: Vec<(u64, Event)>,
    next_id: u64,
    stopped: bool,
    /// Feeds the loop's command channel: aborts from [`Aborter`]s.
    _commands: Sender<Command>,
}

impl ManualLoop {
    /// A loop over `executor` with `config` (its `async_scheduling` is ignored: steps are
    /// synchronous).
    pub fn new(mut config: LoopConfig, executor: Box<dyn Executor>) -> Result<Self, String> {
        config.async_scheduling = false;
        let (tx, rx) = mpsc::channel();
        let mut state = StepLoop::new(config, executor, rx, Arc::new(Stats::default()), None)?;
        state.keep_outbox = true;
        Ok(Self {
            state,
            events: Vec::new(),
            next_id: 1,
            stopped: false,
            _commands: tx,
        })
    }

    /// Queues a request (the next step may admit it) and returns its id. A request the scheduler
    /// refuses (a bug or a limit the caller did not check) ends at once: its `Finished` event,
    /// with the error, is the next one taken. After [`ManualLoop::shutdown`] every submission
    /// ends that way.
    pub fn submit(&mut self, params: GenParams) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let (tx, mut rx) = unbounded_channel();
        if self.stopped {
            drop(tx);
            let dead = RequestError::engine_dead("the engine is not running");
            let f = Finished::refused(params.prompt.len() as u32, dead);
            self.events.push((id, Event::Finished(f)));
            return id;
        }
        self.state.add(id, params, tx, Instant::now());
        // Only a refusal is sent on the channel; everything else goes through the outbox.
        if let Ok(ev) = rx.try_recv() {
            self.events.push((id, ev));
        }
        id
    }

    /// Aborts a request in any state now (unknown ids are ignored): its blocks are free when this
    /// returns and its `Finished` event (reason abort) is queued.
    pub fn abort(&mut self, id: u64) {
        self.state.aborts.push(id);
        self.state.apply_aborts();
        self.state.publish_gauges();
        self.take_outbox();
    }

    /// A handle that asks for an abort from where the loop cannot be borrowed (a thread that does
    /// not own it, or code the executor calls during a step): it takes effect when the next step
    /// starts.
    pub fn aborter(&self) -> Aborter {
        Aborter(self._commands.clone())
    }

    /// Runs one step. Its events (and those of aborts since the last call) are queued for
    /// [`ManualLoop::take_events`]. A failed step ends the requests it ran with an error event and
    /// returns the error; the loop goes on (it stops only after `max_consecutive_failures`).
    pub fn step(&mut self) -> StepReport {
        if self.stopped {
            return StepReport {
                ran: false,
                error: None,
            };
        }
        self.state.drain_commands(); // only aborts are ever sent (`Aborter`)
        self.state.apply_aborts();
        let report = match self.state.plan(false) {
            None => StepReport {
                ran: false,
                error: None,
            },
            Some(plan) => {
                self.state.launch(plan);
                let f = self.state.in_flight.take().expect("a launched step");
                let c = self.state.collect(f);
                let error = c.error.clone();
                self.state.apply_step(c);
                StepReport { ran: true, error }
            }
        };
        self.state.publish_gauges();
        self.state.publish_kv_events();
        self.take_outbox();
        if self.state.failures >= self.state.max_failures {
            self.shutdown();
        }
        report
    }

    /// The events queued since the last call: `(request id, event)` in order, a request's last
    /// one `Finished`.
    pub fn take_events(&mut self) -> Vec<(u64, Event)> {
        std::mem::take(&mut self.events)
    }

    /// Requests submitted and not yet ended.
    pub fn num_unfinished(&self) -> usize {
        self.state.live.len()
    }

    /// The loop's figures (the same as a threaded loop's).
    pub fn stats(&self) -> &Arc<Stats> {
        &self.state.stats
    }

    /// The scheduler's structural invariants, and no text, grammar matcher or logprob request
    /// left behind by an ended request (tests; O(pool)).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.state.check_invariants()
    }

    /// Drops every cached prefix; false while requests hold blocks.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let done = self.state.sched.reset_prefix_cache();
        self.state.publish_kv_events();
        self.state.publish_gauges();
        done
    }

    /// The KV events collected since the last call (empty unless the scheduler enables them, and
    /// always empty when a publisher takes them).
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.state.sched.take_kv_events()
    }

    /// Ends every live request as aborted and stops the loop (flushing a KV-event publisher).
    /// Idempotent; later steps do nothing and later submissions are refused.
    pub fn shutdown(&mut self) {
        if !self.stopped {
            self.stopped = true;
            self.state.stop();
            self.take_outbox();
        }
    }

    fn take_outbox(&mut self) {
        self.events
            .extend(self.state.outbox.drain(..).map(|(id, ev, _)| (id, ev)));
    }
}

/// Asks a [`ManualLoop`] for aborts from anywhere (see [`ManualLoop::aborter`]).
#[derive(Clone)]
pub struct Aborter(Sender<Command>);

impl Aborter {
    /// Aborts request `id` at the start of the loop's next step (unknown ids are ignored).
    pub fn abort(&self, id: u64) {
        let _ = self.0.send(Command::Abort(id));
    }
}
