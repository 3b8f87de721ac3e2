//! Applying a collected step: `update` (tokens, stop conditions, frees), detokenization and stop
//! strings (`yoco-text`), and the requests' events; or, for a failed step, aborting its requests.
//!
//! In async mode this runs while the next step's forward does, so a request that matches a stop
//! string here was already planned (and launched) for one more token: the core discards that row,
//! and nothing of it is emitted.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use yoco_core::sched::{FinishReason as CoreFinish, StepOutcome, NOT_FINISHED};

use crate::output::{Event, FinishReason, RequestError, StopReason};
use crate::step_loop::{Collected, StepLoop};

impl StepLoop {
    /// Applies the oldest step awaiting update.
    pub(crate) fn apply_step(&mut self, c: Collected) {
        if let Some(msg) = c.error {
            self.fail_oldest_step(c.num_samples, &msg);
            return;
        }
        self.failures = 0;
        if let Err(e) = self.sched.update(&self.out.sampled) {
            // Ids checked at collect: only a bug gets here; contained like a failed forward.
            let msg = format!("bad sampled ids: {e}");
            self.fail_oldest_step(c.num_samples, &msg);
            return;
        }
        let outcome = self.sched.take_outcome();
        self.grammar.record(&outcome);
        self.emit(&outcome);
        self.sched.recycle_outcome(outcome);
    }

    /// Text and events of one step's outcome.
    fn emit(&mut self, o: &StepOutcome) {
        self.stats
            .generation_tokens
            .fetch_add(o.req_ids.len() as u64, Relaxed);
        let mut step = match self.text.step(&o.req_ids, &o.new_tokens, &o.finish_reasons) {
            Ok(_) => self.text.take_step(),
            Err(e) => {
                let msg = e.to_string();
                for &id in &o.req_ids {
                    self.sched.abort(id);
                    self.end(
                        id,
                        FinishReason::Abort,
                        None,
                        Some(RequestError::failed(msg.clone())),
                        None,
                    );
                }
                return;
            }
        };
        // Stop strings (in `stop_idx` order, ascending): the core finishes those requests now.
        let mut si = 0;
        let mut di = 0;
        // The outcome's rows are a subsequence of the step's sampling rows (`sample_ids`): `s`
        // walks them to find each row's logprobs.
        let mut s = 0;
        let want_lps = !self.out.sample_lp_rows.is_empty();
        let grammar_failed = self.grammar.any_failed();
        let now = Instant::now();
        for (k, &id) in o.req_ids.iter().enumerate() {
            let mut fin = o.finish_reasons[k];
            if grammar_failed && self.grammar.failed(id) {
                // A grammar that failed (a token it rejects, or a mask over llguidance's budget)
                // ends its sequence as an abort: the output is a prefix, not a valid document.
                if fin == NOT_FINISHED {
                    self.sched.finish(id, CoreFinish::Abort);
                }
                fin = CoreFinish::Abort as u8;
            }
            let mut stop_which = None;
            if si < step.stop_idx.len() && step.stop_idx[si] as usize == k {
                if fin == NOT_FINISHED {
                    self.sched.finish(id, CoreFinish::StopString);
                }
                fin = CoreFinish::StopString as u8;
                stop_which = Some(step.stop_which[si] as usize);
                si += 1;
            }
            let delta = if di < step.delta_idx.len() && step.delta_idx[di] as usize == k {
                di += 1;
                std::mem::take(&mut step.deltas[di - 1])
            } else {
                String::new()
            };
            let Some(l) = self.live.get_mut(&id) else {
                continue;
            };
            let tok = o.new_tokens[k];
            if tok >= 0 {
                l.generated += 1;
                self.stats.observe_token(&mut l.times, now);
            }
            let token_id = (tok >= 0).then_some(tok as u32);
            let logprob = match token_id {
                Some(t) if want_lps => {
                    while s < self.sample_ids.len() && self.sample_ids[s] != id {
                        s += 1;
                    }
                    let lp = self.lps.sampled(&self.out, s, id, t);
                    s += 1;
                    lp
                }
                _ => None,
            };
            if !l.stream {
                l.logprobs.extend(logprob.clone());
            }
            if fin == NOT_FINISHED {
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
            let stop_reason = match fin {
                2 => Some(StopReason::Token(tok as u32)),
                5 => stop_which
                    .and_then(|w| l.stop.get(w).cloned())
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
            self.end(id, FinishReason::from_core(fin), stop_reason, None, tail);
        }
        self.text.recycle_step(step);
    }

    /// The oldest step awaiting update failed (its executor call, or its sampled ids): abort every
    /// request it ran, complete it in the core, and go on. One abort path for every failure.
    ///
    /// A failed step none of whose requests is still live (in async mode: the step planned ahead
    /// of a failed one, whose requests that failure already aborted) fails nobody, so it does not
    /// count towards `max_consecutive_failures`.
    fn fail_oldest_step(&mut self, num_samples: usize, msg: &str) {
        self.stats.failed_steps.fetch_add(1, Relaxed);
        let mut ids = Vec::new();
        self.sched.oldest_pending_ids(&mut ids);
        let mut fatal = false;
        if !ids.is_empty() {
            self.failures += 1;
            if self.failures >= self.max_failures {
                // This failure stops the loop: the server reports it (health, 503s, the exit), and
                // its own requests get the same 503 as those that arrive after it.
                fatal = true;
                if let Ok(mut e) = self.stats.dead_error.lock() {
                    *e = Some(msg.to_string());
                }
                // Dead from now, before these requests' 503s go out: a client that retries on
                // seeing one must be routed to another loop, not back to this one.
                self.stats.dead.store(true, Relaxed);
            }
        }
        for &id in &ids {
            self.sched.abort(id);
        }
        // Rows of aborted requests are skipped; the ids only need to be valid.
        self.out.clear();
        self.out.sampled.resize(num_samples, 0);
        let _ = self.sched.update(&self.out.sampled);
        for id in ids {
            self.end(
                id,
                FinishReason::Abort,
                None,
                Some(if fatal {
                    RequestError::engine_dead(msg)
                } else {
                    RequestError::failed(format!("engine step failed: {msg}"))
                }),
                None,
            );
        }
    }
}
