//! Validation of a `/v1/completions` request: prompts (tokenized, `<bos>` as the checkpoint wants),
//! lengths against the context, sampling fields (logprobs and penalties included), and the fields this
//! front end does not serve yet.
//! Every refusal is a 400 naming the field, with vLLM's wording where vLLM has one.

use std::sync::Arc;

use axum::http::StatusCode;

use crate::app::AppState;
use crate::openai::{ApiError, CompletionRequest, PromptInput, StopInput};
use crate::params::{GenParams, SamplingFields};

/// Prompts longer than this many bytes are tokenized on the blocking pool.
const INLINE_TOKENIZE_BYTES: usize = 4096;

/// One prompt: its ids, and its text when it came as text (for `echo`).
pub(crate) struct Prompt {
    pub ids: Vec<u32>,
    pub text: Option<String>,
}

/// `logprobs` / `prompt_logprobs`: an integer in `[0, max_logprobs]` (the Python server's wording).
pub(crate) fn logprobs_field(
    name: &str,
    v: Option<i64>,
    max: u32,
) -> Result<Option<u32>, ApiError> {
    match v {
        None => Ok(None),
        Some(k) if k > max as i64 => Err(ApiError::bad(
            format!("{name} must be <= max_logprobs ({max}; the server's --max-logprobs), got {k}"),
            Some(name),
        )),
        Some(k) if k < 0 => Err(ApiError::bad(
            format!("{name} must be an integer >= 0 or None, got {k}"),
            Some(name),
        )),
        Some(k) => Ok(Some(k as u32)),
    }
}

/// The request's prompts as ids, each cut to its last `keep` tokens when `truncate_prompt_tokens`
/// asks (a text is then tokenized from its tail only, so a long text is not refused for length).
pub(crate) async fn prompts(
    s: &Arc<AppState>,
    input: Option<PromptInput>,
    keep: Option<usize>,
) -> Result<Vec<Prompt>, ApiError> {
    let input = input.ok_or_else(|| ApiError::bad("prompt is required", Some("prompt")))?;
    let max = s.cfg.max_prompts_per_request as usize;
    let count = match &input {
        PromptInput::Text(_) | PromptInput::Ids(_) => 1,
        PromptInput::Texts(v) => v.len(),
        PromptInput::IdLists(v) => v.len(),
    };
    if count == 0 {
        return Err(ApiError::bad(
            "prompt is an empty list: give a string, a list of strings, a list of token ids or a list of lists of token ids",
            Some("prompt"),
        ));
    }
    if count > max {
        return Err(ApiError::bad(
            format!("prompt holds {count} prompts; at most {max} per request (the server's --max-prompts-per-request)"),
            Some("prompt"),
        ));
    }
    let mut out = Vec::with_capacity(count);
    match input {
        PromptInput::Text(t) => out.push(encode(s, t, "prompt", keep).await?),
        PromptInput::Texts(ts) => {
            for (i, t) in ts.into_iter().enumerate() {
                out.push(encode(s, t, &format!("prompt[{i}]"), keep).await?);
            }
        }
        PromptInput::Ids(ids) => out.push(check_ids(s, ids, "prompt")?),
        PromptInput::IdLists(ls) => {
            for (i, ids) in ls.into_iter().enumerate() {
                out.push(check_ids(s, ids, &format!("prompt[{i}]"))?);
            }
        }
    }
    Ok(out.into_iter().map(|p| truncated(p, keep)).collect())
}

/// Tokenizes `text` (no special tokens) and hands it back with its ids. A text over
/// `INLINE_TOKENIZE_BYTES` is tokenized on tokio's blocking pool: tokenizing a large body inline would
/// hold an HTTP worker (of two, on a small machine) for milliseconds and stall every other stream's SSE.
async fn tokenize_off_workers(
    s: &Arc<AppState>,
    text: String,
) -> Result<(String, Result<Vec<u32>, String>), ApiError> {
    fn ids(s: &AppState, text: &str) -> Result<Vec<u32>, String> {
        s.tok
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }
    if text.len() <= INLINE_TOKENIZE_BYTES {
        let enc = ids(s, &text);
        return Ok((text, enc));
    }
    let s2 = s.clone();
    tokio::task::spawn_blocking(move || {
        let enc = ids(&s2, &text);
        (text, enc)
    })
    .await
    .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

async fn encode(
    s: &Arc<AppState>,
    mut text: String,
    wher: &str,
    keep: Option<usize>,
) -> Result<Prompt, ApiError> {
    if text.is_empty() {
        return Err(ApiError::bad(
            format!("{wher} is empty: give at least one character or token id"),
            Some("prompt"),
        ));
    }
    // A text with more bytes than 32 x the context is taken to be too long; refusing it before
    // tokenizing keeps a huge body from occupying a worker. Truncated, only its tail is tokenized
    // (enough bytes for `keep` + 16 tokens: the cut falls among tokens dropped anyway).
    let limit = s.cfg.max_prompt_bytes();
    if let Some(k) = keep {
        let tail = (k + 16) * (limit / s.cfg.max_model_len.max(1) as usize).max(1);
        if text.len() > tail {
            let mut at = text.len() - tail;
            while !text.is_char_boundary(at) {
                at += 1;
            }
            text.drain(..at);
        }
    } else if text.len() > limit {
        return Err(too_long(wher, &text, s.cfg.max_model_len, "prompt"));
    }
    let (text, enc) = tokenize_off_workers(s, text).await?;
    let mut ids = enc.map_err(|e| {
        ApiError::bad(
            format!("{wher} could not be tokenized: {e}"),
            Some("prompt"),
        )
    })?;
    if let Some(bos) = s.cfg.bos_token_id {
        if ids.first() != Some(&bos) {
            ids.insert(0, bos);
        }
    }
    Ok(Prompt {
        ids,
        text: Some(text),
    })
}

/// The 400 for a text that cannot fit the context (the Python server's words).
pub(crate) fn too_long(wher: &str, text: &str, max_model_len: u32, param: &str) -> ApiError {
    ApiError::bad(
        format!(
            "{wher} is too long: {} characters make more than {max_model_len} tokens, this model's maximum \
             context length",
            text.chars().count()
        ),
        Some(param),
    )
}

fn check_ids(s: &AppState, ids: Vec<i64>, wher: &str) -> Result<Prompt, ApiError> {
    if ids.is_empty() {
        return Err(ApiError::bad(
            format!("{wher} is an empty list of token ids: give at least one token id"),
            Some("prompt"),
        ));
    }
    let v = s.cfg.vocab_size as i64;
    if let Some(bad) = ids.iter().find(|&&t| t < 0 || t >= v) {
        return Err(ApiError::bad(
            format!("{wher} holds token id {bad}, outside the vocabulary [0, {v})"),
            Some("prompt"),
        ));
    }
    Ok(Prompt {
        ids: ids.into_iter().map(|t| t as u32).collect(),
        text: None,
    })
}

fn context_error(
    limit: u32,
    prompt_len: usize,
    max_tokens: Option<i64>,
    prompt_param: &str,
) -> ApiError {
    let p = prompt_len as i64;
    let n = limit as i64;
    if p >= n {
        let asked = max_tokens
            .map(|m| {
                format!(
                    " and you requested {m} output tokens, for a total of {} tokens",
                    p + m
                )
            })
            .unwrap_or_default();
        return ApiError::bad(
            format!("This model's maximum context length is {n} tokens. However, your prompt contains {p} input \
                     tokens{asked}. The prompt must be at most {} tokens to leave room for at least one output \
                     token; please reduce the length of the prompt.", n - 1),
            Some(prompt_param),
        );
    }
    let m = max_tokens.unwrap_or(0);
    ApiError::bad(
        format!("This model's maximum context length is {n} tokens. However, you requested {m} output tokens \
                 and your prompt contains {p} input tokens, for a total of {} tokens. Please reduce the length \
                 of the prompt or the number of requested output tokens (max_tokens <= {} fits this prompt).",
                p + m, n - p),
        Some("max_tokens"),
    )
}

fn finite_in(name: &str, v: Option<f64>, lo: f64, hi: f64, default: f64) -> Result<f32, ApiError> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x as f32),
        Some(x) => Err(ApiError::bad(
            format!("{name} must be in [{lo}, {hi}], got {x}"),
            Some(name),
        )),
    }
}

pub(crate) fn gen_params(
    s: &AppState,
    r: &CompletionRequest,
    prompt: &[u32],
    stream: bool,
) -> Result<GenParams, ApiError> {
    gen_params_for(s, r, prompt, stream, "prompt")
}

/// [`gen_params`] for a prompt that came in as `prompt_param` (`messages` for chat: a context
/// error then names it). Sampling fields the request leaves unset take the server's defaults (the
/// checkpoint's `generation_config.json`, as the Python server does).
pub(crate) fn gen_params_for(
    s: &AppState,
    r: &CompletionRequest,
    prompt: &[u32],
    stream: bool,
    prompt_param: &str,
) -> Result<GenParams, ApiError> {
    let limit = s.cfg.max_model_len;
    let d = &s.cfg.sampling_defaults;
    if let Some(m) = r.sampling.max_tokens {
        if m < 1 {
            return Err(ApiError::bad(
                format!("max_tokens must be an integer >= 1 (or omitted for up to the context length), got {m}"),
                Some("max_tokens"),
            ));
        }
    }
    let room = limit as i64 - prompt.len() as i64;
    if room < 1 || r.sampling.max_tokens.is_some_and(|m| m > room) {
        return Err(context_error(
            limit,
            prompt.len(),
            r.sampling.max_tokens,
            prompt_param,
        ));
    }
    let max_tokens = r
        .sampling
        .max_tokens
        .unwrap_or(room)
        .min(d.max_tokens.unwrap_or(i64::MAX).max(1)) as u32;
    let temperature = match r.sampling.temperature.or(d.temperature) {
        Some(t) if t < 0.0 => {
            return Err(ApiError::bad(
                format!("temperature must be a number >= 0 (0 means greedy), got {t}"),
                Some("temperature"),
            ))
        }
        t => finite_in("temperature", t, 0.0, 100.0, 1.0)?,
    };
    let top_p = match r.sampling.top_p.or(d.top_p) {
        None => 1.0,
        Some(p) if p > 0.0 && p <= 1.0 => p as f32,
        Some(p) => {
            return Err(ApiError::bad(
                format!("top_p must be in (0, 1], got {p}"),
                Some("top_p"),
            ))
        }
    };
    let min_p = finite_in("min_p", r.sampling.min_p.or(d.min_p), 0.0, 1.0, 0.0)?;
    let top_k = match r.sampling.top_k.or(d.top_k) {
        None | Some(-1) | Some(0) => 0,
        Some(k) if (1..=i32::MAX as i64).contains(&k) => k as u32,
        Some(k) => {
            return Err(ApiError::bad(
                format!("top_k must be 0 or -1 (disabled) or in [1, 2**31 - 1], got {k}"),
                Some("top_k"),
            ))
        }
    };
    let min_tokens = match r.sampling.min_tokens {
        None => 0,
        Some(m) if m >= 0 && m <= max_tokens as i64 => m as u32,
        Some(m) if m < 0 => {
            return Err(ApiError::bad(
                format!("min_tokens must be an integer >= 0, got {m}"),
                Some("min_tokens"),
            ))
        }
        Some(m) => {
            return Err(ApiError::bad(
                format!("min_tokens must be <= max_tokens ({max_tokens}), got {m}"),
                Some("min_tokens"),
            ))
        }
    };
    // Empty stop strings are dropped, as the Python server does (an empty string matches nothing).
    let stop: Vec<String> = match &r.sampling.stop {
        None => Vec::new(),
        Some(StopInput::One(x)) => vec![x.clone()],
        Some(StopInput::Many(v)) => v.clone(),
    }
    .into_iter()
    .filter(|x| !x.is_empty())
    .collect();
    if stop.len() > s.cfg.max_stop_strings {
        return Err(ApiError::bad(
            format!(
                "stop holds {} strings; at most {}",
                stop.len(),
                s.cfg.max_stop_strings
            ),
            Some("stop"),
        ));
    }
    let v = s.cfg.vocab_size as i64;
    let stop_token_ids = r.sampling.stop_token_ids.clone().unwrap_or_default();
    if let Some(bad) = stop_token_ids.iter().find(|&&t| t < 0 || t >= v) {
        return Err(ApiError::bad(
            format!("stop_token_ids holds {bad}, outside the vocabulary [0, {v})"),
            Some("stop_token_ids"),
        ));
    }
    let logprobs = logprobs_field("logprobs", r.logprobs, s.cfg.max_logprobs)?;
    let mut prompt_logprobs = logprobs_field(
        "prompt_logprobs",
        r.sampling.prompt_logprobs,
        s.cfg.max_logprobs,
    )?;
    // Echo with logprobs shows the prompt's tokens with theirs (at least `logprobs` alternatives).
    if let (true, Some(k)) = (r.echo.unwrap_or(false), logprobs) {
        prompt_logprobs = Some(prompt_logprobs.map_or(k, |p| p.max(k)));
    }
    let presence_penalty = finite_in(
        "presence_penalty",
        r.sampling.presence_penalty,
        -2.0,
        2.0,
        0.0,
    )?;
    let frequency_penalty = finite_in(
        "frequency_penalty",
        r.sampling.frequency_penalty,
        -2.0,
        2.0,
        0.0,
    )?;
    let repetition_penalty = match r.sampling.repetition_penalty.or(d.repetition_penalty) {
        None => 1.0,
        // Outside f32's range: clamp rather than round to 0 or inf (a divisor).
        Some(x) if x.is_finite() && x > 0.0 => {
            x.clamp(f32::MIN_POSITIVE as f64, f32::MAX as f64) as f32
        }
        Some(x) => {
            return Err(ApiError::bad(
                format!("repetition_penalty must be > 0 (1 disables), got {x}"),
                Some("repetition_penalty"),
            ))
        }
    };
    let priority = match r.sampling.priority {
        None => 0,
        Some(0) => 0,
        Some(p) => {
            return Err(ApiError::bad(
                format!("priority is only supported with --scheduling-policy priority (this server schedules \
                         first come, first served), got {p}"),
                Some("priority"),
            ))
        }
    };
    Ok(GenParams {
        prompt: prompt.to_vec(),
        max_tokens,
        min_tokens,
        ignore_eos: r.sampling.ignore_eos.unwrap_or(false),
        stop_token_ids: stop_token_ids.into_iter().map(|t| t as u32).collect(),
        stop,
        include_stop_str: r.sampling.include_stop_str_in_output.unwrap_or(false),
        skip_special_tokens: r.sampling.skip_special_tokens.unwrap_or(true),
        stream,
        detokenize: true,
        cache_salt: r.sampling.cache_salt.clone(),
        priority,
        sampling: SamplingFields {
            temperature,
            top_p,
            top_k,
            min_p,
            seed: r.sampling.seed.map(|x| x as u64),
            presence_penalty,
            frequency_penalty,
            repetition_penalty,
        },
        logprobs,
        prompt_logprobs,
        media: None,
        grammar: None,
        after: None,
    })
}

/// `n`: 1 when omitted, at most the server's `--max-n`.
pub(crate) fn check_n(s: &AppState, n: Option<i64>) -> Result<u32, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if n >= 1 && n <= s.cfg.max_n as i64 => Ok(n as u32),
        Some(n) if n < 1 => Err(ApiError::bad(
            format!("n must be an integer >= 1, got {n}"),
            Some("n"),
        )),
        Some(n) => Err(ApiError::bad(
            format!(
                "n must be <= {} (the server's --max-n), got {n}",
                s.cfg.max_n
            ),
            Some("n"),
        )),
    }
}

/// vLLM's `truncate_prompt_tokens`: how many prompt tokens to keep (the last ones; -1: the context
/// length), checked as the Python server checks it.
pub(crate) fn truncate_keep(s: &AppState, k: Option<i64>) -> Result<Option<usize>, ApiError> {
    let max = s.cfg.max_model_len as i64;
    match k {
        None => Ok(None),
        Some(-1) => Ok(Some(max as usize)),
        Some(k) if k >= 1 && k <= max => Ok(Some(k as usize)),
        Some(k) if k > max => Err(ApiError::bad(
            format!("truncate_prompt_tokens must be <= max_model_len ({max}), got {k}"),
            Some("truncate_prompt_tokens"),
        )),
        Some(k) => Err(ApiError::bad(
            format!("truncate_prompt_tokens must be -1 or an integer >= 1, got {k}"),
            Some("truncate_prompt_tokens"),
        )),
    }
}

/// The last `keep` ids of `p` (its text is then not the prompt's any more: `echo` decodes the ids).
fn truncated(mut p: Prompt, keep: Option<usize>) -> Prompt {
    if let Some(k) = keep.filter(|&k| p.ids.len() > k) {
        p.ids.drain(..p.ids.len() - k);
        p.text = None;
    }
    p
}

/// The token ids of a rendered conversation (or a `/tokenize` text): `<bos>` is prepended only
/// with `add_special_tokens` (chat templates write it themselves), `truncate_prompt_tokens` keeps
/// the last k ids (-1: the context length). Long texts are tokenized on the blocking pool; a text
/// that cannot fit the context is refused without tokenizing it.
pub(crate) async fn encode_rendered(
    s: &Arc<AppState>,
    text: String,
    add_special_tokens: bool,
    truncate: Option<i64>,
) -> Result<Vec<u32>, ApiError> {
    let keep = truncate_keep(s, truncate)?;
    if keep.is_none() {
        check_rendered_len(s, &text)?;
    }
    let (_, enc) = tokenize_off_workers(s, text).await?;
    let mut ids = enc.map_err(|e| {
        ApiError::bad(
            format!("the rendered conversation could not be tokenized: {e}"),
            Some("messages"),
        )
    })?;
    if add_special_tokens {
        if let Some(bos) = s.cfg.bos_token_id {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
    }
    if ids.is_empty() {
        return Err(ApiError::bad(
            "the rendered conversation is empty",
            Some("messages"),
        ));
    }
    if let Some(k) = keep {
        if ids.len() > k {
            ids.drain(..ids.len() - k);
        }
    }
    Ok(ids)
}

/// A rendered conversation longer in bytes than any prompt of `max_model_len` tokens can be is
/// refused before it is tokenized (a 400 naming `messages`).
pub(crate) fn check_rendered_len(s: &AppState, text: &str) -> Result<(), ApiError> {
    if text.len() > s.cfg.max_prompt_bytes() {
        return Err(too_long(
            "the rendered conversation",
            text,
            s.cfg.max_model_len,
            "messages",
        ));
    }
    Ok(())
}
