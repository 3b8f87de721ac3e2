//! Persistent block tables, one per KV group, `[max_num_seqs, max_blocks_per_seq]` int32 row-major,
//! indexed by the requests' persistent rows (vLLM's persistent batch made explicit). A row is
//! rewritten only when the request's table changed, and reported in the plan's `dirty_rows`, so the
//! executor copies only those rows to the device.
//!
//! While a request runs, its table in a group changes in two ways only: entries are appended
//! (allocation) and leading entries become [`NULL_BLOCK`] (a sliding window moving past them). So per
//! `(row, group)` the written length and the count of leading null entries tell, in amortised O(1),
//! whether anything changed; `check` compares whole rows (tests).

use crate::kv::{BlockId, NULL_BLOCK};

#[derive(Debug)]
pub(super) struct BlockTables {
    num_groups: usize,
    max_blocks: usize,
    /// Per group, `[max_num_seqs * max_blocks]`. Never reallocated: Python holds views of them.
    data: Vec<Vec<i32>>,
    /// `[row * num_groups + g]`: entries written in the row (the rest are 0).
    len: Vec<u32>,
    /// `[row * num_groups + g]`: leading entries known to be null.
    nulls: Vec<u32>,
}

impl BlockTables {
    pub fn new(num_groups: usize, max_num_seqs: usize, max_blocks: usize) -> Self {
        BlockTables {
            num_groups,
            max_blocks,
            data: (0..num_groups)
                .map(|_| vec![0; max_num_seqs * max_blocks])
                .collect(),
            len: vec![0; max_num_seqs * num_groups],
            nulls: vec![0; max_num_seqs * num_groups],
        }
    }

    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    pub fn group(&self, g: usize) -> &[i32] {
        &self.data[g]
    }

    /// Writes row `row` of group `g` from scratch (a newly admitted request), zeroing what a previous
    /// holder of the row left beyond the new length.
    pub fn write_row(&mut self, row: u32, g: usize, table: &[BlockId]) {
        let k = row as usize * self.num_groups + g;
        assert!(
            table.len() <= self.max_blocks,
            "block table longer than max_blocks_per_seq"
        );
        let base = row as usize * self.max_blocks;
        let dst = &mut self.data[g][base..base + self.max_blocks];
        for (d, &b) in dst.iter_mut().zip(table) {
            *d = b as i32;
        }
        let old = self.len[k] as usize;
        if old > table.len() {
            dst[table.len()..old].fill(0);
        }
        self.len[k] = table.len() as u32;
        self.nulls[k] = table.iter().take_while(|&&b| b == NULL_BLOCK).count() as u32;
    }

    /// Brings row `row` of group `g` up to date with a running request's `table`, whose first
    /// `nulls` entries are [`NULL_BLOCK`] and the rest real blocks (the request's own count, so an
    /// unchanged row is detected without reading the table); true when it changed.
    pub fn sync_row(&mut self, row: u32, g: usize, table: &[BlockId], nulls: usize) -> bool {
        let k = row as usize * self.num_groups + g;
        let old_len = self.len[k] as usize;
        let old_nulls = self.nulls[k] as usize;
        if table.len() == old_len && nulls == old_nulls {
            return false;
        }
        debug_assert!(
            table[..nulls].iter().all(|&b| b == NULL_BLOCK)
                && !table[nulls..].contains(&NULL_BLOCK),
            "sync_row: {nulls} leading nulls expected in {table:?}"
        );
        assert!(
            table.len() <= self.max_blocks,
            "block table longer than max_blocks_per_seq"
        );
        assert!(
            table.len() >= old_len && nulls >= old_nulls,
            "a running request's block table never shrinks"
        );
        let base = row as usize * self.max_blocks;
        let dst = &mut self.data[g][base..base + self.max_blocks];
        for i in old_nulls..table.len() {
            dst[i] = table[i] as i32;
        }
        self.len[k] = table.len() as u32;
        self.nulls[k] = nulls as u32;
        true
    }

    /// Whether row `row` of group `g` holds exactly `table` (then zeros).
    pub fn check_row(&self, row: u32, g: usize, table: &[BlockId]) -> Result<(), String> {
        let base = row as usize * self.max_blocks;
        let dst = &self.data[g][base..base + self.max_blocks];
        let want = table.iter().map(|&b| b as i32).chain(std::iter::repeat(0));
        for (i, (&have, want)) in dst.iter().zip(want).enumerate() {
            if have != want {
                return Err(format!(
                    "block table group {g} row {row} entry {i}: {have} != {want} (table {table:?})"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_and_window_nulling_are_synced_and_reported() {
        let mut t = BlockTables::new(1, 2, 4);
        t.write_row(1, 0, &[5, 6]);
        assert_eq!(&t.group(0)[4..8], &[5, 6, 0, 0]);
        assert!(!t.sync_row(1, 0, &[5, 6], 0));
        assert!(t.sync_row(1, 0, &[5, 6, 7], 0));
        assert!(t.sync_row(1, 0, &[0, 6, 7], 1));
        assert_eq!(&t.group(0)[4..8], &[0, 6, 7, 0]);
        assert!(t.check_row(1, 0, &[0, 6, 7]).is_ok());
        // A new holder of the row with a shorter table leaves no stale entries.
        t.write_row(1, 0, &[9]);
        assert_eq!(&t.group(0)[4..8], &[9, 0, 0, 0]);
        assert!(t.check_row(1, 0, &[9, 1]).is_err());
    }
}
