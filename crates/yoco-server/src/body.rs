//! A request body read as the Python server reads it (`serve/body.py`): every way the bytes can be
//! wrong is a 400 that says what and where, in the same words. Empty; not UTF-8 (the byte and its
//! offset); not JSON (line and column); nested too deeply; not an object; a lone UTF-16 surrogate
//! (`"\ud800"`, which no UTF-8 text can hold) named by the field that holds it; `NaN`/`Infinity`
//! (Python's `json` reads them, serde does not) named by their field as not finite.
//!
//! The usual body parses once. Only a body serde refuses is scanned again ([`mark`]): lone
//! surrogates and non-finite literals are replaced by marker strings, the result is parsed, and the
//! first marker's path names the field.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::app::AppState;
use crate::body_fields::{check, Schema};
use crate::openai::ApiError;

/// What a marker string starts and ends with (NUL cannot appear unescaped in a JSON string, and a
/// body that already holds `\u0000yoco` markers is only misreported, never accepted).
const MARK: &str = "\u{0}yoco:";

/// A request body read into `T` after [`read_object`] and the schema's field checks; what serde
/// still refuses is a 400 with its message.
pub(crate) fn parse_json<T: DeserializeOwned>(
    s: &AppState,
    body: Result<Bytes, BytesRejection>,
    schema: &Schema,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            too_large(s.cfg.max_request_body_bytes)
        } else {
            ApiError::bad(format!("Could not read the request body: {e}"), None)
        }
    })?;
    let mut obj = read_object(&bytes)?;
    check(&mut obj, schema, s.cfg.vocab_size)?;
    serde_json::from_value(Value::Object(obj))
        .map_err(|e| ApiError::bad(format!("The request body is not valid: {e}"), None))
}

/// The 413 for a body over `--max-request-body-bytes`.
pub(crate) fn too_large(limit: usize) -> ApiError {
    ApiError::status(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body is too large; the limit is {limit} bytes (the server's --max-request-body-bytes)"),
    )
}

/// The body as a JSON object, or the 400 that says why not.
pub(crate) fn read_object(raw: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad(
            "request body is empty: send a JSON object (Content-Type: application/json)",
            None,
        ));
    }
    let text = std::str::from_utf8(raw).map_err(|e| not_utf8(raw, e))?;
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Err(located(text).unwrap_or_else(|| not_json(&e))),
    };
    match value {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad(
            format!("request body must be a JSON object, got {}", kind(&other)),
            None,
        )),
    }
}

/// `'an object'`, `'an array'`, ... for messages about a JSON value (`describe_kind` in Python).
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "an object",
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
        Value::Number(_) => "a number",
    }
}

fn not_utf8(raw: &[u8], e: std::str::Utf8Error) -> ApiError {
    let at = e.valid_up_to();
    let byte = raw[at];
    let reason = match e.error_len() {
        None => "unexpected end of data",
        Some(_) if (0x80..0xc2).contains(&byte) || byte >= 0xf5 => "invalid start byte",
        Some(_) => "invalid continuation byte",
    };
    ApiError::bad(
        format!(
            "request body is not valid UTF-8: byte 0x{byte:02x} at offset {at} ({reason}); JSON bodies must be UTF-8"
        ),
        None,
    )
}

fn not_json(e: &serde_json::Error) -> ApiError {
    let full = e.to_string();
    if full.starts_with("recursion limit exceeded") {
        return ApiError::bad(
            "request body is not valid JSON: nested too deeply (more than 128 levels)",
            None,
        );
    }
    let what = full.split(" at line ").next().unwrap_or(&full);
    ApiError::bad(
        format!(
            "request body is not valid JSON: {what} at line {} column {}",
            e.line(),
            e.column()
        ),
        None,
    )
}

/// The 400 for the first lone surrogate or non-finite number in a body serde refused, naming its
/// field; `None` when the body holds neither (then serde's own error is the answer).
fn located(text: &str) -> Option<ApiError> {
    let marked = mark(text)?;
    let value: Value = serde_json::from_str(&marked).ok()?;
    let (path, what) = first_marker(&value, String::new())?;
    let param = path
        .split(['.', '['])
        .next()
        .filter(|p| !p.is_empty())
        .unwrap_or("body")
        .to_string();
    let field = if path.is_empty() { "body" } else { &path };
    let msg = match what {
        Marker::NonFinite(lit) => format!("{field} must be a finite number, got {lit}"),
        Marker::Surrogate { code, at } => format!(
            "{field} holds a lone UTF-16 surrogate (\\u{code} at character {at}), which is not valid Unicode"
        ),
    };
    Some(ApiError::bad(msg, Some(&param)))
}

enum Marker {
    NonFinite(&'static str),
    Surrogate { code: String, at: usize },
}

/// `text` with each lone surrogate escape inside a string replaced by `\u0000yoco:s:d800\u0000` and
/// each `NaN`/`Infinity`/`-Infinity` outside strings by the string `"\u0000yoco:n:NaN\u0000"`;
/// `None` when there was nothing to replace.
fn mark(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 32);
    let (mut i, mut last, mut in_str, mut changed) = (0, 0, false, false);
    while i < b.len() {
        if in_str {
            match b[i] {
                b'"' => in_str = false,
                b'\\' if b.get(i + 1) == Some(&b'u') => {
                    if let Some(code) = hex4(b, i + 2) {
                        let high = (0xd800..0xdc00).contains(&code);
                        let low = (0xdc00..0xe000).contains(&code);
                        let paired = high
                            && b.get(i + 6) == Some(&b'\\')
                            && b.get(i + 7) == Some(&b'u')
                            && hex4(b, i + 8).is_some_and(|c| (0xdc00..0xe000).contains(&c));
                        if paired {
                            i += 12;
                            continue;
                        }
                        if high || low {
                            out.push_str(&text[last..i]);
                            out.push_str(&format!("\\u0000yoco:s:{code:04x}\\u0000"));
                            i += 6;
                            last = i;
                            changed = true;
                            continue;
                        }
                    }
                    i += 2;
                    continue;
                }
                b'\\' => {
                    i += 2;
                    continue;
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        if b[i] == b'"' {
            in_str = true;
            i += 1;
            continue;
        }
        let lit = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|l| b[i..].starts_with(l.as_bytes()));
        if let Some(l) = lit {
            out.push_str(&text[last..i]);
            out.push_str(&format!("\"\\u0000yoco:n:{l}\\u0000\""));
            i += l.len();
            last = i;
            changed = true;
            continue;
        }
        i += 1;
    }
    out.push_str(&text[last..]);
    changed.then_some(out)
}

fn hex4(b: &[u8], at: usize) -> Option<u32> {
    let s = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
    u32::from_str_radix(s, 16).ok()
}

/// The path (`messages[0].content`, Python's form) and kind of the first marker, in document order.
fn first_marker(v: &Value, path: String) -> Option<(String, Marker)> {
    match v {
        Value::String(s) => marker_in(s).map(|m| (path, m)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| first_marker(x, format!("{path}[{i}]"))),
        Value::Object(m) => m.iter().find_map(|(k, x)| {
            if let Some(found) = marker_in(k) {
                return Some((path.clone(), found));
            }
            let sub = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            first_marker(x, sub)
        }),
        _ => None,
    }
}

fn marker_in(s: &str) -> Option<Marker> {
    let start = s.find(MARK)?;
    let rest = &s[start + MARK.len()..];
    let body = rest.split('\u{0}').next().unwrap_or("");
    let (tag, arg) = body.split_once(':')?;
    match tag {
        "n" => Some(Marker::NonFinite(match arg {
            "NaN" => "nan",
            "Infinity" => "inf",
            _ => "-inf",
        })),
        "s" => Some(Marker::Surrogate {
            code: arg.to_string(),
            at: s[..start].chars().count(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(raw: &[u8]) -> ApiError {
        read_object(raw).unwrap_err()
    }

    #[test]
    fn each_broken_body_is_named_in_the_python_server_s_words() {
        assert!(err(b"  ").message.contains("request body is empty"));
        let e = err(b"{\"prompt\": \"\xff\xfe\"}");
        assert!(
            e.message
                .contains("byte 0xff at offset 12 (invalid start byte)"),
            "{}",
            e.message
        );
        let e = err(b"{\"prompt\": \"x\", ");
        assert!(
            e.message.starts_with("request body is not valid JSON: ")
                && e.message.contains("line 1")
        );
        assert!(err(&[b'['; 100_000]).message.contains("nested too deeply"));
        assert_eq!(
            err(b"[1, 2]").message,
            "request body must be a JSON object, got an array"
        );
    }

    #[test]
    fn a_lone_surrogate_is_named_by_its_field_and_character() {
        let e = err(br#"{"max_tokens": 1, "prompt": "A\ud800B"}"#);
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert!(
            e.message
                .starts_with("prompt holds a lone UTF-16 surrogate (\\ud800 at character 1)"),
            "{}",
            e.message
        );
        let e = err(br#"{"messages": [{"role": "user", "content": "\udbff"}]}"#);
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(
            e.message.starts_with("messages[0].content holds"),
            "{}",
            e.message
        );
        let e = err(br#"{"prompt": "x", "\ud800": 1}"#);
        assert!(
            e.message.starts_with("body holds a lone UTF-16 surrogate"),
            "{}",
            e.message
        );
        // an escaped backslash before `u` is not an escape; a pair is fine
        assert!(read_object(br#"{"p": "\\ud800", "q": "\ud83d\ude00"}"#).is_ok());
    }

    #[test]
    fn non_finite_literals_are_refused_by_field_not_as_syntax() {
        let e = err(br#"{"prompt": "NaN", "temperature": NaN}"#);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert_eq!(e.message, "temperature must be a finite number, got nan");
        let e = err(br#"{"top_p": -Infinity}"#);
        assert_eq!(e.message, "top_p must be a finite number, got -inf");
    }
}
