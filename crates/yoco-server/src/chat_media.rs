//! Chat content parts that carry media (OpenAI / vLLM shapes), for a multimodal checkpoint; the
//! Python server's `serve/chat_media.py`, same shapes and wording:
//!
//! * `{"type": "image_url", "image_url": {"url": ...}}` (or the url as a string);
//! * `{"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav" | "mp3" | ...}}`;
//! * `{"type": "audio_url", "audio_url": {"url": ...}}` (vLLM's), like `image_url`.
//!
//! A message's parts reach the template as `{"type": "text", "text": ...}`, `{"type": "image"}` and
//! `{"type": "audio"}` (Gemma 3n's template renders one placeholder token for each); the refs are
//! collected in order for the [`crate::media::MediaSeam`]. Only a request with at least one media
//! part takes this path (a text-only conversation's parts go by the template's content format,
//! [`crate::content_format`]).

use minijinja::value::{Value, ValueKind};

use crate::media::{MediaRef, MediaSource, Modality};
use crate::openai::ApiError;

/// Content part types that carry media.
const MEDIA_PARTS: [&str; 3] = ["image_url", "input_audio", "audio_url"];

fn bad(msg: String) -> ApiError {
    ApiError::bad(msg, Some("messages"))
}

fn part_type(p: &Value) -> Option<String> {
    if p.kind() != ValueKind::Map {
        return None;
    }
    p.get_attr("type")
        .ok()
        .and_then(|t| t.as_str().map(str::to_string))
}

/// Whether any message has a media content part (the Python server's `has_media`).
pub(crate) fn has_media(messages: &[Value]) -> bool {
    messages.iter().any(|m| {
        let c = m.get_attr("content").unwrap_or_default();
        c.kind() == ValueKind::Seq
            && c.try_iter()
                .into_iter()
                .flatten()
                .any(|p| part_type(&p).is_some_and(|t| MEDIA_PARTS.contains(&t.as_str())))
    })
}

fn url_of(part: &Value, key: &str, location: &str) -> Result<String, ApiError> {
    let v = part.get_attr(key).unwrap_or_default();
    let url = if v.kind() == ValueKind::Map {
        v.get_attr("url").unwrap_or_default()
    } else {
        v
    };
    match url.as_str() {
        Some(u) if !u.is_empty() => Ok(u.to_string()),
        _ => Err(bad(format!(
            "{location}: {key} needs a url ({{'{key}': {{'url': ...}}}})"
        ))),
    }
}

/// Message `i`'s content as template parts (`{"type": "text"|"image"|"audio"}`), its media refs
/// appended to `refs` in order; also its text parts joined (what `continue_final_message` reads).
pub(crate) fn media_content(
    i: usize,
    c: &Value,
    refs: &mut Vec<MediaRef>,
) -> Result<(Value, String), ApiError> {
    match c.kind() {
        ValueKind::None | ValueKind::Undefined => return Ok((Value::from(""), String::new())),
        ValueKind::String => {
            let s = c.as_str().unwrap_or("").to_string();
            return Ok((Value::from(s.as_str()), s));
        }
        ValueKind::Seq => {}
        _ => {
            return Err(bad(format!(
                "messages[{i}].content must be a string or a list of content parts"
            )))
        }
    }
    let mut parts = Vec::new();
    let mut texts = Vec::new();
    for (j, p) in c.try_iter().into_iter().flatten().enumerate() {
        let location = format!("messages[{i}].content[{j}]");
        let kind = part_type(&p);
        let text = p.get_attr("text").unwrap_or_default();
        let (modality, source) = match kind.as_deref() {
            Some("text") if text.as_str().is_some() => {
                let t = text.as_str().unwrap_or("");
                texts.push(t.to_string());
                parts.push(Value::from_pairs([
                    ("type", Value::from("text")),
                    ("text", Value::from(t)),
                ]));
                continue;
            }
            Some("image_url") => (
                Modality::Image,
                MediaSource::Url(url_of(&p, "image_url", &location)?),
            ),
            Some("audio_url") => (
                Modality::Audio,
                MediaSource::Url(url_of(&p, "audio_url", &location)?),
            ),
            Some("input_audio") => {
                let a = p.get_attr("input_audio").unwrap_or_default();
                let data = a.get_attr("data").unwrap_or_default();
                let (true, Some(data)) = (a.kind() == ValueKind::Map, data.as_str()) else {
                    return Err(bad(format!(
                        "{location}: input_audio needs {{'data': <base64>, 'format': 'wav'|'mp3'}}"
                    )));
                };
                let format = a.get_attr("format").unwrap_or_default();
                (
                    Modality::Audio,
                    MediaSource::Inline {
                        data: data.to_string(),
                        format: format.as_str().map(str::to_string),
                    },
                )
            }
            other => {
                let got = match other {
                    Some(k) => format!("'{k}'"),
                    None => "None".into(),
                };
                return Err(bad(format!(
                    "{location}: unsupported content part {got}; use text, image_url, input_audio \
                     or audio_url"
                )));
            }
        };
        parts.push(Value::from_pairs([("type", Value::from(modality.name()))]));
        refs.push(MediaRef {
            modality,
            location,
            source,
        });
    }
    Ok((Value::from(parts), texts.join("\n")))
}
