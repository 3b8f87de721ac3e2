//! `MockExecutor`: the Rust mock executor (`yoco_core::mock`), for tests and benchmarks without torch.

use numpy::PyArray1;
use pyo3::prelude::*;
use yoco_core::mock::{self, TimingModel};

use crate::plan::StepPlan;
use crate::scheduler::Scheduler;

#[pyclass(module = "yoco_rs._core", name = "MockExecutor")]
pub struct MockExecutor {
    inner: mock::MockExecutor,
    /// KV-simulating mode reads this scheduler's block tables.
    scheduler: Option<Py<Scheduler>>,
}

#[pymethods]
impl MockExecutor {
    #[new]
    #[pyo3(signature = (vocab_size, *, first_token = 0, scheduler = None, base_us = 0.0, per_token_us = 0.0, per_cross_row_us = 0.0, sleep = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        vocab_size: u32,
        first_token: u32,
        scheduler: Option<Bound<'_, Scheduler>>,
        base_us: f64,
        per_token_us: f64,
        per_cross_row_us: f64,
        sleep: bool,
    ) -> PyResult<Self> {
        if vocab_size == 0 || first_token >= vocab_size {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "need 0 <= first_token < vocab_size, got first_token={first_token}, vocab_size={vocab_size}"
            )));
        }
        let mut inner = mock::MockExecutor::new(vocab_size)
            .first_token(first_token)
            .with_timing(TimingModel {
                base_us,
                per_token_us,
                per_cross_row_us,
                sleep,
            });
        if let Some(s) = &scheduler {
            inner = inner.simulating_kv_of(&s.borrow().inner);
        }
        Ok(MockExecutor {
            inner,
            scheduler: scheduler.map(Bound::unbind),
        })
    }

    /// One sampled token per `plan.logits_indices` entry, as a new int32 numpy array `[S]`.
    fn sample<'py>(
        &mut self,
        py: Python<'py>,
        plan: &Bound<'py, StepPlan>,
    ) -> Bound<'py, PyArray1<i32>> {
        let plan = &plan.get().plan;
        let out = match &self.scheduler {
            Some(s) => {
                let s = s.bind(py).borrow();
                let tables: Vec<&[i32]> = (0..s.inner.num_groups())
                    .map(|g| s.inner.block_table(g))
                    .collect();
                PyArray1::from_slice(py, self.inner.sample(plan, &tables))
            }
            None => PyArray1::from_slice(py, self.inner.sample(plan, &[])),
        };
        out
    }

    /// Modelled executor time so far (µs), from the timing model.
    #[getter]
    fn modelled_us(&self) -> f64 {
        self.inner.modelled_us()
    }

    #[getter]
    fn simulates_kv(&self) -> bool {
        self.inner.simulates_kv()
    }

    /// What the mock samples after `tokens` when every plan is right (one request alone, no cache).
    fn reference_next(&self, tokens: Vec<u32>) -> PyResult<u32> {
        if tokens.is_empty() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "tokens must not be empty",
            ));
        }
        Ok(self.inner.reference_next(&tokens))
    }
}
