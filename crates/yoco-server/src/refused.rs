//! Request fields yoco-serve knows but does not implement: each is refused with a 400 that names it,
//! never silently ignored (a client asking for a logit bias must not get unbiased text). One table,
//! as the Python server's `serve/unsupported.py`, plus the field combinations that make no sense
//! (`best_of` other than `n`, `stream_options` without `stream`).

use serde_json::{Map, Value};

use crate::openai::{ApiError, SamplingRequest};

const NEVER: &str = "is not supported by yoco-serve";
const TOOLS: &str = "(tool calling) is not supported by yoco-serve";

/// Anything but an absent value (null) asks for the feature.
fn is_set(v: &Value) -> bool {
    !v.is_null()
}

fn is_nonempty(v: &Value) -> bool {
    !(v.is_null()
        || v.as_array().is_some_and(|a| a.is_empty())
        || v.as_object().is_some_and(|o| o.is_empty())
        || v.as_str() == Some(""))
}

fn not_text_only(v: &Value) -> bool {
    is_set(v) && v != &serde_json::json!(["text"])
}

type Check = fn(&Value) -> bool;

/// (field, refused on chat, refused on completions, when, why).
const REFUSED: [(&str, bool, bool, Check, &str); 10] = [
    (
        "functions",
        true,
        false,
        is_nonempty,
        "(tool calling) is not supported by yoco-serve; omit functions",
    ),
    ("function_call", true, false, is_set, TOOLS),
    ("logit_bias", true, true, is_nonempty, NEVER),
    ("allowed_token_ids", true, true, is_nonempty, NEVER),
    ("bad_words", true, true, is_nonempty, NEVER),
    ("suffix", false, true, is_set, NEVER),
    (
        "audio",
        true,
        false,
        is_set,
        "(audio output) is not supported by yoco-serve",
    ),
    (
        "modalities",
        true,
        false,
        not_text_only,
        "is not supported by yoco-serve (only ['text'])",
    ),
    (
        "prediction",
        true,
        false,
        is_set,
        "(predicted outputs) is not supported by yoco-serve",
    ),
    ("web_search_options", true, false, is_set, NEVER),
];

/// A 400 naming the first field of `rest` (the fields no struct took) this server does not
/// implement on this endpoint, or the first combination of `sampling` fields it refuses.
pub(crate) fn refuse(
    rest: &Map<String, Value>,
    sampling: &SamplingRequest,
    chat: bool,
) -> Result<(), ApiError> {
    for (name, on_chat, on_completion, set, why) in REFUSED {
        if (if chat { on_chat } else { on_completion }) && rest.get(name).is_some_and(set) {
            return Err(ApiError::bad(format!("{name} {why}"), Some(name)));
        }
    }
    if let Some(b) = rest.get("best_of").filter(|v| !v.is_null()) {
        let n = sampling.n.unwrap_or(1);
        if b.as_i64() != Some(n) {
            return Err(ApiError::bad(
                format!("best_of is not supported (it must equal n={n} or be omitted), got {b}"),
                Some("best_of"),
            ));
        }
    }
    if sampling.stream_options.is_some() && sampling.stream != Some(true) {
        return Err(ApiError::bad(
            "stream_options is only allowed when stream is true",
            Some("stream_options"),
        ));
    }
    Ok(())
}
