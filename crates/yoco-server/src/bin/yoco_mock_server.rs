//! `yoco-mock-server`: the Rust front end and step loop over the mock executor, for the serving
//! benchmarks (`benches/serve_ceiling.py`) and black-box tests. Tokenization and detokenization are
//! real (a `tokenizer.json`); the model is `yoco_core::mock` with a modelled forward time.
//!
//! ```text
//! yoco-mock-server --tokenizer python/yoco_rs/default_model/tokenizer.json --port 8000 \
//!     [--forward-ms 0] [--max-num-seqs 256] [--max-model-len 4096] [--block-size 16]
//!     [--num-blocks N] [--served-model-name NAME] [--api-key KEY] [--metrics-prefix yoco|vllm]
//!     [--data-parallel-size N] [--no-async-scheduling] [--chat-template PATH|TEMPLATE]
//!     [--trust-request-chat-template]
//! ```
//!
//! Extra routes for benchmarks: `GET /bench/step_trace` returns the step periods (µs) recorded since
//! the previous call (the first call starts recording), `GET /bench/gap_trace` the loop's time from a
//! step's `collect` to the next `launch` (µs), likewise.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use yoco_core::kv::LayerKind;
use yoco_core::sched::SchedulerConfig;
use yoco_server::{AppConfig, EngineHandle, LoopConfig, MockModel};
use yoco_text::Tokenizer;

struct Args {
    tokenizer: String,
    host: String,
    port: u16,
    forward_ms: f64,
    max_num_seqs: u32,
    max_model_len: u32,
    block_size: u32,
    num_blocks: Option<u32>,
    name: String,
    api_keys: Vec<String>,
    metrics_prefix: String,
    data_parallel_size: usize,
    async_scheduling: bool,
    chat_template: Option<String>,
    trust_request_chat_template: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        tokenizer: String::new(),
        host: "127.0.0.1".into(),
        port: 8000,
        forward_ms: 0.0,
        max_num_seqs: 256,
        max_model_len: 4096,
        block_size: 16,
        num_blocks: None,
        name: "yoco-mock".into(),
        api_keys: Vec::new(),
        metrics_prefix: "yoco".into(),
        data_parallel_size: 1,
        async_scheduling: true,
        chat_template: None,
        trust_request_chat_template: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| {
            v.parse::<f64>()
                .map_err(|e| format!("bad number {v:?}: {e}"))
        };
        match flag.as_str() {
            "--tokenizer" => a.tokenizer = val()?,
            "--host" => a.host = val()?,
            "--port" => a.port = num(val()?)? as u16,
            "--forward-ms" => a.forward_ms = num(val()?)?,
            "--max-num-seqs" => a.max_num_seqs = num(val()?)? as u32,
            "--max-model-len" => a.max_model_len = num(val()?)? as u32,
            "--block-size" => a.block_size = num(val()?)? as u32,
            "--num-blocks" => a.num_blocks = Some(num(val()?)? as u32),
            "--served-model-name" => a.name = val()?,
            "--api-key" => a.api_keys.push(val()?),
            "--metrics-prefix" => a.metrics_prefix = val()?,
            "--data-parallel-size" => a.data_parallel_size = (num(val()?)? as usize).max(1),
            "--async-scheduling" => a.async_scheduling = true,
            "--no-async-scheduling" => a.async_scheduling = false,
            "--chat-template" => {
                let v = val()?;
                a.chat_template = Some(std::fs::read_to_string(&v).unwrap_or(v));
            }
            "--trust-request-chat-template" => a.trust_request_chat_template = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.tokenizer.is_empty() {
        return Err("--tokenizer PATH/tokenizer.json is required".into());
    }
    Ok(a)
}

/// Gemma 3n's layout, shrunk: sliding and full layers, the last third sharing KV.
fn layers() -> Vec<LayerKind> {
    vec![
        LayerKind::Sliding { window: 512 },
        LayerKind::Sliding { window: 512 },
        LayerKind::Full,
        LayerKind::SharesKv { donor: 1 },
        LayerKind::SharesKv { donor: 2 },
    ]
}

/// `<bos>` when the checkpoint's `tokenizer_config.json` (beside `tokenizer.json`) says to add it.
fn bos_of(tokenizer_json: &str, tok: &Tokenizer) -> Option<u32> {
    let dir = std::path::Path::new(tokenizer_json).parent()?;
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?)
            .ok()?;
    if !cfg
        .get("add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
    {
        return None;
    }
    let bos = cfg.get("bos_token")?;
    let text = bos.as_str().or_else(|| bos.get("content")?.as_str())?;
    tok.token_to_id(text)
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("yoco-mock-server: error: {e}");
            std::process::exit(2);
        }
    };
    let tok = match Tokenizer::from_file(&a.tokenizer) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("yoco-mock-server: error: {}: {e}", a.tokenizer);
            std::process::exit(2);
        }
    };
    let vocab = tok.get_vocab_size(true) as u32;
    let per_seq = a.max_model_len.div_ceil(a.block_size) + 1;
    let blocks = a.num_blocks.unwrap_or(a.max_num_seqs * per_seq + 16);
    let mut sc = SchedulerConfig::new(layers(), a.block_size, blocks).expect("scheduler config");
    sc.max_num_seqs = a.max_num_seqs;
    sc.max_model_len = a.max_model_len;
    sc.max_num_batched_tokens = 8192.max(a.max_model_len);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let loops: Vec<EngineHandle> = (0..a.data_parallel_size)
        .map(|_| {
            let exec = MockModel::new(
                vocab,
                16.min(vocab - 1),
                Duration::from_secs_f64(a.forward_ms * 1e-3),
            );
            let cfg = LoopConfig {
                scheduler: sc.clone(),
                tokenizer: tok.clone(),
                eos_token_ids: vec![1],
                max_consecutive_failures: 8,
                async_scheduling: a.async_scheduling,
                kv_events: None,
            };
            EngineHandle::start_delivering_on(cfg, Box::new(exec), rt.handle()).expect("step loop")
        })
        .collect();
    let mut cfg = AppConfig::new(&a.name, a.max_model_len, vocab);
    cfg.bos_token_id = bos_of(&a.tokenizer, &tok);
    let dir = std::path::Path::new(&a.tokenizer)
        .parent()
        .unwrap_or(std::path::Path::new("."));
    let (template, tokens) = yoco_server::load_checkpoint_template(dir);
    cfg.chat_template = a.chat_template.or(template);
    cfg.special_tokens = tokens;
    cfg.trust_request_chat_template = a.trust_request_chat_template;
    cfg.api_keys = a.api_keys;
    cfg.metrics_prefix = a.metrics_prefix;
    let addr: SocketAddr = format!("{}:{}", a.host, a.port).parse().expect("address");
    let stop_all = loops.clone();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| {
                eprintln!("yoco-mock-server: error: cannot bind {addr}: {e}");
                std::process::exit(1);
            });
        // The step trace of loop 0 (benchmarks run one loop).
        let stats = loops[0].stats().clone();
        let gap_stats = stats.clone();
        let app = yoco_server::try_router(cfg, yoco_server::Engines::new(loops), tok)
            .unwrap_or_else(|e| {
                eprintln!("yoco-mock-server: error: {e}");
                std::process::exit(2);
            })
            .route(
                "/bench/step_trace",
                get(move || {
                    let s = stats.clone();
                    async move { axum::Json(s.take_step_trace()) }
                }),
            )
            .route(
                "/bench/gap_trace",
                get(move || {
                    let s = gap_stats.clone();
                    async move { axum::Json(s.take_gap_trace()) }
                }),
            );
        eprintln!(
            "yoco-mock-server: serving on http://{}",
            listener.local_addr().unwrap()
        );
        yoco_server::serve_router(listener, app, yoco_server::shutdown_signal())
            .await
            .expect("serve");
    });
    stop_all.iter().for_each(|l| l.shutdown());
}
