//! The miniature scheduler: random requests (shared "system prompts", multi-turn follow-ups,
//! salts and LoRA namespaces, cache-skipping requests) and one engine step the way the real
//! scheduler calls the manager (running requests first, preempting from the back on `NoSpace`;
//! FCFS admission with lookup + allocate; execute; update; finish or abort).

use rand::Rng;
use yoco_core::kv::*;

use super::{Harness, Req, S_ADMIT, S_FINISH, S_HIT, S_NOSPACE, S_PREEMPT, S_STEPS};

impl Harness<'_> {
    /// A prompt (a "system prompt" or a finished conversation, plus random text), its hash
    /// namespace and identity namespace, and whether it skips reading the cache.
    fn random_prompt(&mut self) -> (Vec<u32>, HashExtras, u64, bool) {
        let bs = self.cfg.bs as usize;
        let v = self.cfg.vocab;
        let mut t: Vec<u32> = if !self.finished.is_empty() && self.rng.random_bool(0.3) {
            // multi-turn: a previous conversation plus new text
            let i = self.rng.random_range(0..self.finished.len());
            self.finished[i].clone()
        } else {
            // one of a few "system prompts"
            let sys = self.rng.random_range(0..4u32);
            let n = self.rng.random_range(0..=3 * bs);
            (0..n).map(|i| (i as u32 * 7 + sys) % v).collect()
        };
        let extra = self.rng.random_range(0..=2 * bs);
        for _ in 0..extra {
            t.push(self.rng.random_range(0..v));
        }
        if t.is_empty() {
            t.push(0);
        }
        let ns = self.rng.random_range(0..10u32);
        let (extras, nsid) = match ns {
            0 => (
                HashExtras {
                    cache_salt: Some("a".into()),
                    lora: None,
                },
                1,
            ),
            1 => (
                HashExtras {
                    cache_salt: None,
                    lora: Some(("l".into(), "/l".into())),
                },
                2,
            ),
            _ => (HashExtras::default(), 0),
        };
        let skip = self.rng.random_bool(0.05);
        (t, extras, nsid, skip)
    }

    /// Longest prompt + output the smallest full pool can hold (the engine's max_model_len).
    fn max_len(&self) -> usize {
        let windows = self.windows();
        let min_full = (0..self.ng())
            .filter(|&g| windows[g].is_none())
            .map(|g| self.cfg.pools[g] as usize - 1)
            .min();
        min_full
            .map_or(64, |n| n * self.cfg.bs as usize - 2)
            .min(64)
    }

    /// Queues a random request whose prompt + output fit [`Harness::max_len`].
    pub(super) fn add_request(&mut self) {
        let (mut t, extras, ns, skip) = self.random_prompt();
        let max = self.max_len();
        t.truncate(max - 1);
        let out = self.rng.random_range(1..=self.cfg.bs as usize * 2);
        let target = (t.len() + out).min(max);
        self.waiting.push(Req::new(t, target, extras, ns, skip));
    }

    /// Tokens to schedule for a request with `remaining` uncomputed tokens: all that fits, or a
    /// random smaller chunk.
    fn chunk(&mut self, remaining: usize, budget: usize) -> usize {
        let max = remaining.min(budget).min(self.cfg.max_batched as usize);
        if max == 0 {
            return 0;
        }
        if self.rng.random_bool(0.5) {
            max
        } else {
            self.rng.random_range(1..=max)
        }
    }

    /// One engine step: schedule running, admit waiting, execute, update.
    pub(super) fn step(&mut self) {
        self.stats[S_STEPS] += 1;
        let mut budget = self.cfg.max_batched as usize;
        let mut scheduled: Vec<(usize, usize, usize)> = Vec::new(); // (running idx, start, n)
        let mut preempted_any = false;
        // running, in admission order; victims from the back
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let r = &self.running[i];
            let remaining = r.tokens.len() - r.num_computed;
            let n = self.chunk(remaining, budget);
            if n == 0 {
                i += 1;
                continue;
            }
            loop {
                let before = self.snapshot();
                let r = &mut self.running[i];
                let res = self
                    .m
                    .allocate(r.kv.as_mut().unwrap(), None, r.num_computed, n, 0);
                self.check();
                if res.is_ok() {
                    scheduled.push((i, self.running[i].num_computed, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                self.stats[S_NOSPACE] += 1;
                self.assert_unchanged_on_failure(&before);
                // preempt the most recently admitted request
                preempted_any = true;
                self.stats[S_PREEMPT] += 1;
                let victim = self.running.len() - 1;
                let mut v = self.running.pop().unwrap();
                if let Some(pos) = scheduled.iter().position(|s| s.0 == victim) {
                    budget += scheduled[pos].2;
                    scheduled.remove(pos);
                }
                self.m.free(v.kv.take().unwrap());
                self.check();
                v.num_computed = 0;
                self.waiting.insert(0, v);
                if victim == i {
                    break;
                }
            }
        }
        // admission (only when nothing was preempted), FCFS, stop at the first that does not fit
        while !preempted_any && budget > 0 && !self.waiting.is_empty() && self.running.len() < 6 {
            let mut r = self.waiting.remove(0);
            let mut kv = self.m.new_seq(r.extras.clone(), r.skip);
            self.m.hash_tokens(&mut kv, &r.tokens);
            r.kv = Some(kv);
            self.register_hashes(&r);
            // the candidate sits in `running` while it is being admitted so every check sees it
            self.running.push(r);
            self.check();
            let ri = self.running.len() - 1;
            let hit = self.m.lookup(
                self.running[ri].kv.as_ref().unwrap(),
                self.running[ri].tokens.len(),
            );
            self.check();
            let nc = hit.as_ref().map_or(0, |h| h.num_tokens as usize);
            let len = self.running[ri].tokens.len();
            if let Some(h) = &hit {
                assert!(
                    (h.num_tokens as usize) < len && h.num_tokens % self.cfg.sbs == 0,
                    "hits never cover the last token"
                );
                assert!(!self.running[ri].skip && self.cfg.caching);
            }
            let n = self.chunk(len - nc, budget);
            let before = self.snapshot();
            let res = self.m.allocate(
                self.running[ri].kv.as_mut().unwrap(),
                hit.as_ref(),
                nc,
                n,
                len,
            );
            self.check();
            match res {
                Ok(_) => {
                    self.stats[S_ADMIT] += 1;
                    self.stats[S_HIT] += nc as u64;
                    self.running[ri].num_computed = nc;
                    if self.rng.random_bool(0.02) {
                        // aborted in the same pass: its copy op (if any) still runs, harmlessly
                        let mut r = self.running.pop().unwrap();
                        self.m.free(r.kv.take().unwrap());
                        self.check();
                        continue;
                    }
                    scheduled.push((ri, nc, n));
                    budget -= n;
                }
                Err(NoSpace) => {
                    self.stats[S_NOSPACE] += 1;
                    self.assert_unchanged_on_failure(&before);
                    let mut r = self.running.pop().unwrap();
                    self.m.free(r.kv.take().unwrap());
                    self.check();
                    self.waiting.insert(0, r);
                    break;
                }
            }
        }
        // execute: copies first, then the forward writes
        self.execute_shadow(&scheduled);
        // update: advance, sample, hash, commit; then release the copy sources; then finish
        for &(ri, _, n) in &scheduled {
            let r = &mut self.running[ri];
            r.num_computed += n;
            if r.num_computed == r.tokens.len() {
                let t = self.rng.random_range(0..self.cfg.vocab);
                r.push(t);
            }
            let r = &mut self.running[ri];
            self.m.hash_tokens(r.kv.as_mut().unwrap(), &r.tokens);
            self.check();
            let r = &mut self.running[ri];
            self.m
                .commit_computed(r.kv.as_mut().unwrap(), r.num_computed);
            self.check();
        }
        self.register_running_chains();
        self.m.release_copy_sources();
        self.check();
        // every live request reads its own prefix's KV wherever its table points
        self.assert_reads_own_kv();
        // finish / abort
        let mut k = 0;
        while k < self.running.len() {
            let done = self.running[k].tokens.len() >= self.running[k].target_len
                && self.running[k].num_computed + 1 >= self.running[k].tokens.len();
            if done || self.rng.random_bool(0.01) {
                let mut r = self.running.remove(k);
                self.m.free(r.kv.take().unwrap());
                self.check();
                self.stats[S_FINISH] += 1;
                if done {
                    if self.finished.len() > 16 {
                        let j = self.rng.random_range(0..self.finished.len());
                        self.finished.swap_remove(j);
                    }
                    self.finished.push(r.tokens);
                }
            } else {
                k += 1;
            }
        }
    }
}
