//! Applying a collected step: `update` (tokens, stop conditions, frees), detokenization and stop
//! strings (`yoco-text`), and the requests' events; or, for a failed step, aborting its requests.
//!
//! In async mode this runs while the next step's forward does, so a request that matches a stop
//! string here was already planned (and launched) for one more token: the core discards that row,
//! and nothing of it is emitted.

use std::sync::atomic::Ordering::Relaxed;

use yoco_core::sched::{FinishReason as CoreFinish, StepOutcome, NOT_FINISHED};

use crate::output::{Event, FinishReason, StopReason};
use crate::step_loop::{Collected, StepLoop};

impl StepLoop {
    /// Applies the oldest step awaiting update.
    pub(crate) fn apply_step(&mut self, c: Collected) {
        if let Some(msg) = c.error {
            self.fail_oldest_step(c.num_samples, &msg);
            return;
        }
        self.failures = 0;
        if let Err(e) = self.sched.update(&self.sampled) {
            // Ids checked at collect: only a bug gets here; contained like a failed forward.
            let msg = format!("bad sampled ids: {e}");
            self.fail_oldest_step(c.num_samples, &msg);
            return;
        }
        let outcome = self.sched.take_outcome();
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
                    self.end(id, FinishReason::Abort, None, Some(msg.clone()), None);
                }
                return;
            }
        };
        // Stop strings (in `stop_idx` order, ascending): the core finishes those requests now.
        let mut si = 0;
        let mut di = 0;
        for (k, &id) in o.req_ids.iter().enumerate() {
            let mut fin = o.finish_reasons[k];
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
            }
            let token_id = (tok >= 0).then_some(tok as u32);
            if fin == NOT_FINISHED {
                if l.stream {
                    self.outbox.push((
                        id,
                        Event::Delta {
                            token_id,
                            text: delta,
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
            let tail = l.stream.then(|| (delta, token_id.into_iter().collect()));
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
        if !ids.is_empty() {
            self.failures += 1;
        }
        for &id in &ids {
            self.sched.abort(id);
        }
        // Rows of aborted requests are skipped; the ids only need to be valid.
        self.sampled.clear();
        self.sampled.resize(num_samples, 0);
        let _ = self.sched.update(&self.sampled);
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
}
