//! [`Engines`]: N step loops behind one front end (`--data-parallel-size N`), each request sent to
//! one loop, chosen by prefix overlap and load.
//!
//! Prefix overlap is estimated on the front end, as SGLang's router does, without asking the loops:
//! prompts are cut into 16-token chunks whose chained hashes map to the loop that last received them
//! (a bounded table). The loop holding the longest run of a new prompt's leading chunks wins if its
//! load (unfinished requests) is within a slack of the least loaded loop's; otherwise the least
//! loaded loop takes it. Loops whose step loop stopped are skipped.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use rustc_hash::FxHashMap;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::handle::{EngineHandle, SubmitError};
use crate::output::Event;
use crate::params::GenParams;

/// Tokens per chunk of the front end's prefix table.
const CHUNK: usize = 16;
/// Leading chunks of a prompt that are hashed (the first 1,024 tokens).
const MAX_CHUNKS: usize = 64;
/// Entries the prefix table holds before it is cleared (a coarse LRU: routing degrades to load
/// balancing for a moment, never to a wrong answer).
const TABLE_CAP: usize = 1 << 18;

/// The loops of one server.
pub struct Engines {
    loops: Vec<EngineHandle>,
    submitted: Vec<AtomicU64>,
    table: Mutex<FxHashMap<u64, u32>>,
    rr: AtomicUsize,
}

impl Engines {
    /// Loops to dispatch over (at least one).
    pub fn new(loops: Vec<EngineHandle>) -> Self {
        assert!(!loops.is_empty(), "at least one step loop");
        let submitted = loops.iter().map(|_| AtomicU64::new(0)).collect();
        Self {
            loops,
            submitted,
            table: Mutex::new(FxHashMap::default()),
            rr: AtomicUsize::new(0),
        }
    }

    /// The loops, in index order (the `engine` label of their metrics).
    pub fn loops(&self) -> &[EngineHandle] {
        &self.loops
    }

    /// Every loop has stopped.
    pub fn all_dead(&self) -> bool {
        self.loops.iter().all(|l| l.stats().dead.load(Relaxed))
    }

    /// Why the first loop a failing executor stopped did stop (None: none did).
    pub fn dead_error(&self) -> Option<String> {
        self.loops
            .iter()
            .find_map(|l| l.stats().dead_error.lock().ok().and_then(|e| e.clone()))
    }

    /// Resolves once every loop has stopped (polled: a loop dies at most once).
    pub async fn until_all_dead(&self) {
        while !self.all_dead() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Unfinished requests of loop `i` (submitted and not yet ended).
    pub fn load(&self, i: usize) -> u64 {
        let done: u64 = self.loops[i]
            .stats()
            .finished
            .iter()
            .map(|c| c.load(Relaxed))
            .sum();
        self.submitted[i].load(Relaxed).saturating_sub(done)
    }

    /// Submits to the chosen loop: `(loop index, request id in that loop, events)`.
    pub fn submit(
        &self,
        params: GenParams,
    ) -> Result<(usize, u64, UnboundedReceiver<Event>), SubmitError> {
        let hashes = chunk_hashes(&params.prompt);
        let i = self.choose(&hashes).ok_or(SubmitError::Closed)?;
        self.submitted[i].fetch_add(1, Relaxed);
        let (id, rx) = match self.loops[i].submit(params) {
            Ok(x) => x,
            Err(e) => {
                self.submitted[i].fetch_sub(1, Relaxed);
                return Err(e);
            }
        };
        let mut t = self.table.lock().unwrap();
        if t.len() + hashes.len() > TABLE_CAP {
            t.clear();
        }
        for h in hashes {
            t.insert(h, i as u32);
        }
        Ok((i, id, rx))
    }

    /// Submits another completion of the prompt `first` (`(loop index, request id)` from
    /// [`Engines::submit`]) runs: to the same loop, admitted once `first` has computed the prompt,
    /// so its cached blocks serve every completion (an `n > 1` request prefills its prompt once).
    pub fn submit_sibling(
        &self,
        first: (usize, u64),
        mut params: GenParams,
    ) -> Result<(usize, u64, UnboundedReceiver<Event>), SubmitError> {
        let i = first.0;
        params.after = Some(first.1);
        self.submitted[i].fetch_add(1, Relaxed);
        match self.loops[i].submit(params) {
            Ok((id, rx)) => Ok((i, id, rx)),
            Err(e) => {
                self.submitted[i].fetch_sub(1, Relaxed);
                Err(e)
            }
        }
    }

    fn choose(&self, hashes: &[u64]) -> Option<usize> {
        let alive: Vec<usize> = (0..self.loops.len())
            .filter(|&i| !self.loops[i].stats().dead.load(Relaxed))
            .collect();
        if alive.is_empty() {
            return None;
        }
        if alive.len() == 1 {
            return Some(alive[0]);
        }
        let loads: Vec<u64> = alive.iter().map(|&i| self.load(i)).collect();
        let min = *loads.iter().min().unwrap();
        // The loop that received the longest run of this prompt's leading chunks.
        let owner = {
            let t = self.table.lock().unwrap();
            let mut owner = None;
            for h in hashes {
                match t.get(h) {
                    Some(&i) => owner = Some(i as usize),
                    None => break,
                }
            }
            owner
        };
        if let Some(o) = owner {
            if let Some(k) = alive.iter().position(|&i| i == o) {
                let slack = (min / 4).max(4);
                if loads[k] <= min + slack {
                    return Some(o);
                }
            }
        }
        // Least loaded; ties in turn.
        let start = self.rr.fetch_add(1, Relaxed);
        let n = alive.len();
        (0..n)
            .map(|j| (start + j) % n)
            .min_by_key(|&k| loads[k])
            .map(|k| alive[k])
    }

    /// Aborts request `id` of loop `i`.
    pub fn abort(&self, i: usize, id: u64) {
        self.loops[i].abort(id);
    }

    /// Stops every loop.
    pub fn shutdown(&self) {
        for l in &self.loops {
            l.shutdown();
        }
    }
}

impl From<EngineHandle> for Engines {
    fn from(h: EngineHandle) -> Self {
        Engines::new(vec![h])
    }
}

/// Chained hashes of the prompt's whole leading chunks (a chunk's hash covers everything before it).
fn chunk_hashes(prompt: &[u32]) -> Vec<u64> {
    let mut out = Vec::with_capacity((prompt.len() / CHUNK).min(MAX_CHUNKS));
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15;
    for c in prompt.chunks_exact(CHUNK).take(MAX_CHUNKS) {
        for &t in c {
            h = yoco_core::mock::mix64(h ^ t as u64);
        }
        out.push(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::chunk_hashes;

    #[test]
    fn chunk_hashes_chain_the_prefix() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[20] = 999;
        let (ha, hb) = (chunk_hashes(&a), chunk_hashes(&b));
        assert_eq!(ha.len(), 2, "whole chunks only");
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        let mut c = a.clone();
        c[3] = 7;
        assert_ne!(
            chunk_hashes(&c)[1],
            ha[1],
            "a later chunk's hash covers the earlier ones"
        );
    }
}
