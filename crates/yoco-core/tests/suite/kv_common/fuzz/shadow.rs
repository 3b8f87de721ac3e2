//! The shadow side of the harness: what is checked after every manager call (the manager's own
//! invariants, indexed hashes backed by the right KV, events replayed as a set equal to the index,
//! the sliding-window budget, failed allocations changing nothing), and the shadow execution of a
//! step (copies, writes, and every request reading its own prefix's KV).

use yoco_core::kv::*;

use super::{Harness, Req};

impl Harness<'_> {
    /// After every manager call.
    pub(super) fn check(&mut self) {
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

    pub(super) fn register_hashes(&mut self, r: &Req) {
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

    pub(super) fn snapshot(&self) -> Vec<(Vec<u32>, Vec<u32>)> {
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

    pub(super) fn assert_unchanged_on_failure(&self, before: &[(Vec<u32>, Vec<u32>)]) {
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

    /// Runs the step on the shadow store as the executor would: the copy ops first (their sources
    /// must be pinned and still hold the copied sub-blocks), then every scheduled token's write.
    /// Checks that each chunk attends only to mapped slots holding its own prefix's KV, and that
    /// no write lands in an indexed slot.
    pub(super) fn execute_shadow(&mut self, scheduled: &[(usize, usize, usize)]) {
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
        for &(ri, start, n) in scheduled {
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
    }

    /// Records the chain of every running request (hashes grow as tokens are appended), so
    /// `check` can tell what KV each indexed hash stands for.
    pub(super) fn register_running_chains(&mut self) {
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
    }

    /// After a step: every live request reads its own prefix's KV wherever its table points.
    pub(super) fn assert_reads_own_kv(&self) {
        let bs = self.cfg.bs as usize;
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
    }
}
