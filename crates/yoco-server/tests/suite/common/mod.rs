//! A real server on a loopback port over the mock executor, and a minimal HTTP client.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use yoco_core::kv::LayerKind;
use yoco_core::sched::SchedulerConfig;
use yoco_grammar::CompileLimits;
use yoco_server::{AppConfig, EngineHandle, Engines, LoopConfig, MockModel};
use yoco_text::Tokenizer;

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// The bundled checkpoint's `<bos>`, which its `tokenizer_config.json` adds to text prompts.
pub const BOS: u32 = 2;

/// Prompt ids of `text` as the server encodes it: `<bos>` then the tokenizer's ids.
pub fn encode(text: &str) -> Vec<u32> {
    let mut ids = vec![BOS];
    ids.extend_from_slice(tokenizer().encode(text, false).unwrap().get_ids());
    ids
}

/// The bundled checkpoint's directory (tokenizer and chat template).
pub fn bundled_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/yoco_rs/default_model"
    ))
}

pub fn tokenizer() -> Tokenizer {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/yoco_rs/default_model/tokenizer.json"
    );
    Tokenizer::from_file(p).expect("bundled tokenizer")
}

/// The test servers' layer layout: sliding, full, and a layer sharing the full one's KV.
pub fn layers() -> Vec<LayerKind> {
    vec![
        LayerKind::Sliding { window: 64 },
        LayerKind::Full,
        LayerKind::SharesKv { donor: 1 },
    ]
}

pub struct TestServer {
    pub addr: SocketAddr,
    /// Loop 0.
    pub engine: EngineHandle,
    /// Every loop (`Opts::loops`).
    pub loops: Vec<EngineHandle>,
    pub client: HttpClient,
    pub rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

pub struct Opts {
    pub forward: Duration,
    pub num_blocks: u32,
    pub max_num_seqs: u32,
    pub max_model_len: u32,
    pub api_keys: Vec<String>,
    pub max_body: usize,
    pub max_failures: u32,
    /// Loop 0's executor (default: the plain mock with `forward`).
    pub exec: Option<MockModel>,
    /// Step loops behind the front end (`--data-parallel-size`).
    pub loops: usize,
    /// The executor of loop i given the vocabulary size (default: the plain mock).
    pub exec_of: Option<fn(usize, u32) -> MockModel>,
    /// The loops' scheduling mode (default: async, as served).
    pub async_scheduling: bool,
    /// Events sent from the loop thread itself instead of a task on the server's runtime (the
    /// servers' way, the default).
    pub direct_delivery: bool,
    /// `--trust-request-chat-template`.
    pub trust_templates: bool,
    /// `--chat-template` (default: the bundled checkpoint's).
    pub chat_template: Option<String>,
    /// Edits the rest of the front end's configuration.
    pub cfg: Option<fn(&mut AppConfig)>,
    /// The scheduler's token budget per step (chunked prefill below it).
    pub batched_tokens: u32,
    /// Grammar compile budgets (default: the server's).
    pub grammar_limits: Option<CompileLimits>,
    /// JSON constraints without optional whitespace by default (`disable_any_whitespace`).
    pub compact_json: bool,
    /// Images and audio: the media seam and limits (default: a text-only server).
    pub media: Option<yoco_server::media::MediaConfig>,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            forward: Duration::ZERO,
            num_blocks: 1024,
            max_num_seqs: 32,
            max_model_len: 512,
            api_keys: Vec::new(),
            max_body: 1 << 20,
            max_failures: 4,
            exec: None,
            loops: 1,
            exec_of: None,
            async_scheduling: true,
            direct_delivery: false,
            trust_templates: false,
            chat_template: None,
            cfg: None,
            batched_tokens: 1024,
            grammar_limits: None,
            compact_json: false,
            media: None,
        }
    }
}

impl TestServer {
    pub fn start(o: Opts) -> Self {
        let tok = tokenizer();
        let vocab = tok.get_vocab_size(true) as u32;
        let mut sc = SchedulerConfig::new(layers(), 16, o.num_blocks).unwrap();
        sc.max_num_seqs = o.max_num_seqs;
        sc.max_model_len = o.max_model_len;
        sc.max_num_batched_tokens = o.batched_tokens;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut first = o.exec;
        let loops: Vec<EngineHandle> = (0..o.loops.max(1))
            .map(|i| {
                let exec = match (first.take(), o.exec_of) {
                    (Some(e), _) => e,
                    (None, Some(f)) => f(i, vocab),
                    (None, None) => MockModel::new(vocab, 16, o.forward),
                };
                let cfg = LoopConfig {
                    scheduler: sc.clone(),
                    tokenizer: tok.clone(),
                    eos_token_ids: vec![1],
                    max_consecutive_failures: o.max_failures,
                    async_scheduling: o.async_scheduling,
                    kv_events: None,
                };
                if o.direct_delivery {
                    EngineHandle::start(cfg, Box::new(exec)).unwrap()
                } else {
                    EngineHandle::start_delivering_on(cfg, Box::new(exec), rt.handle()).unwrap()
                }
            })
            .collect();
        let mut cfg = AppConfig::new("mock", o.max_model_len, vocab);
        cfg.api_keys = o.api_keys;
        cfg.max_request_body_bytes = o.max_body;
        cfg.bos_token_id = Some(BOS);
        let (template, tokens) = yoco_server::load_checkpoint_template(&bundled_dir());
        cfg.chat_template = o.chat_template.or(template);
        cfg.special_tokens = tokens;
        cfg.trust_request_chat_template = o.trust_templates;
        cfg.structured.eos_token_ids = vec![1];
        cfg.structured.disable_any_whitespace = o.compact_json;
        if let Some(l) = o.grammar_limits {
            cfg.structured.limits = l;
        }
        if let Some(m) = o.media {
            cfg.media = m;
        }
        if let Some(f) = o.cfg {
            f(&mut cfg);
        }
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let app = yoco_server::router(cfg, Engines::new(loops.clone()), tok);
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        rt.spawn(async move {
            let _ = yoco_server::serve_router(listener, app, async {
                let _ = rx.await;
            })
            .await;
        });
        let client = rt.block_on(async { Client::builder(TokioExecutor::new()).build_http() });
        Self {
            addr,
            engine: loops[0].clone(),
            loops,
            client,
            rt,
            stop: Some(stop),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// POST JSON; (status, body text).
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        self.post_with(path, body, &[])
    }

    pub fn post_with(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut b = Request::post(self.url(path));
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            b = b.header("content-type", "application/json");
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(Bytes::from(body.to_string()))).unwrap();
        self.rt.block_on(async {
            let r = self.client.request(req).await.unwrap();
            let status = r.status().as_u16();
            let body = r.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        })
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let req = Request::get(self.url(path))
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.rt.block_on(async {
            let r = self.client.request(req).await.unwrap();
            let status = r.status().as_u16();
            let body = r.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        })
    }

    pub fn json(&self, path: &str, body: &str) -> (u16, Value) {
        let (s, b) = self.post(path, body);
        (
            s,
            serde_json::from_str(&b).unwrap_or_else(|e| panic!("not JSON ({e}): {b}")),
        )
    }

    /// POSTs `body` to `path` and asserts the answer is the 400 envelope naming `param` whose message
    /// contains `needle` (the shape every client mistake gets: `code` 400, `BadRequestError`).
    pub fn assert_400(&self, path: &str, body: &str, param: &str, needle: &str) -> Value {
        let (st, v) = self.json(path, body);
        assert_eq!(st, 400, "{body} -> {v}");
        assert_eq!(v["error"]["code"], 400, "{body}: {v}");
        assert_eq!(v["error"]["type"], "BadRequestError", "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg:?} lacks {needle:?}");
        v
    }

    /// The value of a metric series (first line starting with `name`).
    pub fn metric(&self, name: &str) -> f64 {
        let (_, m) = self.get("/metrics");
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no series {name}"))
    }

    /// Waits (up to 10 s) until `cond` holds.
    pub fn wait_for(&self, what: &str, mut cond: impl FnMut(&Self) -> bool) {
        let t = std::time::Instant::now();
        while !cond(self) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until no request runs or waits and no KV block is held. The loop sets these gauges
    /// after the step that sent the last answer, so a client can read `/metrics` before they
    /// settle: a leak check must wait for them, not sample them once.
    pub fn wait_idle_and_empty(&self) {
        self.wait_for("an idle, empty engine (no request, no KV block)", |s| {
            s.metric("yoco:num_requests_running") == 0.0
                && s.metric("yoco:num_requests_waiting") == 0.0
                && s.metric("yoco:kv_cache_usage_perc") == 0.0
        });
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        for l in &self.loops {
            l.shutdown();
        }
    }
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// What the mock model generates for `prompt` when it runs alone through the core (no step loop,
/// no HTTP): the reference the server's answers are checked against.
pub fn reference_tokens(prompt: &[u32], max_tokens: u32) -> Vec<u32> {
    use yoco_core::mock::MockExecutor;
    use yoco_core::sched::{NewRequest, Scheduler};
    let vocab = tokenizer().get_vocab_size(true) as u32;
    let mut c = SchedulerConfig::new(vec![LayerKind::Full], 16, 256).unwrap();
    c.max_model_len = 1024;
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(NewRequest {
        id: 1,
        prompt: prompt.to_vec(),
        max_tokens,
        eos_token_ids: vec![1],
        ..Default::default()
    })
    .unwrap();
    let mut m = MockExecutor::new(vocab).first_token(16);
    let mut out = Vec::new();
    while s.num_unfinished() > 0 {
        let plan = s.schedule().clone();
        let sampled = m.sample(&plan, &[]).to_vec();
        let o = s.update(&sampled).unwrap();
        out.extend(o.new_tokens.iter().filter(|&&t| t >= 0).map(|&t| t as u32));
    }
    out
}
