//! Seeded randomized invariant test (TGI-style loop): a miniature scheduler drives the block manager
//! through admission (lookup + allocate), chunked prefill, decode, preemption, abort, finish,
//! multi-turn follow-ups, explicit eviction and cache resets, over tiny vocabularies that force
//! sharing, on several pool / block / sub-block / window configurations. It also executes every
//! step against a shadow KV store (per block and slot: the identity of the token prefix whose KV is
//! there), running copy ops before the step's writes like the executor does.
//!
//! After every manager call: `check_invariants` (ref counts = holders, free <=> unreferenced, index
//! map = block lists = the requests' hash chains, LRU links) plus the shadow checks: every index
//! entry points at a block whose slots really hold that sub-block's KV; no write lands in an indexed
//! slot; the events replayed as a set equal the index; budgets (sliding-window cap) hold; a
//! failed allocation changes nothing. After every step: every live request reads exactly its own
//! prefix's KV from every non-null table entry.
//!
//! `YOCO_KV_FUZZ_OPS` overrides the number of manager calls (default 1,000,000 in optimized builds,
//! 100,000 unoptimized; split over the configurations); `YOCO_KV_FUZZ_SEED` the seed.

mod kv_common;

use std::collections::{HashMap, HashSet};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use yoco_core::kv::*;

struct Cfg {
    layers: Vec<LayerKind>,
    bs: u32,
    sbs: u32,
    pools: Vec<u32>,
    max_batched: u32,
    vocab: u32,
    caching: bool,
    events: bool,
}

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

struct Harness<'a> {
    cfg: &'a Cfg,
    m: KvManager,
    rng: SmallRng,
    ops: u64,
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
    stats: [u64; 8],
}

const S_ADMIT: usize = 0;
const S_HIT: usize = 1;
const S_PREEMPT: usize = 2;
const S_FINISH: usize = 3;
const S_RESET: usize = 4;
const S_NOSPACE: usize = 5;
const S_STEPS: usize = 6;

impl<'a> Harness<'a> {
    fn new(cfg: &'a Cfg, seed: u64) -> Self {
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

    fn ng(&self) -> usize {
        self.cfg.pools.len()
    }

    fn windows(&self) -> Vec<Option<usize>> {
        self.m
            .groups()
            .iter()
            .map(|g| g.kind.window().map(|w| w as usize))
            .collect()
    }

    /// After every manager call.
    fn check(&mut self) {
        self.ops += 1;
        let seqs: Vec<&SeqKv> = self.running.iter().filter_map(|r| r.kv.as_ref()).collect();
        if let Err(e) = self.m.check_invariants(seqs) {
            panic!("invariant violated after op {}: {e}", self.ops);
        }
        let (bs, sbs) = (self.cfg.bs as usize, self.cfg.sbs as usize);
        for g in 0..self.ng() {
            for b in 1..self.cfg.pools[g] {
                for (i, h) in self.m.indexed_hashes(g, b).iter().enumerate() {
                    let (want, _) = self.content.get(h).unwrap_or_else(|| {
                        panic!("op {}: indexed hash {h:?} never hashed", self.ops)
                    });
                    let have = &self.slots[g][b as usize][i * sbs..(i + 1) * sbs];
                    assert_eq!(
                        have,
                        &want[..],
                        "op {}: group {g} block {b} sub-block {i} does not hold its indexed KV",
                        self.ops
                    );
                }
            }
        }
        let _ = bs;
        // events replayed as a set == the index
        for e in self.m.take_events() {
            match e {
                KvEvent::Stored {
                    group,
                    parent: _,
                    hashes,
                    token_ids,
                    block_size,
                } => {
                    assert_eq!(block_size, self.cfg.sbs);
                    assert_eq!(token_ids.len(), hashes.len() * sbs);
                    for (i, h) in hashes.iter().enumerate() {
                        assert!(self.stored[group as usize].insert(*h), "Stored twice: {h}");
                        assert_eq!(
                            &self.by_u64[h][..],
                            &token_ids[i * sbs..(i + 1) * sbs],
                            "Stored token ids"
                        );
                    }
                }
                KvEvent::Removed { group, hashes } => {
                    for h in hashes {
                        assert!(
                            self.stored[group as usize].remove(&h),
                            "Removed a hash never stored: {h}"
                        );
                    }
                }
                KvEvent::AllCleared => self.stored.iter_mut().for_each(|s| s.clear()),
            }
        }
        if self.cfg.events {
            for g in 0..self.ng() {
                assert_eq!(
                    self.stored[g].len(),
                    self.m.num_indexed_hashes(g),
                    "op {}: events disagree with the index",
                    self.ops
                );
            }
        }
        // budgets: a sliding group never holds more than the window cap per request
        for (g, w) in self.windows().into_iter().enumerate() {
            if let Some(w) = w {
                let cap =
                    (w - 1 + self.cfg.max_batched as usize).div_ceil(self.cfg.bs as usize) + 1;
                for r in &self.running {
                    if let Some(kv) = &r.kv {
                        assert!(
                            kv.num_live_blocks(g) <= cap,
                            "sliding group {g} holds {} > {cap} blocks",
                            kv.num_live_blocks(g)
                        );
                    }
                }
            }
        }
    }

    fn register_hashes(&mut self, r: &Req) {
        let sbs = self.cfg.sbs as usize;
        let Some(kv) = &r.kv else { return };
        for (i, h) in kv.sub_block_hashes().iter().enumerate() {
            let ids = r.ids[i * sbs..(i + 1) * sbs].to_vec();
            let toks = r.tokens[i * sbs..(i + 1) * sbs].to_vec();
            match self.content.get(h) {
                Some((have, _)) => assert_eq!(have, &ids, "equal hashes for different prefixes"),
                None => {
                    self.by_u64.insert(h.to_u64(), toks.clone());
                    self.content.insert(*h, (ids, toks));
                }
            }
        }
    }

    fn snapshot(&self) -> Vec<(Vec<u32>, Vec<u32>)> {
        (0..self.ng())
            .map(|g| {
                (
                    self.m.free_block_ids(g),
                    (0..self.cfg.pools[g])
                        .map(|b| self.m.ref_count(g, b))
                        .collect(),
                )
            })
            .collect()
    }

    fn assert_unchanged_on_failure(&self, before: &[(Vec<u32>, Vec<u32>)]) {
        let after = self.snapshot();
        for (g, w) in self.windows().into_iter().enumerate() {
            if w.is_none() {
                assert_eq!(before[g], after[g], "a failed allocation changed group {g}");
            } else {
                // sliding groups may release out-of-window blocks even when the allocation fails
                assert!(after[g].0.len() >= before[g].0.len());
            }
        }
    }

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

    fn add_request(&mut self) {
        let (mut t, extras, ns, skip) = self.random_prompt();
        let max = self.max_len();
        t.truncate(max - 1);
        let out = self.rng.random_range(1..=self.cfg.bs as usize * 2);
        let target = (t.len() + out).min(max);
        self.waiting.push(Req::new(t, target, extras, ns, skip));
    }

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
    fn step(&mut self) {
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
        let ops = self.m.take_copy_ops();
        self.check();
        let sbs = self.cfg.sbs as usize;
        for op in &ops {
            let g = op.group as usize;
            assert!(
                self.m.ref_count(g, op.src) >= 1,
                "copy source {} not pinned",
                op.src
            );
            assert!(
                self.m.indexed_hashes(g, op.src).len() * sbs >= op.num_tokens as usize,
                "copy source lost its sub-blocks"
            );
            let src = self.slots[g][op.src as usize][..op.num_tokens as usize].to_vec();
            self.slots[g][op.dst as usize][..op.num_tokens as usize].copy_from_slice(&src);
        }
        let bs = self.cfg.bs as usize;
        let windows = self.windows();
        for &(ri, start, n) in &scheduled {
            let r = &self.running[ri];
            let kv = r.kv.as_ref().unwrap();
            // everything the chunk attends to is backed by a real block holding the right KV
            for (g, w) in windows.iter().enumerate() {
                let lo = w.map_or(0, |w| start.saturating_sub(w - 1));
                for p in lo..start {
                    let b = kv.table(g)[p / bs];
                    assert_ne!(b, NULL_BLOCK, "group {g}: position {p} is in the window of a chunk at {start} but unmapped");
                    // (copies already ran: they precede the forward)
                    assert_eq!(
                        self.slots[g][b as usize][p % bs],
                        r.ids[p],
                        "group {g}: chunk at {start} attends to foreign KV at {p}"
                    );
                }
            }
            for p in start..start + n {
                for g in 0..self.ng() {
                    let b = kv.table(g)[p / bs];
                    assert_ne!(b, NULL_BLOCK, "a computed position has no block");
                    let indexed = self.m.indexed_hashes(g, b).len() * sbs;
                    assert!(
                        p % bs >= indexed,
                        "write into indexed slot {} of block {b}",
                        p % bs
                    );
                    self.slots[g][b as usize][p % bs] = r.ids[p];
                }
            }
        }
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
        for ri in 0..self.running.len() {
            // register the chain of every running request (hashes may have grown)
            let r = &self.running[ri];
            let kv = r.kv.as_ref().unwrap();
            let sbs = self.cfg.sbs as usize;
            for (i, h) in kv.sub_block_hashes().iter().enumerate() {
                if !self.content.contains_key(h) {
                    self.by_u64
                        .insert(h.to_u64(), r.tokens[i * sbs..(i + 1) * sbs].to_vec());
                    self.content.insert(
                        *h,
                        (
                            r.ids[i * sbs..(i + 1) * sbs].to_vec(),
                            r.tokens[i * sbs..(i + 1) * sbs].to_vec(),
                        ),
                    );
                }
            }
        }
        self.m.release_copy_sources();
        self.check();
        // every live request reads its own prefix's KV wherever its table points
        for r in &self.running {
            let kv = r.kv.as_ref().unwrap();
            for g in 0..self.ng() {
                for p in 0..r.num_computed {
                    let b = kv.table(g)[p / bs];
                    if b != NULL_BLOCK {
                        assert_eq!(
                            self.slots[g][b as usize][p % bs],
                            r.ids[p],
                            "group {g}: position {p} reads foreign KV from block {b}"
                        );
                    }
                }
            }
        }
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

    fn run(&mut self, ops: u64) {
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

fn configs() -> Vec<Cfg> {
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

#[test]
fn random_operations_keep_every_invariant_and_every_kv_read_correct() {
    // 1,000,000 calls when optimized (`--profile ci` / `--release`: a few seconds); an unoptimized
    // `cargo test` runs a tenth of that so iterating stays quick (`yoco_optimized` comes from build.rs).
    let default_ops = if cfg!(yoco_optimized) {
        1_000_000
    } else {
        100_000
    };
    let total: u64 = std::env::var("YOCO_KV_FUZZ_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_ops);
    let seed: u64 = std::env::var("YOCO_KV_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let cfgs = configs();
    let per = total / cfgs.len() as u64;
    let mut all = [0u64; 8];
    for (i, cfg) in cfgs.iter().enumerate() {
        let mut h = Harness::new(cfg, seed.wrapping_add(i as u64));
        h.run(per);
        for (a, s) in all.iter_mut().zip(h.stats) {
            *a += s;
        }
        let met = h.m.metrics();
        if cfg.caching {
            assert!(
                met.prefix_hit_tokens > 0,
                "config {i}: the workload must produce hits"
            );
        }
        eprintln!(
            "config {i}: {} ops, {} steps, {} admissions, {} hit tokens, {} preemptions, {} no-space, {} resets, copies {} ({} tokens), adoptions {}",
            h.ops, h.stats[S_STEPS], h.stats[S_ADMIT], h.stats[S_HIT], h.stats[S_PREEMPT], h.stats[S_NOSPACE], h.stats[S_RESET], met.copies, met.copied_tokens, met.adoptions
        );
    }
    assert!(all[S_PREEMPT] > 0 && all[S_ADMIT] > 0 && all[S_RESET] > 0);
}
