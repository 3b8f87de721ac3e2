//! `Scheduler`: the Rust scheduler behind O(1) calls per step. `schedule()` and `update()` release
//! the GIL around the Rust work; plans and outcomes are moved into numpy without copying; block
//! tables are persistent numpy views of Rust buffers, updated in place by `schedule()`.

use numpy::PyReadonlyArray1;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use yoco_core::kv::{kv_groups, HashExtras, KvConfig, KvEventBatch, MmPlaceholder};
use yoco_core::sched::{self as core, FinishReason, NewRequest, SchedulerConfig};

use crate::arrays::view2;
use crate::convert;
use crate::errors::to_py;
use crate::plan::{Bin, StepOutcome, StepPlan};

#[pyclass(module = "yoco_rs._core", name = "Scheduler")]
pub struct Scheduler {
    pub(crate) inner: core::Scheduler,
    /// Buffers of dead plans and outcomes, reused by the next step.
    plan_bin: Bin<core::StepPlan>,
    outcome_bin: Bin<core::StepOutcome>,
    /// KV-event publisher fed after every `update` (and reset), once `start_kv_events` ran.
    pub(crate) kv_publisher: Option<yoco_events::Publisher>,
    /// The empty batch the core collects into next (swapped with the full one at each hand-off).
    kv_spare: KvEventBatch,
}

impl Scheduler {
    /// Hands the events collected since the last call to the publisher, if one runs.
    fn publish_kv_events(&mut self) {
        if let Some(p) = &mut self.kv_publisher {
            if self.inner.has_kv_events() {
                let spare = std::mem::take(&mut self.kv_spare);
                self.kv_spare = p.publish(self.inner.swap_kv_events(spare));
            }
        }
    }
}

fn finish_reason(code: u8) -> PyResult<FinishReason> {
    Ok(match code {
        1 => FinishReason::Stop,
        2 => FinishReason::StopToken,
        3 => FinishReason::Length,
        4 => FinishReason::Abort,
        5 => FinishReason::StopString,
        _ => {
            return Err(PyValueError::new_err(format!(
            "reason_code = {code}: expected 1..=5 (stop, stop_token, length, abort, stop_string)"
        )))
        }
    })
}

#[pymethods]
impl Scheduler {
    #[new]
    #[pyo3(signature = (
        layer_kinds, *, num_blocks, block_size = 16, sub_block_size = None, max_num_seqs = 256,
        max_num_batched_tokens = 8192, max_model_len = 4096, long_prefill_token_threshold = 0,
        enable_prefix_caching = true, policy = "fcfs", max_admission_skips = core::DEFAULT_MAX_ADMISSION_SKIPS,
        token_capture_sizes = Vec::new(), cross_capture_sizes = Vec::new(), enable_kv_events = false,
        hash_seed = None, max_num_encoder_input_tokens = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        layer_kinds: Vec<String>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: u32,
        sub_block_size: Option<u32>,
        max_num_seqs: u32,
        max_num_batched_tokens: u32,
        max_model_len: u32,
        long_prefill_token_threshold: u32,
        enable_prefix_caching: bool,
        policy: &str,
        max_admission_skips: u32,
        token_capture_sizes: Vec<u32>,
        cross_capture_sizes: Vec<u32>,
        enable_kv_events: bool,
        hash_seed: Option<Vec<u8>>,
        max_num_encoder_input_tokens: Option<u32>,
    ) -> PyResult<Self> {
        let layers = convert::layer_kinds(&layer_kinds)?;
        let groups = kv_groups(&layers).map_err(to_py)?;
        let config = SchedulerConfig {
            kv: KvConfig {
                block_size,
                sub_block_size: sub_block_size.unwrap_or(block_size),
                num_blocks: convert::num_blocks(num_blocks, groups.len())?,
                enable_prefix_caching,
                enable_events: enable_kv_events,
                hash_seed,
                max_num_batched_tokens,
            },
            layers,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            long_prefill_token_threshold,
            policy: convert::policy(policy)?,
            max_admission_skips,
            max_num_encoder_input_tokens: max_num_encoder_input_tokens
                .unwrap_or(max_num_batched_tokens),
            token_capture_sizes,
            cross_capture_sizes,
        };
        let inner = py.detach(|| core::Scheduler::new(config)).map_err(to_py)?;
        Ok(Scheduler {
            inner,
            plan_bin: Bin::default(),
            outcome_bin: Bin::default(),
            kv_publisher: None,
            kv_spare: KvEventBatch::new(),
        })
    }

    /// KV groups: `{"kind", "window", "layers", "readers"}` each.
    fn kv_groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for g in self.inner.kv_groups() {
            list.append(convert::group_dict(py, g)?)?;
        }
        Ok(list)
    }

    #[pyo3(signature = (
        req_id, prompt, *, max_tokens, min_tokens = 0, eos_token_ids = Vec::new(), stop_token_ids = Vec::new(),
        ignore_eos = false, priority = 0, cache_salt = None, lora_name = None, lora_path = None,
        prompt_logprobs = false, after = None, mm_placeholders = Vec::new()
    ))]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &mut self,
        py: Python<'_>,
        req_id: u64,
        prompt: &Bound<'_, PyAny>,
        max_tokens: u32,
        min_tokens: u32,
        eos_token_ids: Vec<u32>,
        stop_token_ids: Vec<u32>,
        ignore_eos: bool,
        priority: i32,
        cache_salt: Option<String>,
        lora_name: Option<String>,
        lora_path: Option<String>,
        prompt_logprobs: bool,
        after: Option<u64>,
        mm_placeholders: Vec<(u32, u32, String)>,
    ) -> PyResult<()> {
        if lora_path.is_some() && lora_name.is_none() {
            return Err(PyValueError::new_err("lora_path given without lora_name"));
        }
        let req = NewRequest {
            id: req_id,
            prompt: convert::prompt(prompt)?,
            max_tokens,
            min_tokens,
            eos_token_ids,
            stop_token_ids,
            ignore_eos,
            priority,
            hash_extras: HashExtras {
                cache_salt,
                lora: lora_name.map(|n| (n, lora_path.unwrap_or_default())),
            },
            prompt_logprobs,
            after,
        };
        let mm = mm_placeholders
            .into_iter()
            .map(MmPlaceholder::from)
            .collect();
        let inner = &mut self.inner;
        py.detach(|| inner.add_request_mm(req, mm)).map_err(to_py)
    }

    /// Aborts a request in any state, freeing everything; False for an unknown id.
    fn abort(&mut self, req_id: u64) -> bool {
        self.inner.abort(req_id)
    }

    /// Finishes a request for an engine-side reason (code 1..=5, e.g. 5 = stop string).
    fn finish(&mut self, req_id: u64, reason_code: u8) -> PyResult<bool> {
        Ok(self.inner.finish(req_id, finish_reason(reason_code)?))
    }

    /// Plans the next step (the GIL is released while Rust works).
    fn schedule(&mut self, py: Python<'_>) -> PyResult<StepPlan> {
        if self.inner.awaiting_update() {
            return Err(PyRuntimeError::new_err(
                "schedule() called again before update() consumed the previous plan",
            ));
        }
        let recycled = self.plan_bin.lock().ok().and_then(|mut b| b.take());
        let inner = &mut self.inner;
        let plan = py.detach(|| {
            if let Some(old) = recycled {
                inner.recycle_plan(old);
            }
            inner.schedule();
            inner.take_plan()
        });
        Ok(StepPlan::new(
            plan,
            self.inner.num_groups(),
            Some(self.plan_bin.clone()),
        ))
    }

    /// Applies the sampled tokens (1-D int32 numpy array or list of ints, one per `logits_indices`
    /// entry of the last plan).
    fn update(&mut self, py: Python<'_>, sampled: &Bound<'_, PyAny>) -> PyResult<StepOutcome> {
        if let Some(old) = self.outcome_bin.lock().ok().and_then(|mut b| b.take()) {
            self.inner.recycle_outcome(old);
        }
        let inner = &mut self.inner;
        let res = if let Ok(a) = sampled.extract::<PyReadonlyArray1<'_, i32>>() {
            match a.as_slice() {
                Ok(s) => py.detach(|| inner.update(s).map(|_| ())),
                Err(_) => {
                    let v = a.as_array().to_vec();
                    py.detach(|| inner.update(&v).map(|_| ()))
                }
            }
        } else if let Ok(v) = sampled.extract::<Vec<i32>>() {
            py.detach(|| inner.update(&v).map(|_| ()))
        } else {
            return Err(PyValueError::new_err(
                "sampled: expected a 1-D int32 numpy array (e.g. torch int32 tensor .numpy()) or a list of ints",
            ));
        };
        res.map_err(to_py)?;
        self.publish_kv_events();
        Ok(StepOutcome::new(
            self.inner.take_outcome(),
            Some(self.outcome_bin.clone()),
        ))
    }

    /// Per group, the persistent `[max_num_seqs, max_blocks_per_seq]` int32 block table as a numpy
    /// view of the Rust buffer (base: this scheduler), updated in place by `schedule()`: fetch the
    /// views once, read them between calls, never write. Not cached here (a cycle through the views
    /// would leak the scheduler); every call returns new views of the same buffers.
    fn block_tables<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let this = slf.borrow();
        let rows = this.inner.config().max_num_seqs as usize;
        let cols = this.inner.max_blocks_per_seq();
        // SAFETY: each table is allocated once at construction and never reallocated; the view
        // keeps the scheduler object (its owner) alive.
        let views = (0..this.inner.num_groups())
            .map(|g| unsafe { view2(this.inner.block_table(g), rows, cols, slf.as_any()) });
        PyList::new(slf.py(), views)
    }

    #[getter]
    fn max_blocks_per_seq(&self) -> usize {
        self.inner.max_blocks_per_seq()
    }

    #[getter]
    fn num_groups(&self) -> usize {
        self.inner.num_groups()
    }

    #[getter]
    fn num_unfinished(&self) -> usize {
        self.inner.num_unfinished()
    }

    /// Whether `req_id` is live (waiting, preempted or running).
    fn contains(&self, req_id: u64) -> bool {
        self.inner.contains(req_id)
    }

    fn __contains__(&self, req_id: u64) -> bool {
        self.inner.contains(req_id)
    }

    /// `running`, `waiting`, `preemptions`, and every KV metric.
    /// Also `kv_events_published` and `kv_events_dropped` (batches dropped on a full publisher queue
    /// plus events the core's bounded log discarded).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = convert::stats_dict(py, &self.inner.stats())?;
        let (published, dropped) = self
            .kv_publisher
            .as_ref()
            .map_or((0, 0), |p| (p.published(), p.dropped()));
        d.set_item("kv_events_published", published)?;
        d.set_item(
            "kv_events_dropped",
            dropped + self.inner.kv_events_dropped(),
        )?;
        Ok(d)
    }

    /// KV events since the last call (empty unless `enable_kv_events`).
    fn take_kv_events<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.inner.take_kv_events();
        convert::events_list(py, events)
    }

    /// Drops every prefix-cache entry; False while any block is referenced.
    fn reset_prefix_cache(&mut self) -> bool {
        let done = self.inner.reset_prefix_cache();
        self.publish_kv_events();
        done
    }

    /// Starts publishing KV events in vLLM's ZMQ format (`yoco_events::PublisherConfig` documents
    /// each key); from now on every `update` hands its events to the publisher thread. Needs
    /// `enable_kv_events=True`. `group=None` publishes every KV group with its `group_idx`.
    #[pyo3(signature = (
        endpoint, *, replay_endpoint = None, buffer_steps = 10_000, hwm = 100_000,
        max_queue_size = 100_000, topic = String::new(), encoding = "array", block_size = 16,
        group = Some(0), data_parallel_rank = None, medium = "GPU".to_string()
    ))]
    #[allow(clippy::too_many_arguments)]
    fn start_kv_events(
        &mut self,
        py: Python<'_>,
        endpoint: String,
        replay_endpoint: Option<String>,
        buffer_steps: usize,
        hwm: usize,
        max_queue_size: usize,
        topic: String,
        encoding: &str,
        block_size: u32,
        group: Option<u32>,
        data_parallel_rank: Option<i64>,
        medium: String,
    ) -> PyResult<()> {
        if !self.inner.config().kv.enable_events {
            return Err(PyValueError::new_err(
                "start_kv_events needs Scheduler(enable_kv_events=True)",
            ));
        }
        if self.kv_publisher.is_some() {
            return Err(PyRuntimeError::new_err(
                "KV events are already being published",
            ));
        }
        let cfg = yoco_events::PublisherConfig {
            endpoint,
            replay_endpoint,
            buffer_steps,
            hwm,
            max_queue_size,
            topic,
            encoding: encoding.parse().map_err(PyValueError::new_err)?,
            block_size,
            sub_block_size: self.inner.config().kv.sub_block_size,
            group,
            data_parallel_rank,
            medium,
        };
        let publisher = py
            .detach(|| yoco_events::Publisher::start(cfg))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.kv_publisher = Some(publisher);
        Ok(())
    }

    /// Sends what is queued (at most `timeout_s`) and closes the event sockets.
    #[pyo3(signature = (timeout_s = 1.0))]
    fn stop_kv_events(&mut self, py: Python<'_>, timeout_s: f64) {
        if let Some(mut p) = self.kv_publisher.take() {
            py.detach(|| p.shutdown(std::time::Duration::from_secs_f64(timeout_s.max(0.0))));
        }
    }

    /// `{"published", "dropped", "send_errors", "log_dropped"}`: batches sent, batches dropped on a
    /// full queue, sends refused by the socket, and events the core's bounded log discarded.
    fn kv_events_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        use std::sync::atomic::Ordering::Relaxed;
        let d = PyDict::new(py);
        let (published, dropped, errors) = match &self.kv_publisher {
            Some(p) => {
                let s = p.stats();
                (
                    s.published.load(Relaxed),
                    s.dropped.load(Relaxed),
                    s.send_errors.load(Relaxed),
                )
            }
            None => (0, 0, 0),
        };
        d.set_item("published", published)?;
        d.set_item("dropped", dropped)?;
        d.set_item("send_errors", errors)?;
        d.set_item("log_dropped", self.inner.kv_events_dropped())?;
        Ok(d)
    }

    /// Checks every scheduler and block-manager invariant (O(pool); tests). Raises AssertionError.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.check_invariants())
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }
}
