//! One matcher per constrained sequence; each step, the packed bitmask of every constrained row.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use llguidance::Matcher;
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::compiler::{CompiledGrammar, Fork};
use crate::{bitmask_words, GrammarError};

/// The threads grammar work runs on: `YOCO_GRAMMAR_THREADS`, else one fewer than the machine's cores
/// (at least one). The engine loop's thread is the step's critical path (it builds the batch while the
/// masks start, and samples after the forward); leaving it a core keeps the masks from delaying it, and
/// on a GPU host the forward's wait is where the masks run.
pub fn grammar_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = std::env::var("YOCO_GRAMMAR_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
            });
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("yoco-grammar-{i}"))
            .build()
            .expect("grammar thread pool")
    })
}

/// A sequence's matcher and whether it has failed (a token the grammar rejects, or a mask over the
/// per-step budget): a failed sequence may only end (EOS), so it stops instead of running unconstrained.
///
/// The matcher is forked from the grammar's template on first use, inside the step's background job
/// (the copy of a warm lexer cache stays off the engine loop and runs in parallel); when the slot is
/// dropped (sequence finished or aborted, wherever the last reference goes) a healthy matcher is
/// donated back to the grammar as its next template.
struct Slot {
    grammar: Arc<CompiledGrammar>,
    fork: Option<Fork>,
    error: Option<String>,
    /// The error was returned by `advance` once (the engine ends the sequence).
    reported: bool,
}

impl Slot {
    fn matcher(&mut self) -> &mut Matcher {
        let g = &self.grammar;
        &mut self.fork.get_or_insert_with(|| g.fork()).matcher
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let (None, Some(f)) = (&self.error, self.fork.take()) {
            self.grammar.donate(f);
        }
    }
}

type SlotRef = Arc<Mutex<Slot>>;

/// The matchers of the constrained sequences, keyed by the core's sequence ids.
///
/// The engine adds a sequence's matcher when it submits it (each of `n` completions has its own),
/// advances every matcher with the tokens the core appended after each step, and removes it when the
/// sequence finishes or is aborted. Preemption keeps a sequence's output tokens (recompute rebuilds
/// only its KV), so its matcher stays where it is; nothing is replayed.
pub struct MatcherTable {
    seqs: FxHashMap<u64, SlotRef>,
    words: usize,
    eos_ids: Vec<u32>,
}

/// The bitmasks of one step's constrained rows.
#[derive(Debug, Default)]
pub struct StepMasks {
    /// Positions (into the step's sampling rows) of the constrained rows, ascending.
    pub rows: Vec<i64>,
    /// `[rows.len(), words]` packed bits, row-major.
    pub bitmask: Vec<i32>,
    pub words: usize,
    /// Sequences whose grammar failed while the job advanced them (see `MatcherTable::advance`).
    pub failed: Vec<u64>,
}

/// Masks being computed on the rayon pool (started before the forward, collected before sampling).
pub struct MaskJob {
    // In a Mutex so a job may sit in a `Sync` holder (a Python object).
    rx: Option<Mutex<mpsc::Receiver<StepMasks>>>,
    ready: Option<StepMasks>,
}

impl MaskJob {
    /// Block until the masks are ready.
    pub fn wait(mut self) -> StepMasks {
        if let Some(m) = self.ready.take() {
            return m;
        }
        self.rx
            .take()
            .and_then(|rx| {
                rx.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .recv()
                    .ok()
            })
            .unwrap_or_default()
    }
}

impl MatcherTable {
    /// Masks over `vocab_size` tokens (the model's logits width); `eos_ids` allowed exactly where the
    /// grammar accepts.
    pub fn new(vocab_size: usize, eos_ids: &[u32]) -> Self {
        Self {
            seqs: FxHashMap::default(),
            words: bitmask_words(vocab_size),
            eos_ids: eos_ids.to_vec(),
        }
    }

    pub fn words(&self) -> usize {
        self.words
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn contains(&self, seq_id: u64) -> bool {
        self.seqs.contains_key(&seq_id)
    }

    /// A fresh matcher of `grammar` for `seq_id`.
    pub fn add(&mut self, seq_id: u64, grammar: &Arc<CompiledGrammar>) -> Result<(), GrammarError> {
        if self.seqs.contains_key(&seq_id) {
            return Err(GrammarError::DuplicateSequence(seq_id));
        }
        let slot = Slot {
            grammar: grammar.clone(),
            fork: None,
            error: None,
            reported: false,
        };
        self.seqs.insert(seq_id, Arc::new(Mutex::new(slot)));
        Ok(())
    }

    /// Drop `seq_id`'s matcher (finished or aborted); false when it had none.
    pub fn remove(&mut self, seq_id: u64) -> bool {
        self.seqs.remove(&seq_id).is_some()
    }

    /// The error that stopped `seq_id`'s matcher, if any.
    pub fn error(&self, seq_id: u64) -> Option<String> {
        self.seqs.get(&seq_id).and_then(|s| lock(s).error.clone())
    }

    /// Whether `seq_id`'s grammar accepts what it has consumed so far (a complete JSON document, ...).
    pub fn is_accepting(&self, seq_id: u64) -> Result<bool, GrammarError> {
        let s = self
            .seqs
            .get(&seq_id)
            .ok_or(GrammarError::UnknownSequence(seq_id))?;
        let mut s = lock(s);
        if s.error.is_some() {
            return Ok(false);
        }
        let m = s.matcher();
        Ok(m.is_stopped() || m.is_accepting().unwrap_or(false))
    }

    /// Start a step's grammar work on the rayon pool and return at once: first advance `adv_ids` by
    /// `adv_tokens` (the previous step's appended tokens, deferred to here so they too run while the
    /// forward does), then compute the masks of the constrained rows among `seq_ids` (this step's
    /// sampling rows). `MaskJob::wait` collects the masks and the failures. With nothing to do,
    /// nothing is spawned.
    pub fn start_masks(&self, seq_ids: &[u64], adv_ids: &[u64], adv_tokens: &[u32]) -> MaskJob {
        let work: Vec<(i64, SlotRef)> = seq_ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| self.seqs.get(id).map(|s| (i as i64, s.clone())))
            .collect();
        let adv: Vec<(u64, u32, SlotRef)> = adv_ids
            .iter()
            .zip(adv_tokens)
            .filter_map(|(id, &t)| self.seqs.get(id).map(|s| (*id, t, s.clone())))
            .collect();
        let words = self.words;
        if work.is_empty() && adv.is_empty() {
            return MaskJob {
                rx: None,
                ready: Some(StepMasks {
                    words,
                    ..StepMasks::default()
                }),
            };
        }
        let eos = self.eos_ids.clone();
        let (tx, rx) = mpsc::sync_channel(1);
        grammar_pool().spawn(move || {
            let failed = advance_all(&adv);
            let mut m = compute(&work, words, &eos);
            m.failed = failed;
            let _ = tx.send(m);
        });
        MaskJob {
            rx: Some(Mutex::new(rx)),
            ready: None,
        }
    }

    /// `start_masks` and `wait` in one call (on the grammar pool, the caller blocked).
    pub fn masks(&self, seq_ids: &[u64]) -> StepMasks {
        let work: Vec<(i64, SlotRef)> = seq_ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| self.seqs.get(id).map(|s| (i as i64, s.clone())))
            .collect();
        grammar_pool().install(|| compute(&work, self.words, &self.eos_ids))
    }

    /// Advance the matchers of `seq_ids` (rows without one are skipped) by the token each was just
    /// given; returns the ids whose grammar failed since the last call: it rejected the token, or the
    /// mask of this step exceeded llguidance's per-step budget (their masks now allow only EOS; the
    /// engine ends them).
    pub fn advance(&self, seq_ids: &[u64], tokens: &[u32]) -> Vec<u64> {
        let work: Vec<(u64, u32, SlotRef)> = seq_ids
            .iter()
            .zip(tokens)
            .filter_map(|(id, &t)| self.seqs.get(id).map(|s| (*id, t, s.clone())))
            .collect();
        grammar_pool().install(|| advance_all(&work))
    }
}

/// Advance each sequence by its token (rows in parallel); the ids whose grammar failed since the
/// last report.
fn advance_all(work: &[(u64, u32, SlotRef)]) -> Vec<u64> {
    let advance_one = |(id, t, s): &(u64, u32, SlotRef)| -> Option<u64> {
        let mut s = lock(s);
        if s.error.is_some() {
            let first = !s.reported;
            s.reported = true;
            return first.then_some(*id);
        }
        let m = s.matcher();
        if m.is_stopped() {
            // The grammar was complete: only EOS was allowed, and the core ends the sequence on it.
            return None;
        }
        match m.consume_token(*t) {
            Ok(()) => None,
            Err(e) => {
                s.error = Some(format!("token {t} rejected by the grammar: {e}"));
                s.reported = true;
                Some(*id)
            }
        }
    };
    if work.len() >= 8 {
        work.par_iter().filter_map(advance_one).collect()
    } else {
        work.iter().filter_map(advance_one).collect()
    }
}

fn lock(s: &SlotRef) -> std::sync::MutexGuard<'_, Slot> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every row's mask, rows in parallel.
fn compute(work: &[(i64, SlotRef)], words: usize, eos: &[u32]) -> StepMasks {
    let mut bitmask = vec![0i32; work.len() * words];
    bitmask
        .par_chunks_mut(words)
        .zip(work.par_iter())
        .for_each(|(out, (_, slot))| {
            fill_row(&mut lock(slot), out, eos);
        });
    StepMasks {
        rows: work.iter().map(|(i, _)| *i).collect(),
        bitmask,
        words,
        failed: vec![],
    }
}

/// One row: the grammar's allowed tokens, then the EOS ids set exactly when the grammar accepts.
fn fill_row(slot: &mut Slot, out: &mut [i32], eos: &[u32]) {
    let accepting = if slot.error.is_some() {
        true
    } else if slot.matcher().is_stopped() {
        true
    } else {
        let m = slot.matcher();
        let failure = match m.compute_mask() {
            Ok(_) if m.is_stopped() && !m.stop_reason().is_ok() => {
                // Stopped while computing the mask (over a per-step budget: the mask is not exact).
                Some(format!("the grammar stopped: {}", m.stop_reason()))
            }
            Ok(mask) => {
                let src = mask.as_slice();
                let n = src.len().min(out.len());
                for (o, &w) in out[..n].iter_mut().zip(src) {
                    *o = w as i32;
                }
                None
            }
            Err(e) => Some(format!("mask computation failed: {e}")),
        };
        match failure {
            None => m.is_accepting().unwrap_or(false),
            Some(e) => {
                slot.error = Some(e);
                out.fill(0);
                true
            }
        }
    };
    for &t in eos {
        let (w, b) = ((t / 32) as usize, t % 32);
        if w < out.len() {
            if accepting {
                out[w] |= 1 << b;
            } else {
                out[w] &= !(1 << b);
            }
        }
    }
}
