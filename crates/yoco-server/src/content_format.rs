//! How a chat template wants a message's `content` when the client sends a list of text parts:
//! vLLM's `--chat-template-content-format` (`auto`: detected per template).
//!
//! Templates that loop over the parts themselves (Gemma 3n's: each text part trimmed, parts
//! concatenated, images and audio as placeholders) get the list as it came ("openai"), as vLLM,
//! transformers' `apply_chat_template` and `Engine.chat` hand it over. Templates written for string
//! content ("string") get the text parts joined with newlines, as vLLM does; given the list, they
//! would print its repr or fail.
//!
//! Detection renders the template twice with one user message, once with the content as a string
//! and once as a one-part list: if the two renderings are the same and hold the text, the template
//! reads the parts. vLLM instead walks the template's syntax tree for a loop over the content. Both
//! classify the common templates alike, and rendering cannot be fooled by a macro or a helper
//! variable in between.

use minijinja::value::{Value, ValueKind};
use minijinja::{context, Environment};

/// A template's content format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// Text parts joined with `"\n"` into one string.
    String,
    /// The list of parts as sent.
    OpenAi,
}

impl ContentFormat {
    /// `auto`, `string` or `openai`: None for `auto` (detect per template).
    pub fn parse_flag(s: &str) -> Result<Option<Self>, String> {
        match s {
            "auto" => Ok(None),
            "string" => Ok(Some(Self::String)),
            "openai" => Ok(Some(Self::OpenAi)),
            other => Err(format!(
                "--chat-template-content-format must be auto, string or openai, got {other:?}"
            )),
        }
    }
}

const PROBE: &str = "yoco content format probe 7f3a";

/// Detects the format of the template named `chat` in `env` (see the module doc). A template that
/// fails either rendering is taken as "string" (vLLM's fallback too).
pub(crate) fn detect(env: &Environment<'_>) -> ContentFormat {
    let Ok(t) = env.get_template("chat") else {
        return ContentFormat::String;
    };
    let render = |content: Value| {
        let user = Value::from_pairs([("role", Value::from("user")), ("content", content)]);
        t.render(context! {
            messages => vec![user], add_generation_prompt => true, tools => (), documents => (),
            bos_token => "", eos_token => "", pad_token => "", unk_token => "",
        })
        .ok()
    };
    let as_string = render(Value::from(PROBE));
    let as_parts = render(Value::from(vec![text_part(PROBE)]));
    match (as_string, as_parts) {
        (Some(a), Some(b)) if a == b && a.contains(PROBE) => ContentFormat::OpenAi,
        _ => ContentFormat::String,
    }
}

/// `{"type": "text", "text": text}`.
pub(crate) fn text_part(text: &str) -> Value {
    Value::from_pairs([("type", Value::from("text")), ("text", Value::from(text))])
}

/// The texts of a list of parts when every part is a text part (else None: media lists keep their
/// shape in both formats).
fn text_parts(content: &Value) -> Option<Vec<String>> {
    if content.kind() != ValueKind::Seq {
        return None;
    }
    let mut out = Vec::new();
    for part in content.try_iter().ok()? {
        if part.get_attr("type").ok()?.as_str() != Some("text") {
            return None;
        }
        out.push(part.get_attr("text").ok()?.as_str()?.to_string());
    }
    Some(out)
}

/// The messages as `format` wants them: with "string", each content that is a list of text parts
/// becomes the parts joined with newlines; with "openai", nothing changes.
pub(crate) fn apply(messages: Vec<Value>, format: ContentFormat) -> Vec<Value> {
    if format == ContentFormat::OpenAi {
        return messages;
    }
    messages
        .into_iter()
        .map(|m| {
            let Some(texts) = m.get_attr("content").ok().as_ref().and_then(text_parts) else {
                return m;
            };
            let pairs: Vec<(Value, Value)> = m
                .try_iter()
                .into_iter()
                .flatten()
                .map(|k| {
                    let v = if k.as_str() == Some("content") {
                        Value::from(texts.join("\n"))
                    } else {
                        m.get_item(&k).unwrap_or_default()
                    };
                    (k, v)
                })
                .collect();
            Value::from_pairs(pairs)
        })
        .collect()
}

/// The final message's text that `continue_final_message` cuts after, as transformers picks it:
/// the content if a string, else its last text part. `joined` is the text parts joined with
/// newlines, which is what a "string" template rendered.
pub(crate) fn final_text(messages: &[Value], format: ContentFormat, joined: String) -> String {
    if format == ContentFormat::String {
        return joined;
    }
    let content = messages.last().and_then(|m| m.get_attr("content").ok());
    match content {
        Some(c) if c.kind() == ValueKind::Seq => c
            .try_iter()
            .into_iter()
            .flatten()
            .filter(|p| {
                p.get_attr("type")
                    .ok()
                    .and_then(|t| t.as_str().map(|s| s == "text"))
                    == Some(true)
            })
            .filter_map(|p| p.get_attr("text").ok()?.as_str().map(str::to_string))
            .last()
            .unwrap_or(joined),
        _ => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(src: &str) -> Environment<'static> {
        let mut e = Environment::new();
        e.add_template_owned("chat", src.to_string()).unwrap();
        e
    }

    const GEMMA_LIKE: &str = "{%- macro text(c) -%}{%- if c is string -%}{{ c | trim }}{%- else -%}\
        {%- for p in c -%}{%- if p['type'] == 'text' -%}{{ p['text'] | trim }}{%- endif -%}{%- endfor -%}\
        {%- endif -%}{%- endmacro -%}{% for m in messages %}<{{ m['role'] }}>{{ text(m['content']) }}{% endfor %}";
    const STRING_ONLY: &str =
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}";

    #[test]
    fn a_template_that_loops_over_the_parts_is_openai_and_one_that_prints_content_is_string() {
        assert_eq!(detect(&env(GEMMA_LIKE)), ContentFormat::OpenAi);
        assert_eq!(detect(&env(STRING_ONLY)), ContentFormat::String);
        // one that fails on a list (a string filter) is string too
        assert_eq!(
            detect(&env(
                "{% for m in messages %}{{ m['content'].strip() }}{% endfor %}"
            )),
            ContentFormat::String
        );
    }

    #[test]
    fn string_format_joins_text_parts_with_newlines_and_keeps_media_lists_and_other_fields() {
        let parts = Value::from(vec![text_part("a "), text_part(" b")]);
        let media = Value::from(vec![
            text_part("look"),
            Value::from_pairs([("type", Value::from("image"))]),
        ]);
        let msgs = vec![
            Value::from_pairs([
                ("role", Value::from("user")),
                ("content", parts.clone()),
                ("name", Value::from("n")),
            ]),
            Value::from_pairs([("role", Value::from("user")), ("content", media.clone())]),
        ];
        let out = apply(msgs.clone(), ContentFormat::String);
        assert_eq!(out[0].get_attr("content").unwrap().as_str(), Some("a \n b"));
        assert_eq!(out[0].get_attr("name").unwrap().as_str(), Some("n"));
        assert_eq!(out[1].get_attr("content").unwrap(), media);
        assert_eq!(
            apply(msgs, ContentFormat::OpenAi)[0]
                .get_attr("content")
                .unwrap(),
            parts
        );
    }

    #[test]
    fn continue_final_cuts_after_the_last_text_part_of_a_parts_list_as_transformers_does() {
        let msgs = vec![Value::from_pairs([
            ("role", Value::from("assistant")),
            (
                "content",
                Value::from(vec![text_part("first"), text_part("second ")]),
            ),
        ])];
        assert_eq!(
            final_text(&msgs, ContentFormat::OpenAi, "first\nsecond ".into()),
            "second "
        );
        assert_eq!(
            final_text(&msgs, ContentFormat::String, "first\nsecond ".into()),
            "first\nsecond "
        );
    }

    #[test]
    fn the_flag_takes_auto_string_and_openai_and_names_a_bad_value() {
        assert_eq!(ContentFormat::parse_flag("auto"), Ok(None));
        assert_eq!(
            ContentFormat::parse_flag("openai"),
            Ok(Some(ContentFormat::OpenAi))
        );
        assert!(ContentFormat::parse_flag("json")
            .unwrap_err()
            .contains("auto, string or openai"));
    }
}
