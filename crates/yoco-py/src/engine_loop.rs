//! `EngineLoop`: the Rust step loop (`yoco_server::EngineHandle`, the one `yoco-serve` runs) under
//! the Python engines. `submit` queues one completion and returns its loop id; `poll` waits, with
//! the GIL released, for the events of every request and hands them over as flat tuples, one call
//! per wake-up however many requests advanced. The loop owns scheduling, detokenization and stop
//! strings; the Python side only turns events into `RequestOutput`s.
//!
//! Each request's channel is forwarded by a task on a one-worker runtime into one queue, which is
//! what `poll` reads: the loop thread pays one send per step for all of them (its delivery task runs
//! on the same runtime).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use yoco_server::media::{MediaInputs, MediaItems, MmPlaceholder};
use yoco_server::output::{Finished, StopReason};
use yoco_server::params::{Grammar, SamplingFields};
use yoco_server::{EngineHandle, Event, GenParams, PromptLogprobs, TokenLogprob};
use yoco_text::Tokenizer;

use crate::errors::EngineDied;
use crate::grammar::PyCompiledGrammar;
use crate::scheduler::Scheduler;
use crate::serve_media::PyItems;
use crate::step_executor::{start_loop, LoopSettings};

/// Events `poll` hands over per call at most (the rest wait for the next call).
const MAX_EVENTS_PER_POLL: usize = 4096;

/// A running Rust step loop over one Python executor.
#[pyclass(module = "yoco_rs._core", name = "EngineLoop", frozen)]
pub struct PyEngineLoop {
    handle: EngineHandle,
    rt: tokio::runtime::Runtime,
    events_tx: Sender<(u64, Event)>,
    events_rx: Mutex<Receiver<(u64, Event)>>,
    vocab_size: usize,
}

#[pymethods]
impl PyEngineLoop {
    /// Starts the loop on its own thread over `executor` (a `StepExecutor`), with `scheduler`'s
    /// configuration and KV-event publisher (the Python scheduler itself is not stepped).
    #[new]
    #[pyo3(signature = (scheduler, executor, *, tokenizer_file, eos_token_ids, vocab_size,
                        max_consecutive_failures = 3, async_scheduling = false))]
    fn new(
        py: Python<'_>,
        scheduler: Py<Scheduler>,
        executor: Py<PyAny>,
        tokenizer_file: String,
        eos_token_ids: Vec<u32>,
        vocab_size: usize,
        max_consecutive_failures: u32,
        async_scheduling: bool,
    ) -> PyResult<Self> {
        if max_consecutive_failures == 0 {
            return Err(PyValueError::new_err(
                "max_consecutive_failures must be >= 1",
            ));
        }
        let tok = Tokenizer::from_file(&tokenizer_file)
            .map_err(|e| PyValueError::new_err(format!("{tokenizer_file}: {e}")))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("yoco-engine-events")
            .build()
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let settings = LoopSettings {
            tokenizer: &tok,
            eos_token_ids: &eos_token_ids,
            max_consecutive_failures,
            async_scheduling,
        };
        let handle = start_loop(py, &scheduler, executor, &settings, Some(rt.handle()))?;
        let (events_tx, events_rx) = mpsc::channel();
        Ok(Self {
            handle,
            rt,
            events_tx,
            events_rx: Mutex::new(events_rx),
            vocab_size,
        })
    }

    /// Queues one completion; returns its loop id. Its events come out of `poll`, the last one
    /// finished. The caller validated it (prompt ids below the vocabulary, prompt + `max_tokens`
    /// within the context). `EngineDied` once the loop has stopped.
    #[pyo3(signature = (prompt, max_tokens, *, min_tokens = 0, ignore_eos = false,
                        stop_token_ids = Vec::new(), stop = Vec::new(), include_stop_str = false,
                        skip_special_tokens = true, stream = true, detokenize = true, cache_salt = None, priority = 0,
                        temperature = 1.0, top_p = 1.0, top_k = 0, min_p = 0.0, seed = None,
                        presence_penalty = 0.0, frequency_penalty = 0.0, repetition_penalty = 1.0,
                        logprobs = None, prompt_logprobs = None, grammar = None,
                        mm_placeholders = Vec::new(), mm_items = None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        prompt: Vec<u32>,
        max_tokens: u32,
        min_tokens: u32,
        ignore_eos: bool,
        stop_token_ids: Vec<u32>,
        stop: Vec<String>,
        include_stop_str: bool,
        skip_special_tokens: bool,
        stream: bool,
        detokenize: bool,
        cache_salt: Option<String>,
        priority: i32,
        temperature: f32,
        top_p: f32,
        top_k: u32,
        min_p: f32,
        seed: Option<u64>,
        presence_penalty: f32,
        frequency_penalty: f32,
        repetition_penalty: f32,
        logprobs: Option<u32>,
        prompt_logprobs: Option<u32>,
        grammar: Option<PyRef<'_, PyCompiledGrammar>>,
        mm_placeholders: Vec<(u32, u32, String)>,
        mm_items: Option<Py<PyAny>>,
    ) -> PyResult<u64> {
        if prompt.is_empty() {
            return Err(PyValueError::new_err("the prompt is empty"));
        }
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(PyValueError::new_err(format!(
                "prompt token id {t} is out of range for the vocabulary of {}",
                self.vocab_size
            )));
        }
        let media = mm_items.map(|items| MediaInputs {
            placeholders: mm_placeholders
                .into_iter()
                .map(MmPlaceholder::from)
                .collect(),
            items: MediaItems(std::sync::Arc::new(PyItems(items))),
        });
        let params = GenParams {
            prompt,
            max_tokens: max_tokens.max(1),
            min_tokens,
            ignore_eos,
            stop_token_ids,
            stop,
            include_stop_str,
            skip_special_tokens,
            stream,
            detokenize,
            cache_salt,
            priority,
            sampling: SamplingFields {
                temperature,
                top_p,
                top_k,
                min_p,
                seed,
                presence_penalty,
                frequency_penalty,
                repetition_penalty,
            },
            logprobs,
            prompt_logprobs,
            grammar: grammar.map(|g| Grammar {
                compiled: g.inner.clone(),
                vocab_size: self.vocab_size,
            }),
            media,
        };
        let (id, mut rx) = self
            .handle
            .submit(params)
            .map_err(|e| EngineDied::new_err(self.why_dead().unwrap_or_else(|| e.to_string())))?;
        let tx = self.events_tx.clone();
        self.rt.spawn(async move {
            while let Some(ev) = rx.recv().await {
                let last = matches!(ev, Event::Finished(_));
                if tx.send((id, ev)).is_err() || last {
                    break;
                }
            }
        });
        Ok(id)
    }

    /// Aborts a request in any state (unknown ids are ignored); it finishes with reason "abort".
    fn abort(&self, id: u64) {
        self.handle.abort(id);
    }

    /// Waits up to `timeout` seconds (GIL released) for events and returns those ready, in order:
    /// `(id, token_id | None, text, logprob | None, prompt_logprobs | None)` for a stream's delta and
    /// `(id, finished)` for a request's end, `finished` a dict (reason, stop_reason, text, token_ids,
    /// logprobs, prompt_logprobs, prompt_tokens, completion_tokens, cached_tokens, error,
    /// engine_dead). A logprob is `(token, logprob, rank, [(id, logprob)...])`.
    fn poll<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let wait = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let got = py.detach(|| {
            let rx = self.events_rx.lock().unwrap();
            let mut got = Vec::new();
            match rx.recv_timeout(wait) {
                Ok(e) => got.push(e),
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => return got,
            }
            while got.len() < MAX_EVENTS_PER_POLL {
                match rx.try_recv() {
                    Ok(e) => got.push(e),
                    Err(_) => break,
                }
            }
            got
        });
        got.into_iter()
            .map(|(id, ev)| event_to_py(py, id, ev))
            .collect()
    }

    /// Whether the loop has stopped (shut down, or its executor failed too many steps in a row).
    fn is_dead(&self) -> bool {
        self.handle.stats().dead.load(Relaxed)
    }

    /// Why a failing executor stopped the loop (the last step's error), or None.
    fn dead_error(&self) -> Option<String> {
        self.handle.stats().dead_error.lock().unwrap().clone()
    }

    /// The loop's live figures (`EngineMetrics`' counters, gauges and histograms, by the same names;
    /// a histogram as `(bounds, per-bucket counts with +Inf last, sum)`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.handle.stats();
        let d = PyDict::new(py);
        d.set_item("num_requests_running", s.running.load(Relaxed))?;
        d.set_item("num_requests_waiting", s.waiting.load(Relaxed))?;
        d.set_item("kv_cache_usage", s.kv_usage_ppm.load(Relaxed) as f64 * 1e-6)?;
        d.set_item("kv_blocks_total", s.kv.blocks_total.load(Relaxed))?;
        d.set_item("kv_blocks_used", s.kv.blocks_used.load(Relaxed))?;
        d.set_item("kv_blocks_free", s.kv.blocks_free.load(Relaxed))?;
        d.set_item("kv_blocks_cached", s.kv.blocks_cached.load(Relaxed))?;
        d.set_item("prefix_cache_queries", s.prefix_queries.load(Relaxed))?;
        d.set_item("prefix_cache_hits", s.prefix_hits.load(Relaxed))?;
        d.set_item("num_preemptions", s.preemptions.load(Relaxed))?;
        d.set_item("prompt_tokens", s.prompt_tokens.load(Relaxed))?;
        d.set_item("generation_tokens", s.generation_tokens.load(Relaxed))?;
        d.set_item("num_steps", s.steps.load(Relaxed))?;
        d.set_item("scheduled_tokens", s.scheduled_tokens.load(Relaxed))?;
        d.set_item("cross_rows", s.cross_rows.load(Relaxed))?;
        d.set_item("kv_copies", s.kv.copies.load(Relaxed))?;
        d.set_item("kv_copied_tokens", s.kv.copied_tokens.load(Relaxed))?;
        d.set_item("kv_adoptions", s.kv.adoptions.load(Relaxed))?;
        d.set_item("kv_events_published", s.kv_events_published.load(Relaxed))?;
        d.set_item("kv_events_dropped", s.kv_events_dropped.load(Relaxed))?;
        let done = PyDict::new(py);
        for (i, name) in ["stop", "length", "abort"].into_iter().enumerate() {
            done.set_item(name, s.finished[i].load(Relaxed))?;
        }
        d.set_item("request_success", done)?;
        let h = &s.hists;
        for (name, hist) in [
            ("time_to_first_token", &h.ttft),
            ("inter_token_latency", &h.itl),
            ("e2e_request_latency", &h.e2e),
            ("request_queue_time", &h.queue),
            ("request_prefill_time", &h.prefill),
            ("request_decode_time", &h.decode),
            ("request_prompt_tokens", &h.prompt_tokens),
            ("request_generation_tokens", &h.generation_tokens),
            ("iteration_tokens", &h.iteration_tokens),
        ] {
            d.set_item(name, hist.snapshot())?;
        }
        Ok(d)
    }

    /// Aborts everything (each request finishes with reason "abort"), stops the loop and waits
    /// for its thread (GIL released: the loop's last executor calls need it). Idempotent.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.handle.shutdown());
    }
}

impl PyEngineLoop {
    fn why_dead(&self) -> Option<String> {
        self.handle
            .stats()
            .dead_error
            .lock()
            .unwrap()
            .clone()
            .map(|e| format!("the engine is dead: {e}"))
    }
}

impl Drop for PyEngineLoop {
    /// Stops the loop if `shutdown` was not called. Its thread's last executor calls need the GIL,
    /// so the join runs with the GIL released.
    fn drop(&mut self) {
        let handle = self.handle.clone();
        Python::attach(|py| py.detach(|| handle.shutdown()));
    }
}

fn logprob_to_py<'py>(py: Python<'py>, l: &TokenLogprob) -> PyResult<Bound<'py, PyTuple>> {
    (l.token, l.logprob, l.rank, l.top.clone()).into_pyobject(py)
}

fn prompt_logprobs_to_py<'py>(py: Python<'py>, p: &PromptLogprobs) -> PyResult<Bound<'py, PyAny>> {
    let items = p
        .iter()
        .map(|e| match e {
            Some(l) => logprob_to_py(py, l).map(|t| t.into_any()),
            None => Ok(py.None().into_bound(py)),
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(pyo3::types::PyList::new(py, items)?.into_any())
}

fn opt_prompt_lp<'py>(py: Python<'py>, p: &Option<PromptLogprobs>) -> PyResult<Bound<'py, PyAny>> {
    match p {
        Some(p) => prompt_logprobs_to_py(py, p),
        None => Ok(py.None().into_bound(py)),
    }
}

fn event_to_py<'py>(py: Python<'py>, id: u64, ev: Event) -> PyResult<Bound<'py, PyTuple>> {
    match ev {
        Event::Delta {
            token_id,
            text,
            logprob,
            prompt_logprobs,
        } => {
            let lp = match &logprob {
                Some(l) => logprob_to_py(py, l)?.into_any(),
                None => py.None().into_bound(py),
            };
            (id, token_id, text, lp, opt_prompt_lp(py, &prompt_logprobs)?).into_pyobject(py)
        }
        Event::Finished(f) => (id, finished_to_py(py, &f)?).into_pyobject(py),
    }
}

fn finished_to_py<'py>(py: Python<'py>, f: &Finished) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("reason", f.reason.as_str())?;
    match &f.stop_reason {
        Some(StopReason::Text(s)) => d.set_item("stop_reason", s)?,
        Some(StopReason::Token(t)) => d.set_item("stop_reason", t)?,
        None => d.set_item("stop_reason", py.None())?,
    }
    d.set_item("text", &f.text)?;
    d.set_item("token_ids", &f.token_ids)?;
    let lps = f
        .logprobs
        .iter()
        .map(|l| logprob_to_py(py, l))
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("logprobs", lps)?;
    d.set_item("prompt_logprobs", opt_prompt_lp(py, &f.prompt_logprobs)?)?;
    d.set_item("prompt_tokens", f.prompt_tokens)?;
    d.set_item("completion_tokens", f.completion_tokens)?;
    d.set_item("cached_tokens", f.cached_tokens)?;
    match &f.error {
        Some(e) => {
            d.set_item("error", &e.message)?;
            d.set_item("engine_dead", e.engine_dead)?;
        }
        None => {
            d.set_item("error", py.None())?;
            d.set_item("engine_dead", false)?;
        }
    }
    Ok(d)
}
