//! The top-level fields of each request body and their kinds, checked before serde reads the body
//! into its struct, so a wrong value is a 400 that names the field in the Python server's words
//! (`serve/protocol.py`: strict kinds, `100.0` accepted as the integer 100, every integer within 64
//! bits; `missing required field 'prompt'`). A field not listed is left to serde; unknown fields are
//! ignored, as vLLM does.

use serde_json::{Map, Value};

use crate::body::kind;
use crate::openai::ApiError;

/// What a field must hold.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// An integer within 64 bits (an integral float is taken as one).
    Int,
    /// A finite number.
    Float,
    /// `true` or `false`.
    Bool,
    /// A string.
    Str,
    /// A list of [`Kind::Int`].
    IntList,
    /// A list of strings.
    StrList,
    /// An object.
    Object,
    /// `prompt`: a string, a list of strings, token ids, or lists of token ids (ids beyond 64 bits
    /// are named as outside the vocabulary, as the Python server names them).
    Prompt,
    /// `messages`: a list of objects, each with a string `role`.
    Messages,
    /// `stop`: a string or a list of strings.
    Stop,
}

/// One field: its name, kind and whether `null` means "omitted".
pub(crate) struct Field(pub &'static str, pub Kind, pub Nullable);

/// Whether `null` is accepted as "omitted" (pydantic's `Optional[...]`).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Nullable {
    Yes,
    No,
}

use Kind::*;
use Nullable::{No, Yes};

/// The fields `/v1/completions` and `/v1/chat/completions` share (`SamplingFields`).
const SAMPLING: &[Field] = &[
    Field("model", Str, Yes),
    Field("n", Int, No),
    Field("best_of", Int, Yes),
    Field("temperature", Float, Yes),
    Field("top_p", Float, Yes),
    Field("top_k", Int, Yes),
    Field("min_p", Float, Yes),
    Field("seed", Int, Yes),
    Field("stop", Stop, Yes),
    Field("stop_token_ids", IntList, Yes),
    Field("presence_penalty", Float, Yes),
    Field("frequency_penalty", Float, Yes),
    Field("repetition_penalty", Float, Yes),
    Field("min_tokens", Int, No),
    Field("ignore_eos", Bool, No),
    Field("skip_special_tokens", Bool, No),
    Field("spaces_between_special_tokens", Bool, No),
    Field("include_stop_str_in_output", Bool, No),
    Field("stream", Bool, Yes),
    Field("stream_options", Object, Yes),
    Field("user", Str, Yes),
    Field("allowed_token_ids", IntList, Yes),
    Field("bad_words", StrList, Yes),
    Field("prompt_logprobs", Int, Yes),
    Field("truncate_prompt_tokens", Int, Yes),
    Field("cache_salt", Str, Yes),
    Field("priority", Int, No),
    Field("return_tokens_as_token_ids", Bool, Yes),
];

/// What a body must hold: its field tables and the fields it may not omit.
pub(crate) struct Schema {
    pub tables: &'static [&'static [Field]],
    pub required: &'static [&'static str],
}

/// `/v1/completions` (and its render endpoint).
pub(crate) const COMPLETION: Schema = Schema {
    tables: COMPLETION_FIELDS,
    required: &["prompt"],
};

/// `/v1/chat/completions` (and its render endpoint); `/tokenize` with `messages`.
pub(crate) const CHAT: Schema = Schema {
    tables: CHAT_FIELDS,
    required: &["messages"],
};

/// `/tokenize` with a text `prompt` (a body with neither is refused by the handler).
pub(crate) const TOKENIZE_TEXT: Schema = Schema {
    tables: TOKENIZE_TEXT_FIELDS,
    required: &[],
};

/// `/detokenize`.
pub(crate) const DETOKENIZE: Schema = Schema {
    tables: DETOKENIZE_FIELDS,
    required: &["tokens"],
};

/// Any object (the handler reads what it needs).
pub(crate) const ANY_OBJECT: Schema = Schema {
    tables: &[],
    required: &[],
};

const COMPLETION_FIELDS: &[&[Field]] = &[
    SAMPLING,
    &[
        Field("prompt", Prompt, No),
        Field("max_tokens", Int, Yes),
        Field("logprobs", Int, Yes),
        Field("echo", Bool, Yes),
        Field("add_special_tokens", Bool, No),
    ],
];

const CHAT_FIELDS: &[&[Field]] = &[
    SAMPLING,
    &[
        Field("messages", Messages, No),
        Field("max_tokens", Int, Yes),
        Field("max_completion_tokens", Int, Yes),
        Field("logprobs", Bool, Yes),
        Field("top_logprobs", Int, Yes),
        Field("echo", Bool, Yes),
        Field("parallel_tool_calls", Bool, Yes),
        Field("add_generation_prompt", Bool, No),
        Field("continue_final_message", Bool, No),
        Field("add_special_tokens", Bool, No),
        Field("chat_template", Str, Yes),
        Field("chat_template_kwargs", Object, Yes),
        Field("return_token_strs", Bool, Yes),
    ],
];

const TOKENIZE_TEXT_FIELDS: &[&[Field]] = &[&[
    Field("model", Str, Yes),
    Field("prompt", Str, No),
    Field("add_special_tokens", Bool, No),
    Field("return_token_strs", Bool, Yes),
]];

const DETOKENIZE_FIELDS: &[&[Field]] = &[&[Field("model", Str, Yes), Field("tokens", IntList, No)]];

/// Checks that `body` has the schema's required fields and that every listed field it holds is of
/// its kind, turning integral floats of integer fields into integers (so serde's `i64` reads
/// `100.0`). `vocab` names prompt ids beyond 64 bits.
pub(crate) fn check(
    body: &mut Map<String, Value>,
    schema: &Schema,
    vocab: u32,
) -> Result<(), ApiError> {
    if let Some(name) = schema.required.iter().find(|n| !body.contains_key(**n)) {
        return Err(ApiError::bad(
            format!("missing required field '{name}'"),
            Some(name),
        ));
    }
    for table in schema.tables {
        for Field(name, kind, nullable) in table.iter() {
            let Some(v) = body.get_mut(*name) else {
                continue;
            };
            if v.is_null() && *nullable == Yes {
                continue;
            }
            check_one(name, *kind, v, vocab)?;
        }
    }
    Ok(())
}

fn check_one(name: &str, k: Kind, v: &mut Value, vocab: u32) -> Result<(), ApiError> {
    let wrong = |what: &str, v: &Value| {
        ApiError::bad(
            format!("{name} must be {what}, got {}", show(v)),
            Some(name),
        )
    };
    match k {
        Int => int(name, v),
        Float => match v {
            Value::Number(n) if n.as_f64().is_some_and(f64::is_finite) => Ok(()),
            other => Err(wrong("a number", other)),
        },
        Bool if v.is_boolean() => Ok(()),
        Bool => Err(wrong("a boolean", v)),
        Str if v.is_string() => Ok(()),
        Str => Err(wrong("a string", v)),
        Object if v.is_object() => Ok(()),
        Object => Err(wrong("an object", v)),
        IntList => match v {
            Value::Array(a) => a
                .iter_mut()
                .enumerate()
                .try_for_each(|(i, x)| int(&format!("{name}.{i}"), x)),
            other => Err(wrong("a list of integers", other)),
        },
        StrList => match v {
            Value::Array(a) if a.iter().all(Value::is_string) => Ok(()),
            other => Err(wrong("a list of strings", other)),
        },
        Prompt => prompt(v, vocab),
        Messages => messages(v),
        Stop => match v {
            Value::String(_) => Ok(()),
            Value::Array(a) if a.iter().all(Value::is_string) => Ok(()),
            other => Err(ApiError::bad(
                format!(
                    "stop must be a string, a list of strings or null, got {}",
                    kind(other)
                ),
                Some("stop"),
            )),
        },
    }
}

/// An integer within 64 bits; an integral float becomes the integer.
fn int(name: &str, v: &mut Value) -> Result<(), ApiError> {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    let range = |shown: String| {
        ApiError::bad(
            format!(
                "{name} must be an integer in the 64-bit range [-2**63, 2**63 - 1], got {shown}"
            ),
            Some(name.split('.').next().unwrap_or(name)),
        )
    };
    let Value::Number(n) = v else {
        return Err(ApiError::bad(
            format!("{name} must be an integer, got {}", show(v)),
            Some(name.split('.').next().unwrap_or(name)),
        ));
    };
    if n.is_i64() {
        return Ok(());
    }
    if let Some(u) = n.as_u64() {
        return Err(range(u.to_string()));
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    if !f.is_finite() || f.fract() != 0.0 {
        return Err(ApiError::bad(
            format!("{name} must be an integer, got {f}"),
            Some(name.split('.').next().unwrap_or(name)),
        ));
    }
    // -2**63 itself parses as an i64; a float equal to it came from a literal below it.
    if f <= -TWO_63 || f >= TWO_63 {
        return Err(range(format!("{f:.0}")));
    }
    *v = Value::from(f as i64);
    Ok(())
}

fn prompt(v: &Value, vocab: u32) -> Result<(), ApiError> {
    let shape = || {
        ApiError::bad(
            format!(
                "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids, got {}",
                kind(v)
            ),
            Some("prompt"),
        )
    };
    let items: Vec<&Value> = match v {
        Value::String(_) => return Ok(()),
        Value::Array(a) if a.is_empty() => return Ok(()),
        Value::Array(a) if a.iter().all(Value::is_number) => vec![v],
        Value::Array(a) if a.iter().all(|x| x.is_string() || x.is_array()) => a.iter().collect(),
        _ => return Err(shape()),
    };
    let many = !std::ptr::eq(items[0], v);
    for (i, item) in items.iter().enumerate() {
        let Value::Array(ids) = item else { continue };
        let wher = if many {
            format!("prompt[{i}]")
        } else {
            "prompt".into()
        };
        for t in ids {
            let Value::Number(n) = t else {
                return Err(ApiError::bad(
                    format!("{wher} must hold integer token ids, got {}", kind(t)),
                    Some("prompt"),
                ));
            };
            if n.is_i64() {
                continue;
            }
            let shown = match (n.as_u64(), n.as_f64()) {
                (Some(u), _) => u.to_string(),
                (None, Some(f)) if f.is_finite() && f.fract() == 0.0 => format!("{f:.0}"),
                _ => {
                    return Err(ApiError::bad(
                        format!("{wher} must hold integer token ids, got a number"),
                        Some("prompt"),
                    ))
                }
            };
            return Err(ApiError::bad(
                format!("{wher} holds token id {shown}, outside the vocabulary [0, {vocab})"),
                Some("prompt"),
            ));
        }
    }
    Ok(())
}

fn messages(v: &Value) -> Result<(), ApiError> {
    let Value::Array(list) = v else {
        return Err(ApiError::bad(
            format!("messages must be a list of messages, got {}", kind(v)),
            Some("messages"),
        ));
    };
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else { continue };
        match m.get("role") {
            None => {
                let p = format!("messages.{i}.role");
                return Err(ApiError::bad(
                    format!("missing required field '{p}'"),
                    Some(&p),
                ));
            }
            Some(Value::String(_)) => {}
            Some(other) => {
                let p = format!("messages.{i}.role");
                return Err(ApiError::bad(
                    format!("{p} must be a string, got {}", show(other)),
                    Some(&p),
                ));
            }
        }
    }
    Ok(())
}

/// A value as Python's messages show it: `'ten'`, `true`, `null`, `an array`, `5.5`.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) if s.chars().count() > 40 => {
            format!("'{}...'", s.chars().take(40).collect::<String>())
        }
        Value::String(s) => format!("'{s}'"),
        Value::Array(_) | Value::Object(_) => kind(v).into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn checked(body: Value, schema: &Schema) -> Result<Value, ApiError> {
        let Value::Object(mut m) = body else {
            unreachable!()
        };
        m.entry("prompt").or_insert(json!("x"));
        check(&mut m, schema, 100).map(|()| Value::Object(m))
    }

    fn err(body: Value) -> ApiError {
        checked(body, &COMPLETION).unwrap_err()
    }

    #[test]
    fn integers_must_fit_64_bits_and_integral_floats_are_integers() {
        let ok = checked(
            json!({"max_tokens": 100.0, "seed": -9_223_372_036_854_775_808i64}),
            &COMPLETION,
        );
        assert_eq!(ok.unwrap()["max_tokens"], json!(100));
        for big in [
            json!(9_223_372_036_854_775_808u64),
            json!(1.8446744073709552e19),
            json!(-9.223_372_036_854_776e18),
        ] {
            let e = err(json!({"seed": big}));
            assert_eq!(e.param.as_deref(), Some("seed"));
            assert!(e.message.contains("64-bit range"), "{}", e.message);
        }
        assert_eq!(
            err(json!({"max_tokens": "ten"})).message,
            "max_tokens must be an integer, got 'ten'"
        );
        assert_eq!(
            err(json!({"max_tokens": 5.5})).message,
            "max_tokens must be an integer, got 5.5"
        );
        assert_eq!(
            err(json!({"n": true})).message,
            "n must be an integer, got true"
        );
        assert_eq!(err(json!({"n": null})).param.as_deref(), Some("n"));
        let e = err(json!({"stop_token_ids": [1, 18446744073709551615u64]}));
        assert!(e
            .message
            .starts_with("stop_token_ids.1 must be an integer in the 64-bit range"));
    }

    #[test]
    fn kinds_are_strict_and_null_is_omitted_only_where_optional() {
        assert!(err(json!({"temperature": "hot"}))
            .message
            .contains("must be a number, got 'hot'"));
        assert!(err(json!({"stream": "yes"}))
            .message
            .contains("must be a boolean"));
        assert!(err(json!({"ignore_eos": null}))
            .message
            .contains("ignore_eos must be a boolean, got null"));
        assert!(checked(
            json!({"temperature": null, "stream": null, "top_k": 5}),
            &COMPLETION
        )
        .is_ok());
    }

    #[test]
    fn prompts_of_the_wrong_shape_or_with_huge_ids_are_named() {
        let shape = "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids";
        assert!(err(json!({"prompt": 42})).message.starts_with(shape));
        assert!(err(json!({"prompt": [1, "a"]})).message.starts_with(shape));
        let e = err(json!({"prompt": [2, 9_223_372_036_854_775_808u64]}));
        assert_eq!(
            e.message,
            "prompt holds token id 9223372036854775808, outside the vocabulary [0, 100)"
        );
        let e = err(json!({"prompt": [[1], [2, 1.1805916207174113e21]]}));
        assert!(
            e.message
                .starts_with("prompt[1] holds token id 1180591620717411303424"),
            "{}",
            e.message
        );
        assert!(checked(json!({"prompt": ["a", [1, 2]]}), &COMPLETION).is_ok());
    }

    #[test]
    fn a_message_without_a_role_is_a_missing_field_of_that_message() {
        let Value::Object(mut m) = json!({"messages": [{"role": "user"}, {"content": "hi"}]})
        else {
            unreachable!()
        };
        let e = check(&mut m, &CHAT, 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages.1.role"));
        assert_eq!(e.message, "missing required field 'messages.1.role'");
    }
}
