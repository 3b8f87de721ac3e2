//! The engine step loop: one thread that owns the scheduler, the text state and every live request's
//! output channel, and drives the executor once per step.
//!
//! One iteration (step N):
//!
//! 1. `schedule()` → plan N; new admissions are announced to the executor. The grammar job of plan N
//!    starts on the grammar pool (`GrammarRows::start`) and the prompt positions to score are listed
//!    (`LogprobRows::plan`).
//! 2. `launch(plan N)`: the device starts (the executor waits for the masks after its forward).
//! 3. While it runs: deliver step N−1's events to the requests' channels, take new submissions into
//!    the core's waiting queue, note aborts.
//! 4. `collect()` → sampled ids and logprobs; the grammar job is collected (`GrammarRows::finish`);
//!    `update()`; the accepted tokens are recorded for job N+1 (`GrammarRows::record`) and the
//!    logprobs routed (`LogprobRows::take_prompt` / `sampled`); detokenize and match stop strings
//!    (`yoco-text`); build step N's events (delivered in step N+1's window); apply aborts.
//!
//! So the only loop work the device waits for between two forwards is `update` + text + `schedule`
//! (Rust, tens of µs at 256 rows); everything per request and per token that reaches other threads
//! happens while the device computes. An executor error fails the step's requests, not the loop;
//! `max_consecutive_failures` failed steps in a row stop it (the server then answers 503).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::sync::mpsc::UnboundedSender;
use yoco_core::kv::HashExtras;
use yoco_core::sched::{FinishReason as CoreFinish, NewRequest, Scheduler};
use yoco_text::{SeqOptions, TextBatch};

use crate::executor::{Executor, StepInputs, StepOutput};
use crate::grammar_rows::GrammarRows;
use crate::handle::LoopConfig;
use crate::logprobs::{LogprobRows, PromptLogprobs, TokenLogprob};
use crate::output::{Event, FinishReason, Finished, StopReason};
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
struct Live {
    tx: UnboundedSender<Event>,
    stream: bool,
    prompt_tokens: u32,
    generated: u32,
    cached: u32,
    admitted: bool,
    stop: Vec<String>,
    times: RequestTimes,
    /// Sampled-token logprobs not yet delivered (non-streaming requests that asked).
    logprobs: Vec<TokenLogprob>,
    /// The prompt's logprobs once complete, until an event carries them.
    prompt_logprobs: Option<PromptLogprobs>,
}

pub(crate) struct StepLoop {
    sched: Scheduler,
    text: TextBatch,
    exec: Box<dyn Executor>,
    live: FxHashMap<u64, Live>,
    eos: Vec<u32>,
    max_failures: u32,
    failures: u32,
    rx: Receiver<Command>,
    stats: Arc<Stats>,
    /// Events of the last step, delivered while the next forward runs. A request's last event
    /// carries its sender (the request has left `live`).
    outbox: Vec<(u64, Event, Option<UnboundedSender<Event>>)>,
    /// Requests to abort once the step in flight is collected.
    aborts: Vec<u64>,
    /// What the executor returned for the step just collected.
    out: StepOutput,
    /// Matchers and masks of constrained sequences (structured outputs).
    grammar: GrammarRows,
    /// Who asked for logprobs; each step's prompt positions to score.
    lps: LogprobRows,
    last_step: Option<Instant>,
}

impl StepLoop {
    pub(crate) fn new(
        config: LoopConfig,
        exec: Box<dyn Executor>,
        rx: Receiver<Command>,
        stats: Arc<Stats>,
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
            outbox: Vec::new(),
            aborts: Vec::new(),
            out: StepOutput::default(),
            last_step: None,
        })
    }

    /// Runs until shutdown, or until too many steps failed in a row.
    pub(crate) fn run(&mut self) {
        let stop = loop {
            if self.live.is_empty() && self.outbox.is_empty() {
                // Idle: sleep until a command arrives.
                self.last_step = None;
                match self.rx.recv() {
                    Ok(cmd) => {
                        if self.command(cmd) {
                            break true;
                        }
                    }
                    Err(_) => break true,
                }
            }
            if self.drain_commands() {
                break true;
            }
            self.apply_aborts();
            if !self.step() {
                break false;
            }
        };
        let _ = stop;
        self.stats.dead.store(true, Relaxed);
        self.deliver();
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in ids {
            self.end(
                id,
                FinishReason::Abort,
                None,
                Some("the engine stopped".into()),
                None,
            );
        }
        self.deliver();
    }

    /// Takes every queued command; true on shutdown (or when every handle is gone).
    fn drain_commands(&mut self) -> bool {
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

    fn add(&mut self, id: u64, p: GenParams, tx: UnboundedSender<Event>, arrival: Instant) {
        let opts = SeqOptions {
            skip_special_tokens: p.skip_special_tokens,
            include_stop_str_in_output: p.include_stop_str,
            stop: p.stop.clone(),
            stream: p.stream,
            detokenize: true,
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
            after: None,
        };
        // The front end validated the request against the same limits; a refusal here is a bug
        // or a race with a limit change, reported to the client rather than dropped.
        let refused = match self.sched.add_request(req) {
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
            let _ = tx.send(Event::Finished(Finished {
                reason: FinishReason::Abort,
                stop_reason: None,
                text: String::new(),
                token_ids: Vec::new(),
                logprobs: Vec::new(),
                prompt_logprobs: None,
                prompt_tokens,
                completion_tokens: 0,
                cached_tokens: 0,
                error: Some(msg),
            }));
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

    /// One step; false when the loop must stop (too many failed steps).
    fn step(&mut self) -> bool {
        let t0 = Instant::now();
        self.sched.schedule();
        let plan = self.sched.plan();
        if plan.num_rows() == 0 {
            // Nothing runnable (every request waits on memory held by none: cannot happen with
            // validated requests) or everything finished: deliver and idle briefly.
            self.deliver();
            self.publish_gauges();
            if !self.live.is_empty() {
                std::thread::sleep(Duration::from_micros(200));
            }
            return true;
        }
        if let Some(prev) = self.last_step.replace(t0) {
            self.stats.observe_step((t0 - prev).as_nanos() as u64);
        }
        let mut resumed = Vec::new();
        for k in 0..plan.admitted_ids.len() {
            let id = plan.admitted_ids[k];
            if let Some(l) = self.live.get_mut(&id) {
                if !l.admitted {
                    l.admitted = true;
                    self.stats.observe_admitted(&mut l.times, t0);
                    l.cached = plan.admitted_num_cached[k].max(0) as u32;
                } else {
                    resumed.push((
                        id,
                        self.text
                            .tokens(id)
                            .map(<[u32]>::to_vec)
                            .unwrap_or_default(),
                    ));
                }
            }
        }
        self.stats.observe_plan(plan.num_tokens, plan.num_cross);
        let ngroups = self.sched.num_groups();
        let tables: Vec<&[i32]> = (0..ngroups).map(|g| self.sched.block_table(g)).collect();
        // Grammar masks start on the pool now and run while the forward does.
        let masks = self.grammar.start(plan);
        let prompt_scoring = self.lps.plan(plan);
        let launched = self.exec.launch(&StepInputs {
            plan,
            tables: &tables,
            max_blocks_per_seq: self.sched.max_blocks_per_seq(),
            resumed: &resumed,
            masks,
            prompt_scoring,
        });
        let num_samples = plan.num_samples();

        // Overlapped with the forward.
        self.deliver();
        self.reap_closed();
        let shutdown = self.drain_commands();

        let result = launched.and_then(|()| self.exec.collect().map(|o| self.out.clone_from(o)));
        self.grammar.finish();
        let checked = result.map_err(|e| e.0).and_then(|()| {
            if self.out.sampled.len() != num_samples {
                return Err(format!(
                    "executor returned {} sampled ids for {} sampling rows",
                    self.out.sampled.len(),
                    num_samples
                ));
            }
            self.lps.check(&self.out, num_samples)
        });
        match checked {
            Ok(()) => {
                self.failures = 0;
                self.after_update();
            }
            Err(msg) => self.fail_step(num_samples, msg),
        }
        self.stats.steps.fetch_add(1, Relaxed);
        self.apply_aborts();
        self.publish_gauges();
        !shutdown && self.failures < self.max_failures
    }

    fn after_update(&mut self) {
        let sampled = std::mem::take(&mut self.out.sampled);
        let outcome = match self.sched.update(&sampled) {
            Ok(o) => o.clone(),
            Err(e) => {
                // Sampled ids out of range: the executor's bug, contained like a failed forward.
                self.out.sampled = sampled;
                let msg = format!("bad sampled ids: {e}");
                self.fail_update(msg);
                return;
            }
        };
        // Outcome rows are the plan's sampling rows, in order (what the logprob rows index).
        let aligned = outcome.req_ids.len() == sampled.len();
        self.out.sampled = sampled;
        self.grammar.record(&outcome);
        for (id, plp) in self.lps.take_prompt(&self.out) {
            if let Some(l) = self.live.get_mut(&id) {
                l.prompt_logprobs = Some(plp);
            }
        }
        self.stats
            .generation_tokens
            .fetch_add(outcome.req_ids.len() as u64, Relaxed);
        let mut fin = outcome.finish_reasons.clone();
        let mut step = match self.text.step(&outcome.req_ids, &outcome.new_tokens, &fin) {
            Ok(_) => self.text.take_step(),
            Err(e) => {
                let ids = outcome.req_ids.clone();
                for id in ids {
                    self.sched.abort(id);
                    self.end(id, FinishReason::Abort, None, Some(e.to_string()), None);
                }
                return;
            }
        };
        if self.grammar.any_failed() {
            // A grammar that failed (a token it rejects, or a mask over llguidance's budget) ends
            // its sequence as an abort: the output is a prefix, not a valid document.
            for (k, &id) in outcome.req_ids.iter().enumerate() {
                if self.grammar.failed(id) {
                    if fin[k] == 0 {
                        self.sched.finish(id, CoreFinish::Abort);
                    }
                    fin[k] = CoreFinish::Abort as u8;
                }
            }
        }
        let mut stop_text: FxHashMap<usize, usize> = FxHashMap::default();
        for (&k, &w) in step.stop_idx.iter().zip(&step.stop_which) {
            let k = k as usize;
            if fin[k] == 0 {
                self.sched
                    .finish(outcome.req_ids[k], CoreFinish::StopString);
            }
            fin[k] = CoreFinish::StopString as u8;
            stop_text.insert(k, w as usize);
        }
        let mut di = 0;
        let now = Instant::now();
        for (k, &id) in outcome.req_ids.iter().enumerate() {
            let delta = if di < step.delta_idx.len() && step.delta_idx[di] as usize == k {
                di += 1;
                std::mem::take(&mut step.deltas[di - 1])
            } else {
                String::new()
            };
            let Some(l) = self.live.get_mut(&id) else {
                continue;
            };
            let tok = outcome.new_tokens[k];
            if tok >= 0 {
                l.generated += 1;
                self.stats.observe_token(&mut l.times, now);
            }
            let token_id = (tok >= 0).then_some(tok as u32);
            let logprob = match token_id {
                Some(t) if aligned => self.lps.sampled(&self.out, k, id, t),
                _ => None,
            };
            if !l.stream {
                l.logprobs.extend(logprob.clone());
            }
            if fin[k] == 0 {
                if l.stream {
                    self.outbox.push((
                        id,
                        Event::Delta {
                            token_id,
                            text: delta,
                            logprob,
                            prompt_logprobs: l.prompt_logprobs.take(),
                        },
                        None,
                    ));
                }
                continue;
            }
            let stop_reason = match fin[k] {
                2 => Some(StopReason::Token(tok as u32)),
                5 => stop_text
                    .get(&k)
                    .and_then(|&w| l.stop.get(w).cloned())
                    .map(StopReason::Text),
                _ => None,
            };
            // A streaming request's last delta rides on its `Finished` (one chunk, as vLLM).
            let tail = l.stream.then(|| {
                (
                    delta,
                    token_id.into_iter().collect(),
                    logprob.into_iter().collect(),
                )
            });
            self.end(id, FinishReason::from_core(fin[k]), stop_reason, None, tail);
        }
    }

    /// The step's executor call failed: abort every request it ran, complete the plan, go on.
    fn fail_step(&mut self, num_samples: usize, msg: String) {
        self.failures += 1;
        self.stats.failed_steps.fetch_add(1, Relaxed);
        let ids = self.sched.plan().req_ids.clone();
        for &id in &ids {
            self.sched.abort(id);
        }
        // Rows of aborted requests are skipped; the ids only need to be valid.
        let _ = self.sched.update(&vec![0; num_samples]);
        for id in ids {
            self.end(
                id,
                FinishReason::Abort,
                None,
                Some(format!("engine step failed: {msg}")),
                None,
            );
        }
    }

    /// `update` refused the sampled ids (it completed the step before refusing).
    fn fail_update(&mut self, msg: String) {
        self.failures += 1;
        self.stats.failed_steps.fetch_add(1, Relaxed);
        let ids = self.sched.plan().req_ids.clone();
        for id in ids {
            self.sched.abort(id);
            self.end(
                id,
                FinishReason::Abort,
                None,
                Some(format!("engine step failed: {msg}")),
                None,
            );
        }
    }

    /// Ends a live request: frees its text and executor state and queues its `Finished` event.
    /// The core has already finished or aborted it.
    /// `tail`: a streaming request's last delta (text, token ids, their logprobs).
    fn end(
        &mut self,
        id: u64,
        reason: FinishReason,
        stop_reason: Option<StopReason>,
        error: Option<String>,
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
                error,
            }),
            Some(l.tx),
        ));
    }

    /// Sends the outbox; a closed channel (client gone) aborts its request.
    fn deliver(&mut self) {
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
    fn reap_closed(&mut self) {
        for (&id, l) in &self.live {
            if l.tx.is_closed() {
                self.aborts.push(id);
            }
        }
    }

    fn apply_aborts(&mut self) {
        for id in std::mem::take(&mut self.aborts) {
            if self.live.contains_key(&id) {
                self.sched.abort(id);
                self.end(id, FinishReason::Abort, None, None, None);
            }
        }
    }

    fn publish_gauges(&self) {
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
