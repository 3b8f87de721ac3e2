//! The mock executor: runs step plans on the [`MockModel`] over reference paged memory, the way the
//! PyTorch executor does (DESIGN.md §3): apply `kv_copies`, run the self-decoder on all padded
//! tokens (producing layers write K/V through `slot_mapping`, attention reads through the block
//! tables, bottom-right aligned against `seq_lens`), gather the `cross_indices` rows, run the
//! cross-decoder on them only (bottom-right aligned by `cross_query_start_loc`), and sample greedily
//! at `logits_cross_pos`. With `fast_prefill` off every layer runs on every token and sampling reads
//! `logits_indices`.

use yoco_core::sched::StepPlan;

use crate::attention::visible;
use crate::error::{Error, Result};
use crate::layout::ModelLayout;
use crate::model::MockModel;
use crate::paged::{Fill, KvGeometry, PagedKv};
use crate::plan_view::{PlanGeometry, PlanView, RowView};
use crate::tables::TableMirror;

/// Executes step plans on the [`MockModel`] over reference paged memory (see the module docs);
/// block tables come from a [`TableMirror`] updated only through the plan's dirty rows.
pub struct MockExecutor {
    /// The model whose greedy streams the run must reproduce.
    pub model: MockModel,
    /// Run the cross-decoder only on `cross_indices` (YOCO fast prefill) and sample at
    /// `logits_cross_pos`; off: every layer on every token, sampling at `logits_indices`.
    pub fast_prefill: bool,
    paged: PagedKv,
}

/// Queries of one layer pass: hidden states, and per row which of them align where.
struct Pass<'a> {
    /// Hidden state per query.
    x: &'a mut [Vec<f32>],
    /// RoPE position per query.
    pos: Vec<i64>,
    /// Per row: its queries (indices into `x`) in order; they sit at the last positions before
    /// `seq_len`.
    rows: Vec<(&'a RowView, std::ops::Range<usize>)>,
}

impl MockExecutor {
    /// An executor for `model` with NaN-filled paged memory shaped by `geo` (so a read of a slot
    /// no token wrote poisons the output); fails when `geo` has another number of KV groups than
    /// the model.
    pub fn new(model: MockModel, geo: &PlanGeometry, fast_prefill: bool) -> Result<Self> {
        let layout: &ModelLayout = &model.layout;
        if layout.groups.len() != geo.num_blocks.len() {
            return Err(Error(format!(
                "the model has {} KV groups but num_blocks lists {}",
                layout.groups.len(),
                geo.num_blocks.len()
            )));
        }
        let kv = KvGeometry {
            block_size: geo.block_size,
            kv_heads: model.cfg.heads.kv_heads,
            head_dim: model.cfg.heads.head_dim,
        };
        let per_group: Vec<usize> = layout.groups.iter().map(|g| g.layers.len()).collect();
        let paged = PagedKv::new(kv, &geo.num_blocks, &per_group, Fill::Nan)?;
        Ok(MockExecutor {
            model,
            fast_prefill,
            paged,
        })
    }

    /// The paged memory as the executed plans left it (tests inspect slots).
    pub fn paged(&self) -> &PagedKv {
        &self.paged
    }

    /// Runs one step; returns one token per sampling request, in `sample_rows` order.
    pub fn execute(
        &mut self,
        plan: &StepPlan,
        view: &PlanView,
        tables: &TableMirror,
    ) -> Result<Vec<i32>> {
        let step = plan.step_id;
        let ctx = |e: Error| Error(format!("step {step}: {e}"));
        self.paged.copy_blocks(&view.copies).map_err(ctx)?;
        let tp = view.num_tokens_padded;
        let nl = self.model.layout.num_layers();
        let first_cross = if self.fast_prefill {
            self.model.layout.first_cross
        } else {
            nl
        };

        let mut x: Vec<Vec<f32>> = plan.input_ids[..tp]
            .iter()
            .map(|&t| self.model.embed(t.max(0) as u32))
            .collect();
        {
            let rows = view.rows.iter().map(|r| (r, r.tokens.clone())).collect();
            let mut pass = Pass {
                x: &mut x,
                pos: plan.positions[..tp].to_vec(),
                rows,
            };
            for layer in 0..first_cross {
                self.layer(plan, &mut pass, layer, Some(&plan.slot_mapping), tables)
                    .map_err(ctx)?;
            }
        }
        if first_cross == nl {
            return view
                .samples
                .iter()
                .map(|s| self.sample(&x[s.token], s.token))
                .collect::<Result<_>>()
                .map_err(ctx);
        }
        let sel: Vec<usize> = plan.cross_indices.iter().map(|&i| i as usize).collect();
        let mut xc: Vec<Vec<f32>> = sel.iter().map(|&i| x[i].clone()).collect();
        {
            let rows = view.rows.iter().map(|r| (r, r.cross.clone())).collect();
            let pos = sel.iter().map(|&i| plan.positions[i]).collect();
            let mut pass = Pass {
                x: &mut xc,
                pos,
                rows,
            };
            for layer in first_cross..nl {
                self.layer(plan, &mut pass, layer, None, tables)
                    .map_err(ctx)?;
            }
        }
        view.samples
            .iter()
            .map(|s| self.sample(&xc[s.cross_pos], s.token))
            .collect::<Result<_>>()
            .map_err(ctx)
    }

    /// Greedy token of a final hidden state. Memory starts as NaN, so a NaN here means the
    /// request attended to a slot nothing wrote: an error, not a token (argmax over NaN would
    /// quietly answer 0).
    fn sample(&self, x: &[f32], token: usize) -> Result<i32> {
        if x.iter().any(|v| v.is_nan()) {
            return Err(Error(format!("the hidden state sampled at token {token} is NaN: its request read never-written KV")));
        }
        Ok(self.model.argmax(x) as i32)
    }

    /// One layer over a pass: q/k/v for every query (padding included, as an executor would),
    /// K/V written through `slot_mapping` when the layer produces them, attention per row over the
    /// paged memory, then the rest of the layer. Queries outside every row (padding) attend to
    /// nothing; their results are never read.
    fn layer(
        &mut self,
        plan: &StepPlan,
        pass: &mut Pass,
        layer: usize,
        slot_mapping: Option<&[i64]>,
        tables: &TableMirror,
    ) -> Result<()> {
        let m = &self.model;
        let h = m.cfg.heads;
        let n = pass.x.len();
        let qkv: Vec<_> = (0..n)
            .map(|i| m.qkv(layer, &pass.x[i], pass.pos[i]))
            .collect();
        let at = m.layout.kv_of[layer];
        if m.layout.is_producer(layer) {
            let slots = slot_mapping
                .ok_or_else(|| Error::msg(format!("cross-decoder layer {layer} produces K/V")))?;
            let tp = n;
            let (mut k, mut v) = (
                Vec::with_capacity(n * h.kv_len()),
                Vec::with_capacity(n * h.kv_len()),
            );
            for e in &qkv {
                let (kk, vv) = e.kv.as_ref().unwrap();
                k.extend_from_slice(kk);
                v.extend_from_slice(vv);
            }
            self.paged.write_kv_slices(
                at.group,
                at.slot,
                &slots[at.group * tp..(at.group + 1) * tp],
                &k,
                &v,
            )?;
        }
        let window = m.layout.window(layer);
        let mut attn = vec![vec![0f32; h.q_len()]; n];
        for (row, qs) in &pass.rows {
            if qs.is_empty() {
                continue;
            }
            let first = row.seq_len - qs.len();
            let lo = visible(first, window).start;
            let table = tables.row(at.group, row.req_row);
            let (k, v) = self
                .paged
                .gather_vecs(at.group, at.slot, table, lo, row.seq_len)
                .map_err(|e| Error(format!("request {} layer {layer}: {e}", row.req_id)))?;
            for (i, qi) in qs.clone().enumerate() {
                crate::attention::attend(
                    h,
                    &qkv[qi].q,
                    &k,
                    &v,
                    lo,
                    first + i,
                    window,
                    m.cfg.scale,
                    &mut attn[qi],
                );
            }
        }
        let _ = plan;
        for (x, a) in pass.x.iter_mut().zip(&attn) {
            *x = m.finish(layer, x, a);
        }
        Ok(())
    }
}
