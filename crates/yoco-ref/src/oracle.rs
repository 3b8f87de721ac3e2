//! The plan oracle: executes each step plan on reference paged memory with synthetic K/V and
//! checks that every query's attention over *paged* memory (copies applied, K/V written through
//! `slot_mapping`, keys read through the block tables, queries bottom-right aligned against
//! `seq_lens`) equals attention over the request's *contiguous* history computed independently
//! from the ground truth. The same for the cross-decoder's selected rows, which read their donor's
//! memory and must attend to exactly the keys at or before their own position.

use std::collections::HashMap;

use yoco_core::kv::LayerKind;
use yoco_core::sched::StepPlan;

use crate::attention::{attend, max_abs_diff, visible, Heads};
use crate::bail;
use crate::error::{Error, Result};
use crate::layout::ModelLayout;
use crate::paged::{Fill, KvGeometry, PagedKv};
use crate::plan_view::{PlanGeometry, PlanView, RowView};
use crate::synth::Synth;
use crate::tables::TableMirror;
use crate::truth::{ReqTruth, Truth};

/// What the oracle needs to know: the model's KV layout, the synthetic heads, the memory geometry.
#[derive(Debug, Clone)]
pub struct OracleConfig {
    /// The scheduler's layers; the oracle derives the groups itself ([`ModelLayout`]).
    pub layers: Vec<LayerKind>,
    /// Heads of the synthetic K/V and queries (small: the oracle checks addressing, not math).
    pub heads: Heads,
    /// Gemma 3n uses 1.0.
    pub scale: f32,
    /// Pools and block-table shape, as the scheduler sizes them.
    pub geo: PlanGeometry,
    /// Seed of the synthetic K/V and queries.
    pub seed: u64,
    /// Largest allowed |paged - contiguous| per output element.
    pub tolerance: f32,
}

/// What the oracle has checked, so tests can prove they were not vacuous.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OracleStats {
    /// Plans executed and checked.
    pub steps: u64,
    /// (query, layer) pairs compared in the self-decoder.
    pub self_checks: u64,
    /// (cross row, layer) pairs compared in the cross-decoder.
    pub cross_checks: u64,
    /// Copy-on-match ops the plans carried (each applied to reference memory before the step).
    pub copies: u64,
    /// Token slots those copies moved, per group.
    pub copied_tokens: u64,
    /// Admissions that reused cached KV.
    pub cached_admissions: u64,
    /// Tokens those admissions reused (their `admitted_num_cached`).
    pub cached_tokens: u64,
    /// Preemptions the plans announced.
    pub preemptions: u64,
    /// Queries whose sliding window excluded at least one earlier key.
    pub windowed_queries: u64,
}

impl std::ops::AddAssign for OracleStats {
    fn add_assign(&mut self, o: Self) {
        self.steps += o.steps;
        self.self_checks += o.self_checks;
        self.cross_checks += o.cross_checks;
        self.copies += o.copies;
        self.copied_tokens += o.copied_tokens;
        self.cached_admissions += o.cached_admissions;
        self.cached_tokens += o.cached_tokens;
        self.preemptions += o.preemptions;
        self.windowed_queries += o.windowed_queries;
    }
}

/// A request's contiguous K/V history per producing layer, built from the truth alone.
#[derive(Debug, Default)]
struct History {
    /// `[layer] -> [len * kv_len]`
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
}

/// Executes each step plan on reference paged memory with synthetic K/V and compares every
/// query's paged attention with its contiguous history (see the module docs). Feed it the plans
/// in order with [`PlanOracle::forget`] for every request that ends.
pub struct PlanOracle {
    cfg: OracleConfig,
    layout: ModelLayout,
    paged: PagedKv,
    synth: Synth,
    hist: HashMap<u64, History>,
    /// What was checked so far.
    pub stats: OracleStats,
}

/// One query to compare: where the plan puts it (bottom-right) and where the truth says it is.
#[derive(Debug, Clone, Copy)]
struct Query {
    /// Position the plan's metadata gives it.
    planned: usize,
    /// Position of its token in the request.
    actual: usize,
    /// Token index in the batch (for messages).
    token: usize,
    cross: Option<usize>,
}

impl PlanOracle {
    /// An oracle with NaN-filled paged memory (a read of an unwritten slot poisons the result);
    /// fails when the layers form another number of groups than `cfg.geo.num_blocks` lists.
    pub fn new(cfg: OracleConfig) -> Result<Self> {
        let layout = ModelLayout::new(&cfg.layers).map_err(Error)?;
        if layout.groups.len() != cfg.geo.num_blocks.len() {
            bail!(
                "the layers form {} KV groups but num_blocks lists {}",
                layout.groups.len(),
                cfg.geo.num_blocks.len()
            );
        }
        let geo = KvGeometry {
            block_size: cfg.geo.block_size,
            kv_heads: cfg.heads.kv_heads,
            head_dim: cfg.heads.head_dim,
        };
        let per_group: Vec<usize> = layout.groups.iter().map(|g| g.layers.len()).collect();
        let paged = PagedKv::new(geo, &cfg.geo.num_blocks, &per_group, Fill::Nan)?;
        let synth = Synth {
            heads: cfg.heads,
            seed: cfg.seed,
        };
        Ok(PlanOracle {
            cfg,
            layout,
            paged,
            synth,
            hist: HashMap::new(),
            stats: OracleStats::default(),
        })
    }

    /// The KV layout the oracle derived from the layers.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// The paged memory as the executed plans left it.
    pub fn paged(&self) -> &PagedKv {
        &self.paged
    }

    /// Drops a finished or aborted request's history (its id may be reused).
    pub fn forget(&mut self, id: u64) {
        self.hist.remove(&id);
    }

    /// Executes one step and checks it. `view` is the parsed `plan`; `truth` already reflects the
    /// plan's admissions and preemptions ([`Truth::begin_step`]); `tables` is the executor's view.
    pub fn check_step(
        &mut self,
        plan: &StepPlan,
        view: &PlanView,
        truth: &mut Truth,
        tables: &TableMirror,
    ) -> Result<()> {
        let step = plan.step_id;
        self.stats.steps += 1;
        self.stats.preemptions += plan.preempted_ids.len() as u64;
        for &c in &plan.admitted_num_cached {
            if c > 0 {
                self.stats.cached_admissions += 1;
                self.stats.cached_tokens += c as u64;
            }
        }
        self.paged
            .copy_blocks(&view.copies)
            .map_err(|e| Error(format!("step {step}: {e}")))?;
        self.stats.copies += view.copies.len() as u64;
        self.stats.copied_tokens += view.copies.iter().map(|c| c.num_tokens as u64).sum::<u64>();

        // The forward: every producing layer writes this step's K/V through slot_mapping.
        let tp = view.num_tokens_padded;
        let kvl = self.cfg.heads.kv_len();
        for layer in 0..self.layout.num_layers() {
            if !self.layout.is_producer(layer) {
                continue;
            }
            let at = self.layout.kv_of[layer];
            let (mut k, mut v) = (Vec::with_capacity(tp * kvl), Vec::with_capacity(tp * kvl));
            for row in &view.rows {
                let r = truth.get_mut(row.req_id)?;
                for p in row.start_pos()..row.seq_len {
                    let h = r.prefix_hash(p);
                    self.synth.kv(h, p, layer, &mut k, &mut v);
                }
            }
            for tok in view.num_tokens..tp {
                self.synth.junk(tok, layer, &mut k, &mut v);
            }
            let slots = &plan.slot_mapping[at.group * tp..(at.group + 1) * tp];
            self.paged
                .write_kv_slices(at.group, at.slot, slots, &k, &v)
                .map_err(|e| Error(format!("step {step}: {e}")))?;
        }

        // Self-decoder: every scheduled token in every layer before the cross-decoder.
        for row in &view.rows {
            let queries: Vec<Query> = row
                .tokens
                .clone()
                .enumerate()
                .map(|(i, tok)| Query {
                    planned: row.start_pos() + i,
                    actual: row.start_pos() + i,
                    token: tok,
                    cross: None,
                })
                .collect();
            for layer in 0..self.layout.first_cross {
                self.check_queries(step, row, layer, &queries, truth, tables)?;
            }
        }
        // Cross-decoder: the selected rows, bottom-right aligned by cross_query_start_loc.
        for row in &view.rows {
            let nx = row.cross.len();
            if nx == 0 {
                continue;
            }
            let queries: Vec<Query> = row
                .cross
                .clone()
                .enumerate()
                .map(|(i, x)| {
                    let tok = plan.cross_indices[x] as usize;
                    Query {
                        planned: row.seq_len - nx + i,
                        actual: row.start_pos() + (tok - row.tokens.start),
                        token: tok,
                        cross: Some(x),
                    }
                })
                .collect();
            for layer in self.layout.first_cross..self.layout.num_layers() {
                self.check_queries(step, row, layer, &queries, truth, tables)?;
            }
        }
        Ok(())
    }

    fn ensure_history(&mut self, id: u64, r: &mut ReqTruth, len: usize) {
        let nl = self.layout.num_layers();
        let h = self.hist.entry(id).or_insert_with(|| History {
            k: vec![Vec::new(); nl],
            v: vec![Vec::new(); nl],
            len: 0,
        });
        while h.len < len {
            let p = h.len;
            let ph = r.prefix_hash(p);
            for layer in 0..nl {
                if self.layout.is_producer(layer) {
                    self.synth
                        .kv(ph, p, layer, &mut h.k[layer], &mut h.v[layer]);
                }
            }
            h.len += 1;
        }
    }

    fn check_queries(
        &mut self,
        step: u64,
        row: &RowView,
        layer: usize,
        queries: &[Query],
        truth: &mut Truth,
        tables: &TableMirror,
    ) -> Result<()> {
        let heads = self.cfg.heads;
        let kvl = heads.kv_len();
        let at = self.layout.kv_of[layer];
        let producer = self.layout.groups[at.group].layers[at.slot];
        let window = self.layout.window(layer);
        let r = truth.get_mut(row.req_id)?;
        self.ensure_history(row.req_id, r, row.seq_len);
        let lo = queries
            .iter()
            .map(|q| visible(q.planned, window).start)
            .min()
            .unwrap();
        let table = tables.row(at.group, row.req_row);
        let (pk, pv) = self
            .paged
            .gather_vecs(at.group, at.slot, table, lo, row.seq_len)
            .map_err(|e| {
                Error(format!(
                    "step {step}: request {} (block-table row {}) group {}: {e}{}",
                    row.req_id,
                    row.req_row,
                    at.group,
                    if table.contains(&crate::tables::NEVER_UPLOADED) {
                        " (the row was never announced in dirty_rows)"
                    } else {
                        ""
                    }
                ))
            })?;
        let hist = &self.hist[&row.req_id];
        let (hk, hv) = (&hist.k[producer], &hist.v[producer]);
        let mut out_p = vec![0f32; heads.q_len()];
        let mut out_c = vec![0f32; heads.q_len()];
        for q in queries {
            let qv = self.synth.q(r.prefix_hash(q.actual), q.actual, layer);
            attend(
                heads,
                &qv,
                &pk,
                &pv,
                lo,
                q.planned,
                window,
                self.cfg.scale,
                &mut out_p,
            );
            let vis = visible(q.actual, window);
            let (ks, vs) = (
                &hk[vis.start * kvl..vis.end * kvl],
                &hv[vis.start * kvl..vis.end * kvl],
            );
            attend(
                heads,
                &qv,
                ks,
                vs,
                vis.start,
                q.actual,
                window,
                self.cfg.scale,
                &mut out_c,
            );
            if q.cross.is_some() {
                self.stats.cross_checks += 1;
            } else {
                self.stats.self_checks += 1;
            }
            if vis.start > 0 {
                self.stats.windowed_queries += 1;
            }
            let diff = max_abs_diff(&out_p, &out_c);
            if diff.is_nan() || diff > self.cfg.tolerance {
                let why = self.diagnose(layer, q, table, &pk, &pv, lo, hk, hv);
                let what = match q.cross {
                    Some(x) => format!("cross row {x} (token {})", q.token),
                    None => format!("token {}", q.token),
                };
                bail!(
                    "step {step}: attention mismatch (max |paged - contiguous| = {diff:e}) for request {} {what} at position {} in layer {layer} (group {}, producer layer {producer}, window {window:?}): {why}",
                    row.req_id, q.actual, at.group
                );
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn diagnose(
        &self,
        layer: usize,
        q: &Query,
        table: &[i32],
        pk: &[f32],
        pv: &[f32],
        lo: usize,
        hk: &[f32],
        hv: &[f32],
    ) -> String {
        let kvl = self.cfg.heads.kv_len();
        let bs = self.cfg.geo.block_size;
        let window = self.layout.window(layer);
        let (vp, va) = (visible(q.planned, window), visible(q.actual, window));
        if vp != va {
            return format!(
                "the plan aligns this query at position {} (keys {vp:?}) but its token is at position {} (keys {va:?})",
                q.planned, q.actual
            );
        }
        for p in va.clone() {
            let (gk, gv) = (&pk[(p - lo) * kvl..][..kvl], &pv[(p - lo) * kvl..][..kvl]);
            if gk == &hk[p * kvl..][..kvl] && gv == &hv[p * kvl..][..kvl] {
                continue;
            }
            let block = table[p / bs];
            let slot = block as usize * bs + p % bs;
            let holds = if gk.iter().any(|x| x.is_nan()) {
                "never-written memory".to_string()
            } else if let Some(o) = (0..hk.len() / kvl).find(|&o| &hk[o * kvl..][..kvl] == gk) {
                format!("the KV of this request's position {o}")
            } else {
                "KV of another prefix or request (stale or overwritten)".to_string()
            };
            return format!(
                "key position {p} is read from block {block} slot {slot}, which holds {holds}"
            );
        }
        "all visible keys match; the query itself differs".to_string()
    }
}
