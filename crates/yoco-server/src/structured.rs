//! Structured outputs on the front end: the request fields that constrain an output, read as the
//! Python server reads them (`serve/structured.py`, `structured_outputs.py`), and their compilation
//! with `yoco-grammar` (llguidance) on the blocking pool, never on the step loop.
//!
//! One request may constrain its output with exactly one of `response_format` (`text` is no
//! constraint, `json_object`, `json_schema`), vLLM's `structured_outputs` object (`json`, `regex`,
//! `choice`, `grammar`, `json_object`) or the older `guided_json` / `guided_regex` /
//! `guided_choice` / `guided_grammar`. Malformed constraints are 400s naming the field; a grammar
//! llguidance refuses is a 400 naming the field with llguidance's reason; over the compile time
//! budget a 400; too many compiling at once a 503 with `Retry-After: 1`.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};
use yoco_grammar::{CompileLimits, GrammarCompiler, GrammarError, GrammarKind, GrammarSpec};

use crate::app::AppState;
use crate::grammar_rows::Grammar;
use crate::openai::ApiError;

/// Server-wide structured-output settings (`--structured-outputs-config`).
#[derive(Clone, Debug, Default)]
pub struct StructuredConfig {
    /// Ids that end a sequence (the grammar compiler's EOS; the masks allow them where a grammar
    /// accepts).
    pub eos_token_ids: Vec<u32>,
    /// Compile budgets and cache size.
    pub limits: CompileLimits,
    /// JSON without optional whitespace unless a request says otherwise.
    pub disable_any_whitespace: bool,
}

/// A request's constraint: the field it came from and what to compile.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Constraint {
    /// The request field (for error messages).
    pub field: &'static str,
    /// What llguidance compiles.
    pub kind: GrammarKind,
    /// The grammar's text (JSON Schema, regex, JSON list of choices, Lark).
    pub text: String,
}

/// The constraint fields of a request body (completions and chat share them).
#[derive(Default)]
pub(crate) struct ConstraintFields<'a> {
    pub response_format: Option<&'a Value>,
    pub structured_outputs: Option<&'a Value>,
    pub guided_json: Option<&'a Value>,
    pub guided_regex: Option<&'a Value>,
    pub guided_choice: Option<&'a Value>,
    pub guided_grammar: Option<&'a Value>,
}

/// Python's `repr` of a JSON value, for messages worded as the Python server's.
pub(crate) fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        other => {
            let s = other.to_string();
            if s.chars().count() > 80 {
                format!("{}...", s.chars().take(80).collect::<String>())
            } else {
                s
            }
        }
    }
}

/// Python's type name of a JSON value.
fn py_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// vLLM's `StructuredOutputsParams` fields, as one parsed object.
#[derive(Default)]
struct Params<'a> {
    json: Option<&'a Value>,
    regex: Option<&'a Value>,
    choice: Option<&'a Value>,
    grammar: Option<&'a Value>,
    json_object: Option<&'a Value>,
    disable_any_whitespace: bool,
}

const FIELDS: [&str; 8] = [
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "disable_any_whitespace",
    "disable_fallback",
    "whitespace_pattern",
];

/// Set in Python's sense: not None and not False.
fn set(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
}

impl<'a> Params<'a> {
    /// `(kind, text)` to compile, or the reason it is malformed (Python's wording).
    fn resolve(&self, compact_default: bool) -> Result<(GrammarKind, String), String> {
        let names = ["json", "regex", "choice", "grammar", "json_object"];
        let vals = [
            self.json,
            self.regex,
            self.choice,
            self.grammar,
            self.json_object,
        ];
        let on: Vec<&str> = names
            .iter()
            .zip(vals)
            .filter(|(_, v)| set(*v))
            .map(|(n, _)| *n)
            .collect();
        if on.len() != 1 {
            let got = if on.is_empty() {
                "none".to_string()
            } else {
                format!(
                    "[{}]",
                    on.iter()
                        .map(|n| format!("'{n}'"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Err(format!(
                "structured outputs need exactly one of json, regex, choice, grammar, json_object; got {got}"
            ));
        }
        let compact = self.disable_any_whitespace || compact_default;
        match on[0] {
            "choice" => {
                let v = self.choice.expect("set");
                let ok = v
                    .as_array()
                    .is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_string));
                if !ok {
                    return Err(format!(
                        "structured outputs choice must be a non-empty list of strings, got {}",
                        py_repr(v)
                    ));
                }
                Ok((GrammarKind::Choice, v.to_string()))
            }
            name @ ("regex" | "grammar") => {
                let v = if name == "regex" {
                    self.regex
                } else {
                    self.grammar
                }
                .expect("set");
                match v.as_str() {
                    Some(s) if !s.trim().is_empty() => Ok((
                        if name == "regex" {
                            GrammarKind::Regex
                        } else {
                            GrammarKind::Lark
                        },
                        s.to_string(),
                    )),
                    _ => Err(format!(
                        "structured outputs {name} must be a non-empty string, got {}",
                        py_repr(v)
                    )),
                }
            }
            "json_object" => Ok(json_text(&json!({"type": "object"}), compact, true)),
            _ => {
                let v = self.json.expect("set");
                match v {
                    Value::Object(_) | Value::Bool(_) => Ok(json_text(v, compact, false)),
                    Value::String(s) if !compact => Ok((GrammarKind::JsonSchema, s.clone())),
                    Value::String(s) => match serde_json::from_str::<Value>(s) {
                        Ok(parsed) => Ok(json_text(&parsed, true, false)),
                        Err(_) => Ok((GrammarKind::JsonSchema, s.clone())), // the compiler names the error
                    },
                    other => Err(format!(
                        "structured outputs json must be a JSON Schema (dict or JSON text), got {}",
                        py_type(other)
                    )),
                }
            }
        }
    }
}

/// A JSON constraint's `(kind, text)`: compact JSON (no optional whitespace) through llguidance's
/// `x-guidance` option, as the Python engine asks for it.
pub(crate) fn json_text(schema: &Value, compact: bool, any_object: bool) -> (GrammarKind, String) {
    if !compact {
        if any_object {
            return (GrammarKind::JsonObject, String::new());
        }
        return (GrammarKind::JsonSchema, schema.to_string());
    }
    let mut s = schema.clone();
    if let Value::Object(m) = &mut s {
        let mut g = m
            .get("x-guidance")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        g.insert("whitespace_flexible".into(), Value::Bool(false));
        m.insert("x-guidance".into(), Value::Object(g));
    }
    (GrammarKind::JsonSchema, s.to_string())
}

fn from_response_format(rf: &Value) -> Result<Option<Params<'_>>, ApiError> {
    let bad = |m: String| ApiError::bad(m, Some("response_format"));
    let Some(obj) = rf.as_object() else {
        return Err(bad(format!(
            "response_format must be an object with a 'type', got {}",
            py_type(rf)
        )));
    };
    let kind = obj.get("type").unwrap_or(&Value::Null);
    match kind.as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Params {
            json_object: Some(&Value::Bool(true)),
            ..Params::default()
        })),
        Some("json_schema") => {
            let Some(js) = obj.get("json_schema").and_then(Value::as_object) else {
                return Err(bad(
                    "response_format of type 'json_schema' needs a 'json_schema' object \
                                ({'name': ..., 'schema': {...}})"
                        .into(),
                ));
            };
            let schema = js.get("schema").or_else(|| js.get("json_schema"));
            match schema {
                None | Some(Value::Null) => Err(bad(
                    "response_format.json_schema.schema is required (the JSON Schema the output follows)".into(),
                )),
                Some(s @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(Params {
                    json: Some(s),
                    ..Params::default()
                })),
                Some(other) => Err(bad(format!(
                    "response_format.json_schema.schema must be a JSON Schema object, got {}",
                    py_type(other)
                ))),
            }
        }
        _ => Err(bad(format!(
            "response_format type must be 'text', 'json_object' or 'json_schema', got {}",
            py_repr(kind)
        ))),
    }
}

fn from_structured_outputs(v: &Value) -> Result<Params<'_>, String> {
    let Some(obj) = v.as_object() else {
        return Err(format!(
            "structured_outputs must be an object, got {}",
            py_type(v)
        ));
    };
    let mut unknown: Vec<&str> = obj
        .keys()
        .map(String::as_str)
        .filter(|k| !FIELDS.contains(k))
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        let list: Vec<String> = unknown.iter().map(|k| format!("'{k}'")).collect();
        return Err(format!(
            "unknown structured_outputs fields: [{}]",
            list.join(", ")
        ));
    }
    Ok(Params {
        json: obj.get("json"),
        regex: obj.get("regex"),
        choice: obj.get("choice"),
        grammar: obj.get("grammar"),
        json_object: obj.get("json_object"),
        disable_any_whitespace: obj
            .get("disable_any_whitespace")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// The request's constraint (None for none), or a 400 naming the field when one is malformed or
/// more than one field asks for a constraint. `tool`: what chat's `tool_choice` (required / a
/// named function) asks for, counted like the others.
pub(crate) fn constraint_of(
    f: &ConstraintFields<'_>,
    tool: Option<Constraint>,
    compact_default: bool,
) -> Result<Option<Constraint>, ApiError> {
    let mut found: Vec<Constraint> = tool.into_iter().collect();
    let mk =
        |field: &'static str, (kind, text): (GrammarKind, String)| Constraint { field, kind, text };
    if let Some(rf) = f.response_format.filter(|v| !v.is_null()) {
        if let Some(p) = from_response_format(rf)? {
            let r = p
                .resolve(compact_default)
                .map_err(|m| ApiError::bad(m, Some("response_format")))?;
            found.push(mk("response_format", r));
        }
    }
    if let Some(so) = f.structured_outputs.filter(|v| !v.is_null()) {
        let r = from_structured_outputs(so)
            .and_then(|p| p.resolve(compact_default))
            .map_err(|m| ApiError::bad(m, Some("structured_outputs")))?;
        found.push(mk("structured_outputs", r));
    }
    let guided: [(&'static str, Option<&Value>); 4] = [
        ("guided_json", f.guided_json),
        ("guided_regex", f.guided_regex),
        ("guided_choice", f.guided_choice),
        ("guided_grammar", f.guided_grammar),
    ];
    for (name, v) in guided {
        let Some(v) = v.filter(|v| !v.is_null()) else {
            continue;
        };
        let mut p = Params::default();
        match name {
            "guided_json" => p.json = Some(v),
            "guided_regex" => p.regex = Some(v),
            "guided_choice" => p.choice = Some(v),
            _ => p.grammar = Some(v),
        }
        let r = p
            .resolve(compact_default)
            .map_err(|m| ApiError::bad(format!("{name}: {m}"), Some(name)))?;
        found.push(mk(name, r));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|c| c.field).collect();
        return Err(ApiError::bad(
            format!(
                "only one structured output constraint per request, got {}",
                names.join(", ")
            ),
            Some(found[1].field),
        ));
    }
    Ok(found.pop())
}

/// The front end's grammar compiler, built on first use (the token trie of a 262k vocabulary
/// takes a moment), on the blocking pool.
fn compiler(s: &AppState) -> Result<Arc<GrammarCompiler>, String> {
    s.grammar
        .get_or_init(|| {
            let json = s
                .tok
                .to_string(false)
                .map_err(|e| format!("tokenizer: {e}"))?;
            let c = &s.cfg.structured;
            GrammarCompiler::from_tokenizer_json(
                json.as_bytes(),
                s.cfg.vocab_size as usize,
                &c.eos_token_ids,
                c.limits.clone(),
            )
            .map(Arc::new)
            .map_err(|e| e.to_string())
        })
        .clone()
}

/// Compiles `c` (or takes it from the compiler's cache) on the blocking pool, under the budget.
pub(crate) async fn compile(s: &Arc<AppState>, c: Constraint) -> Result<Grammar, ApiError> {
    let s2 = s.clone();
    let field = c.field;
    let r = tokio::task::spawn_blocking(move || {
        let comp = compiler(&s2).map_err(GrammarError::Tokenizer)?;
        let spec = GrammarSpec::parse(c.kind, &c.text)?;
        comp.compile(&spec).map(|g| Grammar {
            compiled: g,
            vocab_size: comp.vocab_size(),
        })
    })
    .await
    .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    r.map_err(|e| match e {
        GrammarError::Busy { .. } => {
            ApiError::status(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
        GrammarError::Tokenizer(_) => {
            ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
        _ => ApiError::bad(e.to_string(), Some(field)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(body: Value) -> Result<Option<Constraint>, ApiError> {
        let f = ConstraintFields {
            response_format: body.get("response_format"),
            structured_outputs: body.get("structured_outputs"),
            guided_json: body.get("guided_json"),
            guided_regex: body.get("guided_regex"),
            guided_choice: body.get("guided_choice"),
            guided_grammar: body.get("guided_grammar"),
        };
        constraint_of(&f, None, false)
    }

    #[test]
    fn each_spelling_gives_its_kind_and_text() {
        let c = of(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}}))
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.field, c.kind, c.text.as_str()),
            (
                "response_format",
                GrammarKind::JsonSchema,
                r#"{"type":"integer"}"#
            )
        );
        let c = of(json!({"response_format": {"type": "json_object"}}))
            .unwrap()
            .unwrap();
        assert_eq!(c.kind, GrammarKind::JsonObject);
        assert_eq!(
            of(json!({"response_format": {"type": "text"}})).unwrap(),
            None
        );
        let c = of(json!({"structured_outputs": {"choice": ["a", "b"]}}))
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.kind, c.text.as_str()),
            (GrammarKind::Choice, r#"["a","b"]"#)
        );
        let c = of(json!({"guided_regex": "[a-z]+"})).unwrap().unwrap();
        assert_eq!((c.field, c.kind), ("guided_regex", GrammarKind::Regex));
        let c = of(json!({"guided_grammar": "start: \"x\""}))
            .unwrap()
            .unwrap();
        assert_eq!(c.kind, GrammarKind::Lark);
        assert_eq!(of(json!({})).unwrap(), None);
    }

    #[test]
    fn compact_json_asks_llguidance_for_no_optional_whitespace() {
        let f = json!({"structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": true}});
        let c = of(f).unwrap().unwrap();
        let v: Value = serde_json::from_str(&c.text).unwrap();
        assert_eq!(v["x-guidance"]["whitespace_flexible"], json!(false));
        let c = constraint_of(
            &ConstraintFields {
                response_format: Some(&json!({"type": "json_object"})),
                ..Default::default()
            },
            None,
            true,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.kind, GrammarKind::JsonSchema);
        assert!(c.text.contains("whitespace_flexible"));
    }

    #[test]
    fn malformed_constraints_are_400s_naming_the_field() {
        let cases = [
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
                "structured_outputs",
                "exactly one",
            ),
            (
                json!({"structured_outputs": {"jsn": {}}}),
                "structured_outputs",
                "'jsn'",
            ),
            (
                json!({"structured_outputs": 3}),
                "structured_outputs",
                "must be an object",
            ),
            (
                json!({"guided_choice": []}),
                "guided_choice",
                "guided_choice: structured outputs choice",
            ),
            (
                json!({"guided_regex": ""}),
                "guided_regex",
                "non-empty string",
            ),
            (json!({"guided_json": 5}), "guided_json", "JSON Schema"),
            (
                json!({"guided_regex": "a", "guided_choice": ["a"]}),
                "guided_choice",
                "only one",
            ),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format",
                "'yaml'",
            ),
            (
                json!({"response_format": "json"}),
                "response_format",
                "must be an object",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}),
                "response_format",
                "schema is required",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format",
                "needs a 'json_schema' object",
            ),
        ];
        for (body, param, needle) in cases {
            let e = of(body.clone()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(needle), "{body}: {}", e.message);
        }
    }
}
