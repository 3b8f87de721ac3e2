//! The oracle against hand-built plans (the toy planner), independent of the real scheduler: it
//! accepts correct plans, including copy-on-match, sliding windows, padding and cross rows, and
//! rejects each classic off-by-one.

use yoco_core::kv::{HashExtras, LayerKind};
use yoco_core::sched::StepPlan;
use yoco_ref::attention::Heads;
use yoco_ref::oracle::{OracleConfig, PlanOracle};
use yoco_ref::plan_view::{PlanGeometry, PlanView};
use yoco_ref::toy::ToyPlanner;
use yoco_ref::truth::Truth;
use yoco_ref::Result;

const BS: usize = 4;

fn layers() -> Vec<LayerKind> {
    vec![
        LayerKind::Sliding { window: 3 },
        LayerKind::Full,
        LayerKind::Sliding { window: 3 },
        LayerKind::Full,
        LayerKind::SharesKv { donor: 2 },
        LayerKind::SharesKv { donor: 3 },
    ]
}

struct Rig {
    geo: PlanGeometry,
    truth: Truth,
    toy: ToyPlanner,
    oracle: PlanOracle,
}

impl Rig {
    fn new() -> Rig {
        let geo = PlanGeometry {
            block_size: BS,
            num_blocks: vec![24, 24],
            max_num_seqs: 4,
            max_blocks_per_seq: 8,
        };
        let oracle = PlanOracle::new(OracleConfig {
            layers: layers(),
            heads: Heads {
                num_heads: 4,
                kv_heads: 2,
                head_dim: 4,
            },
            scale: 1.0,
            geo: geo.clone(),
            seed: 7,
            tolerance: 1e-6,
        })
        .unwrap();
        let mut toy = ToyPlanner::new(geo.clone(), 3);
        toy.token_capture_sizes = vec![16, 32];
        toy.cross_capture_sizes = vec![2, 4];
        Rig {
            geo,
            truth: Truth::default(),
            toy,
            oracle,
        }
    }

    fn add(&mut self, id: u64, prompt: &[u32]) {
        self.truth.add(id, prompt, &HashExtras::default(), false);
    }

    fn step(&mut self, chunks: &[(u64, usize)], mutate: impl FnOnce(&mut StepPlan)) -> Result<()> {
        let mut plan = self.toy.plan(chunks, &self.truth)?;
        mutate(&mut plan);
        let view = PlanView::parse(&plan, &self.geo)?;
        self.truth.begin_step(&plan, &view)?;
        self.oracle
            .check_step(&plan, &view, &mut self.truth, &self.toy.mirror())?;
        self.truth.check_sampling(&plan, &view)?;
        self.truth.end_step(&view)?;
        for s in &view.samples {
            let id = view.rows[s.row].req_id;
            let r = self.truth.get_mut(id)?;
            let next = (r.tokens.len() as u32 * 7 + id as u32) % 50;
            r.tokens.push(next);
        }
        Ok(())
    }

    /// A: 11-token prompt in chunks 6 + 5, then B shares A's first 6 tokens (1 full block shared, 2
    /// tokens copied into a fresh block) and runs next to A's decode. `mutate` hits B's step.
    fn scenario(&mut self, mutate: impl FnOnce(&mut StepPlan)) -> Result<()> {
        let a: Vec<u32> = (0..11).map(|i| (i * 5 + 1) % 50).collect();
        let mut b = a[..6].to_vec();
        b.extend([40, 41, 42, 43, 44, 45, 46]);
        self.add(1, &a);
        self.add(2, &b);
        self.toy.admit(1, 0);
        self.step(&[(1, 6)], |_| {})?;
        self.step(&[(1, 5)], |_| {})?;
        self.toy.admit_sharing(2, 1, 1, 6)?;
        self.step(&[(1, 1), (2, 7)], mutate)?;
        self.step(&[(1, 1), (2, 1)], |_| {})?;
        self.step(&[(1, 1), (2, 1)], |_| {})
    }
}

#[test]
fn correct_plans_with_copy_windows_padding_and_cross_rows_pass() {
    let mut rig = Rig::new();
    rig.scenario(|p| {
        assert_eq!(p.kv_copies.len(), 8, "one copy per group");
        assert!(p.num_tokens_padded > p.num_tokens);
    })
    .unwrap();
    let s = rig.oracle.stats;
    assert_eq!(s.copies, 2);
    assert!(s.windowed_queries > 0 && s.cross_checks > 0, "{s:?}");
    // 11 + 7 prefill tokens and 5 decode tokens, 4 self-decoder layers each.
    assert_eq!(s.self_checks, (11 + 7 + 5) * 4);
}

fn expect_mismatch(mutate: impl FnOnce(&mut StepPlan), want: &str) {
    let err = Rig::new()
        .scenario(mutate)
        .expect_err("the oracle must reject the mutated plan")
        .to_string();
    assert!(err.contains(want), "expected {want:?} in: {err}");
}

#[test]
fn slot_mapping_off_by_one_is_caught() {
    // B's last token (token 7 of the step) writes one slot further in group 1 (full attention).
    expect_mismatch(
        |p| {
            let tp = p.num_tokens_padded as usize;
            p.slot_mapping[tp + 7] += 1;
        },
        "attention mismatch",
    );
}

#[test]
fn copy_length_short_by_one_is_caught() {
    expect_mismatch(|p| p.kv_copies[3] -= 1, "never-written memory");
}

#[test]
fn copy_from_the_wrong_block_is_caught() {
    expect_mismatch(
        |p| p.kv_copies[1] = if p.kv_copies[1] == 5 { 6 } else { 5 },
        "attention mismatch",
    );
}

#[test]
fn logits_index_off_by_one_is_caught() {
    // The sampled row and its cross row move to B's second-to-last token together (a consistent
    // plan, just the wrong token): the cross row then sits one position before where
    // cross_query_start_loc aligns it.
    expect_mismatch(
        |p| {
            let s = p.sample_rows.iter().position(|&r| r == 1).unwrap();
            p.logits_indices[s] -= 1;
            p.cross_indices[p.logits_cross_pos[s] as usize] -= 1;
        },
        "the plan aligns this query at position 12",
    );
}

#[test]
fn seq_len_one_too_long_is_caught() {
    expect_mismatch(
        |p| {
            p.seq_lens[1] += 1;
            p.max_seq_len = p.max_seq_len.max(p.seq_lens[1] as u32);
        },
        "has position 6, want 7",
    );
}

#[test]
fn block_table_entry_pointing_elsewhere_is_caught() {
    let mut rig = Rig::new();
    let a: Vec<u32> = (0..9).collect();
    rig.add(1, &a);
    rig.toy.admit(1, 0);
    rig.step(&[(1, 5)], |_| {}).unwrap();
    // Corrupt the executor's view of row 0's first block in group 0 only.
    let mut mirror = rig.toy.mirror();
    let bad = rig.toy.block_table(0)[0] + 1;
    let plan = rig.toy.plan(&[(1, 4)], &rig.truth).unwrap();
    let mut groups = vec![
        rig.toy.block_table(0).to_vec(),
        rig.toy.block_table(1).to_vec(),
    ];
    groups[0][0] = bad;
    mirror = yoco_ref::tables::TableMirror::from_tables(mirror.max_blocks_per_seq(), groups);
    let view = PlanView::parse(&plan, &rig.geo).unwrap();
    rig.truth.begin_step(&plan, &view).unwrap();
    let err = rig
        .oracle
        .check_step(&plan, &view, &mut rig.truth, &mirror)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("group 0") && err.contains("attention mismatch"),
        "{err}"
    );
}

#[test]
fn structural_errors_name_the_field() {
    let mut rig = Rig::new();
    rig.add(1, &[1, 2, 3]);
    rig.toy.admit(1, 0);
    let mut plan = rig.toy.plan(&[(1, 3)], &rig.truth).unwrap();
    plan.positions[1] = 5;
    let err = PlanView::parse(&plan, &rig.geo).unwrap_err().to_string();
    assert!(err.contains("has position 5, want 1"), "{err}");
    let mut plan = rig.toy.plan(&[], &rig.truth).unwrap();
    plan.kv_copies = vec![0, 3, 3, 1];
    let err = PlanView::parse(&plan, &rig.geo).unwrap_err().to_string();
    assert!(err.contains("onto itself"), "{err}");
}
