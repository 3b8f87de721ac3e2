//! The randomized KV invariant harness behind `kv_random_invariants.rs`: a miniature scheduler
//! that drives a [`KvManager`] through admission, chunked prefill, decode, preemption, abort,
//! finish, multi-turn follow-ups, explicit eviction and cache resets, and a shadow KV store that
//! executes every step (per block and slot: the identity of the token prefix whose KV is there).
//!
//! Files: this one (configurations, requests, the harness's state and its operation mix),
//! `schedule.rs` (the request generator and one engine step), `shadow.rs` (the checks after every
//! manager call and the shadow execution of a step).

mod schedule;
mod shadow;

use std::collections::{HashMap, HashSet};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use yoco_core::kv::*;

/// One pool / block / sub-block / window configuration the harness runs on.
pub struct Cfg {
    pub layers: Vec<LayerKind>,
    pub bs: u32,
    pub sbs: u32,
    pub pools: Vec<u32>,
    pub max_batched: u32,
    pub vocab: u32,
    pub caching: bool,
    pub events: bool,
}

/// A request of the miniature scheduler, with the identity of the KV each of its positions must
/// have.
struct Req {
    tokens: Vec<u32>,
    /// `ids[p]`: identity of the KV of position p (its whole prefix and namespace).
    ids: Vec<u64>,
    target_len: usize,
    extras: HashExtras,
    ns: u64,
    skip: bool,
    kv: Option<SeqKv>,
    num_computed: usize,
}

/// Folds `x` into the identity `h` (the shadow store's stand-in for "KV of this prefix").
fn fnv(h: u64, x: u64) -> u64 {
    (h ^ x).wrapping_mul(0x100000001b3).rotate_left(17) ^ 0x9e3779b97f4a7c15
}

impl Req {
    fn new(tokens: Vec<u32>, target_len: usize, extras: HashExtras, ns: u64, skip: bool) -> Self {
        let mut r = Req {
            ids: Vec::new(),
            tokens: Vec::new(),
            target_len,
            extras,
            ns,
            skip,
            kv: None,
            num_computed: 0,
        };
        for t in tokens {
            r.push(t);
        }
        r
    }
    fn push(&mut self, t: u32) {
        let prev = self.ids.last().copied().unwrap_or(self.ns.wrapping_add(1));
        self.ids.push(fnv(prev, t as u64 + 1));
        self.tokens.push(t);
    }
}

/// The block manager under test, the miniature scheduler's requests, and the shadow KV store.
pub struct Harness<'a> {
    cfg: &'a Cfg,
    /// The manager under test.
    pub m: KvManager,
    rng: SmallRng,
    /// Manager calls so far (each one followed by `check`).
    pub ops: u64,
    /// `slots[g][block][slot]`: identity of the KV there (0: never written).
    slots: Vec<Vec<Vec<u64>>>,
    /// sub-block hash -> (identities of its slots, its tokens)
    content: HashMap<BlockHash, (Vec<u64>, Vec<u32>)>,
    by_u64: HashMap<u64, Vec<u32>>,
    /// replay of the events: hashes currently stored, per group
    stored: Vec<HashSet<u64>>,
    running: Vec<Req>,
    waiting: Vec<Req>,
    finished: Vec<Vec<u32>>,
    /// Event counts, indexed by the `S_*` constants.
    pub stats: [u64; 8],
}

pub const S_ADMIT: usize = 0;
pub const S_HIT: usize = 1;
pub const S_PREEMPT: usize = 2;
pub const S_FINISH: usize = 3;
pub const S_RESET: usize = 4;
pub const S_NOSPACE: usize = 5;
pub const S_STEPS: usize = 6;

impl<'a> Harness<'a> {
    /// A fresh manager for `cfg` and an empty shadow store; `seed` fixes every random choice.
    pub fn new(cfg: &'a Cfg, seed: u64) -> Self {
        let mut c = KvConfig::new(cfg.bs, cfg.pools.clone());
        c.sub_block_size = cfg.sbs;
        c.enable_prefix_caching = cfg.caching;
        c.enable_events = cfg.events;
        c.max_num_batched_tokens = cfg.max_batched;
        let m = KvManager::new(kv_groups(&cfg.layers).unwrap(), c).unwrap();
        let slots = cfg
            .pools
            .iter()
            .map(|&n| vec![vec![0u64; cfg.bs as usize]; n as usize])
            .collect();
        Harness {
            cfg,
            m,
            rng: SmallRng::seed_from_u64(seed),
            ops: 0,
            slots,
            content: HashMap::new(),
            by_u64: HashMap::new(),
            stored: vec![HashSet::new(); cfg.pools.len()],
            running: Vec::new(),
            waiting: Vec::new(),
            finished: Vec::new(),
            stats: [0; 8],
        }
    }

    /// Number of KV groups.
    fn ng(&self) -> usize {
        self.cfg.pools.len()
    }

    /// Sliding window per group (`None`: full attention).
    fn windows(&self) -> Vec<Option<usize>> {
        self.m
            .groups()
            .iter()
            .map(|g| g.kind.window().map(|w| w as usize))
            .collect()
    }

    /// Runs random operations (requests arriving, steps, cache resets, explicit evictions) until
    /// `ops` manager calls were checked, then drains every request and asserts nothing leaked.
    pub fn run(&mut self, ops: u64) {
        while self.ops < ops {
            let x = self.rng.random_range(0..100u32);
            if x < 30 || self.waiting.len() + self.running.len() < 2 {
                self.add_request();
            } else if x < 31 {
                let expect = self.running.is_empty();
                let ok = self.m.reset_prefix_cache();
                self.check();
                assert_eq!(ok, expect, "reset succeeds iff nothing is referenced");
                self.stats[S_RESET] += ok as u64;
            } else if x < 32 {
                // preempt everything, then the reset must succeed
                while let Some(mut r) = self.running.pop() {
                    self.m.free(r.kv.take().unwrap());
                    self.check();
                    r.num_computed = 0;
                    self.waiting.push(r);
                }
                assert!(self.m.reset_prefix_cache());
                self.check();
                self.stats[S_RESET] += 1;
            } else if x < 34 {
                let g = self.rng.random_range(0..self.ng());
                let b = self.rng.random_range(1..self.cfg.pools[g]);
                self.m.evict_cached_blocks(g, &[b]);
                self.check();
            } else {
                self.step();
            }
            if self.waiting.len() > 12 {
                self.waiting.truncate(12);
            }
        }
        // drain: everything finishes, nothing leaks
        while let Some(mut r) = self.running.pop() {
            self.m.free(r.kv.take().unwrap());
            self.check();
        }
        for g in 0..self.ng() {
            assert_eq!(
                self.m.num_free_blocks(g),
                self.cfg.pools[g] - 1,
                "leaked blocks in group {g}"
            );
        }
        let _ = &self.cfg.layers;
    }
}

/// The configurations the test splits its operations over: full-only with sub-blocks smaller
/// than blocks, hybrid sliding + full with a KV-sharing layer, windows shorter and longer than a
/// block, caching off, events on and off.
pub fn configs() -> Vec<Cfg> {
    use LayerKind::*;
    vec![
        Cfg {
            layers: vec![Full],
            bs: 4,
            sbs: 4,
            pools: vec![16],
            max_batched: 8,
            vocab: 2,
            caching: true,
            events: true,
        },
        Cfg {
            layers: vec![Full],
            bs: 8,
            sbs: 2,
            pools: vec![12],
            max_batched: 8,
            vocab: 3,
            caching: true,
            events: false,
        },
        Cfg {
            layers: vec![Full, Sliding { window: 5 }, SharesKv { donor: 1 }],
            bs: 4,
            sbs: 2,
            pools: vec![24, 10],
            max_batched: 6,
            vocab: 2,
            caching: true,
            events: true,
        },
        Cfg {
            layers: vec![Sliding { window: 3 }, Full],
            bs: 2,
            sbs: 1,
            pools: vec![12, 36],
            max_batched: 4,
            vocab: 2,
            caching: true,
            events: false,
        },
        Cfg {
            layers: vec![Full, Sliding { window: 16 }],
            bs: 8,
            sbs: 4,
            pools: vec![12, 10],
            max_batched: 8,
            vocab: 3,
            caching: true,
            events: true,
        },
        Cfg {
            layers: vec![Full, Sliding { window: 4 }],
            bs: 4,
            sbs: 4,
            pools: vec![16, 8],
            max_batched: 8,
            vocab: 2,
            caching: false,
            events: false,
        },
    ]
}
