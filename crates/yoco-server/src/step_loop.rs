//! The engine step loop: one thread that owns the scheduler, the text state and every live request's
//! output channel, and drives the executor once per step.
//!
//! Async scheduling (the default, vLLM's `--async-scheduling`), one iteration while step N runs:
//!
//! 1. `launch(plan N)`: the device starts (N was planned during N−1's forward). The grammar job of
//!    plan N starts on the grammar pool (`GrammarRows::start`; the executor waits for the masks
//!    after its forward) and the prompt positions to score are listed (`LogprobRows::plan`).
//! 2. In the forward's shadow: `update(N−1)`, the accepted tokens recorded for the next grammar job
//!    (`GrammarRows::record`), detokenization and stop strings (`yoco-text`), sampled-token
//!    logprobs routed (`LogprobRows::sampled`), the events of N−1 delivered to the requests'
//!    channels; new submissions and aborts taken; closed channels reaped.
//! 3. `schedule_ahead()` → plan N+1, its decodes on placeholders for N's tokens.
//! 4. `collect(N)` → sampled ids and logprobs; the grammar job is collected
//!    (`GrammarRows::finish`) and the prompt logprobs filed (`LogprobRows::take_prompt`).
//!
//! So between two forwards the device waits only for `collect` to return and `launch` to start: no
//! `update`, text or `schedule`. A stop string then ends its request one step late (its extra row is
//! computed and discarded, as in vLLM). Synchronous mode (`async_scheduling: false`) keeps the old
//! order: `update(N)`, text and `schedule(N+1)` between `collect(N)` and `launch(N+1)`.
//!
//! Structured outputs: while any constrained sequence is live the loop does not plan ahead (step
//! 3 is skipped, so each step runs in the synchronous order): the mask of a constrained row at
//! step N+1 comes from its matcher advanced by its step-N token, which the host has only after
//! `collect(N)` and `update(N)`. Unconstrained requests served alongside lose the overlap for
//! those steps, not correctness.
//!
//! Files: this one (state, commands, request lifecycle), `step_cycle.rs` (the order of one
//! iteration, launch and collect), `step_outputs.rs` (update, text and events of a collected step,
//! and failure containment), `delivery.rs` (sending the events, reaping closed channels). An
//! executor error fails the step's requests, not the loop; `max_consecutive_failures` failed steps
//! in a row stop it (the server then answers 503).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::sync::mpsc::UnboundedSender;
use yoco_core::kv::HashExtras;
use yoco_core::sched::{NewRequest, Scheduler, StepPlan};
use yoco_text::{SeqOptions, TextBatch};

use crate::delivery::RuntimeDelivery;
use crate::executor::{ExecError, Executor, StepOutput};
use crate::grammar_rows::GrammarRows;
use crate::handle::LoopConfig;
use crate::kv_events::KvEventSink;
use crate::logprobs::{LogprobRows, PromptLogprobs, TokenLogprob};
use crate::output::{Event, FinishReason, Finished, RequestError, StopReason};
use crate::params::GenParams;
use crate::stats::{RequestTimes, Stats};

/// What handles send the loop.
pub(crate) enum Command {
    Submit {
        id: u64,
        params: GenParams,
        tx: UnboundedSender<Event>,
        arrival: Instant,
    },
    Abort(u64),
    Shutdown,
}

/// A request the loop serves.
pub(crate) struct Live {
    pub tx: UnboundedSender<Event>,
    pub stream: bool,
    pub prompt_tokens: u32,
    pub generated: u32,
    pub cached: u32,
    pub admitted: bool,
    /// Preemptions so far.
    pub preemptions: u32,
    pub stop: Vec<String>,
    pub times: RequestTimes,
    /// Sampled-token logprobs not yet delivered (non-streaming requests that asked).
    pub logprobs: Vec<TokenLogprob>,
    /// The prompt's logprobs once complete, until an event carries them.
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// A step launched and not yet collected.
pub(crate) struct InFlight {
    pub plan: Arc<StepPlan>,
    /// `Err` when `launch` failed (then nothing is collected from the executor).
    pub launched: Result<(), ExecError>,
}

/// A step collected and not yet applied: what the executor returned is in `StepLoop::out`, the
/// requests of its sampling rows (in order) in `StepLoop::sample_ids`.
pub(crate) struct Collected {
    /// Sampling rows of its plan.
    pub num_samples: usize,
    /// Why the step failed (launch, collect, or outputs that do not fit the plan).
    pub error: Option<String>,
}

pub(crate) struct StepLoop {
    pub(crate) sched: Scheduler,
    pub(crate) text: TextBatch,
    pub(crate) exec: Box<dyn Executor>,
    pub(crate) live: FxHashMap<u64, Live>,
    eos: Vec<u32>,
    pub(crate) max_failures: u32,
    pub(crate) failures: u32,
    rx: Receiver<Command>,
    pub(crate) stats: Arc<Stats>,
    /// Plan step N+1 before step N's update (async scheduling).
    pub(crate) ahead: bool,
    /// Events of the last applied step, delivered while the next forward runs. A request's last
    /// event carries its sender (the request has left `live`).
    pub(crate) outbox: Vec<(u64, Event, Option<UnboundedSender<Event>>)>,
    /// Requests to abort at the next point where the loop takes commands.
    pub(crate) aborts: Vec<u64>,
    /// A plan built and not launched yet (async: N+1 while N runs).
    pub(crate) planned: Option<StepPlan>,
    pub(crate) in_flight: Option<InFlight>,
    pub(crate) collected: Option<Collected>,
    /// What the executor returned for `collected` (reused buffers).
    pub(crate) out: StepOutput,
    /// The request of each sampling row of `collected`, in order (the outcome's rows are a
    /// subsequence of them: rows of requests gone since the plan are dropped).
    pub(crate) sample_ids: Vec<u64>,
    /// Matchers and masks of constrained sequences (structured outputs).
    pub(crate) grammar: GrammarRows,
    /// Who asked for logprobs; each step's prompt positions to score.
    pub(crate) lps: LogprobRows,
    pub(crate) last_step: Option<Instant>,
    /// When the last `collect` returned (for the gap trace).
    pub(crate) collected_at: Option<Instant>,
    /// Events go out through a task on the front end's runtime (else from this thread).
    pub(crate) delivery: Option<RuntimeDelivery>,
    /// The KV-event publisher, fed once per cycle in the forward's shadow.
    kv_events: Option<KvEventSink>,
    /// Events stay in `outbox` for the owner to take (`ManualLoop`): `deliver` sends nothing.
    pub(crate) keep_outbox: bool,
}

impl StepLoop {
    pub(crate) fn new(
        config: LoopConfig,
        exec: Box<dyn Executor>,
        rx: Receiver<Command>,
        stats: Arc<Stats>,
        delivery: Option<tokio::runtime::Handle>,
    ) -> Result<Self, String> {
        Ok(StepLoop {
            grammar: GrammarRows::new(&config.eos_token_ids),
            lps: LogprobRows::default(),
            sched: Scheduler::new(config.scheduler).map_err(|e| e.to_string())?,
            text: TextBatch::new(config.tokenizer),
            exec,
            live: FxHashMap::default(),
            eos: config.eos_token_ids,
            max_failures: config.max_consecutive_failures.max(1),
            failures: 0,
            rx,
            stats,
            ahead: config.async_scheduling,
            outbox: Vec::new(),
            aborts: Vec::new(),
            planned: None,
            in_flight: None,
            collected: None,
            out: StepOutput::default(),
            sample_ids: Vec::new(),
            last_step: None,
            collected_at: None,
            delivery: delivery.as_ref().map(RuntimeDelivery::spawn),
            kv_events: config.kv_events,
            keep_outbox: false,
        })
    }

    /// Nothing live, queued, planned or in flight: the loop may sleep until a command.
    fn idle(&self) -> bool {
        self.live.is_empty()
            && self.outbox.is_empty()
            && self.planned.is_none()
            && self.in_flight.is_none()
            && self.collected.is_none()
    }

    /// Runs until shutdown, or until too many steps failed in a row.
    pub(crate) fn run(&mut self) {
        loop {
            if self.idle() {
                self.last_step = None;
                self.collected_at = None;
                match self.rx.recv() {
                    Ok(cmd) => {
                        if self.command(cmd) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            if !self.cycle() {
                break;
            }
        }
        self.stop();
    }

    /// The loop's end: completes what is in flight, ends every live request, flushes the KV
    /// events. Shut down, requests end as aborted; stopped by failures, they fail.
    pub(crate) fn stop(&mut self) {
        self.stats.dead.store(true, Relaxed);
        // A step still in flight or collected is completed (its tokens are not lost to the
        // executor's state), then everything still live ends.
        if let Some(f) = self.in_flight.take() {
            self.collected = Some(self.collect(f));
        }
        if let Some(c) = self.collected.take() {
            self.apply_step(c);
        }
        self.planned = None;
        self.deliver();
        // Stopped by failures: what is left fails with an error. Shut down (a drain's deadline, a
        // signal): it ends as aborted (finish_reason "abort"), as the Python server's drain ends it.
        let why = (self.failures >= self.max_failures).then(|| {
            RequestError::engine_dead(format!(
                "the engine stopped after {} failed steps",
                self.failures
            ))
        });
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in ids {
            self.sched.abort(id);
            self.end(id, FinishReason::Abort, None, why.clone(), None);
        }
        self.deliver();
        self.publish_kv_events();
        if let Some(k) = &mut self.kv_events {
            k.shutdown(Duration::from_secs(1));
        }
    }

    /// Hands the KV events of what the scheduler did since the last call to the publisher.
    pub(crate) fn publish_kv_events(&mut self) {
        if let Some(k) = &mut self.kv_events {
            k.drain(&mut self.sched, &self.stats);
        }
    }

    /// Takes every queued command; true on shutdown (or when every handle is gone).
    pub(crate) fn drain_commands(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(cmd) => {
                    if self.command(cmd) {
                        return true;
                    }
                }
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => return true,
            }
        }
    }

    fn command(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit {
                id,
                params,
                tx,
                arrival,
            } => self.add(id, params, tx, arrival),
            Command::Abort(id) => self.aborts.push(id),
            Command::Shutdown => return true,
        }
        false
    }

    pub(crate) fn add(
        &mut self,
        id: u64,
        p: GenParams,
        tx: UnboundedSender<Event>,
        arrival: Instant,
    ) {
        let opts = SeqOptions {
            skip_special_tokens: p.skip_special_tokens,
            include_stop_str_in_output: p.include_stop_str,
            stop: p.stop.clone(),
            stream: p.stream,
            detokenize: p.detokenize,
        };
        let prompt_tokens = p.prompt.len() as u32;
        let req = NewRequest {
            id,
            prompt: p.prompt.clone(),
            max_tokens: p.max_tokens,
            min_tokens: p.min_tokens,
            eos_token_ids: self.eos.clone(),
            stop_token_ids: p.stop_token_ids.clone(),
            ignore_eos: p.ignore_eos,
            priority: p.priority,
            hash_extras: HashExtras {
                cache_salt: p.cache_salt.clone(),
                lora: None,
            },
            prompt_logprobs: p.prompt_logprobs.is_some(),
            after: p.after,
        };
        // The front end validated the request against the same limits; a refusal here is a bug
        // or a race with a limit change, reported to the client rather than dropped.
        // Image / audio placeholder runs key the prefix cache and the encoder budget in the core.
        let mm = p
            .media
            .as_ref()
            .map(|m| m.placeholders.clone())
            .unwrap_or_default();
        let refused = match self.sched.add_request_mm(req, mm) {
            Err(e) => Some(e.to_string()),
            Ok(()) => match self.text.add(id, &p.prompt, opts) {
                Err(e) => {
                    self.sched.abort(id);
                    Some(e.to_string())
                }
                Ok(()) => match p.grammar.as_ref().map(|g| self.grammar.add(id, g)) {
                    Some(Err(e)) => {
                        self.sched.abort(id);
                        self.text.remove(id);
                        Some(e)
                    }
                    _ => None,
                },
            },
        };
        if let Some(msg) = refused {
            let _ = tx.send(Event::Finished(Finished::refused(
                prompt_tokens,
                RequestError::failed(msg),
            )));
            return;
        }
        let prompt_logprobs = self.lps.add(id, &p);
        self.exec.add_request(id, &p);
        self.live.insert(
            id,
            Live {
                tx,
                stream: p.stream,
                prompt_tokens,
                generated: 0,
                cached: 0,
                admitted: false,
                preemptions: 0,
                stop: p.stop,
                times: RequestTimes::new(arrival),
                logprobs: Vec::new(),
                prompt_logprobs,
            },
        );
        self.stats
            .prompt_tokens
            .fetch_add(prompt_tokens as u64, Relaxed);
    }

    /// Ends a live request: frees its text and executor state and queues its `Finished` event.
    /// The core has already finished or aborted it.
    /// `tail`: a streaming request's last delta (text, token ids, their logprobs).
    pub(crate) fn end(
        &mut self,
        id: u64,
        reason: FinishReason,
        stop_reason: Option<StopReason>,
        error: Option<RequestError>,
        tail: Option<(String, Vec<u32>, Vec<TokenLogprob>)>,
    ) {
        let Some(mut l) = self.live.remove(&id) else {
            return;
        };
        let (text, token_ids, logprobs) = match self.text.take(id) {
            Some((t, ids)) if !l.stream => (t, ids, std::mem::take(&mut l.logprobs)),
            _ => tail.unwrap_or_default(),
        };
        self.text.remove(id);
        self.grammar.remove(id);
        self.lps.remove(id);
        self.exec.remove_request(id);
        let i = match reason {
            FinishReason::Stop => 0,
            FinishReason::Length => 1,
            FinishReason::Abort => 2,
        };
        self.stats.finished[i].fetch_add(1, Relaxed);
        self.stats
            .observe_end(&l.times, Instant::now(), l.prompt_tokens, l.generated);
        self.outbox.push((
            id,
            Event::Finished(Finished {
                reason,
                stop_reason,
                text,
                token_ids,
                logprobs,
                prompt_logprobs: l.prompt_logprobs.take(),
                prompt_tokens: l.prompt_tokens,
                completion_tokens: l.generated,
                cached_tokens: l.cached,
                preemptions: l.preemptions,
                error,
            }),
            Some(l.tx),
        ));
    }

    /// Aborts what was asked for since the last call (safe while a step is in flight or planned
    /// ahead: the core discards the rows of requests that are gone).
    pub(crate) fn apply_aborts(&mut self) {
        for id in std::mem::take(&mut self.aborts) {
            if self.live.contains_key(&id) {
                self.sched.abort(id);
                self.end(id, FinishReason::Abort, None, None, None);
            }
        }
    }

    /// The scheduler's invariants, and every per-request table (text, grammar matchers, logprob
    /// requests) holding only live requests: an ended request leaves nothing behind (tests; O(pool)).
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.sched.check_invariants()?;
        let texts = self
            .live
            .keys()
            .filter(|&&id| self.text.contains(id))
            .count();
        if texts != self.text.len() {
            return Err(format!(
                "{} text states, {texts} of them of live requests",
                self.text.len()
            ));
        }
        self.grammar.check_live(&self.live)?;
        self.lps.check_live(&self.live)
    }

    pub(crate) fn publish_gauges(&self) {
        let s = self.sched.stats();
        self.stats.running.store(s.num_running, Relaxed);
        self.stats.waiting.store(s.num_waiting, Relaxed);
        let kv = &s.kv;
        let ppm = (kv.blocks_used * 1_000_000)
            .checked_div(kv.blocks_total)
            .unwrap_or(0);
        self.stats.kv_usage_ppm.store(ppm as u32, Relaxed);
        self.stats
            .prefix_queries
            .store(kv.prefix_query_tokens, Relaxed);
        self.stats.prefix_hits.store(kv.prefix_hit_tokens, Relaxed);
        self.stats.preemptions.store(s.num_preemptions, Relaxed);
        self.stats.publish_kv(kv);
    }
}
