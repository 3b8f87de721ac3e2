//! Reads a [`StepPlan`] the way an executor does, and rejects one that an executor could not run
//! unambiguously: wrong lengths, non-monotone prefix sums, padding that writes outside block 0,
//! copies that read what another copy of the same step writes, cross rows outside their request.
//!
//! This is only the *shape* of a plan. Whether its addresses mean the right tokens is the oracle's
//! job ([`crate::oracle`]): it executes the plan on reference memory and compares.

use std::ops::Range;

use yoco_core::kv::{CopyOp, NULL_BLOCK};
use yoco_core::sched::StepPlan;

use crate::bail;
use crate::error::Result;

/// What the executor knows about memory before reading a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanGeometry {
    /// Token slots per block (the same in every group).
    pub block_size: usize,
    /// Blocks per group (block 0 included); its length is the number of groups G.
    pub num_blocks: Vec<usize>,
    /// Rows of the persistent block tables (`req_rows` lie in `0..max_num_seqs`).
    pub max_num_seqs: usize,
    /// Columns of each block-table row.
    pub max_blocks_per_seq: usize,
}

/// One scheduled request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowView {
    /// The request the row schedules.
    pub req_id: u64,
    /// Persistent block-table row.
    pub req_row: usize,
    /// Its token indices in the flat batch.
    pub tokens: Range<usize>,
    /// Context length after this step; its queries are bottom-right aligned against it.
    pub seq_len: usize,
    /// Its cross-decoder rows (indices into `cross_indices`).
    pub cross: Range<usize>,
}

impl RowView {
    /// Tokens scheduled for this row this step.
    pub fn num_scheduled(&self) -> usize {
        self.tokens.len()
    }
    /// Tokens computed before this step (position of the first scheduled token).
    pub fn start_pos(&self) -> usize {
        self.seq_len - self.tokens.len()
    }
}

/// One sampling request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleView {
    /// Index into [`PlanView::rows`] of the row that samples.
    pub row: usize,
    /// `logits_indices[s]`
    pub token: usize,
    /// `logits_cross_pos[s]`
    pub cross_pos: usize,
}

/// A [`StepPlan`] read into per-row, per-sample views, after every shape check passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanView {
    /// Scheduled requests, in plan order.
    pub rows: Vec<RowView>,
    /// Real tokens T.
    pub num_tokens: usize,
    /// Tokens after padding to a capture size (padding writes only to block 0).
    pub num_tokens_padded: usize,
    /// Real cross-decoder rows X (before padding).
    pub num_cross: usize,
    /// The plan's `kv_copies`, decoded; no copy reads a block another copy of the step writes.
    pub copies: Vec<CopyOp>,
    /// Sampling requests, in `sample_rows` order.
    pub samples: Vec<SampleView>,
}

impl PlanView {
    /// Checks the plan's shape against `geo` (lengths, prefix sums, padding, copies, cross rows,
    /// samples, admissions) and returns its view; the error names the step and the first field
    /// that is wrong.
    pub fn parse(plan: &StepPlan, geo: &PlanGeometry) -> Result<PlanView> {
        let step = plan.step_id;
        let r = plan.req_ids.len();
        let g = geo.num_blocks.len();
        let bs = geo.block_size;
        let (t, tp) = (plan.num_tokens as usize, plan.num_tokens_padded as usize);
        macro_rules! want_len {
            ($field:ident, $n:expr) => {
                if plan.$field.len() != $n {
                    bail!(
                        "step {step}: {} has {} entries, want {}",
                        stringify!($field),
                        plan.$field.len(),
                        $n
                    );
                }
            };
        }
        want_len!(req_rows, r);
        want_len!(seq_lens, r);
        want_len!(query_start_loc, r + 1);
        want_len!(cross_query_start_loc, r + 1);
        if t > tp {
            bail!("step {step}: num_tokens {t} > num_tokens_padded {tp}");
        }
        want_len!(input_ids, tp);
        want_len!(positions, tp);
        want_len!(slot_mapping, g * tp);
        let s = plan.logits_indices.len();
        want_len!(sample_rows, s);
        want_len!(logits_cross_pos, s);
        let (x, xp) = (plan.num_cross as usize, plan.num_cross_padded as usize);
        if x > xp {
            bail!("step {step}: num_cross {x} > num_cross_padded {xp}");
        }
        want_len!(cross_indices, xp);
        if plan.kv_copies.len() % 4 != 0 {
            bail!(
                "step {step}: kv_copies has {} entries, not a multiple of 4",
                plan.kv_copies.len()
            );
        }
        want_len!(admitted_rows, plan.admitted_ids.len());
        want_len!(admitted_num_cached, plan.admitted_ids.len());

        // Rows.
        let qsl = &plan.query_start_loc;
        let cqsl = &plan.cross_query_start_loc;
        if qsl[0] != 0 || cqsl[0] != 0 {
            bail!(
                "step {step}: query_start_loc[0] = {}, cross_query_start_loc[0] = {}, want 0",
                qsl[0],
                cqsl[0]
            );
        }
        if qsl[r] as usize != t {
            bail!(
                "step {step}: query_start_loc[{r}] = {} but num_tokens = {t}",
                qsl[r]
            );
        }
        if cqsl[r] as usize != x {
            bail!(
                "step {step}: cross_query_start_loc[{r}] = {} but num_cross = {x}",
                cqsl[r]
            );
        }
        let mut rows = Vec::with_capacity(r);
        let mut seen_rows = vec![false; geo.max_num_seqs];
        for i in 0..r {
            if qsl[i + 1] <= qsl[i] {
                bail!(
                    "step {step}: row {i} (request {}) schedules {} tokens (query_start_loc {:?})",
                    plan.req_ids[i],
                    qsl[i + 1] - qsl[i],
                    &qsl[i..=i + 1]
                );
            }
            if cqsl[i + 1] < cqsl[i] {
                bail!(
                    "step {step}: cross_query_start_loc decreases at row {i}: {:?}",
                    &cqsl[i..=i + 1]
                );
            }
            let req_row = plan.req_rows[i];
            if req_row < 0 || req_row as usize >= geo.max_num_seqs {
                bail!(
                    "step {step}: req_rows[{i}] = {req_row} outside 0..{}",
                    geo.max_num_seqs
                );
            }
            if std::mem::replace(&mut seen_rows[req_row as usize], true) {
                bail!("step {step}: block-table row {req_row} is used by two rows");
            }
            if plan.req_ids[..i].contains(&plan.req_ids[i]) {
                bail!(
                    "step {step}: request {} is scheduled twice",
                    plan.req_ids[i]
                );
            }
            let tokens = qsl[i] as usize..qsl[i + 1] as usize;
            let seq_len = plan.seq_lens[i];
            if seq_len < tokens.len() as i32 {
                bail!(
                    "step {step}: row {i} (request {}) has seq_len {seq_len} < {} scheduled tokens",
                    plan.req_ids[i],
                    tokens.len()
                );
            }
            let seq_len = seq_len as usize;
            if seq_len.div_ceil(bs) > geo.max_blocks_per_seq {
                bail!("step {step}: row {i} seq_len {seq_len} needs more than max_blocks_per_seq {} blocks", geo.max_blocks_per_seq);
            }
            let cross = cqsl[i] as usize..cqsl[i + 1] as usize;
            if cross.len() > tokens.len() {
                bail!(
                    "step {step}: row {i} has {} cross rows but only {} tokens",
                    cross.len(),
                    tokens.len()
                );
            }
            rows.push(RowView {
                req_id: plan.req_ids[i],
                req_row: req_row as usize,
                tokens,
                seq_len,
                cross,
            });
        }

        let max_q = rows.iter().map(|rw| rw.tokens.len()).max().unwrap_or(0);
        let max_s = rows.iter().map(|rw| rw.seq_len).max().unwrap_or(0);
        if plan.max_query_len as usize != max_q || plan.max_seq_len as usize != max_s {
            bail!(
                "step {step}: max_query_len {} / max_seq_len {}, but the rows give {max_q} / {max_s} (kernels size their grids by these)",
                plan.max_query_len, plan.max_seq_len
            );
        }

        // Tokens: bottom-right positions, padding in block 0, no two real tokens on one slot.
        for row in &rows {
            for (i, tok) in row.tokens.clone().enumerate() {
                let want = (row.start_pos() + i) as i64;
                if plan.positions[tok] != want {
                    bail!(
                        "step {step}: token {tok} (request {}, chunk index {i}) has position {}, want {want} (seq_len {} with {} scheduled)",
                        row.req_id, plan.positions[tok], row.seq_len, row.num_scheduled()
                    );
                }
            }
        }
        for tok in t..tp {
            if plan.input_ids[tok] != 0 || plan.positions[tok] != 0 {
                bail!(
                    "step {step}: padding token {tok} has id {} position {}, want 0 0",
                    plan.input_ids[tok],
                    plan.positions[tok]
                );
            }
        }
        for gi in 0..g {
            let slots = &plan.slot_mapping[gi * tp..(gi + 1) * tp];
            let n = (geo.num_blocks[gi] * bs) as i64;
            let mut used = std::collections::HashSet::with_capacity(t);
            for (tok, &sl) in slots.iter().enumerate() {
                if tok >= t {
                    if !(0..bs as i64).contains(&sl) {
                        bail!("step {step}: padding token {tok} writes slot {sl} of group {gi}, want one in block 0 (0..{bs})");
                    }
                    continue;
                }
                if sl < 0 || sl >= n {
                    bail!(
                        "step {step}: slot_mapping[group {gi}, token {tok}] = {sl} outside 0..{n}"
                    );
                }
                if sl < bs as i64 {
                    bail!("step {step}: real token {tok} writes slot {sl} of group {gi}, inside the reserved block 0");
                }
                if !used.insert(sl) {
                    bail!("step {step}: two tokens of this step write slot {sl} of group {gi} (second: token {tok})");
                }
            }
        }

        // Copies.
        let mut copies = Vec::with_capacity(plan.kv_copies.len() / 4);
        for (i, c) in plan.kv_copies.chunks_exact(4).enumerate() {
            let (gi, src, dst, n) = (c[0], c[1], c[2], c[3]);
            if gi < 0 || gi as usize >= g {
                bail!("step {step}: kv_copies[{i}] group {gi} outside 0..{g}");
            }
            let nb = geo.num_blocks[gi as usize] as i32;
            for (what, b) in [("src", src), ("dst", dst)] {
                if b <= NULL_BLOCK as i32 || b >= nb {
                    bail!("step {step}: kv_copies[{i}] {what} block {b} outside 1..{nb}");
                }
            }
            if src == dst {
                bail!("step {step}: kv_copies[{i}] copies block {src} onto itself");
            }
            if n < 1 || n as usize > bs {
                bail!("step {step}: kv_copies[{i}] copies {n} tokens, want 1..={bs}");
            }
            copies.push(CopyOp {
                group: gi as u32,
                src: src as u32,
                dst: dst as u32,
                num_tokens: n as u32,
            });
        }
        for (i, a) in copies.iter().enumerate() {
            for (j, b) in copies.iter().enumerate() {
                if i != j && a.group == b.group && (a.dst == b.dst || a.src == b.dst) {
                    bail!("step {step}: kv_copies[{i}] and kv_copies[{j}] touch block {} of group {} (the result would depend on copy order)", b.dst, a.group);
                }
            }
        }

        // Cross rows: inside their request's tokens, ascending; padding repeats the last real index.
        let ci = &plan.cross_indices;
        for (ri, row) in rows.iter().enumerate() {
            for xi in row.cross.clone() {
                let tok = ci[xi];
                if tok < 0 || !row.tokens.contains(&(tok as usize)) {
                    bail!("step {step}: cross_indices[{xi}] = {tok} is not a token of row {ri} (tokens {:?})", row.tokens);
                }
                if xi > 0 && ci[xi - 1] >= tok {
                    bail!(
                        "step {step}: cross_indices not ascending at {xi}: {} then {tok}",
                        ci[xi - 1]
                    );
                }
            }
        }
        for xi in x..xp {
            let ok = if x > 0 {
                ci[xi] == ci[x - 1]
            } else {
                ci[xi] >= 0 && (ci[xi] as usize) < tp.max(1)
            };
            if !ok {
                bail!(
                    "step {step}: padding cross_indices[{xi}] = {}, want the last real index {:?}",
                    ci[xi],
                    x.checked_sub(1).map(|l| ci[l])
                );
            }
        }

        // Samples.
        let mut samples = Vec::with_capacity(s);
        for si in 0..s {
            let row = plan.sample_rows[si];
            if row < 0 || row as usize >= r {
                bail!("step {step}: sample_rows[{si}] = {row} outside 0..{r}");
            }
            let row = row as usize;
            if plan.sample_rows[..si].contains(&plan.sample_rows[si]) {
                bail!("step {step}: row {row} samples twice");
            }
            let tok = plan.logits_indices[si];
            if tok < 0 || !rows[row].tokens.contains(&(tok as usize)) {
                bail!("step {step}: logits_indices[{si}] = {tok} is not a token of its row {row} (tokens {:?})", rows[row].tokens);
            }
            let cp = plan.logits_cross_pos[si];
            if cp < 0 || cp as usize >= x {
                bail!("step {step}: logits_cross_pos[{si}] = {cp} outside the {x} cross rows");
            }
            if ci[cp as usize] != tok {
                bail!("step {step}: cross_indices[logits_cross_pos[{si}] = {cp}] = {} but logits_indices[{si}] = {tok}", ci[cp as usize]);
            }
            samples.push(SampleView {
                row,
                token: tok as usize,
                cross_pos: cp as usize,
            });
        }

        // Admissions name scheduled rows, with the row and the start they report.
        for (k, &id) in plan.admitted_ids.iter().enumerate() {
            let Some(row) = rows.iter().find(|rw| rw.req_id == id) else {
                bail!("step {step}: admitted request {id} is not scheduled");
            };
            if plan.admitted_rows[k] != row.req_row as i32 {
                bail!(
                    "step {step}: admitted request {id} reports row {} but is scheduled in row {}",
                    plan.admitted_rows[k],
                    row.req_row
                );
            }
            if plan.admitted_num_cached[k] != row.start_pos() as i32 {
                bail!(
                    "step {step}: admitted request {id} reports {} cached tokens but its chunk starts at position {}",
                    plan.admitted_num_cached[k],
                    row.start_pos()
                );
            }
        }
        for &id in &plan.preempted_ids {
            if rows.iter().any(|rw| rw.req_id == id) && !plan.admitted_ids.contains(&id) {
                bail!("step {step}: request {id} is preempted and scheduled in the same step");
            }
        }
        Ok(PlanView {
            rows,
            num_tokens: t,
            num_tokens_padded: tp,
            num_cross: x,
            copies,
            samples,
        })
    }

    /// Slot of token `tok` in group `g`.
    pub fn slot(plan: &StepPlan, g: usize, tok: usize) -> i64 {
        plan.slot_mapping[g * plan.num_tokens_padded as usize + tok]
    }
}
