//! The fields of `POST /v1/audio/transcriptions` (a multipart form), checked as the Python server's
//! `serve/transcriptions.py` checks them, in the same order and words: unknown fields, `language`
//! (ISO 639-1, the supported set), `response_format` (`json`, `text`), the booleans, the numbers'
//! ranges; the upload's format comes from its file name's extension.

use crate::openai::ApiError;

/// Languages a transcription may ask for (ISO 639-1 → the name the prompt says).
pub const LANGUAGES: [(&str, &str); 18] = [
    ("en", "English"),
    ("de", "German"),
    ("fr", "French"),
    ("es", "Spanish"),
    ("it", "Italian"),
    ("pt", "Portuguese"),
    ("nl", "Dutch"),
    ("ja", "Japanese"),
    ("ko", "Korean"),
    ("zh", "Chinese"),
    ("ru", "Russian"),
    ("ar", "Arabic"),
    ("hi", "Hindi"),
    ("pl", "Polish"),
    ("tr", "Turkish"),
    ("sv", "Swedish"),
    ("uk", "Ukrainian"),
    ("id", "Indonesian"),
];

/// Audio containers the decoder reads.
pub const AUDIO_FORMATS: [&str; 4] = ["wav", "flac", "mp3", "ogg"];

/// The form fields the endpoint takes (sorted, as the error lists them).
pub const FIELDS: [&str; 12] = [
    "file",
    "language",
    "max_completion_tokens",
    "model",
    "prompt",
    "response_format",
    "seed",
    "stream",
    "stream_include_usage",
    "temperature",
    "top_k",
    "top_p",
];

/// Python's `repr` of a list of strings (what the Python server's messages show).
fn py_list(items: &[&str]) -> String {
    let inner: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
    format!("[{}]", inner.join(", "))
}

/// A 400 when the form has fields the endpoint does not take (`names` in the form's order).
pub fn check_fields<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ApiError> {
    let mut unknown: Vec<&str> = names.into_iter().filter(|n| !FIELDS.contains(n)).collect();
    unknown.sort_unstable();
    unknown.dedup();
    if let Some(first) = unknown.first() {
        return Err(ApiError::bad(
            format!(
                "unsupported field(s) {}; supported: {}",
                py_list(&unknown),
                py_list(&FIELDS)
            ),
            Some(first),
        ));
    }
    Ok(())
}

/// The upload's format from its file name (None without an extension: the decoder sniffs it).
pub fn audio_format(filename: Option<&str>) -> Result<Option<String>, ApiError> {
    let name = filename.unwrap_or("").to_lowercase();
    let Some((_, ext)) = name.rsplit_once('.') else {
        return Ok(None);
    };
    if !AUDIO_FORMATS.contains(&ext) {
        return Err(ApiError::bad(
            format!(
                "audio format '{ext}' is not supported; use one of {}",
                AUDIO_FORMATS.join(", ")
            ),
            Some("file"),
        ));
    }
    Ok(Some(ext.to_string()))
}

/// `language`: absent or empty is none; otherwise one of [`LANGUAGES`].
pub fn language(v: Option<&str>) -> Result<Option<String>, ApiError> {
    match v.filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(l) if LANGUAGES.iter().any(|(k, _)| *k == l) => Ok(Some(l.to_string())),
        Some(l) => {
            let mut codes: Vec<&str> = LANGUAGES.iter().map(|(k, _)| *k).collect();
            codes.sort_unstable();
            Err(ApiError::bad(
                format!(
                    "language '{l}' is not supported; use an ISO 639-1 code among {}",
                    py_list(&codes)
                ),
                Some("language"),
            ))
        }
    }
}

/// Whether the answer is plain text (`response_format=text`) rather than JSON (the default).
pub fn text_format(v: Option<&str>) -> Result<bool, ApiError> {
    match v.filter(|s| !s.is_empty()).unwrap_or("json") {
        "json" => Ok(false),
        "text" => Ok(true),
        other => Err(ApiError::bad(
            format!("response_format '{other}' is not supported; use json or text"),
            Some("response_format"),
        )),
    }
}

/// A boolean field: `true`/`1`, `false`/`0`/empty (case-insensitive), absent = false.
pub fn boolean(v: Option<&str>, name: &str) -> Result<bool, ApiError> {
    match v.map(|s| s.trim().to_lowercase()).as_deref() {
        None | Some("false") | Some("0") | Some("") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(_) => Err(ApiError::bad(
            format!("{name} must be true or false, got '{}'", v.unwrap_or("")),
            Some(name),
        )),
    }
}

/// A number field in `[lo, hi]`.
pub fn number(v: &str, name: &str, lo: f64, hi: f64) -> Result<f64, ApiError> {
    let x: f64 = v
        .trim()
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite())
        .ok_or_else(|| ApiError::bad(format!("{name} must be a number, got '{v}'"), Some(name)))?;
    if x < lo || x > hi {
        return Err(ApiError::bad(
            format!("{name} must be in [{lo:?}, {hi:?}], got '{v}'"),
            Some(name),
        ));
    }
    Ok(x)
}

/// An integer field in `[lo, hi]`.
pub fn integer(v: &str, name: &str, lo: i64, hi: i64) -> Result<i64, ApiError> {
    let x: i64 = v
        .trim()
        .parse()
        .map_err(|_| ApiError::bad(format!("{name} must be a number, got '{v}'"), Some(name)))?;
    if x < lo || x > hi {
        return Err(ApiError::bad(
            format!("{name} must be in [{lo}, {hi}], got '{v}'"),
            Some(name),
        ));
    }
    Ok(x)
}
