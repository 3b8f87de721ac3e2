//! Structural invariants of the scheduler, checked by tests after every step (O(requests + pool)).

use std::collections::HashSet;

use super::scheduler::Scheduler;
use super::state::{Status, NO_ROW};

pub(super) fn check(s: &Scheduler) -> Result<(), String> {
    let live = s.reqs.iter().filter(|r| r.is_some()).count();
    if live != s.by_id.len() {
        return Err(format!("{live} live slots but {} ids", s.by_id.len()));
    }
    for (&id, &slot) in &s.by_id {
        match s.reqs.get(slot as usize).and_then(|r| r.as_ref()) {
            Some(r) if r.id == id => {}
            _ => {
                return Err(format!(
                    "id {id} maps to slot {slot}, which does not hold it"
                ))
            }
        }
    }
    if s.running.len() + s.waiting.len() != live {
        return Err(format!(
            "{} running + {} waiting != {live} live",
            s.running.len(),
            s.waiting.len()
        ));
    }
    if s.running.len() > s.cfg.max_num_seqs as usize {
        return Err(format!(
            "{} running > max_num_seqs {}",
            s.running.len(),
            s.cfg.max_num_seqs
        ));
    }
    let mut rows = HashSet::new();
    for &slot in &s.running {
        let r = s.req(slot);
        if r.status != Status::Running {
            return Err(format!(
                "request {} in running has status {:?}",
                r.id, r.status
            ));
        }
        if r.row == NO_ROW || r.row >= s.cfg.max_num_seqs || !rows.insert(r.row) {
            return Err(format!(
                "request {} has an invalid or duplicate row {}",
                r.id, r.row
            ));
        }
        if r.num_computed > r.num_tokens() + r.placeholders {
            return Err(format!(
                "request {} computed {} of {} tokens (+{} placeholders)",
                r.id,
                r.num_computed,
                r.num_tokens(),
                r.placeholders
            ));
        }
        let Some(seq) = r.kv.as_ref() else {
            return Err(format!("running request {} has no KV state", r.id));
        };
        for g in 0..s.num_groups {
            s.tables.check_row(r.row, g, seq.table(g))?;
        }
    }
    if s.free_rows.iter().any(|r| rows.contains(&r.0))
        || s.free_rows.len() + rows.len() != s.cfg.max_num_seqs as usize
    {
        return Err(format!(
            "free rows {:?} do not complement running rows {rows:?}",
            s.free_rows
        ));
    }
    // Placeholders are exactly the sampling rows of outstanding plans whose request is live.
    let mut outstanding = vec![0u32; s.reqs.len()];
    for step in &s.pending {
        for p in step.rows.iter().filter(|p| p.samples) {
            if s.reqs[p.slot as usize]
                .as_ref()
                .is_some_and(|r| r.seq_no == p.seq_no)
            {
                outstanding[p.slot as usize] += 1;
            }
        }
    }
    for (slot, r) in s.reqs.iter().enumerate() {
        if let Some(r) = r {
            if r.placeholders != outstanding[slot] {
                return Err(format!(
                    "request {} has {} placeholders but {} sampling rows await update",
                    r.id, r.placeholders, outstanding[slot]
                ));
            }
        }
    }
    if s.pending.len() > 2 {
        return Err(format!(
            "{} plans await update (at most 2)",
            s.pending.len()
        ));
    }
    let mut seen = HashSet::new();
    for slot in s.waiting.iter() {
        if !seen.insert(slot) {
            return Err(format!("slot {slot} queued twice"));
        }
        let r = s.req(slot);
        if !matches!(r.status, Status::Waiting | Status::Preempted)
            || r.row != NO_ROW
            || r.num_computed != 0
        {
            return Err(format!(
                "waiting request {} has status {:?}, row {}, computed {}",
                r.id, r.status, r.row, r.num_computed
            ));
        }
        if r.kv.as_ref().map_or(true, |seq| seq.holds_blocks()) {
            return Err(format!(
                "waiting request {} has no KV state or still holds blocks",
                r.id
            ));
        }
        if r.status == Status::Waiting && r.num_preemptions != 0 {
            return Err(format!("request {} was preempted but is marked new", r.id));
        }
    }
    s.kv.check_invariants(s.reqs.iter().flatten().filter_map(|r| r.kv.as_ref()))
}
