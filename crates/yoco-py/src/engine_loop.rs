//! `EngineLoop`: the Rust step loop (the one `yoco-serve` runs) under the Python engines.
//! `submit` queues one completion and returns its loop id; `poll` hands over the events of every
//! request as flat tuples, one call however many requests advanced. The loop owns scheduling,
//! detokenization and stop strings; the Python side only turns events into `RequestOutput`s.
//!
//! Two modes. Threaded (`AsyncEngine`; `yoco_server::EngineHandle`): the loop runs on its own
//! thread, each request's channel is forwarded by a task on a one-worker runtime into one queue,
//! and `poll` waits on that queue with the GIL released. Manual (`Engine`, `manual=True`;
//! `yoco_server::ManualLoop`): no thread; `step()` runs one synchronous step on the caller's
//! thread (GIL released except inside the executor's calls) and `poll` returns what it made.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyAssertionError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use yoco_server::manual_loop::{Aborter, ManualLoop};
use yoco_server::media::{MediaInputs, MediaItems, MmPlaceholder};
use yoco_server::output::{Finished, StopReason};
use yoco_server::params::{Grammar, SamplingFields};
use yoco_server::stats::Stats;
use yoco_server::{EngineHandle, Event, GenParams, PromptLogprobs, TokenLogprob};
use yoco_text::Tokenizer;

use crate::convert;
use crate::errors::EngineDied;
use crate::grammar::PyCompiledGrammar;
use crate::scheduler::Scheduler;
use crate::serve_media::PyItems;
use crate::step_executor::{loop_parts, start_loop, LoopSettings};

/// Events `poll` hands over per call at most (the rest wait for the next call).
const MAX_EVENTS_PER_POLL: usize = 4096;

/// A loop on its own thread, its events forwarded into one queue.
struct Threaded {
    handle: EngineHandle,
    rt: tokio::runtime::Runtime,
    events_tx: Sender<(u64, Event)>,
    events_rx: Mutex<Receiver<(u64, Event)>>,
}

/// A loop the caller steps (`manual=True`).
struct Manual {
    inner: Box<Mutex<ManualLoop>>,
    aborter: Aborter,
}

enum Mode {
    Threaded(Threaded),
    Manual(Manual),
}

/// A Rust step loop over one Python executor: on its own thread, or stepped by the caller.
#[pyclass(module = "yoco_rs._core", name = "EngineLoop", frozen)]
pub struct PyEngineLoop {
    mode: Mode,
    stats: Arc<Stats>,
    vocab_size: usize,
}

#[pymethods]
impl PyEngineLoop {
    /// A loop over `executor` (a `StepExecutor`), with `scheduler`'s configuration and KV-event
    /// publisher (the Python scheduler itself is not stepped). It runs on its own thread, or with
    /// `manual=True` only when `step()` is called (then `async_scheduling` is ignored: each step
    /// is synchronous).
    #[new]
    #[pyo3(signature = (scheduler, executor, *, tokenizer_file, eos_token_ids, vocab_size,
                        max_consecutive_failures = 3, async_scheduling = false, manual = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        scheduler: Py<Scheduler>,
        executor: Py<PyAny>,
        tokenizer_file: String,
        eos_token_ids: Vec<u32>,
        vocab_size: usize,
        max_consecutive_failures: u32,
        async_scheduling: bool,
        manual: bool,
    ) -> PyResult<Self> {
        if max_consecutive_failures == 0 {
            return Err(PyValueError::new_err(
                "max_consecutive_failures must be >= 1",
            ));
        }
        let tok = Tokenizer::from_file(&tokenizer_file)
            .map_err(|e| PyValueError::new_err(format!("{tokenizer_file}: {e}")))?;
        let settings = LoopSettings {
            tokenizer: &tok,
            eos_token_ids: &eos_token_ids,
            max_consecutive_failures,
            async_scheduling,
        };
        if manual {
            let (config, exec) = loop_parts(py, &scheduler, executor, &settings);
            let inner = ManualLoop::new(config, exec).map_err(PyValueError::new_err)?;
            return Ok(Self {
                stats: inner.stats().clone(),
                mode: Mode::Manual(Manual {
                    aborter: inner.aborter(),
                    inner: Box::new(Mutex::new(inner)),
                }),
                vocab_size,
            });
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("yoco-engine-events")
            .build()
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let handle = start_loop(py, &scheduler, executor, &settings, Some(rt.handle()))?;
        let (events_tx, events_rx) = mpsc::channel();
        Ok(Self {
            stats: handle.stats().clone(),
            mode: Mode::Threaded(Threaded {
                handle,
                rt,
                events_tx,
                events_rx: Mutex::new(events_rx),
            }),
            vocab_size,
        })
    }

    /// Queues one completion; returns its loop id. Its events come out of `poll`, the last one
    /// finished. The caller validated it (prompt ids below the vocabulary, prompt + `max_tokens`
    /// within the context). `after`: the loop id of a sibling completion of the same prompt,
    /// submitted before, whose prompt this one waits for and reuses. `EngineDied` once the
    /// (threaded) loop has stopped; a stopped manual loop ends the request at once, with an error.
    #[pyo3(signature = (prompt, max_tokens, *, min_tokens = 0, ignore_eos = false,
                        stop_token_ids = Vec::new(), stop = Vec::new(), include_stop_str = false,
                        skip_special_tokens = true, stream = true, detokenize = true, cache_salt = None, priority = 0,
                        temperature = 1.0, top_p = 1.0, top_k = 0, min_p = 0.0, seed = None,
                        presence_penalty = 0.0, frequency_penalty = 0.0, repetition_penalty = 1.0,
                        logprobs = None, prompt_logprobs = None, grammar = None,
                        mm_placeholders = Vec::new(), mm_items = None, after = None))]
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
        after: Option<u64>,
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
            after,
        };
        let t = match &self.mode {
            Mode::Manual(m) => return Ok(lock(&m.inner)?.submit(params)),
            Mode::Threaded(t) => t,
        };
        let (id, mut rx) = t
            .handle
            .submit(params)
            .map_err(|e| EngineDied::new_err(self.why_dead().unwrap_or_else(|| e.to_string())))?;
        let tx = t.events_tx.clone();
        t.rt.spawn(async move {
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
    /// A manual loop frees its blocks before this returns (or, when called while the loop steps,
    /// at the start of the next step).
    fn abort(&self, id: u64) {
        match &self.mode {
            Mode::Threaded(t) => t.handle.abort(id),
            Mode::Manual(m) => match m.inner.try_lock() {
                Ok(mut l) => l.abort(id),
                Err(_) => m.aborter.abort(id),
            },
        }
    }

    /// Runs one step of a manual loop (GIL released except for the executor's calls): `(ran,
    /// error)`, `ran` False when nothing was runnable, `error` the failed step's message (its
    /// requests ended with it). Its events come out of `poll`.
    fn step(&self, py: Python<'_>) -> PyResult<(bool, Option<String>)> {
        let m = self.manual("step")?;
        let r = py.detach(|| lock(&m.inner).map(|mut l| l.step()))?;
        Ok((r.ran, r.error))
    }

    /// Requests of a manual loop submitted and not yet ended.
    fn num_unfinished(&self) -> PyResult<usize> {
        Ok(lock(&self.manual("num_unfinished")?.inner)?.num_unfinished())
    }

    /// The manual loop's scheduler invariants (tests; O(pool)); AssertionError naming the broken one.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        let m = self.manual("check_invariants")?;
        py.detach(|| lock(&m.inner).map(|l| l.check_invariants()))?
            .map_err(PyAssertionError::new_err)
    }

    /// Drops every cached prefix of a manual loop; False while requests hold blocks.
    fn reset_prefix_cache(&self) -> PyResult<bool> {
        Ok(lock(&self.manual("reset_prefix_cache")?.inner)?.reset_prefix_cache())
    }

    /// KV events of a manual loop since the last call (empty unless the scheduler enables them
    /// and no publisher takes them), as `Scheduler.take_kv_events` gives them.
    fn take_kv_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = lock(&self.manual("take_kv_events")?.inner)?.take_kv_events();
        convert::events_list(py, events)
    }

    /// Waits up to `timeout` seconds (GIL released) for events and returns those ready, in order:
    /// `(id, token_id | None, text, logprob | None, prompt_logprobs | None)` for a stream's delta and
    /// `(id, finished)` for a request's end, `finished` a dict (reason, stop_reason, text, token_ids,
    /// logprobs, prompt_logprobs, prompt_tokens, completion_tokens, cached_tokens, preemptions, error,
    /// engine_dead). A logprob is `(token, logprob, rank, [(id, logprob)...])`. A manual loop
    /// returns at once with what its steps and aborts made since the last call.
    fn poll<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let got = match &self.mode {
            Mode::Manual(m) => lock(&m.inner)?.take_events(),
            Mode::Threaded(t) => {
                let wait = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
                py.detach(|| {
                    let rx = t.events_rx.lock().unwrap();
                    let mut got = Vec::new();
                    match rx.recv_timeout(wait) {
                        Ok(e) => got.push(e),
                        Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                            return got
                        }
                    }
                    while got.len() < MAX_EVENTS_PER_POLL {
                        match rx.try_recv() {
                            Ok(e) => got.push(e),
                            Err(_) => break,
                        }
                    }
                    got
                })
            }
        };
        got.into_iter()
            .map(|(id, ev)| event_to_py(py, id, ev))
            .collect()
    }

    /// Whether the loop has stopped (shut down, or its executor failed too many steps in a row).
    fn is_dead(&self) -> bool {
        self.stats.dead.load(Relaxed)
    }

    /// Why a failing executor stopped the loop (the last step's error), or None.
    fn dead_error(&self) -> Option<String> {
        self.stats.dead_error.lock().unwrap().clone()
    }

    /// The loop's live figures (`EngineMetrics`' counters, gauges and histograms, by the same names;
    /// a histogram as `(bounds, per-bucket counts with +Inf last, sum)`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = &self.stats;
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
        py.detach(|| self.stop());
    }
}

impl PyEngineLoop {
    fn why_dead(&self) -> Option<String> {
        self.dead_error()
            .map(|e| format!("the engine is dead: {e}"))
    }

    fn manual(&self, what: &str) -> PyResult<&Manual> {
        match &self.mode {
            Mode::Manual(m) => Ok(m),
            Mode::Threaded(_) => Err(PyRuntimeError::new_err(format!(
                "EngineLoop.{what} needs a manual loop (EngineLoop(..., manual=True))"
            ))),
        }
    }

    fn stop(&self) {
        match &self.mode {
            Mode::Threaded(t) => t.handle.shutdown(),
            Mode::Manual(m) => {
                if let Ok(mut l) = m.inner.lock() {
                    l.shutdown();
                }
            }
        }
    }
}

/// The manual loop, or a clear error when a step panicked while holding it.
fn lock(m: &Mutex<ManualLoop>) -> PyResult<std::sync::MutexGuard<'_, ManualLoop>> {
    m.lock()
        .map_err(|_| EngineDied::new_err("the engine loop panicked during a step"))
}

impl Drop for PyEngineLoop {
    /// Stops the loop if `shutdown` was not called. Its last executor calls need the GIL, so it
    /// runs with the GIL released.
    fn drop(&mut self) {
        Python::attach(|py| py.detach(|| self.stop()));
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
    d.set_item("preemptions", f.preemptions)?;
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
