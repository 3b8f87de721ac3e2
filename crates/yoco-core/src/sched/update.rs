//! `update(sampled)` (scheduler.md §3): after the executor ran the plan, append each sampling
//! request's token, index the KV that is now written (deferred indexing: a same-step sibling never
//! copies unwritten KV), check stop conditions, unpin copy sources, free finished requests, and
//! report flat outcome arrays.

use super::plan::NOT_FINISHED;
use super::scheduler::Scheduler;
use crate::error::{Error, Result};

impl Scheduler {
    pub(super) fn update_step(&mut self, sampled: &[i32]) -> Result<()> {
        self.outcome.req_ids.clear();
        self.outcome.new_tokens.clear();
        self.outcome.finish_reasons.clear();
        let expected = if self.awaiting_update {
            self.pending_samples
        } else {
            0
        };
        if sampled.len() != expected {
            let why = if self.awaiting_update {
                "one per logits_indices entry of the last plan"
            } else {
                "no plan awaits update"
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
        if !self.awaiting_update {
            return Ok(());
        }
        self.awaiting_update = false;
        self.outcome.req_ids.reserve(expected);
        self.outcome.new_tokens.reserve(expected);
        self.outcome.finish_reasons.reserve(expected);

        let max_model_len = self.cfg.max_model_len;
        let mut next = 0;
        let mut num_finished = 0;
        for k in 0..self.pending.len() {
            let p = self.pending[k];
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
            let seq = r.kv.as_mut().expect("a running request holds KV state");
            self.kv.commit_computed(seq, r.num_computed as usize);
            let Some(token) = token else { continue };
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
        self.kv.release_copy_sources();

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
            for s in done {
                self.release(s);
            }
        }
        Ok(())
    }
}
