//! The body of `POST /v1/chat/completions` (and `/v1/chat/completions/render`, `/tokenize` with
//! `messages`): fields as the Python server's `ChatCompletionRequest` has them, the fields this
//! front end refuses by name, and the conversion of messages into template input.
//!
//! Messages, `chat_template_kwargs` and tool calls are read straight into template values
//! ([`minijinja::Value`], keys in the client's order) so a template's `tojson` writes them as
//! transformers would.

use minijinja::value::{Value, ValueKind};
use serde::Deserialize;
use serde_json::Value as Json;

use crate::chat_media::{has_media, media_content};
use crate::content_format::text_part;
use crate::media::MediaRef;
use crate::openai::{ApiError, CompletionRequest, SamplingRequest};
use crate::validate::logprobs_field;

/// Roles a message may have.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Names `chat_template_kwargs` may not set (the server sets them).
const RESERVED: [&str; 6] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
];

/// `POST /v1/chat/completions`. Unknown fields are ignored (vLLM's behaviour).
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// Served model name.
    #[serde(default)]
    pub model: Option<String>,
    /// The conversation.
    #[serde(default)]
    pub messages: Option<Vec<Value>>,
    /// Output tokens at most; wins over `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    /// End the prompt with the assistant's turn opener (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Continue the last (assistant) message instead of starting a new one.
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// Prepend `<bos>` when the rendering does not start with it (default false: templates write it).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// A request template (only with `--trust-request-chat-template`).
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Extra template variables.
    #[serde(default)]
    pub chat_template_kwargs: Option<Value>,
    /// Refused for chat (as the Python server does).
    #[serde(default)]
    pub echo: Option<bool>,
    /// Logprobs of each sampled token (chat form: `content` entries).
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// With `logprobs`: this many most likely alternatives per token.
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// Functions the model may call (`serve/tools.py`; checked in [`crate::tools::plan_tools`]).
    #[serde(default)]
    pub tools: Option<Json>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": ...}}`.
    #[serde(default)]
    pub tool_choice: Option<Json>,
    /// False: `required` makes exactly one call (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// The sampling fields shared with `/v1/completions` (`max_completion_tokens` wins over
    /// their `max_tokens`).
    #[serde(flatten)]
    pub sampling: SamplingRequest,
    /// Every other field, checked by name in [`refused`].
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Json>,
}

impl ChatCompletionRequest {
    /// A 400 naming the first field this front end does not serve, before any work is done.
    pub(crate) fn refused(&self) -> Result<(), ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::bad(
                "echo is not supported for chat completions",
                Some("echo"),
            ));
        }
        if self.top_logprobs.is_some() && self.logprobs != Some(true) {
            return Err(ApiError::bad(
                "top_logprobs needs logprobs set to true",
                Some("top_logprobs"),
            ));
        }
        crate::refused::refuse(&self.rest, &self.sampling, true)
    }

    /// The sampling fields as the completions validator reads them (`max_completion_tokens` wins
    /// over `max_tokens`; `logprobs` + `top_logprobs` become the completions `logprobs` count,
    /// checked against `max_logprobs` under the name `top_logprobs`).
    pub(crate) fn sampling_view(&self, max_logprobs: u32) -> Result<CompletionRequest, ApiError> {
        let logprobs = match self.logprobs {
            Some(true) => Some(
                logprobs_field(
                    "top_logprobs",
                    Some(self.top_logprobs.unwrap_or(0)),
                    max_logprobs,
                )?
                .unwrap_or(0) as i64,
            ),
            _ => None,
        };
        let max_tokens = self.max_completion_tokens.or(self.sampling.max_tokens);
        Ok(CompletionRequest {
            model: None,
            prompt: None,
            echo: None,
            logprobs,
            sampling: SamplingRequest {
                max_tokens,
                ..self.sampling.clone()
            },
            rest: serde_json::Map::new(),
        })
    }
}

/// The template variables of `chat_template_kwargs`, without the names the server sets; a
/// request template smuggled in as `chat_template_kwargs.chat_template` is refused unless trusted.
pub(crate) fn template_kwargs(
    kwargs: Option<&Value>,
    trusted: bool,
) -> Result<Vec<(String, Value)>, ApiError> {
    let Some(kw) = kwargs.filter(|v| !v.is_none()) else {
        return Ok(Vec::new());
    };
    if kw.kind() != ValueKind::Map {
        return Err(ApiError::bad(
            "chat_template_kwargs must be an object",
            Some("chat_template_kwargs"),
        ));
    }
    let mut out = Vec::new();
    for k in kw
        .try_iter()
        .map_err(|e| ApiError::bad(e.to_string(), None))?
    {
        let Some(name) = k.as_str() else { continue };
        if name == "chat_template" && !trusted {
            return Err(ApiError::bad(
                "chat_template_kwargs.chat_template is refused (see chat_template)",
                Some("chat_template_kwargs"),
            ));
        }
        if RESERVED.contains(&name) || name == "chat_template" {
            continue;
        }
        let v = kw.get_item(&k).unwrap_or_default();
        out.push((name.to_string(), v));
    }
    Ok(out)
}

fn bad_message(msg: String) -> ApiError {
    ApiError::bad(msg, Some("messages"))
}

fn describe(v: &Value) -> &'static str {
    match v.kind() {
        ValueKind::None | ValueKind::Undefined => "null",
        ValueKind::Bool => "a boolean",
        ValueKind::Number => "a number",
        ValueKind::String => "a string",
        ValueKind::Seq => "an array",
        ValueKind::Map => "an object",
        _ => "a value",
    }
}

/// The messages as template input: `role`, `content` (a string, or a list of text parts that the
/// template's content format later keeps or joins with newlines, [`crate::content_format`];
/// anything but text is refused by name), `name`, an assistant's
/// `tool_calls` (arguments parsed to objects, as tool-aware templates iterate them) and a tool
/// message's `tool_call_id`. Returns the template values and the last message's text (parts
/// joined with newlines).
///
/// With `media` (a multimodal server) and a media part anywhere in the conversation, contents
/// become part lists for the template and the media refs are appended to `media` in order
/// ([`crate::chat_media`]); otherwise media parts are refused by name, as before.
pub(crate) fn template_messages(
    messages: &[Value],
    mut media: Option<&mut Vec<MediaRef>>,
) -> Result<(Vec<Value>, String), ApiError> {
    if media.is_none() || !has_media(messages) {
        media = None;
    }
    if messages.is_empty() {
        return Err(bad_message(
            "messages is empty: give at least one {'role': ..., 'content': ...}".into(),
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    let mut last = String::new();
    for (i, m) in messages.iter().enumerate() {
        if m.kind() != ValueKind::Map {
            return Err(bad_message(format!(
                "messages[{i}] must be an object with 'role' and 'content', got {}",
                describe(m)
            )));
        }
        let role = m.get_attr("role").unwrap_or_default();
        let Some(role) = role.as_str().map(str::to_string) else {
            return Err(bad_message(format!(
                "messages[{i}].role must be a string (one of {}), got {}",
                ROLES.join(", "),
                describe(&role)
            )));
        };
        if !ROLES.contains(&role.as_str()) {
            let shown: String = role.chars().take(40).collect();
            return Err(bad_message(format!(
                "messages[{i}].role must be one of {}, got {shown:?}",
                ROLES.join(", ")
            )));
        }
        let content = m.get_attr("content").unwrap_or_default();
        let (content, text) = match media.as_deref_mut() {
            Some(refs) => media_content(i, &content, refs)?,
            None => content_text(i, &content)?,
        };
        let mut fields: Vec<(&str, Value)> =
            vec![("role", Value::from(role.as_str())), ("content", content)];
        let name = m.get_attr("name").unwrap_or_default();
        if !name.is_none() && !name.is_undefined() {
            if name.as_str().is_none() {
                return Err(bad_message(format!("messages[{i}].name must be a string")));
            }
            fields.push(("name", name));
        }
        let calls = m.get_attr("tool_calls").unwrap_or_default();
        if calls.is_true() {
            fields.push(("tool_calls", tool_calls(i, &calls)?));
        }
        let call_id = m.get_attr("tool_call_id").unwrap_or_default();
        if role == "tool" && !call_id.is_none() && !call_id.is_undefined() {
            fields.push(("tool_call_id", call_id));
        }
        out.push(Value::from_pairs(fields));
        last = text;
    }
    Ok((out, last))
}

/// A text-only content as the template value (a string, or the list of text parts) and its text.
fn content_text(i: usize, c: &Value) -> Result<(Value, String), ApiError> {
    match c.kind() {
        ValueKind::None | ValueKind::Undefined => Ok((Value::from(""), String::new())),
        ValueKind::String => {
            let t = c.as_str().unwrap_or("").to_string();
            Ok((Value::from(t.as_str()), t))
        }
        ValueKind::Seq => {
            let mut texts: Vec<String> = Vec::new();
            for (j, part) in c.try_iter().into_iter().flatten().enumerate() {
                let kind = part.get_attr("type").unwrap_or_default();
                let text = part.get_attr("text").unwrap_or_default();
                match (kind.as_str(), text.as_str()) {
                    (Some("text"), Some(t)) => texts.push(t.to_string()),
                    (k, _) => {
                        let got = k
                            .map(str::to_string)
                            .unwrap_or_else(|| describe(&part).to_string());
                        return Err(bad_message(format!(
                            "messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are \
                             supported, got {got:?}"
                        )));
                    }
                }
            }
            let parts = texts.iter().map(|t| text_part(t)).collect::<Vec<_>>();
            Ok((Value::from(parts), texts.join("\n")))
        }
        _ => Err(bad_message(format!(
            "messages[{i}].content must be a string or a list of text parts, got {}",
            describe(c)
        ))),
    }
}

/// An assistant message's `tool_calls` as tool-aware templates read them: `{id, type, function:
/// {name, arguments}}` with the arguments as an object (OpenAI sends them as a JSON string).
fn tool_calls(i: usize, calls: &Value) -> Result<Value, ApiError> {
    if calls.kind() != ValueKind::Seq {
        return Err(bad_message(format!(
            "messages[{i}].tool_calls must be a list"
        )));
    }
    let mut out = Vec::new();
    for (j, c) in calls.try_iter().into_iter().flatten().enumerate() {
        let f = c.get_attr("function").unwrap_or_default();
        let name = f.get_attr("name").unwrap_or_default();
        if f.kind() != ValueKind::Map || name.as_str().is_none() {
            return Err(bad_message(format!(
                "messages[{i}].tool_calls[{j}] must have function.name"
            )));
        }
        let raw = f.get_attr("arguments").unwrap_or_default();
        let args = match raw.kind() {
            ValueKind::None | ValueKind::Undefined => {
                Value::from_pairs(std::iter::empty::<(String, Value)>())
            }
            ValueKind::String => {
                let s = raw.as_str().unwrap_or("");
                if s.trim().is_empty() {
                    Value::from_pairs(std::iter::empty::<(String, Value)>())
                } else {
                    serde_json::from_str::<Value>(s).map_err(|_| {
                        bad_message(format!(
                            "messages[{i}].tool_calls[{j}].function.arguments is not JSON"
                        ))
                    })?
                }
            }
            _ => raw,
        };
        if args.kind() != ValueKind::Map {
            return Err(bad_message(format!(
                "messages[{i}].tool_calls[{j}].function.arguments must be a JSON object"
            )));
        }
        let func = Value::from_pairs([("name", name), ("arguments", args)]);
        let call = Value::from_pairs([
            ("id", c.get_attr("id").unwrap_or_default()),
            ("type", Value::from("function")),
            ("function", func),
        ]);
        out.push(call);
    }
    Ok(Value::from(out))
}
