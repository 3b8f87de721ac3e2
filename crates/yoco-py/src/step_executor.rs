//! [`PyStepExecutor`]: `yoco_server::Executor` over the Python `StepExecutor`
//! (`python/yoco_rs/executor/step_executor.py`), with the GIL held only for each call:
//! `add_request` / `remove_request` once per request, `launch` and `collect` once per step. Per step
//! the plan crosses as the same zero-copy `StepPlan` object the Python engine uses (sharing the
//! loop's buffers, not a copy), and the block-table rows of the plan as one `[R, cols]` int32 array
//! per KV group. [`start_loop`] starts a Rust step loop over one `(scheduler, executor)` pair: what
//! `serve_http` runs per data-parallel rank and what `EngineLoop` (the Python engines' loop) runs.

use numpy::ndarray::Array2;
use numpy::IntoPyArray;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use yoco_server::{
    EngineHandle, ExecError, Executor, GenParams, KvEventSink, LoopConfig, StepInputs, StepOutput,
};
use yoco_text::Tokenizer;

use crate::plan::StepPlan;
use crate::scheduler::Scheduler;
use crate::serve_media::PyItems;
use crate::serve_sampling::{read_output, PyStepMasks};

/// The Python executor behind the Rust step loop.
pub(crate) struct PyStepExecutor {
    obj: Py<PyAny>,
    num_groups: usize,
    block_size: usize,
    out: StepOutput,
}

pub(crate) fn exec_err(py: Python<'_>, e: PyErr) -> ExecError {
    let tb = e
        .traceback(py)
        .and_then(|t| t.format().ok())
        .unwrap_or_default();
    ExecError(format!(
        "{}: {}{}",
        e.get_type(py)
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default(),
        e.value(py),
        if tb.is_empty() {
            String::new()
        } else {
            format!("\n{tb}")
        }
    ))
}

impl Executor for PyStepExecutor {
    fn add_request(&mut self, id: u64, p: &GenParams) {
        Python::attach(|py| {
            let kw = PyDict::new(py);
            let s = &p.sampling;
            let _ = kw.set_item("temperature", s.temperature);
            let _ = kw.set_item("top_p", s.top_p);
            let _ = kw.set_item("top_k", s.top_k);
            let _ = kw.set_item("min_p", s.min_p);
            let _ = kw.set_item("seed", s.seed);
            let _ = kw.set_item("min_tokens", p.min_tokens);
            let _ = kw.set_item("ignore_eos", p.ignore_eos);
            let _ = kw.set_item("stop_token_ids", p.stop_token_ids.clone());
            let _ = kw.set_item("presence_penalty", s.presence_penalty);
            let _ = kw.set_item("frequency_penalty", s.frequency_penalty);
            let _ = kw.set_item("repetition_penalty", s.repetition_penalty);
            let _ = kw.set_item("logprobs", p.logprobs.map_or(-1, i64::from));
            if let Some(m) = p.media.as_ref() {
                if let Some(items) = m.items.0.downcast_ref::<PyItems>() {
                    let _ = kw.set_item("mm_items", items.0.bind(py));
                }
            }
            let prompt = p
                .prompt
                .iter()
                .map(|&t| t as i32)
                .collect::<Vec<_>>()
                .into_pyarray(py);
            if let Err(e) = self
                .obj
                .call_method(py, "add_request", (id, prompt), Some(&kw))
            {
                // Its first step will fail in `launch` (the executor has no parameters for it) and be
                // contained there; say why now.
                eprintln!(
                    "yoco-serve: executor.add_request({id}) failed: {}",
                    exec_err(py, e)
                );
            }
        })
    }

    fn remove_request(&mut self, id: u64) {
        Python::attach(|py| {
            let _ = self.obj.call_method1(py, "remove_request", (id,));
        })
    }

    fn launch(&mut self, step: &StepInputs<'_>) -> Result<(), ExecError> {
        let plan = step.plan;
        // Block-table rows of the plan, trimmed to the columns its longest sequence can use.
        let rows = plan.req_rows.len();
        let cols = step
            .max_blocks_per_seq
            .min((plan.max_seq_len as usize).div_ceil(self.block_size) + 1);
        let tables: Vec<Array2<i32>> = (0..self.num_groups)
            .map(|g| {
                let t = step.tables[g];
                let mut a = Array2::<i32>::zeros((rows, cols));
                for (r, &row) in plan.req_rows.iter().enumerate() {
                    let base = row as usize * step.max_blocks_per_seq;
                    a.row_mut(r)
                        .as_slice_mut()
                        .expect("row-major")
                        .copy_from_slice(&t[base..base + cols]);
                }
                a
            })
            .collect();
        Python::attach(|py| {
            let plan_obj = Py::new(py, StepPlan::shared(plan.clone(), self.num_groups))
                .map_err(|e| exec_err(py, e))?;
            let tabs = PyList::empty(py);
            for a in tables {
                tabs.append(a.into_pyarray(py))
                    .map_err(|e| exec_err(py, e))?;
            }
            let resumed = PyDict::new(py);
            for (id, toks) in step.resumed {
                let v: Vec<i64> = toks.iter().map(|&t| t as i64).collect();
                resumed
                    .set_item(id, v.into_pyarray(py))
                    .map_err(|e| exec_err(py, e))?;
            }
            let masks = match step.masks {
                Some(m) => Some(
                    Py::new(py, PyStepMasks { inner: m.clone() }).map_err(|e| exec_err(py, e))?,
                ),
                None => None,
            };
            let ps = step.prompt_scoring;
            let scoring = (!ps.is_empty()).then(|| {
                let rows: Vec<i64> = ps.rows.iter().map(|&x| x as i64).collect();
                let targets: Vec<i64> = ps.targets.iter().map(|&x| x as i64).collect();
                (rows.into_pyarray(py), targets.into_pyarray(py), ps.k)
            });
            self.obj
                .call_method1(py, "launch", (plan_obj, tabs, resumed, masks, scoring))
                .map_err(|e| exec_err(py, e))?;
            Ok(())
        })
    }

    fn collect(&mut self) -> Result<&StepOutput, ExecError> {
        let out = &mut self.out;
        Python::attach(|py| -> Result<(), ExecError> {
            let r = self
                .obj
                .call_method0(py, "collect")
                .map_err(|e| exec_err(py, e))?;
            read_output(r.bind(py), out)
        })?;
        Ok(&self.out)
    }
}

/// How a loop over the Python executor runs (the rest of [`LoopConfig`] comes from the scheduler).
pub(crate) struct LoopSettings<'a> {
    /// Decodes outputs.
    pub tokenizer: &'a Tokenizer,
    /// End-of-sequence ids.
    pub eos_token_ids: &'a [u32],
    /// Failed steps in a row after which the loop stops.
    pub max_consecutive_failures: u32,
    /// Plan step N+1 while step N runs.
    pub async_scheduling: bool,
}

/// The loop's configuration and executor over `executor`, with a copy of `scheduler`'s
/// configuration (the Python scheduler itself is not stepped) and the KV-event publisher the
/// runtime started on it (`--kv-events-config`), which moves to the loop that now makes the events.
pub(crate) fn loop_parts(
    py: Python<'_>,
    scheduler: &Py<Scheduler>,
    executor: Py<PyAny>,
    s: &LoopSettings<'_>,
) -> (LoopConfig, Box<dyn Executor>) {
    let (config, num_groups, publisher) = {
        let mut sc = scheduler.borrow_mut(py);
        let publisher = sc.kv_publisher.take();
        (sc.inner.config().clone(), sc.inner.num_groups(), publisher)
    };
    let block_size = config.kv.block_size as usize;
    let exec = PyStepExecutor {
        obj: executor,
        num_groups,
        block_size,
        out: StepOutput::default(),
    };
    let lc = LoopConfig {
        scheduler: config,
        tokenizer: s.tokenizer.clone(),
        eos_token_ids: s.eos_token_ids.to_vec(),
        max_consecutive_failures: s.max_consecutive_failures,
        async_scheduling: s.async_scheduling,
        kv_events: publisher.map(KvEventSink::new),
    };
    (lc, Box::new(exec))
}

/// Starts a Rust step loop on its own thread driving `executor` ([`loop_parts`]). With `rt`, the
/// loop's events are delivered by a task on that runtime.
pub(crate) fn start_loop(
    py: Python<'_>,
    scheduler: &Py<Scheduler>,
    executor: Py<PyAny>,
    s: &LoopSettings<'_>,
    rt: Option<&tokio::runtime::Handle>,
) -> PyResult<EngineHandle> {
    let (lc, exec) = loop_parts(py, scheduler, executor, s);
    match rt {
        Some(rt) => EngineHandle::start_delivering_on(lc, exec, rt),
        None => EngineHandle::start(lc, exec),
    }
    .map_err(PyValueError::new_err)
}
