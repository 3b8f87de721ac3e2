//! `serve_http`: the Rust serving path (`yoco-server`) driving the Python executor.
//!
//! Everything but the model (HTTP, validation, tokenization, scheduling, text, SSE) runs in Rust
//! with the GIL released; each step loop calls its Python executor through
//! [`crate::step_executor::PyStepExecutor`], the GIL held only for that call. With async
//! scheduling (the default; `async_scheduling=False` turns it off) the plan's placeholder inputs
//! are filled by the Python executor from the ids its last `collect` returned.

use std::net::SocketAddr;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use yoco_server::content_format::ContentFormat;
use yoco_server::{AppConfig, SamplingDefaults, SpecialTokens, ToolConfig, ToolParser};
use yoco_text::Tokenizer;

use crate::scheduler::Scheduler;
use crate::serve_media::media_config;
use crate::serve_sampling::structured_config;
use crate::step_executor::{start_loop, LoopSettings};

/// Serves the OpenAI API from Rust until SIGINT or SIGTERM; blocks with the GIL released. SIGTERM
/// drains: no new connection is accepted, in-flight requests get up to `shutdown_timeout` seconds
/// to finish, then what is left is aborted (finish_reason "abort"); SIGINT, or a second signal,
/// aborts at once. `loops`
/// holds one `(scheduler, executor)` pair per step loop (`--data-parallel-size`): each loop copies
/// its scheduler's configuration (the Python scheduler is not used while serving) and drives its
/// executor. `on_ready(url)` is called once the port is bound.
#[pyfunction]
#[pyo3(signature = (
    loops, *, tokenizer_file, eos_token_ids, bos_token_id, host, port, served_model_names, max_model_len,
    vocab_size, api_keys = Vec::new(), max_n = 16, max_prompts_per_request = 256,
    max_request_body_bytes = 32 << 20, metrics_prefix = "yoco".to_string(), max_consecutive_failures = 8,
    async_scheduling = true, on_ready = None, chat_template = None, special_tokens = Vec::new(),
    trust_request_chat_template = false, chat_template_timeout = 2.0,
    chat_template_content_format = "auto".to_string(), sampling_defaults = Vec::new(),
    compat_metric_names = false, allowed_origins = Vec::new(), return_tokens_as_token_ids = false,
    version = None, cache_config_info = Vec::new(), kv_sharing_fast_prefill = true, max_logprobs = 20,
    structured_outputs_config = None, enable_auto_tool_choice = false, tool_call_parser = None,
    tool_chat_template = None, media_seam = None, limit_mm_per_prompt = Vec::new(),
    max_media_bytes = 20 << 20, shutdown_timeout = 30.0
))]
#[allow(clippy::too_many_arguments)]
pub fn serve_http(
    py: Python<'_>,
    loops: Vec<(Py<Scheduler>, Py<PyAny>)>,
    tokenizer_file: String,
    eos_token_ids: Vec<u32>,
    bos_token_id: Option<u32>,
    host: String,
    port: u16,
    served_model_names: Vec<String>,
    max_model_len: u32,
    vocab_size: u32,
    api_keys: Vec<String>,
    max_n: u32,
    max_prompts_per_request: u32,
    max_request_body_bytes: usize,
    metrics_prefix: String,
    max_consecutive_failures: u32,
    async_scheduling: bool,
    on_ready: Option<Py<PyAny>>,
    chat_template: Option<String>,
    special_tokens: Vec<(String, String)>,
    trust_request_chat_template: bool,
    chat_template_timeout: f64,
    chat_template_content_format: String,
    sampling_defaults: Vec<(String, f64)>,
    compat_metric_names: bool,
    allowed_origins: Vec<String>,
    return_tokens_as_token_ids: bool,
    version: Option<String>,
    cache_config_info: Vec<(String, String)>,
    kv_sharing_fast_prefill: bool,
    max_logprobs: u32,
    structured_outputs_config: Option<Bound<'_, PyDict>>,
    enable_auto_tool_choice: bool,
    tool_call_parser: Option<String>,
    tool_chat_template: Option<String>,
    media_seam: Option<Py<PyAny>>,
    limit_mm_per_prompt: Vec<(String, u32)>,
    max_media_bytes: usize,
    shutdown_timeout: f64,
) -> PyResult<()> {
    if !(shutdown_timeout.is_finite() && shutdown_timeout >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "shutdown_timeout must be >= 0 seconds, got {shutdown_timeout}"
        )));
    }
    if served_model_names.is_empty() {
        return Err(PyValueError::new_err("served_model_names is empty"));
    }
    if loops.is_empty() {
        return Err(PyValueError::new_err(
            "loops is empty: give at least one (scheduler, executor)",
        ));
    }
    let tok = Tokenizer::from_file(&tokenizer_file)
        .map_err(|e| PyValueError::new_err(format!("{tokenizer_file}: {e}")))?;
    // The HTTP runtime first: the loops hand their events to a task on it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("yoco-http")
        .build()
        .map_err(|e| PyOSError::new_err(e.to_string()))?;
    let mut handles = Vec::with_capacity(loops.len());
    let settings = LoopSettings {
        tokenizer: &tok,
        eos_token_ids: &eos_token_ids,
        max_consecutive_failures,
        async_scheduling,
    };
    for (scheduler, executor) in loops {
        handles.push(start_loop(
            py,
            &scheduler,
            executor,
            &settings,
            Some(rt.handle()),
        )?);
    }
    let stop_all = handles.clone();
    // Watches the same loops as the router: once every one has stopped, the server stops too.
    let watched = yoco_server::Engines::new(handles.clone());
    let drained = handles.clone();
    let engines = yoco_server::Engines::new(handles);
    let mut cfg = AppConfig::new(&served_model_names[0], max_model_len, vocab_size);
    cfg.served_model_names = served_model_names;
    cfg.api_keys = api_keys;
    cfg.max_n = max_n;
    cfg.max_prompts_per_request = max_prompts_per_request;
    cfg.max_request_body_bytes = max_request_body_bytes;
    cfg.metrics_prefix = metrics_prefix;
    cfg.bos_token_id = bos_token_id;
    cfg.chat_template = chat_template;
    let tok_of = |k: &str| {
        special_tokens
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    cfg.special_tokens = SpecialTokens {
        bos: tok_of("bos_token"),
        eos: tok_of("eos_token"),
        pad: tok_of("pad_token"),
        unk: tok_of("unk_token"),
    };
    cfg.trust_request_chat_template = trust_request_chat_template;
    let parser = match tool_call_parser.as_deref() {
        None => None,
        Some(name) => Some(ToolParser::from_name(name).ok_or_else(|| {
            PyValueError::new_err(format!(
                "tool_call_parser must be pythonic or json, got {name:?}"
            ))
        })?),
    };
    cfg.tools = ToolConfig {
        auto_enabled: enable_auto_tool_choice,
        parser,
        template: tool_chat_template,
    };
    if !(chat_template_timeout.is_finite() && chat_template_timeout >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "chat_template_timeout must be >= 0 seconds, got {chat_template_timeout}"
        )));
    }
    cfg.chat_template_timeout = std::time::Duration::from_secs_f64(chat_template_timeout);
    cfg.chat_template_content_format =
        ContentFormat::parse_flag(&chat_template_content_format).map_err(PyValueError::new_err)?;
    let mut d = SamplingDefaults::default();
    for (k, v) in sampling_defaults {
        match k.as_str() {
            "temperature" => d.temperature = Some(v),
            "top_p" => d.top_p = Some(v),
            "top_k" => d.top_k = Some(v as i64),
            "min_p" => d.min_p = Some(v),
            "repetition_penalty" => d.repetition_penalty = Some(v),
            "max_tokens" => d.max_tokens = Some(v as i64),
            _ => {}
        }
    }
    cfg.sampling_defaults = d;
    cfg.compat_metric_names = compat_metric_names;
    cfg.allowed_origins = allowed_origins;
    cfg.return_tokens_as_token_ids = return_tokens_as_token_ids;
    if let Some(v) = version {
        cfg.version = v;
    }
    cfg.cache_config_info = cache_config_info;
    cfg.kv_sharing_fast_prefill = kv_sharing_fast_prefill;
    cfg.max_logprobs = max_logprobs;
    cfg.media = media_config(media_seam, limit_mm_per_prompt, max_media_bytes)?;
    cfg.structured = structured_config(structured_outputs_config.as_ref(), &eos_token_ids)?;
    let addr: SocketAddr = format!("{host}:{port}")
        .parse()
        .or_else(|_| format!("[{host}]:{port}").parse())
        .map_err(|e| PyValueError::new_err(format!("bad address {host}:{port}: {e}")))?;
    // A chat template that does not compile is a start-up error (before the ready line).
    let app = match yoco_server::try_router(cfg, engines, tok) {
        Ok(app) => app,
        Err(e) => {
            py.detach(|| stop_all.iter().for_each(|h| h.shutdown()));
            return Err(PyValueError::new_err(e));
        }
    };
    let result = py.detach(move || -> Result<(), String> {
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot bind {addr}: {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            if let Some(cb) = on_ready {
                Python::attach(|py| cb.call1(py, (format!("http://{bound}"),)).map(|_| ()))
                    .map_err(|e| e.to_string())?;
            }
            // Stop on SIGINT/SIGTERM, or when the engine died (every step loop stopped after
            // `max_consecutive_failures` failed steps): then the process exits 1, as the Python
            // server's does, so a supervisor restarts it rather than it answering 503 forever.
            let stop = async move {
                tokio::select! {
                    sig = yoco_server::stop_signal() => drain(sig, shutdown_timeout, drained),
                    _ = watched.until_all_dead() => {}
                }
            };
            yoco_server::serve_router(listener, app, stop)
                .await
                .map_err(|e| e.to_string())
        })
    });
    let died = stop_all
        .iter()
        .all(|h| h.stats().dead.load(std::sync::atomic::Ordering::Relaxed));
    let why = yoco_server::Engines::new(stop_all.clone()).dead_error();
    py.detach(|| stop_all.iter().for_each(|h| h.shutdown()));
    result.map_err(PyOSError::new_err)?;
    match (died, why) {
        (true, Some(e)) => Err(crate::errors::EngineDied::new_err(format!(
            "the engine failed: {e}"
        ))),
        _ => Ok(()),
    }
}

/// After a stop signal: the server stops accepting (graceful shutdown) while in-flight requests run
/// for up to `timeout` seconds (SIGTERM; none after SIGINT), or until a second signal; then the
/// loops stop, which aborts what is left, so the open streams end and the shutdown completes.
fn drain(sig: yoco_server::StopSignal, timeout: f64, loops: Vec<yoco_server::EngineHandle>) {
    let secs = if sig == yoco_server::StopSignal::Terminate {
        timeout
    } else {
        0.0
    };
    eprintln!("yoco-serve: draining (up to {secs} s for in-flight requests)");
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs_f64(secs)) => {}
            _ = yoco_server::stop_signal() => {}
        }
        // `shutdown` joins the loop threads: off the async workers.
        let _ = tokio::task::spawn_blocking(move || loops.iter().for_each(|h| h.shutdown())).await;
    });
}
