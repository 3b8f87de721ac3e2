//! Ground truth about every live request, kept by the test driver from what it submitted and what
//! it sampled, never from the scheduler: its tokens, how many of them have KV, and whether it is
//! admitted. Each plan is checked against it: a row's chunk must continue exactly where the request's
//! computed prefix ends, carry the request's tokens, and sample exactly when the request's last known
//! token is in the chunk.

use std::collections::HashMap;

use yoco_core::kv::HashExtras;
use yoco_core::sched::StepPlan;

use crate::bail;
use crate::error::Result;
use crate::plan_view::PlanView;
use crate::rng::chain;

/// What the driver knows about one live request.
#[derive(Debug, Clone)]
pub struct ReqTruth {
    /// Prompt then every sampled token, in order.
    pub tokens: Vec<u32>,
    /// Leading entries of `tokens` that are the prompt.
    pub prompt_len: usize,
    /// The request asked for prompt logprobs: it must be admitted with no cached tokens, and its
    /// cross rows are not limited to its sampling row.
    pub prompt_logprobs: bool,
    /// Tokens with KV (`None` while waiting / preempted).
    pub computed: Option<usize>,
    /// Hash-chain root: the request's cache namespace (salt, LoRA).
    root: u64,
    /// `hashes[p]` commits to the root and `tokens[..=p]`.
    hashes: Vec<u64>,
}

impl ReqTruth {
    /// Digest of the prefix `tokens[..=p]` in this request's namespace: two requests share KV for a
    /// position iff these agree, which is what the synthetic KV is a function of.
    pub fn prefix_hash(&mut self, p: usize) -> u64 {
        while self.hashes.len() <= p {
            let prev = self.hashes.last().copied().unwrap_or(self.root);
            let tok = self.tokens[self.hashes.len()];
            self.hashes.push(chain(prev, tok as u64));
        }
        self.hashes[p]
    }

    /// Tokens sampled so far.
    pub fn num_output(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// Root of a namespace's hash chain.
pub fn namespace_root(extras: &HashExtras) -> u64 {
    let mut h = 0x5EED_0F7A_u64;
    let mut eat = |s: &str| {
        h = chain(h, s.len() as u64);
        for b in s.bytes() {
            h = chain(h, b as u64);
        }
    };
    if let Some(s) = &extras.cache_salt {
        eat("salt");
        eat(s);
    }
    if let Some((n, p)) = &extras.lora {
        eat("lora");
        eat(n);
        eat(p);
    }
    h
}

/// The ground truth of every live request, by id (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Truth {
    /// Live requests by id; finished and aborted ones are removed.
    pub reqs: HashMap<u64, ReqTruth>,
}

impl Truth {
    /// Records a submitted request (waiting, nothing computed). Panics on an id that is live.
    pub fn add(&mut self, id: u64, prompt: &[u32], extras: &HashExtras, prompt_logprobs: bool) {
        let prev = self.reqs.insert(
            id,
            ReqTruth {
                tokens: prompt.to_vec(),
                prompt_len: prompt.len(),
                prompt_logprobs,
                computed: None,
                root: namespace_root(extras),
                hashes: Vec::new(),
            },
        );
        assert!(prev.is_none(), "request id {id} reused while live");
    }

    /// A live request's truth; the error says the id is not live.
    pub fn get(&self, id: u64) -> Result<&ReqTruth> {
        match self.reqs.get(&id) {
            Some(r) => Ok(r),
            None => bail!("request {id} is not live (never added, finished or aborted)"),
        }
    }

    /// As [`Truth::get`], mutable.
    pub fn get_mut(&mut self, id: u64) -> Result<&mut ReqTruth> {
        match self.reqs.get_mut(&id) {
            Some(r) => Ok(r),
            None => bail!("request {id} is not live (never added, finished or aborted)"),
        }
    }

    /// Applies the plan's preemptions and admissions and checks every row against the truth.
    pub fn begin_step(&mut self, plan: &StepPlan, view: &PlanView) -> Result<()> {
        let step = plan.step_id;
        for &id in &plan.preempted_ids {
            let r = self.get_mut(id)?;
            if r.computed.take().is_none() {
                bail!("step {step}: request {id} preempted but it was not running");
            }
        }
        for (k, &id) in plan.admitted_ids.iter().enumerate() {
            let cached = plan.admitted_num_cached[k];
            let r = self.get_mut(id)?;
            if r.computed.is_some() {
                bail!("step {step}: request {id} admitted while already running");
            }
            if cached < 0 || cached as usize >= r.tokens.len() {
                bail!("step {step}: request {id} admitted with {cached} cached tokens of {} (a hit never covers the last token)", r.tokens.len());
            }
            if r.prompt_logprobs && cached != 0 {
                bail!("step {step}: request {id} wants prompt logprobs but was admitted with {cached} cached tokens");
            }
            r.computed = Some(cached as usize);
        }
        for row in &view.rows {
            let id = row.req_id;
            let r = self.get(id)?;
            let Some(computed) = r.computed else {
                bail!("step {step}: request {id} is scheduled but was never admitted (or was preempted)");
            };
            if row.start_pos() != computed {
                bail!(
                    "step {step}: request {id}'s chunk starts at position {} (seq_len {} - {} scheduled) but it has KV for {computed} tokens",
                    row.start_pos(), row.seq_len, row.num_scheduled()
                );
            }
            if row.seq_len > r.tokens.len() {
                bail!(
                    "step {step}: request {id} has seq_len {} but only {} known tokens",
                    row.seq_len,
                    r.tokens.len()
                );
            }
            for (i, tok) in row.tokens.clone().enumerate() {
                let want = r.tokens[computed + i] as i32;
                if plan.input_ids[tok] != want {
                    bail!("step {step}: token {tok} (request {id}, position {}) has id {}, want {want}", computed + i, plan.input_ids[tok]);
                }
            }
        }
        Ok(())
    }

    /// Checks who samples which token: exactly the rows whose chunk reaches the request's last
    /// known token, at that token. Run after the step executed (the oracle's numeric checks give
    /// the more telling message when a logits index is off).
    pub fn check_sampling(&self, plan: &StepPlan, view: &PlanView) -> Result<()> {
        let step = plan.step_id;
        let sampling: Vec<usize> = view.samples.iter().map(|s| s.row).collect();
        for (ri, row) in view.rows.iter().enumerate() {
            let id = row.req_id;
            let r = self.get(id)?;
            let must_sample = row.seq_len == r.tokens.len();
            let samples = sampling.contains(&ri);
            if must_sample != samples {
                bail!(
                    "step {step}: request {id} (seq_len {}, {} known tokens) {} but {}",
                    row.seq_len,
                    r.tokens.len(),
                    if must_sample {
                        "completes its known tokens"
                    } else {
                        "is mid-prefill"
                    },
                    if samples {
                        "samples"
                    } else {
                        "does not sample"
                    }
                );
            }
            if !r.prompt_logprobs && row.cross.len() != samples as usize {
                bail!(
                    "step {step}: request {id} has {} cross rows, want {}",
                    row.cross.len(),
                    samples as usize
                );
            }
        }
        for s in &view.samples {
            let row = &view.rows[s.row];
            if s.token != row.tokens.end - 1 {
                bail!(
                    "step {step}: request {} samples token {} but its last scheduled token is {}",
                    row.req_id,
                    s.token,
                    row.tokens.end - 1
                );
            }
        }
        Ok(())
    }

    /// The step executed: every row's KV now covers its `seq_len`.
    pub fn end_step(&mut self, view: &PlanView) -> Result<()> {
        for row in &view.rows {
            self.get_mut(row.req_id)?.computed = Some(row.seq_len);
        }
        Ok(())
    }
}
