//! A deliberately simple plan builder, independent of `yoco-core`'s scheduler: the caller says which
//! requests run how many tokens each step; it allocates blocks from a shuffled free list (never
//! freeing, so every group keeps every block), shares full prefix blocks and copies a partial one
//! on request, pads to capture sizes, and fills every field of a [`StepPlan`] by the contract.
//!
//! Uses: the oracle's own tests (so a mutation test proves the *oracle* catches the bug, whatever
//! state the real scheduler is in), and the mixed batches of the golden fixtures.

use std::collections::HashMap;

use yoco_core::kv::{CopyOp, NULL_BLOCK};
use yoco_core::sched::StepPlan;

use crate::bail;
use crate::error::Result;
use crate::plan_view::PlanGeometry;
use crate::rng::Rng;
use crate::tables::TableMirror;
use crate::truth::Truth;

#[derive(Debug, Clone)]
struct ToySeq {
    row: usize,
    computed: usize,
    /// Per group.
    blocks: Vec<Vec<u32>>,
    admitted: bool,
}

/// The independent plan builder (see the module docs): `ToyPlanner::new`, then per step say
/// which requests run how many tokens and take the [`StepPlan`].
pub struct ToyPlanner {
    /// Memory and table shape the plans address.
    pub geo: PlanGeometry,
    free: Vec<Vec<u32>>,
    tables: Vec<Vec<i32>>,
    seqs: HashMap<u64, ToySeq>,
    pending_copies: Vec<CopyOp>,
    dirty: Vec<i32>,
    step: u64,
    /// Pad the token count up to the next of these (empty: no padding).
    pub token_capture_sizes: Vec<u32>,
    /// Pad the cross-decoder row count up to the next of these (empty: no padding).
    pub cross_capture_sizes: Vec<u32>,
}

impl ToyPlanner {
    /// A planner over `geo` whose free lists are shuffled by `seed` (so block ids are arbitrary,
    /// not ascending), with no capture sizes.
    pub fn new(geo: PlanGeometry, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let free = geo
            .num_blocks
            .iter()
            .map(|&n| {
                let mut ids: Vec<u32> = (1..n as u32).collect();
                rng.shuffle(&mut ids);
                ids
            })
            .collect();
        let tables = vec![
            vec![NULL_BLOCK as i32; geo.max_num_seqs * geo.max_blocks_per_seq];
            geo.num_blocks.len()
        ];
        ToyPlanner {
            geo,
            free,
            tables,
            seqs: HashMap::new(),
            pending_copies: Vec::new(),
            dirty: Vec::new(),
            step: 0,
            token_capture_sizes: vec![],
            cross_capture_sizes: vec![],
        }
    }

    /// The persistent tables (what `Scheduler::block_table` returns).
    pub fn block_table(&self, g: usize) -> &[i32] {
        &self.tables[g]
    }

    /// A mirror with every row uploaded.
    pub fn mirror(&self) -> TableMirror {
        TableMirror::from_tables(self.geo.max_blocks_per_seq, self.tables.clone())
    }

    fn alloc(&mut self, g: usize) -> Result<u32> {
        match self.free[g].pop() {
            Some(b) => Ok(b),
            None => bail!("toy planner: group {g} is out of blocks"),
        }
    }

    fn set_table(&mut self, id: u64) {
        let s = &self.seqs[&id];
        let m = self.geo.max_blocks_per_seq;
        for (g, blocks) in s.blocks.iter().enumerate() {
            for (i, &b) in blocks.iter().enumerate() {
                self.tables[g][s.row * m + i] = b as i32;
            }
        }
        self.dirty.push(s.row as i32);
    }

    /// Starts a request in block-table row `row` with nothing cached.
    pub fn admit(&mut self, id: u64, row: usize) {
        let g = self.geo.num_blocks.len();
        self.seqs.insert(
            id,
            ToySeq {
                row,
                computed: 0,
                blocks: vec![Vec::new(); g],
                admitted: false,
            },
        );
    }

    /// Starts `id` in `row` reusing the first `num_tokens` tokens of `from`'s KV: full blocks are
    /// shared, a trailing partial block is copied into a fresh block (copy-on-match).
    pub fn admit_sharing(
        &mut self,
        id: u64,
        row: usize,
        from: u64,
        num_tokens: usize,
    ) -> Result<()> {
        let bs = self.geo.block_size;
        let src = self.seqs[&from].clone();
        if num_tokens > src.computed {
            bail!(
                "toy planner: {from} has only {} computed tokens",
                src.computed
            );
        }
        self.admit(id, row);
        for g in 0..self.geo.num_blocks.len() {
            let full = num_tokens / bs;
            let mut blocks: Vec<u32> = src.blocks[g][..full].to_vec();
            if num_tokens % bs != 0 {
                let dst = self.alloc(g)?;
                self.pending_copies.push(CopyOp {
                    group: g as u32,
                    src: src.blocks[g][full],
                    dst,
                    num_tokens: (num_tokens % bs) as u32,
                });
                blocks.push(dst);
            }
            self.seqs.get_mut(&id).unwrap().blocks[g] = blocks;
        }
        self.seqs.get_mut(&id).unwrap().computed = num_tokens;
        self.set_table(id);
        Ok(())
    }

    /// Plans one step: `chunks` lists (request, tokens to schedule) in row order. A request samples
    /// when its chunk reaches its last known token.
    pub fn plan(&mut self, chunks: &[(u64, usize)], truth: &Truth) -> Result<StepPlan> {
        let bs = self.geo.block_size;
        let ng = self.geo.num_blocks.len();
        let mut p = StepPlan {
            step_id: self.step,
            ..Default::default()
        };
        self.step += 1;
        p.query_start_loc.push(0);
        p.cross_query_start_loc.push(0);
        let mut slots: Vec<Vec<i64>> = vec![Vec::new(); ng];
        for (ri, &(id, n)) in chunks.iter().enumerate() {
            let tokens = &truth.get(id)?.tokens;
            let s = self.seqs.get(&id).cloned().expect("admit first");
            let seq_len = s.computed + n;
            if seq_len > tokens.len() {
                bail!(
                    "toy planner: request {id} has {} tokens, asked to reach {seq_len}",
                    tokens.len()
                );
            }
            for g in 0..ng {
                while self.seqs[&id].blocks[g].len() * bs < seq_len {
                    let b = self.alloc(g)?;
                    self.seqs.get_mut(&id).unwrap().blocks[g].push(b);
                }
            }
            self.set_table(id);
            let s = self.seqs.get_mut(&id).unwrap();
            if !s.admitted {
                s.admitted = true;
                p.admitted_ids.push(id);
                p.admitted_rows.push(s.row as i32);
                p.admitted_num_cached.push(s.computed as i32);
            }
            for (pos, &tok) in tokens.iter().enumerate().take(seq_len).skip(s.computed) {
                p.input_ids.push(tok as i32);
                p.positions.push(pos as i64);
                for (g, sl) in slots.iter_mut().enumerate() {
                    sl.push((s.blocks[g][pos / bs] as usize * bs + pos % bs) as i64);
                }
            }
            s.computed = seq_len;
            p.req_ids.push(id);
            p.req_rows.push(s.row as i32);
            p.seq_lens.push(seq_len as i32);
            p.query_start_loc.push(p.input_ids.len() as i32);
            if seq_len == tokens.len() {
                let last = (p.input_ids.len() - 1) as i32;
                p.logits_indices.push(last);
                p.sample_rows.push(ri as i32);
                p.logits_cross_pos.push(p.cross_indices.len() as i32);
                p.cross_indices.push(last);
            }
            p.cross_query_start_loc.push(p.cross_indices.len() as i32);
        }
        p.max_query_len = p
            .query_start_loc
            .windows(2)
            .map(|w| (w[1] - w[0]) as u32)
            .max()
            .unwrap_or(0);
        p.max_seq_len = p.seq_lens.iter().map(|&s| s as u32).max().unwrap_or(0);
        let t = p.input_ids.len();
        let tp = pad_to(t, &self.token_capture_sizes);
        p.num_tokens = t as u32;
        p.num_tokens_padded = tp as u32;
        for i in t..tp {
            p.input_ids.push(0);
            p.positions.push(0);
            for sl in slots.iter_mut() {
                sl.push((i % bs) as i64);
            }
        }
        p.slot_mapping = slots.concat();
        let x = p.cross_indices.len();
        let xp = pad_to(x, &self.cross_capture_sizes);
        p.num_cross = x as u32;
        p.num_cross_padded = xp as u32;
        let fill = p.cross_indices.last().copied().unwrap_or(0);
        p.cross_indices.resize(xp, fill);
        p.kv_copies = std::mem::take(&mut self.pending_copies)
            .iter()
            .flat_map(|c| {
                [
                    c.group as i32,
                    c.src as i32,
                    c.dst as i32,
                    c.num_tokens as i32,
                ]
            })
            .collect();
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        p.dirty_rows = dirty;
        Ok(p)
    }
}

/// `n` rounded up to the first capture size >= n (n itself when none is large enough or none given).
pub fn pad_to(n: usize, sizes: &[u32]) -> usize {
    sizes
        .iter()
        .map(|&s| s as usize)
        .find(|&s| s >= n)
        .unwrap_or(n)
}
