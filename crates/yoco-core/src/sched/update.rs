//! `update(sampled)` (scheduler.md §3): after the executor ran the oldest outstanding plan, append
//! each sampling request's token, index the KV that is now written (deferred indexing: a same-step
//! sibling never copies unwritten KV), check stop conditions, unpin copy sources, free finished
//! requests, and report flat outcome arrays.
//!
//! In async mode the request may have been scheduled again since (on a placeholder for this very
//! token), preempted, or finished by the engine: the row's own `end` says what KV this step wrote,
//! the preemption count says whether the request still holds it, and the generation (`seq_no`)
//! whether the request still exists.

use super::plan::NOT_FINISHED;
use super::scheduler::Scheduler;
use super::state::Status;
use crate::error::{Error, Result};

impl Scheduler {
    pub(super) fn update_step(&mut self, sampled: &[i32]) -> Result<()> {
        self.outcome.req_ids.clear();
        self.outcome.new_tokens.clear();
        self.outcome.finish_reasons.clear();
        let expected = self.pending.front().map_or(0, |p| p.samples);
        if sampled.len() != expected {
            let why = if self.pending.is_empty() {
                "no plan awaits update"
            } else {
                "one per logits_indices entry of the oldest plan awaiting update"
            };
            return Err(Error::Request(format!(
                "update: expected {expected} sampled token ids ({why}), got {}",
                sampled.len()
            )));
        }
        if let Some(i) = sampled.iter().position(|&t| t < 0) {
            return Err(Error::Request(format!(
                "update: sampled[{i}] = {} is not a token id (must be >= 0)",
                sampled[i]
            )));
        }
        let Some(step) = self.pending.pop_front() else {
            return Ok(());
        };
        self.outcome.req_ids.reserve(expected);
        self.outcome.new_tokens.reserve(expected);
        self.outcome.finish_reasons.reserve(expected);

        let max_model_len = self.cfg.max_model_len;
        let mut next = 0;
        let mut num_finished = 0;
        for p in &step.rows {
            let token = if p.samples {
                next += 1;
                Some(sampled[next - 1] as u32)
            } else {
                None
            };
            // Aborted or finished between schedule and update (maybe its slot reused since).
            let Some(r) = self.reqs[p.slot as usize]
                .as_mut()
                .filter(|r| r.seq_no == p.seq_no)
            else {
                continue;
            };
            let seq = r.kv.as_mut().expect("a live request holds KV state");
            if r.num_preemptions == p.preemptions {
                // Still holds the blocks this step wrote: commit what it computed (not what a
                // later plan scheduled on a placeholder).
                self.kv.commit_computed(seq, p.end as usize);
            }
            let Some(token) = token else { continue };
            debug_assert!(r.placeholders > 0, "a sampling row left a placeholder");
            r.placeholders -= 1;
            r.tokens.push(token);
            self.kv.hash_tokens(seq, &r.tokens);
            let reason = r
                .stop
                .check(token, r.num_output(), r.num_tokens(), max_model_len);
            self.outcome.req_ids.push(r.id);
            self.outcome.new_tokens.push(token as i32);
            self.outcome
                .finish_reasons
                .push(reason.map_or(NOT_FINISHED, |x| x as u8));
            if reason.is_some() {
                r.finishing = true;
                num_finished += 1;
            }
        }
        self.kv.release_oldest_copy_sources();
        let mut rows = step;
        rows.rows.clear();
        self.spare_pending.push(rows);

        if num_finished > 0 {
            let reqs = &self.reqs;
            let mut done = Vec::with_capacity(num_finished);
            self.running.retain(|&s| {
                let finishing = reqs[s as usize].as_ref().is_some_and(|r| r.finishing);
                if finishing {
                    done.push(s);
                }
                !finishing
            });
            if done.len() < num_finished {
                // Async mode: preempted after this step was planned, finished by its token.
                for (k, &id) in self.outcome.req_ids.iter().enumerate() {
                    if self.outcome.finish_reasons[k] == NOT_FINISHED {
                        continue;
                    }
                    let slot = self.by_id[&id];
                    if self.req(slot).status != Status::Running {
                        let found = self.waiting.remove_slot(slot);
                        debug_assert!(found, "a preempted request is queued");
                        done.push(slot);
                    }
                }
            }
            for s in done {
                self.release(s);
            }
        }
        Ok(())
    }
}
