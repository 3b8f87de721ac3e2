//! Phase C of `schedule()`: write the step plan from the scheduled requests, sync the persistent
//! block tables, drain the copy ops, and advance `num_computed` (scheduler.md §2.5, §9).
//!
//! Everything the executor needs is computed here on the CPU, including the cross-decoder selection
//! (fast prefill): the executor never syncs with the device to interpret a plan.

use super::plan::StepPlan;
use super::scheduler::{Pending, Scheduler};
use crate::kv::NULL_BLOCK;

/// The smallest capture size >= `n`, or `n` when none is (or `n == 0`).
pub(super) fn padded(sizes: &[u32], n: u32) -> u32 {
    if n == 0 {
        return 0;
    }
    let i = sizes.partition_point(|&s| s < n);
    sizes.get(i).copied().unwrap_or(n)
}

impl StepPlan {
    /// Empties every array (keeping capacity) for the next step.
    pub fn clear(&mut self) {
        let step_id = self.step_id;
        let StepPlan {
            req_ids,
            req_rows,
            query_start_loc,
            seq_lens,
            input_ids,
            positions,
            slot_mapping,
            placeholder_indices,
            placeholder_sources,
            kv_copies,
            logits_indices,
            sample_rows,
            cross_indices,
            cross_query_start_loc,
            logits_cross_pos,
            admitted_ids,
            admitted_rows,
            admitted_num_cached,
            preempted_ids,
            dirty_rows,
            ..
        } = self;
        req_ids.clear();
        req_rows.clear();
        query_start_loc.clear();
        seq_lens.clear();
        input_ids.clear();
        positions.clear();
        slot_mapping.clear();
        placeholder_indices.clear();
        placeholder_sources.clear();
        kv_copies.clear();
        logits_indices.clear();
        sample_rows.clear();
        cross_indices.clear();
        cross_query_start_loc.clear();
        logits_cross_pos.clear();
        admitted_ids.clear();
        admitted_rows.clear();
        admitted_num_cached.clear();
        preempted_ids.clear();
        dirty_rows.clear();
        self.num_tokens = 0;
        self.num_tokens_padded = 0;
        self.num_cross = 0;
        self.num_cross_padded = 0;
        self.max_query_len = 0;
        self.max_seq_len = 0;
        self.step_id = step_id;
    }
}

impl Scheduler {
    pub(super) fn build_plan(&mut self) {
        let mut p = std::mem::take(&mut self.plan);
        p.step_id = self.step_id;
        let num_rows = self.sched.len();
        let t: u32 = self.sched.iter().map(|s| s.num_new).sum();
        debug_assert!(
            t <= self.cfg.max_num_batched_tokens,
            "token budget exceeded"
        );
        let t_pad = padded(&self.cfg.token_capture_sizes, t);
        let bs = self.cfg.kv.block_size;
        let groups = self.num_groups;
        p.num_tokens = t;
        p.num_tokens_padded = t_pad;

        p.req_ids.reserve(num_rows);
        p.req_rows.reserve(num_rows);
        p.seq_lens.reserve(num_rows);
        p.query_start_loc.reserve(num_rows + 1);
        p.cross_query_start_loc.reserve(num_rows + 1);
        // Exact capacities: after `take_plan` (the Python path) the buffers start empty each step.
        p.logits_indices.reserve(num_rows);
        p.sample_rows.reserve(num_rows);
        p.logits_cross_pos.reserve(num_rows);
        p.dirty_rows.reserve(num_rows);
        p.cross_indices
            .reserve(num_rows.max(padded(&self.cfg.cross_capture_sizes, num_rows as u32) as usize));
        p.input_ids.reserve(t_pad as usize);
        p.positions.reserve(t_pad as usize);
        p.slot_mapping.resize(groups * t_pad as usize, 0);
        p.query_start_loc.push(0);
        p.cross_query_start_loc.push(0);
        let mut pending = self.spare_pending.pop().unwrap_or_default();
        pending.rows.clear();
        pending.rows.reserve(num_rows);

        let mut t0 = 0u32;
        for k in 0..num_rows {
            let sc = self.sched[k];
            let r = self.reqs[sc.slot as usize]
                .as_mut()
                .expect("scheduled slot");
            let seq = r.kv.as_ref().expect("scheduled request holds KV state");
            let row = r.row;
            let start = r.num_computed;
            let end = start + sc.num_new;
            // Known tokens; positions from `known` on are placeholders (async scheduling).
            let known = r.num_tokens();
            let samples = end == known + r.placeholders;

            // Persistent block tables: whole rows for admitted requests, deltas otherwise.
            // Slots walk the table from the first position's block and offset (one division per
            // row, not per token).
            let (first_block, first_off) = ((start / bs) as usize, start % bs);
            let mut dirty = false;
            for g in 0..groups {
                let table = seq.table(g);
                if sc.admitted {
                    self.tables.write_row(row, g, table);
                    dirty = true;
                } else {
                    dirty |= self.tables.sync_row(row, g, table, seq.num_null_blocks(g));
                }
                let slots =
                    &mut p.slot_mapping[g * t_pad as usize + t0 as usize..][..sc.num_new as usize];
                let (mut b, mut off) = (first_block, first_off);
                for s in slots.iter_mut() {
                    let block = table[b];
                    debug_assert!(
                        block != NULL_BLOCK,
                        "a computed position maps to a real block"
                    );
                    *s = block as i64 * bs as i64 + off as i64;
                    off += 1;
                    if off == bs {
                        off = 0;
                        b += 1;
                    }
                }
            }
            if dirty {
                p.dirty_rows.push(row as i32);
            }

            p.req_ids.push(r.id);
            p.req_rows.push(row as i32);
            p.seq_lens.push(end as i32);
            if end <= known {
                p.input_ids.extend(
                    r.tokens[start as usize..end as usize]
                        .iter()
                        .map(|&x| x as i32),
                );
            } else {
                // A decode on the token the previous plan samples for this request: the only
                // placeholder it can have (at most one step runs ahead), its only scheduled token.
                debug_assert!(
                    r.placeholders == 1 && start == known && end == known + 1,
                    "a placeholder row schedules exactly the one unknown token"
                );
                p.input_ids.push(0);
                p.placeholder_indices.push(t0 as i32);
                p.placeholder_sources.push(r.last_sample as i32);
            }
            p.positions.extend((start..end).map(|x| x as i64));
            let t1 = t0 + sc.num_new;
            p.query_start_loc.push(t1 as i32);
            p.max_query_len = p.max_query_len.max(sc.num_new);
            p.max_seq_len = p.max_seq_len.max(end);

            // Cross-decoder rows: the sampling token, or every scheduled token of a request that
            // wants prompt logprobs (still the trailing rows of its chunk).
            if r.prompt_logprobs {
                p.cross_indices.extend((t0..t1).map(|x| x as i32));
            } else if samples {
                p.cross_indices.push(t1 as i32 - 1);
            }
            if samples {
                r.last_sample = p.logits_indices.len() as u32;
                r.placeholders += 1;
                p.logits_indices.push(t1 as i32 - 1);
                p.sample_rows.push(k as i32);
                p.logits_cross_pos.push(p.cross_indices.len() as i32 - 1);
            }
            p.cross_query_start_loc.push(p.cross_indices.len() as i32);

            r.num_computed = end;
            pending.rows.push(Pending {
                slot: sc.slot,
                seq_no: r.seq_no,
                samples,
                end,
                preemptions: r.num_preemptions,
            });
            t0 = t1;
        }

        // Padding for graph replay: id 0, position 0, slot 0 (block 0 is reserved).
        p.input_ids.resize(t_pad as usize, 0);
        p.positions.resize(t_pad as usize, 0);
        let x = p.cross_indices.len() as u32;
        p.num_cross = x;
        p.num_cross_padded = padded(&self.cfg.cross_capture_sizes, x);
        if let Some(&last) = p.cross_indices.last() {
            p.cross_indices.resize(p.num_cross_padded as usize, last);
        }

        if num_rows > 0 {
            // Copy ops come only from admissions, so an empty plan has none (and needs no
            // update, which releases the copy sources of its own step).
            for op in self.kv.take_copy_ops() {
                p.kv_copies.extend_from_slice(&[
                    op.group as i32,
                    op.src as i32,
                    op.dst as i32,
                    op.num_tokens as i32,
                ]);
            }
            pending.samples = p.logits_indices.len();
            self.pending.push_back(pending);
        } else {
            self.spare_pending.push(pending);
        }
        self.plan = p;
    }
}

#[cfg(test)]
mod tests {
    use super::padded;

    #[test]
    fn padding_picks_the_next_capture_size_or_none() {
        assert_eq!(padded(&[], 5), 5);
        assert_eq!(padded(&[1, 2, 4, 8], 3), 4);
        assert_eq!(padded(&[1, 2, 4, 8], 4), 4);
        assert_eq!(padded(&[1, 2, 4, 8], 9), 9);
        assert_eq!(padded(&[1, 2, 4, 8], 0), 0);
    }
}
