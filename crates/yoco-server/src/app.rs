//! The HTTP front end: routes, authentication, body limits and the shared state of handlers.
//!
//! Every handler runs on tokio's workers, never on the step loop's thread; tokenizing a long prompt
//! moves to the blocking pool so the accept path stays responsive.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use yoco_grammar::GrammarCompiler;
use yoco_text::Tokenizer;

use crate::completions;
use crate::content_format::ContentFormat;
use crate::dispatch::Engines;
use crate::front_metrics::{count_http, FrontMetrics};
use crate::media::MediaConfig;
use crate::metrics;
use crate::openai::ApiError;
pub use crate::structured::StructuredConfig;
use crate::template::{ChatTemplates, SpecialTokens, TemplateBudget};
use crate::tools::ToolConfig;
use crate::{chat, cors, render, tokenize, transcriptions};

/// What the front end serves and its limits (the `yoco-serve` flags of the same names).
#[derive(Clone)]
pub struct AppConfig {
    /// Names the model answers to (`--served-model-name`); the first is the one reported.
    pub served_model_names: Vec<String>,
    /// Longest prompt + output.
    pub max_model_len: u32,
    /// Token ids below this are valid prompt tokens.
    pub vocab_size: u32,
    /// Bearer keys (`--api-key`); empty: no authentication.
    pub api_keys: Vec<String>,
    /// Largest `n`.
    pub max_n: u32,
    /// Most prompts in one `/v1/completions` request.
    pub max_prompts_per_request: u32,
    /// Largest request body, bytes.
    pub max_request_body_bytes: usize,
    /// Prefix of the vLLM-named metric series (`yoco` or `vllm`).
    pub metrics_prefix: String,
    /// Stop strings per request at most.
    pub max_stop_strings: usize,
    /// Prepended to text prompts that do not start with it (the checkpoint's `add_bos_token`; Gemma's
    /// `tokenizer.json` does not add it itself). None: text is encoded as the tokenizer does.
    pub bos_token_id: Option<u32>,
    /// The chat template (`--chat-template`, else the checkpoint's); None: chat needs a trusted
    /// request template.
    pub chat_template: Option<String>,
    /// `bos_token`, `eos_token`... as templates see them.
    pub special_tokens: SpecialTokens,
    /// Accept `chat_template` in requests (`--trust-request-chat-template`).
    pub trust_request_chat_template: bool,
    /// Time one chat-template rendering may take (`--chat-template-timeout`).
    pub chat_template_timeout: Duration,
    /// How templates get a list of text parts (`--chat-template-content-format`; None: `auto`).
    pub chat_template_content_format: Option<ContentFormat>,
    /// Sampling defaults for fields a request leaves unset (`generation_config.json`).
    pub sampling_defaults: SamplingDefaults,
    /// Also publish vLLM's deprecated metric names (`--compat-metric-names`).
    pub compat_metric_names: bool,
    /// Browser origins CORS allows (`--allowed-origins`); empty: no CORS headers.
    pub allowed_origins: Vec<String>,
    /// What `/version` answers.
    pub version: String,
    /// The `cache_config_info` metric's labels (name, value), sorted by name.
    pub cache_config_info: Vec<(String, String)>,
    /// The executor runs the cross-decoder only on rows whose logits are needed (YOCO fast prefill);
    /// without it every scheduled token is a cross-decoder row (`yoco:cross_decoder_rows`).
    pub kv_sharing_fast_prefill: bool,
    /// Largest `logprobs` / `prompt_logprobs` (`--max-logprobs`).
    pub max_logprobs: u32,
    /// Logprob tokens as `token_id:N` for every request (`--return-tokens-as-token-ids`).
    pub return_tokens_as_token_ids: bool,
    /// Structured outputs: EOS ids, compile budgets, compact JSON (`--structured-outputs-config`).
    pub structured: StructuredConfig,
    /// Tool calling: `--enable-auto-tool-choice`, `--tool-call-parser`, the tool-aware template.
    pub tools: ToolConfig,
    /// Images and audio (a multimodal checkpoint's seam, `--limit-mm-per-prompt`); default: none.
    pub media: MediaConfig,
}

/// The checkpoint's `generation_config.json` sampling defaults (what the Python server applies to a
/// request that leaves them unset).
#[derive(Debug, Clone, Default)]
pub struct SamplingDefaults {
    /// Temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Top-k.
    pub top_k: Option<i64>,
    /// Min-p.
    pub min_p: Option<f64>,
    /// Repetition penalty (vLLM's `--generation-config auto` applies it too).
    pub repetition_penalty: Option<f64>,
    /// `max_new_tokens`: a cap on every request's `max_tokens`, set or not (vLLM's `get_max_tokens`
    /// takes the least of the request's value, the context room and this).
    pub max_tokens: Option<i64>,
}

impl AppConfig {
    /// Defaults as `yoco-serve`'s flags have them.
    pub fn new(model: &str, max_model_len: u32, vocab_size: u32) -> Self {
        Self {
            served_model_names: vec![model.to_string()],
            max_model_len,
            vocab_size,
            api_keys: Vec::new(),
            max_n: 16,
            max_prompts_per_request: 256,
            max_request_body_bytes: 32 << 20,
            metrics_prefix: "yoco".into(),
            max_stop_strings: 64,
            bos_token_id: None,
            chat_template: None,
            special_tokens: SpecialTokens::default(),
            trust_request_chat_template: false,
            chat_template_timeout: Duration::from_secs(2),
            chat_template_content_format: None,
            sampling_defaults: SamplingDefaults::default(),
            compat_metric_names: false,
            allowed_origins: Vec::new(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            cache_config_info: Vec::new(),
            kv_sharing_fast_prefill: true,
            max_logprobs: 20,
            return_tokens_as_token_ids: false,
            structured: StructuredConfig::default(),
            tools: ToolConfig::default(),
            media: MediaConfig::default(),
        }
    }

    /// A text longer than this many bytes cannot fit the context (a token is at most 32 bytes of
    /// text here): refused without tokenizing it; also the chat template's output cap.
    pub fn max_prompt_bytes(&self) -> usize {
        32 * self.max_model_len as usize
    }
}

/// Media seam calls that may run at once ([`AppState::media_slots`]).
const MEDIA_SLOTS: usize = 4;

/// What every handler sees.
pub(crate) struct AppState {
    pub cfg: AppConfig,
    pub engines: Engines,
    pub tok: Tokenizer,
    pub started_at: u64,
    pub templates: ChatTemplates,
    pub front: FrontMetrics,
    /// The grammar compiler, built on the first constrained request (`structured.rs`).
    pub grammar: OnceLock<Result<Arc<GrammarCompiler>, String>>,
    /// Media seam calls at once (fetching, decoding and encoding hold Python threads): a flood of
    /// image requests queues here instead of filling the blocking pool. The permit moves into the
    /// blocking call, so a client that leaves does not free a slot that is still working.
    pub media_slots: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    /// Runs `call` on the blocking pool once a media slot is free, the slot held by the call itself.
    pub(crate) async fn media_call<T: Send + 'static>(
        &self,
        call: impl FnOnce() -> Result<T, crate::media::MediaError> + Send + 'static,
    ) -> Result<T, crate::media::MediaError> {
        use crate::media::MediaError;
        let slot = self
            .media_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| MediaError::Internal(e.to_string()))?;
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            call()
        })
        .await
        .map_err(|e| MediaError::Internal(e.to_string()))?
    }

    /// The served name a request's `model` field resolves to (404 for another).
    pub fn check_model(&self, model: Option<&str>) -> Result<String, ApiError> {
        match model {
            None | Some("") => Ok(self.cfg.served_model_names[0].clone()),
            Some(m) if self.cfg.served_model_names.iter().any(|n| n == m) => Ok(m.to_string()),
            Some(m) => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "The model `{m}` does not exist. This server serves: {}.",
                    self.cfg.served_model_names.join(", ")
                ),
                param: Some("model".into()),
                kind: None,
            }),
        }
    }

    /// 503 once every step loop has stopped.
    pub fn ensure_serving(&self) -> Result<(), ApiError> {
        if self.engines.all_dead() {
            return Err(ApiError::engine_dead(self.engines.dead_error().as_deref()));
        }
        Ok(())
    }
}

/// The router over running step loops (one, or `--data-parallel-size` of them). Panics when the
/// chat template does not compile; [`try_router`] says why instead.
pub fn router(cfg: AppConfig, engines: impl Into<Engines>, tok: Tokenizer) -> Router {
    try_router(cfg, engines, tok).expect("the server's configuration")
}

/// [`router`], or why the configuration cannot serve (a chat template that does not compile).
pub fn try_router(
    cfg: AppConfig,
    engines: impl Into<Engines>,
    tok: Tokenizer,
) -> Result<Router, String> {
    let limit = cfg.max_request_body_bytes;
    let budget = TemplateBudget::for_output(cfg.max_prompt_bytes(), cfg.chat_template_timeout);
    let templates = ChatTemplates::new(
        cfg.chat_template.as_deref(),
        cfg.special_tokens.clone(),
        budget,
        cfg.chat_template_content_format,
    )?;
    let origins = cfg.allowed_origins.clone();
    let state = Arc::new(AppState {
        cfg,
        engines: engines.into(),
        tok,
        grammar: OnceLock::new(),
        media_slots: Arc::new(tokio::sync::Semaphore::new(MEDIA_SLOTS)),
        started_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        templates,
        front: FrontMetrics::default(),
    });
    let api = Router::new()
        .route("/v1/completions", post(completions::create))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/chat/completions", post(chat::create))
        .route("/v1/completions/render", post(render::completion))
        .route("/v1/chat/completions/render", post(render::chat))
        .route("/v1/audio/transcriptions", post(transcriptions::create))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    // Authentication covers `/v1/*` only, as vLLM's and the Python server's: the tokenizer
    // endpoints (which a router calls for prefix matching) and the probes stay open.
    let mut app = Router::new()
        .merge(api)
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/health", get(health))
        .route("/ping", get(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(json_only))
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), count_http));
    if !origins.is_empty() {
        app = app.layer(middleware::from_fn_with_state(
            Arc::new(origins),
            cors::cors,
        ));
    }
    Ok(app.layer(middleware::from_fn(request_id)).with_state(state))
}

/// Echoes the client's `X-Request-Id` (or a fresh one) on every response, as the Python server.
async fn request_id(req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .cloned()
        .unwrap_or_else(|| {
            axum::http::HeaderValue::from_str(&completions::uuid_like())
                .expect("hex is a header value")
        });
    let mut resp = next.run(req).await;
    resp.headers_mut().insert("x-request-id", id);
    resp
}

async fn version(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({"version": s.cfg.version}))
}

/// Serves `app` on `listener` until `shutdown` resolves. Connections get `TCP_NODELAY`: an SSE
/// stream writes one small chunk per token, and with Nagle's algorithm each write would wait for
/// the client's delayed ACK (~40 ms on Linux) whenever the previous chunk is unacknowledged.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// 415 for a request body sent with a Content-Type other than JSON. A web page may send a "simple"
/// cross-origin POST (`text/plain`, form encodings: no CORS preflight) to a local server; refusing
/// those bodies means no page can drive the API. A body without a Content-Type is read as JSON.
async fn json_only(req: Request, next: Next) -> Response {
    let m = req.method();
    // Transcriptions take a multipart upload (and answer a 415 of their own to anything else).
    let multipart = req.uri().path() == "/v1/audio/transcriptions";
    if !multipart
        && (m == axum::http::Method::POST
            || m == axum::http::Method::PUT
            || m == axum::http::Method::PATCH)
    {
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let raw = String::from_utf8_lossy(ct.as_bytes()).into_owned();
            let media = raw
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            let json = media == "application/json"
                || (media.starts_with("application/") && media.ends_with("+json"));
            if !json {
                let shown: String = raw.chars().take(100).collect();
                return ApiError::status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!(
                        "Content-Type '{shown}' is not supported: send the body as JSON with \
                             'Content-Type: application/json'"
                    ),
                )
                .into_response();
            }
        }
    }
    next.run(req).await
}

async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if s.cfg.api_keys.is_empty() {
        return next.run(req).await;
    }
    if req.method() == axum::http::Method::OPTIONS {
        return next.run(req).await;
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .filter(|v| v.len() >= 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
        .map(|v| v[7..].trim_ascii())
        .unwrap_or_default();
    if !token.is_empty() && s.cfg.api_keys.iter().any(|a| a.as_bytes() == token) {
        return next.run(req).await;
    }
    let msg = if token.is_empty() {
        "Missing API key: send 'Authorization: Bearer <key>'"
    } else {
        "Invalid API key"
    };
    let mut r = ApiError::status(StatusCode::UNAUTHORIZED, msg).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    r
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    if s.engines.all_dead() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "dead", "error": s.engines.dead_error()})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

fn model_card(s: &AppState, name: &str) -> serde_json::Value {
    json!({"id": name, "object": "model", "created": s.started_at, "owned_by": "yoco-rs",
           "root": name, "parent": null, "permission": [], "max_model_len": s.cfg.max_model_len})
}

async fn models(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let data: Vec<_> = s
        .cfg
        .served_model_names
        .iter()
        .map(|n| model_card(&s, n))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn model(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match s.check_model(Some(&id)) {
        Ok(name) => Json(model_card(&s, &name)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics_text(State(s): State<Arc<AppState>>) -> Response {
    let stats: Vec<&crate::stats::Stats> = s.engines.loops().iter().map(|l| &**l.stats()).collect();
    let mut body = metrics::render(&s.cfg.metrics_prefix, &s.cfg.served_model_names[0], &stats);
    metrics::render_parity(&mut body, &s.cfg, &stats, &s.front);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    ApiError::status(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
    .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "method {} is not allowed on {}",
            req.method(),
            req.uri().path()
        ),
    )
    .into_response()
}
