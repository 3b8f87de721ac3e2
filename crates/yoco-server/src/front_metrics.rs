//! The front end's own series, as the Python server's `ServerMetrics` has them: vLLM's
//! request-parameter histograms (`request_params_n`, `request_params_max_tokens`) and
//! `http_requests_total{method, status, handler}` (status as `2xx`, handler the route).

use std::collections::BTreeMap;
use std::sync::Mutex;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::hist::{Hist, N_BUCKETS, TOKEN_BUCKETS};

/// The routes, labelled by their path (the Python server's route paths).
const ROUTES: [&str; 12] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/completions/render",
    "/v1/chat/completions/render",
    "/v1/audio/transcriptions",
    "/v1/models",
    "/health",
    "/ping",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/version",
];

/// Series the HTTP layer observes.
pub(crate) struct FrontMetrics {
    pub params_n: Hist,
    pub params_max_tokens: Hist,
    /// `(method, status class, handler)` -> requests.
    pub http: Mutex<BTreeMap<(String, String, String), u64>>,
}

impl Default for FrontMetrics {
    fn default() -> Self {
        Self {
            params_n: Hist::new(N_BUCKETS),
            params_max_tokens: Hist::new(TOKEN_BUCKETS),
            http: Mutex::new(BTreeMap::new()),
        }
    }
}

impl FrontMetrics {
    /// A generation request's `n` and (resolved) `max_tokens`.
    pub fn observe_params(&self, n: u32, max_tokens: u32) {
        self.params_n.observe(n as f64);
        self.params_max_tokens.observe(max_tokens as f64);
    }
}

/// The handler label: the route's path as the Python server (FastAPI) spells it, `other` for a
/// path no route serves (so a scanner cannot grow the series without bound).
fn handler(path: &str) -> String {
    if ROUTES.contains(&path) {
        path.to_string()
    } else if path.starts_with("/v1/models/") {
        "/v1/models/{model_id:path}".into()
    } else {
        "other".into()
    }
}

/// Counts every answered request (streams when their head is sent).
pub(crate) async fn count_http(
    State(s): State<std::sync::Arc<crate::app::AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let method = req.method().as_str().to_string();
    let h = handler(req.uri().path());
    let resp = next.run(req).await;
    let status = format!("{}xx", resp.status().as_u16() / 100);
    *s.front
        .http
        .lock()
        .unwrap()
        .entry((method, status, h))
        .or_insert(0) += 1;
    resp
}
