//! `StepPlan` and `StepOutcome`: immutable Python views of one step's flat arrays. The Rust buffers
//! are moved in (no copy); each array attribute is a numpy view created on first access and cached,
//! so an access is O(1) and returns the same object every time. Views keep the plan alive.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use yoco_core::sched as core;

use crate::arrays::{view1, view2};

/// Cached views, one per array attribute.
const NUM_PLAN_ARRAYS: usize = 18;

#[pyclass(frozen, module = "yoco_rs._core", name = "StepPlan")]
pub struct StepPlan {
    pub(crate) plan: core::StepPlan,
    num_groups: usize,
    views: [PyOnceLock<Py<PyAny>>; NUM_PLAN_ARRAYS],
}

impl StepPlan {
    pub fn new(plan: core::StepPlan, num_groups: usize) -> Self {
        StepPlan { plan, num_groups, views: std::array::from_fn(|_| PyOnceLock::new()) }
    }

    fn cached<'py>(
        slf: &Bound<'py, Self>,
        k: usize,
        make: impl FnOnce(&core::StepPlan, usize, &Bound<'py, PyAny>) -> Bound<'py, PyAny>,
    ) -> Bound<'py, PyAny> {
        let py = slf.py();
        let this = slf.get();
        let owner = slf.as_any();
        this.views[k].get_or_init(py, || make(&this.plan, this.num_groups, owner).unbind()).bind(py).clone()
    }
}

/// One `#[pymethods]` block: cached 1-D array getters plus the items given after them.
macro_rules! plan_methods {
    ([$($k:literal $name:ident),* $(,)?] $($rest:tt)*) => {
        #[pymethods]
        impl StepPlan {
            $(
                #[getter]
                fn $name<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
                    // SAFETY: the plan is frozen inside `slf`, so the buffer never moves or changes.
                    Self::cached(slf, $k, |p, _, owner| unsafe { view1(&p.$name, owner) })
                }
            )*
            $($rest)*
        }
    };
}

plan_methods! {
    [
        0 req_ids, 1 req_rows, 2 query_start_loc, 3 seq_lens, 4 input_ids, 5 positions,
        6 logits_indices, 7 sample_rows, 8 cross_indices, 9 cross_query_start_loc, 10 logits_cross_pos,
        11 admitted_ids, 12 admitted_rows, 13 admitted_num_cached, 14 preempted_ids, 15 dirty_rows,
    ]
    /// `[G, T_pad]` int64 KV slot of each token in each group.
    #[getter]
    fn slot_mapping<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        Self::cached(slf, 16, |p, g, owner| {
            let t = p.num_tokens_padded as usize;
            // SAFETY: as in the 1-D getters.
            unsafe { view2(&p.slot_mapping, g, t, owner) }
        })
    }

    /// `[C, 4]` int32 rows `(group, src_block, dst_block, num_tokens)`.
    #[getter]
    fn kv_copies<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        Self::cached(slf, 17, |p, _, owner| unsafe { view2(&p.kv_copies, p.kv_copies.len() / 4, 4, owner) })
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
    views: [PyOnceLock<Py<PyAny>>; 3],
}

impl StepOutcome {
    pub fn new(out: core::StepOutcome) -> Self {
        StepOutcome { out, views: std::array::from_fn(|_| PyOnceLock::new()) }
    }

    fn cached<'py>(slf: &Bound<'py, Self>, k: usize, make: impl FnOnce(&core::StepOutcome, &Bound<'py, PyAny>) -> Bound<'py, PyAny>) -> Bound<'py, PyAny> {
        let py = slf.py();
        let this = slf.get();
        this.views[k].get_or_init(py, || make(&this.out, slf.as_any()).unbind()).bind(py).clone()
    }
}

#[pymethods]
impl StepOutcome {
    /// `[K]` uint64 ids of the requests that received a token this step.
    #[getter]
    fn req_ids<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        // SAFETY: the outcome is frozen inside `slf`.
        Self::cached(slf, 0, |o, owner| unsafe { view1(&o.req_ids, owner) })
    }
    /// `[K]` int32 appended token (-1: none).
    #[getter]
    fn new_tokens<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        Self::cached(slf, 1, |o, owner| unsafe { view1(&o.new_tokens, owner) })
    }
    /// `[K]` uint8: 0 running, else a finish reason code.
    #[getter]
    fn finish_reasons<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyAny> {
        Self::cached(slf, 2, |o, owner| unsafe { view1(&o.finish_reasons, owner) })
    }
    /// Number of requests finished this step.
    #[getter]
    fn num_finished(&self) -> usize {
        self.out.finish_reasons.iter().filter(|&&r| r != core::NOT_FINISHED).count()
    }
    fn __len__(&self) -> usize {
        self.out.req_ids.len()
    }
    fn __repr__(&self) -> String {
        format!("StepOutcome(len={}, finished={})", self.out.req_ids.len(), self.num_finished())
    }
}
