//! One `schedule()` call (scheduler.md §2): phase A gives running requests their tokens under the
//! budget, preempting by recompute when blocks run out; phase B admits waiting requests, only if
//! nothing was preempted, with skip-and-continue and an aging bound; phase C (`build.rs`) writes the
//! plan and advances `num_computed`.

use super::config::Policy;
use super::encoder_budget::limit_chunk;
use super::scheduler::{Scheduled, Scheduler};
use super::state::{Status, NO_ROW};
use crate::kv::{KvManager, NoSpace, SeqKv};

impl Scheduler {
    pub(super) fn schedule_step(&mut self) {
        self.step_id += 1;
        self.sched.clear();
        self.plan.clear();
        let mut budget = self.cfg.max_num_batched_tokens;
        // vLLM 0.33: the per-request chunk cap is ignored when a request is alone.
        let threshold = self.cfg.long_prefill_token_threshold;
        let cap = if threshold > 0 && self.num_unfinished() > 1 {
            threshold
        } else {
            u32::MAX
        };
        let mut encoder = self.cfg.max_num_encoder_input_tokens;
        let preempted = self.schedule_running(&mut budget, &mut encoder, cap);
        if !preempted {
            self.admit_waiting(&mut budget, &mut encoder, cap);
        }
        self.build_plan();
    }

    /// Phase A: running requests in admission order. Returns whether anything was preempted.
    fn schedule_running(&mut self, budget: &mut u32, encoder: &mut u32, cap: u32) -> bool {
        let mut preempted = false;
        let mut i = 0;
        'running: while i < self.running.len() && *budget > 0 {
            let slot = self.running[i];
            let r = self.req(slot);
            let n = r.num_uncomputed().min(cap).min(*budget);
            // A chunk stops before an image / audio item the step's encoder budget cannot take.
            let (n, cost) = limit_chunk(&r.mm, r.num_computed, n, false, *encoder);
            if n == 0 {
                // Deliberately not strict FCFS: a request with nothing to do does not stop the pass.
                i += 1;
                continue;
            }
            loop {
                let r = self.reqs[slot as usize].as_mut().expect("running slot");
                let seq = r.kv.as_mut().expect("running request holds KV state");
                match self
                    .kv
                    .allocate(seq, None, r.num_computed as usize, n as usize, 0)
                {
                    Ok(_) => {
                        self.sched.push(Scheduled {
                            slot,
                            num_new: n,
                            admitted: false,
                        });
                        *budget -= n;
                        *encoder -= cost;
                        i += 1;
                        break;
                    }
                    Err(NoSpace) => {
                        preempted = true;
                        let v = self.pick_victim();
                        let victim = self.running.remove(v);
                        if let Some(k) = self.sched.iter().position(|s| s.slot == victim) {
                            // Only under the priority policy can the victim precede `i`: undo its
                            // scheduling (its blocks go with the preemption).
                            *budget += self.sched[k].num_new;
                            self.sched.remove(k);
                        }
                        if v < i {
                            i -= 1;
                        }
                        self.preempt(victim);
                        if victim == slot {
                            match self.cfg.policy {
                                // Nothing behind the preempted tail can be scheduled either.
                                Policy::Fcfs => break 'running,
                                // More important requests later in the list may still fit.
                                Policy::Priority => break,
                            }
                        }
                    }
                }
            }
        }
        preempted
    }

    /// FCFS: the most recently admitted; priority: the least important, latest arrival first.
    fn pick_victim(&self) -> usize {
        match self.cfg.policy {
            Policy::Fcfs => self.running.len() - 1,
            Policy::Priority => {
                let mut best = 0;
                let mut best_key = (i32::MIN, 0u64);
                for (i, &s) in self.running.iter().enumerate() {
                    let r = self.req(s);
                    let key = (r.priority, r.seq_no);
                    if key > best_key || i == 0 {
                        best = i;
                        best_key = key;
                    }
                }
                best
            }
        }
    }

    /// Recompute preemption: the victim frees its blocks and row, forgets its progress, and waits
    /// at the front (FCFS) or at its key's place (priority). Its full, indexed blocks stay in the
    /// prefix cache, so resuming usually hits them again; it keeps its hash chain
    /// ([`KvManager::free_blocks`](crate::kv::KvManager::free_blocks)), so resuming does not
    /// rehash its tokens.
    fn preempt(&mut self, slot: u32) {
        let r = self.reqs[slot as usize].as_mut().expect("running slot");
        if let Some(seq) = r.kv.as_mut() {
            self.kv.free_blocks(seq);
        }
        let row = std::mem::replace(&mut r.row, NO_ROW);
        r.num_computed = 0;
        r.status = Status::Preempted;
        r.num_preemptions += 1;
        let (id, priority, seq_no) = (r.id, r.priority, r.seq_no);
        self.release_row(row);
        self.num_preemptions += 1;
        self.plan.preempted_ids.push(id);
        self.waiting.push_preempted(slot, priority, seq_no);
    }

    /// Phase B: admit waiting requests in queue order while budget and rows last. A request that
    /// does not fit is passed over (skip-and-continue) until it has been passed over in
    /// `max_admission_skips` steps; then admission stops behind it until it fits.
    fn admit_waiting(&mut self, budget: &mut u32, encoder: &mut u32, cap: u32) {
        let max_seqs = self.cfg.max_num_seqs as usize;
        let mut i = 0;
        while i < self.waiting.len() && *budget > 0 && self.running.len() < max_seqs {
            let slot = self.waiting.get(i);
            if self.blocked_by_sibling(slot) {
                i += 1;
                continue;
            }
            let step = self.step_id;
            let r = self.reqs[slot as usize].as_mut().expect("waiting slot");
            let num_tokens = r.num_tokens();
            let seq = r.kv.as_mut().expect("a live request holds KV state");
            // A preempted request kept its chain: this only hashes tokens appended since (none
            // in practice), and is free when the chain is complete.
            self.kv.hash_tokens(seq, &r.tokens);
            let admitted = admit_alloc(
                &mut self.kv,
                seq,
                num_tokens,
                cap.min(*budget),
                &r.mm,
                *encoder,
            );
            match admitted {
                Ok((computed, n, cost)) => {
                    *encoder -= cost;
                    r.num_computed = computed;
                    r.status = Status::Running;
                    r.skips = 0;
                    let id = r.id;
                    let row = self.take_row();
                    self.req_mut(slot).row = row;
                    self.waiting.remove_at(i);
                    self.running.push(slot);
                    self.sched.push(Scheduled {
                        slot,
                        num_new: n,
                        admitted: true,
                    });
                    self.plan.admitted_ids.push(id);
                    self.plan.admitted_rows.push(row as i32);
                    self.plan.admitted_num_cached.push(computed as i32);
                    *budget -= n;
                }
                // The step's encoder budget is spent: later (text) requests may still run, and
                // this one is first in line next step; no skip is counted (blocks are not short).
                Err(Refused::EncoderBudget) => i += 1,
                Err(Refused::NoSpace) => {
                    if r.skips >= self.cfg.max_admission_skips {
                        break;
                    }
                    if r.last_skip_step != step {
                        r.skips += 1;
                        r.last_skip_step = step;
                    }
                    i += 1;
                }
            }
        }
    }

    /// An `n > 1` sibling waits until the request it follows has computed its prompt (or ended).
    fn blocked_by_sibling(&self, slot: u32) -> bool {
        let Some(after) = self.req(slot).after else {
            return false;
        };
        match self.by_id.get(&after) {
            Some(&s) => !self.req(s).prompt_computed(),
            None => false,
        }
    }
}

/// Why a waiting request was not admitted this step.
enum Refused {
    /// The pools cannot hold it now.
    NoSpace,
    /// Its first chunk would start at an image / audio item the step's encoder budget cannot take.
    EncoderBudget,
}

/// Allocates a waiting request's first chunk (at most `max_new` tokens, and what the encoder
/// budget `encoder` allows of its multimodal items `mm`), reserving its whole prompt. Returns
/// `(prefix-cache hit in tokens, tokens scheduled, encoder tokens charged)`.
///
/// A hit can need more free blocks than no hit: a trailing partial match pins its source block
/// while a private copy destination is allocated. On a small pool that extra block may never be
/// free, and retrying the same hit every step would stall admission behind this request forever
/// (found by yoco-ref's property tests). So on `NoSpace` the hit is trimmed to its full, shared
/// blocks, and then dropped; each attempt is side-effect free when it fails.
fn admit_alloc(
    kv: &mut KvManager,
    seq: &mut SeqKv,
    num_tokens: u32,
    max_new: u32,
    mm: &[(u32, u32)],
    encoder: u32,
) -> Result<(u32, u32, u32), Refused> {
    let block_size = kv.config().block_size;
    let mut hit = kv.lookup(seq, num_tokens as usize);
    loop {
        let computed = hit.as_ref().map_or(0, |h| h.num_tokens);
        debug_assert!(
            computed < num_tokens,
            "a prefix hit never covers the last token"
        );
        let n = (num_tokens - computed).min(max_new);
        let (n, cost) = limit_chunk(mm, computed, n, true, encoder);
        if n == 0 {
            return Err(Refused::EncoderBudget);
        }
        if kv
            .allocate(
                seq,
                hit.as_ref(),
                computed as usize,
                n as usize,
                num_tokens as usize,
            )
            .is_ok()
        {
            return Ok((computed, n, cost));
        }
        hit = match hit {
            None => return Err(Refused::NoSpace),
            Some(h) => {
                let shared = h.num_shared_tokens(block_size);
                if shared > 0 && shared < h.num_tokens {
                    // The largest hit every group can serve within the full blocks.
                    kv.lookup(seq, shared as usize + 1)
                        .filter(|t| t.num_tokens < h.num_tokens)
                } else {
                    None
                }
            }
        };
    }
}
