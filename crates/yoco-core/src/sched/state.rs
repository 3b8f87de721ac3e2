//! A live request inside the scheduler: its tokens, counters, status, KV state and stop data.
//!
//! The whole scheduler is built on one counter (scheduler.md §1.1): `num_computed` is the number of
//! tokens whose KV is written *or scheduled to be written*. Every step the scheduler tries to make it
//! catch up with `tokens.len()`; chunked prefill, prefix hits and resumed (preempted) requests all fall
//! out of that rule. It advances at schedule time, so a request samples in a step iff that step brings
//! `num_computed` to `tokens.len()`.

use smallvec::SmallVec;

use super::encoder_budget::MmRanges;
use super::plan::FinishReason;
use super::request::NewRequest;
use crate::kv::SeqKv;

/// Where a live request is. Finished requests are removed, so they have no status here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// Queued, never admitted.
    Waiting,
    /// Admitted: holds a row and blocks, listed in `running`.
    Running,
    /// Queued again after losing its row and blocks (recompute preemption).
    Preempted,
}

/// "No row": the request is not running.
pub(super) const NO_ROW: u32 = u32::MAX;

/// The sampling-relevant stop data, checked once per appended token.
#[derive(Debug, Clone)]
pub(super) struct StopParams {
    pub max_tokens: u32,
    pub min_tokens: u32,
    pub eos: SmallVec<[u32; 2]>,
    pub stop: SmallVec<[u32; 4]>,
    pub ignore_eos: bool,
}

impl StopParams {
    /// vLLM's `check_stop` order (scheduler.md §3): EOS (unless `ignore_eos`), then stop ids, then
    /// length (`max_tokens` or `max_model_len`). `min_tokens` defers EOS and stop ids only: a
    /// length-capped request stops whatever `min_tokens` says.
    ///
    /// `num_output` counts the output tokens including `token`; `num_tokens` is the sequence length.
    #[inline]
    pub fn check(
        &self,
        token: u32,
        num_output: u32,
        num_tokens: u32,
        max_model_len: u32,
    ) -> Option<FinishReason> {
        if num_output >= self.min_tokens {
            if !self.ignore_eos && self.eos.contains(&token) {
                return Some(FinishReason::Stop);
            }
            if self.stop.contains(&token) {
                return Some(FinishReason::StopToken);
            }
        }
        if num_output >= self.max_tokens || num_tokens >= max_model_len {
            return Some(FinishReason::Length);
        }
        None
    }
}

/// One live request.
#[derive(Debug)]
pub(super) struct Req {
    pub id: u64,
    /// Arrival counter, unique over the scheduler's life: the FCFS/priority tie-break, and the
    /// generation that tells a step's row apart from a later request reusing the same id and slot.
    pub seq_no: u64,
    /// Prompt followed by the output tokens.
    pub tokens: Vec<u32>,
    pub num_prompt: u32,
    pub num_computed: u32,
    pub status: Status,
    /// Persistent row while running, else [`NO_ROW`].
    pub row: u32,
    /// KV state: the block tables (empty unless running) and the hash chain, kept across
    /// preemptions. `Some` while the request is live (taken when it is released).
    pub kv: Option<SeqKv>,
    pub stop: StopParams,
    pub priority: i32,
    pub prompt_logprobs: bool,
    pub after: Option<u64>,
    /// Steps in which this request failed admission and later requests were tried past it.
    pub skips: u32,
    /// The step of the last counted skip (a skip counts once per step).
    pub last_skip_step: u64,
    pub num_preemptions: u32,
    /// Stopped in the `update` being applied; released at its end.
    pub finishing: bool,
    /// Multimodal placeholder runs `(offset, length)` of the prompt (encoder budget).
    pub mm: MmRanges,
}

impl Req {
    pub fn new(r: NewRequest, seq_no: u64, kv: SeqKv, mm: MmRanges) -> Self {
        let num_prompt = r.prompt.len() as u32;
        Req {
            id: r.id,
            seq_no,
            tokens: r.prompt,
            num_prompt,
            num_computed: 0,
            status: Status::Waiting,
            row: NO_ROW,
            kv: Some(kv),
            stop: StopParams {
                max_tokens: r.max_tokens,
                min_tokens: r.min_tokens,
                eos: r.eos_token_ids.into_iter().collect(),
                stop: r.stop_token_ids.into_iter().collect(),
                ignore_eos: r.ignore_eos,
            },
            priority: r.priority,
            prompt_logprobs: r.prompt_logprobs,
            after: r.after,
            skips: 0,
            last_skip_step: 0,
            num_preemptions: 0,
            finishing: false,
            mm,
        }
    }

    pub fn num_tokens(&self) -> u32 {
        self.tokens.len() as u32
    }

    pub fn num_output(&self) -> u32 {
        self.num_tokens() - self.num_prompt
    }

    /// Tokens still to compute before the request can sample (1 for a decode).
    pub fn num_uncomputed(&self) -> u32 {
        self.num_tokens() - self.num_computed
    }

    /// Whether the prompt's KV is computed (or scheduled): siblings waiting `after` it may start.
    pub fn prompt_computed(&self) -> bool {
        self.num_computed >= self.num_prompt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(min_tokens: u32, ignore_eos: bool) -> StopParams {
        StopParams {
            max_tokens: 4,
            min_tokens,
            eos: SmallVec::from_slice(&[2]),
            stop: SmallVec::from_slice(&[42]),
            ignore_eos,
        }
    }

    #[test]
    fn eos_then_stop_id_then_length_in_vllm_order() {
        let p = params(0, false);
        assert_eq!(p.check(7, 1, 11, 100), None);
        assert_eq!(p.check(2, 1, 11, 100), Some(FinishReason::Stop));
        assert_eq!(p.check(42, 1, 11, 100), Some(FinishReason::StopToken));
        // EOS on the max_tokens-th token reports EOS, not length.
        assert_eq!(p.check(2, 4, 14, 100), Some(FinishReason::Stop));
        assert_eq!(p.check(7, 4, 14, 100), Some(FinishReason::Length));
        assert_eq!(p.check(7, 1, 100, 100), Some(FinishReason::Length));
    }

    #[test]
    fn min_tokens_defers_eos_and_stop_ids_but_not_length() {
        let p = params(3, false);
        assert_eq!(p.check(2, 2, 12, 100), None);
        assert_eq!(p.check(42, 2, 12, 100), None);
        assert_eq!(p.check(2, 3, 13, 100), Some(FinishReason::Stop));
        // Reaching max_model_len below min_tokens still stops.
        assert_eq!(p.check(7, 2, 100, 100), Some(FinishReason::Length));
        let p = StopParams {
            max_tokens: 2,
            ..params(3, false)
        };
        assert_eq!(p.check(7, 2, 12, 100), Some(FinishReason::Length));
    }

    #[test]
    fn ignore_eos_suppresses_eos_but_not_stop_ids() {
        let p = params(0, true);
        assert_eq!(p.check(2, 1, 11, 100), None);
        assert_eq!(p.check(42, 1, 11, 100), Some(FinishReason::StopToken));
    }
}
