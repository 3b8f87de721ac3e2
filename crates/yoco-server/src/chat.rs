//! `POST /v1/chat/completions`: the conversation rendered with the chat template (off the async
//! workers, under the template budget), tokenized, then one prompt with `n` choices, answered as
//! one `chat.completion` body or an SSE stream of `chat.completion.chunk`s ([`crate::chat_answer`]).
//!
//! Validation, defaults and errors are the Python server's (`serve/chat.py`): `max_completion_tokens`
//! wins over `max_tokens`, `add_generation_prompt` defaults to true, `continue_final_message`
//! excludes it, a request `chat_template` needs `--trust-request-chat-template`, logprobs come in
//! the chat form (`logprobs` + `top_logprobs`), penalties and structured outputs are the completions
//! endpoint's. Tools (`tools`, `tool_choice`) are planned in [`crate::tools`]: they reach the
//! template (the tool-aware one unless a template was given), `required` / a named function add
//! their grammar, and the answer carries the parsed `tool_calls` ([`crate::tool_parse`],
//! [`crate::tool_stream`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;

use axum::response::{IntoResponse, Response};

use crate::app::AppState;
use crate::body::parse_json;
use crate::body_fields::CHAT;
use crate::chat_answer::{chat_final, chat_stream, ChatCtx};
use crate::chat_protocol::{template_kwargs, template_messages, ChatCompletionRequest};
use crate::completions::{now, uuid_like};
use crate::logprobs_json::TokenText;
use crate::media::{MediaRef, Prepared};
use crate::openai::ApiError;
use crate::params::GenParams;
use crate::structured::{compile, constraint_of};
use crate::template::Conversation;
use crate::tools::{plan_tools, tool_constraint, ToolPlan};
use crate::validate::{check_n, check_rendered_len, encode_rendered, gen_params_for};

pub(crate) async fn create(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(s, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// What a chat request runs: the served name, one choice's parameters (the prompt among them)
/// and `n` (what `/v1/chat/completions/render` shows, too).
pub(crate) struct ChatInputs {
    pub model: String,
    pub params: GenParams,
    pub n: u32,
    /// What the request does with its tools.
    pub tools: ToolPlan,
}

/// Validates, renders and tokenizes a chat request, without submitting it.
pub(crate) async fn chat_inputs(
    s: &Arc<AppState>,
    req: &ChatCompletionRequest,
) -> Result<ChatInputs, ApiError> {
    let model = s.check_model(req.model.as_deref())?;
    s.ensure_serving()?;
    req.refused()?;
    let n = check_n(s, req.sampling.n)?;
    let tools = plan_tools(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        &s.cfg.tools,
    )?;
    let mut refs = Vec::new();
    let media_on = s.cfg.media.seam.is_some();
    let text = render(s, req, Some(&tools), media_on.then_some(&mut refs)).await?;
    let add_special = req.add_special_tokens.unwrap_or(false);
    let (ids, media) = if refs.is_empty() {
        let ids =
            encode_rendered(s, text, add_special, req.sampling.truncate_prompt_tokens).await?;
        (ids, None)
    } else {
        let p = prepare_media(
            s,
            text,
            add_special,
            refs,
            req.sampling.truncate_prompt_tokens,
        )
        .await?;
        (p.token_ids, Some(p.media))
    };
    let view = req.sampling_view(s.cfg.max_logprobs)?;
    let stream = req.sampling.stream.unwrap_or(false);
    let mut params = gen_params_for(s, &view, &ids, stream, "messages")?;
    params.media = media;
    let fields = req.sampling.constraint_fields();
    let compact = s.cfg.structured.disable_any_whitespace;
    if let Some(c) = constraint_of(&fields, tool_constraint(&tools, compact), compact)? {
        // Compiled once (off the loop, under the budget); every choice forks its own matcher.
        params.grammar = Some(compile(s, c).await?);
    }
    Ok(ChatInputs {
        model,
        params,
        n,
        tools,
    })
}

/// The request's conversation through the template (the server's, or the request's own where the
/// server trusts request templates). With `tools` holding functions, they reach the template as
/// `tools`, and a request without its own template renders with the tool-aware one.
///
/// With `media` (a multimodal server), image and audio parts render as `{"type": "image"}` /
/// `{"type": "audio"}` and their refs are appended to it in order; without, they are refused.
pub(crate) async fn render(
    s: &Arc<AppState>,
    req: &ChatCompletionRequest,
    tools: Option<&ToolPlan>,
    media: Option<&mut Vec<MediaRef>>,
) -> Result<String, ApiError> {
    let trusted = s.cfg.trust_request_chat_template;
    if req.chat_template.is_some() && !trusted {
        return Err(ApiError::bad(
            "chat_template in a request is refused: templates are code, and this server does not trust \
             request templates (start it with --trust-request-chat-template)",
            Some("chat_template"),
        ));
    }
    let mut kwargs = template_kwargs(req.chat_template_kwargs.as_ref(), trusted)?;
    let mut request_template = req
        .chat_template
        .clone()
        .or_else(|| kwargs_template(req.chat_template_kwargs.as_ref()).filter(|_| trusted));
    if let Some(plan) = tools.filter(|p| !p.tools.is_empty()) {
        kwargs.retain(|(k, _)| k != "tools");
        kwargs.push((
            "tools".into(),
            serde_json::from_value::<minijinja::Value>(plan.template_tools())
                .map_err(|e| ApiError::bad(e.to_string(), Some("tools")))?,
        ));
        if request_template.is_none() {
            request_template = s.cfg.tools.template.clone();
        }
    }
    let messages = req
        .messages
        .as_deref()
        .ok_or_else(|| ApiError::bad("messages is required", Some("messages")))?;
    let (messages, last) = template_messages(messages, media)?;
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
    let continue_final = req.continue_final_message.unwrap_or(false);
    if continue_final && add_generation_prompt {
        return Err(ApiError::bad(
            "continue_final_message and add_generation_prompt cannot both be true (set \
             add_generation_prompt to false to continue the last message)",
            Some("continue_final_message"),
        ));
    }
    let conv = Conversation {
        messages,
        add_generation_prompt,
        continue_final: continue_final.then_some(last),
        kwargs,
    };
    s.templates.render(request_template.as_deref(), conv).await
}

/// The rendered conversation's media through the seam, on the blocking pool (fetching, decoding,
/// the processor and the encoder ahead are heavy): the expanded prompt's ids and its items.
async fn prepare_media(
    s: &Arc<AppState>,
    text: String,
    add_special_tokens: bool,
    refs: Vec<MediaRef>,
    truncate: Option<i64>,
) -> Result<Prepared, ApiError> {
    s.cfg.media.check_limits(&refs)?;
    if truncate.is_some() {
        return Err(ApiError::bad(
            "truncate_prompt_tokens cannot be combined with image or audio parts (truncation could cut \
             a placeholder run)",
            Some("truncate_prompt_tokens"),
        ));
    }
    check_rendered_len(s, &text)?;
    let seam = s
        .cfg
        .media
        .seam
        .clone()
        .expect("refs are only collected with a seam");
    let p = s
        .media_call(move || seam.prepare(&text, add_special_tokens, &refs))
        .await?;
    if p.token_ids.is_empty() {
        return Err(ApiError::bad(
            "the rendered conversation is empty",
            Some("messages"),
        ));
    }
    Ok(p)
}

fn kwargs_template(kw: Option<&minijinja::Value>) -> Option<String> {
    kw?.get_attr("chat_template")
        .ok()?
        .as_str()
        .map(str::to_string)
}

async fn run(s: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_json(&s, body, &CHAT)?;
    let inputs = chat_inputs(&s, &req).await?;
    s.front.observe_params(inputs.n, inputs.params.max_tokens);
    let mut subs = Vec::with_capacity(inputs.n as usize);
    let mut first = None;
    for j in 0..inputs.n {
        let mut p = inputs.params.clone();
        if let (Some(seed), true) = (p.sampling.seed, j > 0) {
            p.sampling.seed = Some(seed.wrapping_add(j as u64));
        }
        let (l, id, rx) = match first {
            None => s.engines.submit(p),
            Some(f) => s.engines.submit_sibling(f, p),
        }
        .map_err(|_| ApiError::engine_dead(s.engines.dead_error().as_deref()))?;
        first.get_or_insert((l, id));
        subs.push((j as usize, rx));
    }
    let ctx = ChatCtx {
        id: format!("chatcmpl-{}", uuid_like()),
        model: inputs.model,
        created: now(),
        prompt_len: inputs.params.prompt.len() as u64,
        top_logprobs: inputs.params.logprobs.map(|k| k as usize),
        prompt_logprobs: inputs.params.prompt_logprobs.is_some(),
        text: TokenText::new(
            s.clone(),
            req.sampling.return_tokens_as_token_ids.unwrap_or(false)
                || s.cfg.return_tokens_as_token_ids,
        ),
        tools: inputs.tools,
    };
    if inputs.params.stream {
        let opts = req.sampling.stream_options.clone().unwrap_or_default();
        Ok(chat_stream(
            ctx,
            subs,
            opts.include_usage.unwrap_or(false),
            opts.continuous_usage_stats.unwrap_or(false),
        ))
    } else {
        chat_final(ctx, subs).await
    }
}
