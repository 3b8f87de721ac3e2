//! The executor's copy of the block tables. The scheduler keeps persistent tables
//! (`[max_num_seqs * max_blocks_per_seq]` per group, rows indexed by `req_rows`) and names in each
//! plan the rows that changed (`dirty_rows`); an executor uploads only those. The reference does the
//! same, so a change the plan forgets to announce makes the executor read stale blocks, and the
//! oracle sees it.

/// Entry value of a row never uploaded: reading it is an error that names the row.
pub const NEVER_UPLOADED: i32 = -1;

/// The executor-side block tables: per group `[max_num_seqs * max_blocks_per_seq]`, rows updated
/// only by [`TableMirror::upload`] of the rows a plan names as dirty.
#[derive(Debug, Clone)]
pub struct TableMirror {
    max_blocks_per_seq: usize,
    groups: Vec<Vec<i32>>,
}

impl TableMirror {
    /// Tables whose every entry is [`NEVER_UPLOADED`].
    pub fn new(num_groups: usize, max_num_seqs: usize, max_blocks_per_seq: usize) -> Self {
        TableMirror {
            max_blocks_per_seq,
            groups: vec![vec![NEVER_UPLOADED; max_num_seqs * max_blocks_per_seq]; num_groups],
        }
    }

    /// Tables taken whole from a source (tests that build plans by hand).
    pub fn from_tables(max_blocks_per_seq: usize, groups: Vec<Vec<i32>>) -> Self {
        TableMirror {
            max_blocks_per_seq,
            groups,
        }
    }

    /// Columns of each row.
    pub fn max_blocks_per_seq(&self) -> usize {
        self.max_blocks_per_seq
    }

    /// Uploads `rows` of every group from the scheduler's tables (`source(g)`).
    pub fn upload<'a>(&mut self, rows: &[i32], source: impl Fn(usize) -> &'a [i32]) {
        let m = self.max_blocks_per_seq;
        for (g, mirror) in self.groups.iter_mut().enumerate() {
            let src = source(g);
            assert_eq!(
                src.len(),
                mirror.len(),
                "block table of group {g} changed size"
            );
            for &r in rows {
                let r = r as usize;
                mirror[r * m..(r + 1) * m].copy_from_slice(&src[r * m..(r + 1) * m]);
            }
        }
    }

    /// Row `req_row` of group `g`.
    pub fn row(&self, g: usize, req_row: usize) -> &[i32] {
        let m = self.max_blocks_per_seq;
        &self.groups[g][req_row * m..(req_row + 1) * m]
    }
}
