//! What a request constrains its output to, and the canonical text compiled grammars are cached by.

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::Value;

use crate::GrammarError;

/// The constraint families of vLLM's `structured_outputs` (and OpenAI's `response_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrammarKind {
    /// A JSON Schema (text of a JSON document).
    JsonSchema,
    /// Any JSON object (`response_format: {"type": "json_object"}`); the text is ignored.
    JsonObject,
    /// A regular expression (Rust `regex` syntax, as llguidance reads it) the whole output matches.
    Regex,
    /// One of a list of strings (text: a JSON array of strings).
    Choice,
    /// A grammar in llguidance's Lark dialect (vLLM's `grammar`; EBNF-like, `start:` rule).
    Lark,
}

impl GrammarKind {
    /// Parse the kind names the binding passes (`json`, `json_object`, `regex`, `choice`, `grammar`).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "json" | "json_schema" => Self::JsonSchema,
            "json_object" => Self::JsonObject,
            "regex" => Self::Regex,
            "choice" => Self::Choice,
            "grammar" | "lark" => Self::Lark,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::JsonSchema => "JSON schema",
            Self::JsonObject => "JSON object",
            Self::Regex => "regex",
            Self::Choice => "choice",
            Self::Lark => "grammar",
        }
    }
}

/// A parsed constraint: its kind, its canonical text (the cache key) and the llguidance grammar.
#[derive(Clone, Debug)]
pub struct GrammarSpec {
    pub kind: GrammarKind,
    /// JSON re-serialized without insignificant whitespace (key order kept: it is the order the
    /// output follows); regexes and grammars verbatim.
    pub canonical: String,
    grammar: TopLevelGrammar,
}

impl GrammarSpec {
    /// Parse `text` as a constraint of `kind`; malformed JSON or an empty choice is an error here,
    /// everything else is checked when the grammar compiles.
    pub fn parse(kind: GrammarKind, text: &str) -> Result<Self, GrammarError> {
        let invalid = |message: String| GrammarError::Invalid {
            kind: kind.name(),
            message,
        };
        let (canonical, grammar) = match kind {
            GrammarKind::JsonSchema => {
                let v: Value = serde_json::from_str(text)
                    .map_err(|e| invalid(format!("not valid JSON: {e}")))?;
                if !(v.is_object() || v.is_boolean()) {
                    return Err(invalid(
                        "a JSON Schema must be an object or a boolean".into(),
                    ));
                }
                (v.to_string(), TopLevelGrammar::from_json_schema(v))
            }
            GrammarKind::JsonObject => {
                let v = serde_json::json!({"type": "object"});
                (String::new(), TopLevelGrammar::from_json_schema(v))
            }
            GrammarKind::Regex => {
                if text.is_empty() {
                    return Err(invalid("the regex is empty".into()));
                }
                (text.to_string(), TopLevelGrammar::from_regex(text))
            }
            GrammarKind::Choice => {
                let v: Vec<String> = serde_json::from_str(text)
                    .map_err(|e| invalid(format!("expected a list of strings: {e}")))?;
                if v.is_empty() {
                    return Err(invalid("the list of choices is empty".into()));
                }
                // Each choice is a Lark string literal (JSON string escaping).
                let alts: Vec<String> = v
                    .iter()
                    .map(|c| Value::String(c.clone()).to_string())
                    .collect();
                let lark = format!("start: {}", alts.join(" | "));
                (
                    serde_json::to_string(&v).unwrap_or_default(),
                    TopLevelGrammar::from_lark(lark),
                )
            }
            GrammarKind::Lark => {
                if text.trim().is_empty() {
                    return Err(invalid("the grammar is empty".into()));
                }
                let g = TopLevelGrammar {
                    grammars: vec![GrammarWithLexer::from_lark(text.to_string())],
                    max_tokens: None,
                };
                (text.to_string(), g)
            }
        };
        Ok(Self {
            kind,
            canonical,
            grammar,
        })
    }

    /// The cache key: kind and canonical text.
    pub fn key(&self) -> (GrammarKind, &str) {
        (self.kind, &self.canonical)
    }

    pub(crate) fn grammar(&self) -> TopLevelGrammar {
        self.grammar.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_schema_canonical_text_ignores_whitespace_but_keeps_key_order() {
        let a = GrammarSpec::parse(
            GrammarKind::JsonSchema,
            r#"{ "type": "object",  "required": ["a"] }"#,
        )
        .unwrap();
        let b = GrammarSpec::parse(
            GrammarKind::JsonSchema,
            r#"{"type":"object","required":["a"]}"#,
        )
        .unwrap();
        let c = GrammarSpec::parse(
            GrammarKind::JsonSchema,
            r#"{"required":["a"],"type":"object"}"#,
        )
        .unwrap();
        assert_eq!(a.canonical, b.canonical);
        assert_ne!(a.canonical, c.canonical);
    }

    #[test]
    fn malformed_json_schema_is_an_error_naming_json() {
        let e = GrammarSpec::parse(GrammarKind::JsonSchema, "{nope")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid JSON"), "{e}");
        let e = GrammarSpec::parse(GrammarKind::JsonSchema, "[1]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("object or a boolean"), "{e}");
    }

    #[test]
    fn empty_choice_list_is_an_error() {
        assert!(GrammarSpec::parse(GrammarKind::Choice, "[]").is_err());
        assert!(GrammarSpec::parse(GrammarKind::Choice, "{}").is_err());
    }
}
