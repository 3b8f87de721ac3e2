//! CORS for `--allowed-origins` (off, with no headers at all, when no origin is named), with the
//! Python server's semantics (Starlette's `CORSMiddleware`, methods GET/POST/OPTIONS, any header,
//! no credentials): a preflight from an allowed origin gets 200 and the allow headers, one from
//! another origin a 400 without `access-control-allow-origin`; other requests from an allowed
//! origin get `access-control-allow-origin` echoed, others nothing (the browser then blocks the
//! page from reading the answer).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

const METHODS: &str = "GET, POST, OPTIONS";

fn allowed<'a>(origins: &[String], headers: &'a HeaderMap) -> Option<&'a HeaderValue> {
    let o = headers.get(header::ORIGIN)?;
    let s = o.to_str().ok()?;
    origins.iter().any(|a| a == "*" || a == s).then_some(o)
}

pub(crate) async fn cors(
    State(origins): State<Arc<Vec<String>>>,
    req: Request,
    next: Next,
) -> Response {
    let h = req.headers();
    let preflight = req.method() == Method::OPTIONS
        && h.contains_key(header::ORIGIN)
        && h.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let origin = allowed(&origins, h).cloned();
    if preflight {
        let method_ok = h
            .get(header::ACCESS_CONTROL_REQUEST_METHOD)
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| METHODS.split(", ").any(|x| x == m));
        let mut out = HeaderMap::new();
        out.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(METHODS),
        );
        out.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        if let Some(rh) = h.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, rh.clone());
        }
        out.insert(header::VARY, HeaderValue::from_static("Origin"));
        return match (origin, method_ok) {
            (Some(o), true) => {
                out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
                (StatusCode::OK, out, "OK").into_response()
            }
            (None, _) => (StatusCode::BAD_REQUEST, out, "Disallowed CORS origin").into_response(),
            (Some(_), false) => {
                (StatusCode::BAD_REQUEST, out, "Disallowed CORS method").into_response()
            }
        };
    }
    let mut resp = next.run(req).await;
    if let Some(o) = origin {
        let hs = resp.headers_mut();
        hs.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        hs.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    resp
}
