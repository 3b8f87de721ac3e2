//! `POST /v1/completions`: one or several prompts, `n` completions each, streamed or not.
//!
//! Choice `index` is `prompt_index * n + sample_index` (OpenAI's layout); `usage` counts each prompt
//! once and every generated token; `prompt_tokens_details.cached_tokens` is the prefix-cache hit.
//! A dropped connection drops the requests' channels, which aborts them in the step loop.
//! Logprobs (`logprobs`, `echo` with logprobs, `prompt_logprobs`, `return_tokens_as_token_ids`) are
//! formatted as the Python server does (`logprobs_json.rs`); a structured-output constraint is
//! compiled once per request before anything is submitted.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;

use axum::response::{IntoResponse, Response};

use crate::answer::{final_response, stream_response, Ctx};
use crate::app::AppState;
use crate::body::parse_json;
use crate::body_fields::COMPLETION;
use crate::logprobs_json::TokenText;
use crate::openai::{ApiError, CompletionRequest};
use crate::params::GenParams;
use crate::structured::{compile, constraint_of};
use crate::validate::{check_n, gen_params, prompts, truncate_keep, Prompt};

pub(crate) async fn create(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(s, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// What a completions request runs: the served name, the prompts, one choice's parameters per
/// prompt, and `n` (what `/v1/completions/render` shows, too).
pub(crate) async fn completion_inputs(
    s: &Arc<AppState>,
    req: &CompletionRequest,
) -> Result<(String, Vec<Prompt>, Vec<GenParams>, u32), ApiError> {
    let model = s.check_model(req.model.as_deref())?;
    s.ensure_serving()?;
    crate::refused::refuse(&req.rest, &req.sampling, false)?;
    let n = check_n(s, req.sampling.n)?;
    let keep = truncate_keep(s, req.sampling.truncate_prompt_tokens)?;
    let prompts = prompts(s, req.prompt.clone(), keep).await?;
    let stream = req.sampling.stream.unwrap_or(false);
    let params: Vec<GenParams> = prompts
        .iter()
        .map(|p| gen_params(s, req, &p.ids, stream))
        .collect::<Result<_, _>>()?;
    Ok((model, prompts, params, n))
}

async fn run(s: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_json(&s, body, &COMPLETION)?;
    let (model, prompts, mut params, n) = completion_inputs(&s, &req).await?;
    let stream = req.sampling.stream.unwrap_or(false);
    s.front.observe_params(n, params[0].max_tokens);
    let fields = req.sampling.constraint_fields();
    if let Some(c) = constraint_of(&fields, None, s.cfg.structured.disable_any_whitespace)? {
        // Compiled once (off the loop, under the budget); every completion forks its own matcher.
        let g = compile(&s, c).await?;
        for p in &mut params {
            p.grammar = Some(g.clone());
        }
    }
    let mut subs = Vec::with_capacity(prompts.len() * n as usize);
    for (i, p) in params.iter().enumerate() {
        let mut first = None;
        for j in 0..n {
            let mut p = p.clone();
            if let (Some(seed), true) = (p.sampling.seed, j > 0) {
                p.sampling.seed = Some(seed.wrapping_add(j as u64));
            }
            let (l, id, rx) = match first {
                None => s.engines.submit(p),
                Some(f) => s.engines.submit_sibling(f, p),
            }
            .map_err(|_| ApiError::engine_dead(s.engines.dead_error().as_deref()))?;
            first.get_or_insert((l, id));
            subs.push((i * n as usize + j as usize, rx));
        }
    }
    let logprobs = req.logprobs.is_some();
    let echo_on = req.echo.unwrap_or(false);
    let echo_ids: Vec<Option<Vec<u32>>> = prompts
        .iter()
        .map(|p| (echo_on && logprobs).then(|| p.ids.clone()))
        .collect();
    let echo: Vec<Option<String>> = if echo_on {
        prompts
            .iter()
            .map(|p| p.text.clone().or_else(|| s.tok.decode(&p.ids, false).ok()))
            .collect()
    } else {
        vec![None; prompts.len()]
    };
    let ctx = Ctx {
        id: format!("cmpl-{}", uuid_like()),
        model,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        n: n as usize,
        prompt_lens: prompts.iter().map(|p| p.ids.len() as u64).collect(),
        echo,
        echo_ids,
        logprobs,
        prompt_logprobs: req.sampling.prompt_logprobs.is_some(),
        text: TokenText::new(
            s.clone(),
            req.sampling.return_tokens_as_token_ids.unwrap_or(false)
                || s.cfg.return_tokens_as_token_ids,
        ),
    };
    if stream {
        let opts = req.sampling.stream_options.clone().unwrap_or_default();
        Ok(stream_response(
            ctx,
            subs,
            opts.include_usage.unwrap_or(false),
            opts.continuous_usage_stats.unwrap_or(false),
        ))
    } else {
        final_response(ctx, subs).await
    }
}

/// Unix seconds (the `created` of responses).
pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A random-enough request id without a uuid dependency: time and a process-wide counter, mixed.
pub(crate) fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:016x}{:08x}",
        yoco_core::mock::mix64(t ^ c.rotate_left(32)),
        c as u32
    )
}
