//! Logprobs on the loop side: which prompt positions a step scores, and the routing of the
//! executor's flat logprob tables ([`StepOutput`]) to the requests that asked.
//!
//! The step loop calls [`LogprobRows`] at these points only:
//! 1. a request is added / ends: [`LogprobRows::add`] / [`LogprobRows::remove`];
//! 2. before `launch(N)`: [`LogprobRows::plan`] lists the prompt positions plan N computes that
//!    are still owed (a preempted request recomputes its prompt; nothing is reported twice);
//! 3. after `collect(N)`: [`LogprobRows::take_prompt`] files them under their requests and hands
//!    back a request's whole prompt logprobs once complete; [`LogprobRows::sampled`] gives one
//!    sampling row's token logprob.
//!
//! Values are those the executor computed; what vLLM reports per position is the chosen token
//! (with its logprob and rank) plus the `k` most likely tokens.

use rustc_hash::FxHashMap;
use yoco_core::sched::StepPlan;

use crate::executor::{LogprobTable, PromptScoring, StepOutput};
use crate::params::GenParams;

/// One position's logprobs: the chosen token (sampled, or the prompt's), its logprob and 1-based
/// rank, and the `k` most likely tokens in rank order.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The chosen token.
    pub token: u32,
    /// Its logprob.
    pub logprob: f32,
    /// Its rank (1 = most likely).
    pub rank: u32,
    /// The most likely tokens, most likely first (rank `i + 1`), with their logprobs.
    pub top: Vec<(u32, f32)>,
}

/// A prompt's logprobs: `None` for position 0 (nothing predicts it), then one entry per position.
pub type PromptLogprobs = Vec<Option<TokenLogprob>>;

fn entry(t: &LogprobTable, i: usize, token: u32, k: usize) -> TokenLogprob {
    let k = k.min(t.k);
    let base = i * t.k;
    TokenLogprob {
        token,
        logprob: t.token_logprobs[i],
        rank: t.token_ranks[i].max(1) as u32,
        top: (0..k)
            .map(|j| (t.top_ids[base + j].max(0) as u32, t.top_logprobs[base + j]))
            .collect(),
    }
}

/// A request still owed prompt logprobs.
struct Owed {
    prompt: Vec<u32>,
    k: u32,
    /// Next prompt position to report.
    next: u32,
    got: PromptLogprobs,
}

/// A run of this step's scored positions: request `id`, prompt positions `lo..hi`.
struct Segment {
    id: u64,
    lo: u32,
    hi: u32,
}

/// Who asked for logprobs, and this step's prompt scoring.
#[derive(Default)]
pub(crate) struct LogprobRows {
    sample_k: FxHashMap<u64, u32>,
    owed: FxHashMap<u64, Owed>,
    scoring: PromptScoring,
    segments: Vec<Segment>,
    /// Per sampling row of the step: its position in `sample_lp_rows`, or -1.
    sample_pos: Vec<i32>,
}

impl LogprobRows {
    /// Notes what `id` asked for. A one-token prompt's logprobs are complete at once (`[None]`).
    pub(crate) fn add(&mut self, id: u64, p: &GenParams) -> Option<PromptLogprobs> {
        if let Some(k) = p.logprobs {
            self.sample_k.insert(id, k);
        }
        let k = p.prompt_logprobs?;
        if p.prompt.len() <= 1 {
            return Some(vec![None]);
        }
        self.owed.insert(
            id,
            Owed {
                prompt: p.prompt.clone(),
                k,
                next: 1,
                got: vec![None],
            },
        );
        None
    }

    /// `id` ended.
    pub(crate) fn remove(&mut self, id: u64) {
        self.sample_k.remove(&id);
        self.owed.remove(&id);
    }

    /// Every logprob request belongs to a request in `live` (`check_invariants`).
    pub(crate) fn check_live<V>(&self, live: &FxHashMap<u64, V>) -> Result<(), String> {
        let ended = self
            .sample_k
            .keys()
            .chain(self.owed.keys())
            .find(|id| !live.contains_key(id));
        match ended {
            Some(id) => Err(format!(
                "request {id} ended with its logprob request still held"
            )),
            None => Ok(()),
        }
    }

    /// How many alternatives `id` asked per sampled token.
    pub(crate) fn sample_k(&self, id: u64) -> Option<u32> {
        if self.sample_k.is_empty() {
            return None;
        }
        self.sample_k.get(&id).copied()
    }

    /// The prompt positions `plan` computes that are still owed. A row of a request that wants
    /// prompt logprobs has every scheduled token as a cross row (the core selects them), so cross
    /// row `x0 + j` holds position `seq_len - nx + j` and predicts position `seq_len - nx + j + 1`.
    pub(crate) fn plan(&mut self, plan: &StepPlan) -> &PromptScoring {
        self.scoring.rows.clear();
        self.scoring.targets.clear();
        self.scoring.k = 0;
        self.segments.clear();
        if self.owed.is_empty() {
            return &self.scoring;
        }
        let cq = &plan.cross_query_start_loc;
        for (r, &id) in plan.req_ids.iter().enumerate() {
            let Some(o) = self.owed.get(&id) else {
                continue;
            };
            let (x0, x1) = (cq[r] as i64, cq[r + 1] as i64);
            let sl = plan.seq_lens[r] as i64;
            let first_pred = sl - (x1 - x0) + 1;
            let lo = first_pred.max(o.next as i64);
            let hi = (sl + 1).min(o.prompt.len() as i64);
            if hi <= lo {
                continue;
            }
            for p in lo..hi {
                self.scoring.rows.push((x0 + p - first_pred) as i32);
                self.scoring.targets.push(o.prompt[p as usize] as i32);
            }
            self.scoring.k = self.scoring.k.max(o.k);
            self.segments.push(Segment {
                id,
                lo: lo as u32,
                hi: hi as u32,
            });
        }
        &self.scoring
    }

    /// Checks the executor's logprob arrays against the step (`samples` sampling rows); prepares
    /// [`LogprobRows::sampled`].
    pub(crate) fn check(&mut self, out: &StepOutput, samples: usize) -> Result<(), String> {
        out.sample_logprobs
            .check(out.sample_lp_rows.len(), "sampled-token")?;
        out.prompt_logprobs.check(self.scoring.len(), "prompt")?;
        self.sample_pos.clear();
        if !out.sample_lp_rows.is_empty() {
            self.sample_pos.resize(samples, -1);
            for (j, &s) in out.sample_lp_rows.iter().enumerate() {
                let slot = usize::try_from(s)
                    .ok()
                    .and_then(|s| self.sample_pos.get_mut(s))
                    .ok_or_else(|| {
                        format!("executor returned logprobs for sampling row {s} of {samples}")
                    })?;
                *slot = j as i32;
            }
        }
        Ok(())
    }

    /// Files this step's prompt logprobs under their requests; the requests whose prompt logprobs
    /// are now complete, with them.
    pub(crate) fn take_prompt(&mut self, out: &StepOutput) -> Vec<(u64, PromptLogprobs)> {
        let mut done = Vec::new();
        let mut i = 0;
        for seg in &self.segments {
            let n = (seg.hi - seg.lo) as usize;
            if let Some(o) = self.owed.get_mut(&seg.id) {
                // Positions never computed (cannot happen: such requests skip the prefix cache)
                // stay null rather than shifting the rest.
                o.got.resize(o.got.len().max(seg.lo as usize), None);
                for j in 0..n {
                    let p = seg.lo as usize + j;
                    let e = entry(&out.prompt_logprobs, i + j, o.prompt[p], o.k as usize);
                    o.got.push(Some(e));
                }
                o.next = seg.hi;
                if o.next as usize >= o.prompt.len() {
                    let o = self.owed.remove(&seg.id).expect("present");
                    done.push((seg.id, o.got));
                }
            }
            i += n;
        }
        self.segments.clear();
        done
    }

    /// The logprobs of sampling row `s`'s token `token` for request `id`, if it asked.
    pub(crate) fn sampled(
        &self,
        out: &StepOutput,
        s: usize,
        id: u64,
        token: u32,
    ) -> Option<TokenLogprob> {
        let k = self.sample_k(id)?;
        let j = *self.sample_pos.get(s)?;
        (j >= 0).then(|| entry(&out.sample_logprobs, j as usize, token, k as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan of one row (request `id`) computing positions `start..end`, every token a cross row
    /// (as the core selects them for prompt logprobs), sampling when `end` completes the prompt.
    fn plan_of(id: u64, start: i32, end: i32) -> StepPlan {
        StepPlan {
            req_ids: vec![id],
            seq_lens: vec![end],
            cross_query_start_loc: vec![0, end - start],
            ..StepPlan::default()
        }
    }

    fn table(n: usize, k: usize) -> LogprobTable {
        LogprobTable {
            k,
            token_logprobs: (0..n).map(|i| -(i as f32)).collect(),
            token_ranks: vec![1; n],
            top_ids: vec![0; n * k],
            top_logprobs: vec![0.0; n * k],
        }
    }

    #[test]
    fn a_prompt_recomputed_after_preemption_is_scored_only_where_not_yet_reported() {
        let prompt: Vec<u32> = (100..140).collect();
        let mut lr = LogprobRows::default();
        let p = GenParams {
            prompt: prompt.clone(),
            prompt_logprobs: Some(1),
            ..GenParams::default()
        };
        assert!(lr.add(7, &p).is_none());
        // Chunk 1: positions 0..16 predict 1..=16.
        let s = lr.plan(&plan_of(7, 0, 16)).clone();
        assert_eq!(s.rows, (0..16).collect::<Vec<_>>());
        assert_eq!(
            s.targets,
            prompt[1..17].iter().map(|&t| t as i32).collect::<Vec<_>>()
        );
        let out = StepOutput {
            prompt_logprobs: table(16, 1),
            ..StepOutput::default()
        };
        assert!(lr.take_prompt(&out).is_empty());
        // Preempted, then resumed: positions 0..24 recomputed; only 17..=24 are new.
        let s = lr.plan(&plan_of(7, 0, 24)).clone();
        assert_eq!(s.rows, (16..24).collect::<Vec<_>>());
        assert_eq!(
            s.targets,
            prompt[17..25].iter().map(|&t| t as i32).collect::<Vec<_>>()
        );
        assert!(lr
            .take_prompt(&StepOutput {
                prompt_logprobs: table(8, 1),
                ..StepOutput::default()
            })
            .is_empty());
        // The last chunk (24..40; its last row samples and predicts past the prompt): 25..=39.
        let s = lr.plan(&plan_of(7, 24, 40)).clone();
        assert_eq!(s.rows, (0..15).collect::<Vec<_>>());
        let done = lr.take_prompt(&StepOutput {
            prompt_logprobs: table(15, 1),
            ..StepOutput::default()
        });
        assert_eq!(done.len(), 1);
        let (id, plp) = &done[0];
        assert_eq!(*id, 7);
        assert_eq!(plp.len(), prompt.len());
        assert!(plp[0].is_none());
        for (p, e) in plp.iter().enumerate().skip(1) {
            assert_eq!(e.as_ref().unwrap().token, prompt[p], "position {p}");
        }
        // Nothing more is owed: decode steps score nothing.
        assert!(lr.plan(&plan_of(7, 40, 41)).is_empty());
    }

    #[test]
    fn a_one_token_prompt_has_its_prompt_logprobs_at_once() {
        let mut lr = LogprobRows::default();
        let p = GenParams {
            prompt: vec![2],
            prompt_logprobs: Some(0),
            ..GenParams::default()
        };
        assert_eq!(lr.add(1, &p), Some(vec![None]));
        assert!(lr.plan(&plan_of(1, 0, 1)).is_empty());
    }
}
