//! `StepPlan` and `StepOutcome`: immutable Python views of one step's flat arrays. The Rust buffers
//! are moved in (no copy); each array attribute is a numpy view of the Rust buffer whose base is the
//! plan (or outcome) object, created per access in O(1). Views are not cached on the object: a cache
//! would form a reference cycle (object -> view -> base object) that numpy arrays, which the garbage
//! collector does not track, would leak.
//!
//! When the object dies (all its views gone too), its buffers go back to the scheduler through a
//! one-slot bin, so the next step writes into warm, already allocated memory. The Rust step loop
//! shares its plan instead (`StepPlan::shared`): the object holds one reference of the loop's
//! `Arc`, and the loop recycles the buffers once the object is gone.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use yoco_core::sched as core;

use crate::arrays::{view1, view2};

/// Where a dead plan's or outcome's buffers wait for the scheduler to take them back.
pub type Bin<T> = Arc<Mutex<Option<T>>>;

fn give_back<T: Default>(bin: &Option<Bin<T>>, value: &mut T) {
    if let Some(bin) = bin {
        if let Ok(mut slot) = bin.lock() {
            if slot.is_none() {
                *slot = Some(std::mem::take(value));
            }
        }
    }
}

#[pyclass(frozen, module = "yoco_rs._core", name = "StepPlan")]
pub struct StepPlan {
    /// Never mutated while the object lives (views point into it); unique unless shared with the
    /// Rust step loop.
    pub(crate) plan: Arc<core::StepPlan>,
    num_groups: usize,
    bin: Option<Bin<core::StepPlan>>,
}

impl StepPlan {
    pub fn new(plan: core::StepPlan, num_groups: usize, bin: Option<Bin<core::StepPlan>>) -> Self {
        StepPlan {
            plan: Arc::new(plan),
            num_groups,
            bin,
        }
    }

    /// A view of a plan the Rust step loop owns too (no copy, no bin: the loop recycles it).
    pub fn shared(plan: Arc<core::StepPlan>, num_groups: usize) -> Self {
        StepPlan {
            plan,
            num_groups,
            bin: None,
        }
    }
}

impl Drop for StepPlan {
    fn drop(&mut self) {
        if let Some(plan) = Arc::get_mut(&mut self.plan) {
            give_back(&self.bin, plan);
        }
    }
}

/// One `#[pymethods]` block: 1-D array getters plus the items given after them.
macro_rules! plan_methods {
    ([$($name:ident),* $(,)?] $($rest:tt)*) => {
        #[pymethods]
        impl StepPlan {
            $(
                #[getter]
                fn $name<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
                    // SAFETY: the plan is frozen inside `slf`, so the buffer never moves or changes
                    // while the view (which holds `slf`) lives.
                    unsafe { view1(&slf.get().plan.$name, slf.as_any()) }
                }
            )*
            $($rest)*
        }
    };
}

plan_methods! {
    [
        req_ids, req_rows, query_start_loc, seq_lens, input_ids, positions, logits_indices, sample_rows,
        cross_indices, cross_query_start_loc, logits_cross_pos, admitted_ids, admitted_rows,
        admitted_num_cached, preempted_ids, dirty_rows, placeholder_indices, placeholder_sources,
    ]

    /// `[G, T_pad]` int64 KV slot of each token in each group.
    #[getter]
    fn slot_mapping<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        let this = slf.get();
        let t = this.plan.num_tokens_padded as usize;
        // SAFETY: as in the 1-D getters.
        unsafe { view2(&this.plan.slot_mapping, this.num_groups, t, slf.as_any()) }
    }

    /// `[C, 4]` int32 rows `(group, src_block, dst_block, num_tokens)`.
    #[getter]
    fn kv_copies<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        let c = &slf.get().plan.kv_copies;
        // SAFETY: as in the 1-D getters.
        unsafe { view2(c, c.len() / 4, 4, slf.as_any()) }
    }

    #[getter]
    fn step_id(&self) -> u64 {
        self.plan.step_id
    }
    #[getter]
    fn num_rows(&self) -> usize {
        self.plan.num_rows()
    }
    #[getter]
    fn num_samples(&self) -> usize {
        self.plan.num_samples()
    }
    /// Placeholder inputs (async scheduling): `input_ids[placeholder_indices]` are to be read from
    /// the previous step's sampled ids at `placeholder_sources` before the forward.
    #[getter]
    fn num_placeholders(&self) -> usize {
        self.plan.num_placeholders()
    }
    #[getter]
    fn num_tokens(&self) -> u32 {
        self.plan.num_tokens
    }
    #[getter]
    fn num_tokens_padded(&self) -> u32 {
        self.plan.num_tokens_padded
    }
    #[getter]
    fn num_cross(&self) -> u32 {
        self.plan.num_cross
    }
    #[getter]
    fn num_cross_padded(&self) -> u32 {
        self.plan.num_cross_padded
    }
    #[getter]
    fn max_query_len(&self) -> u32 {
        self.plan.max_query_len
    }
    #[getter]
    fn max_seq_len(&self) -> u32 {
        self.plan.max_seq_len
    }
    #[getter]
    fn num_groups(&self) -> usize {
        self.num_groups
    }

    fn __len__(&self) -> usize {
        self.plan.num_rows()
    }

    fn __repr__(&self) -> String {
        let p = &self.plan;
        format!(
            "StepPlan(step_id={}, num_rows={}, num_tokens={}, num_tokens_padded={}, num_samples={}, num_cross={}, num_cross_padded={}, kv_copies={}, admitted={}, preempted={})",
            p.step_id,
            p.num_rows(),
            p.num_tokens,
            p.num_tokens_padded,
            p.num_samples(),
            p.num_cross,
            p.num_cross_padded,
            p.kv_copies.len() / 4,
            p.admitted_ids.len(),
            p.preempted_ids.len()
        )
    }
}

#[pyclass(frozen, module = "yoco_rs._core", name = "StepOutcome")]
pub struct StepOutcome {
    out: core::StepOutcome,
    bin: Option<Bin<core::StepOutcome>>,
}

impl StepOutcome {
    pub fn new(out: core::StepOutcome, bin: Option<Bin<core::StepOutcome>>) -> Self {
        StepOutcome { out, bin }
    }
}

impl Drop for StepOutcome {
    fn drop(&mut self) {
        give_back(&self.bin, &mut self.out);
    }
}

#[pymethods]
impl StepOutcome {
    /// `[K]` uint64 ids of the requests that received a token this step.
    #[getter]
    fn req_ids<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        // SAFETY: the outcome is frozen inside `slf`, which the view holds.
        unsafe { view1(&slf.get().out.req_ids, slf.as_any()) }
    }
    /// `[K]` int32 appended token (-1: none).
    #[getter]
    fn new_tokens<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        unsafe { view1(&slf.get().out.new_tokens, slf.as_any()) }
    }
    /// `[K]` uint8: 0 running, else a finish reason code.
    #[getter]
    fn finish_reasons<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        unsafe { view1(&slf.get().out.finish_reasons, slf.as_any()) }
    }
    /// Number of requests finished this step.
    #[getter]
    fn num_finished(&self) -> usize {
        self.out
            .finish_reasons
            .iter()
            .filter(|&&r| r != core::NOT_FINISHED)
            .count()
    }
    fn __len__(&self) -> usize {
        self.out.req_ids.len()
    }
    fn __repr__(&self) -> String {
        format!(
            "StepOutcome(len={}, finished={})",
            self.out.req_ids.len(),
            self.num_finished()
        )
    }
}
