//! A finished reply's tool calls under a [`ToolPlan`] (`serve/tools.py::parse_tool_calls`): the
//! forced forms (named: the reply is the arguments; required: a JSON list of `{"name",
//! "parameters"}`) and the two `auto` parsers (`pythonic`: the whole reply is `[f(a=1), ...]`;
//! `json`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, the rest content).
//! Text that does not parse as calls is content. Arguments are written as Python's
//! `json.dumps(args, ensure_ascii=False)` writes them.

use minijinja::value::{Value, ValueKind};
use serde_json::{json, Value as Json};

use crate::pyjson::{self, Style};
use crate::pylit::{parse_call_list, py_space};
use crate::tools::{ToolMode, ToolParser, ToolPlan};

/// One call of a reply.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `call_` and 24 hex digits.
    pub id: String,
    /// The function.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(name: impl Into<String>, arguments: String) -> Self {
        Self {
            id: new_call_id(),
            name: name.into(),
            arguments,
        }
    }

    /// The OpenAI `tool_calls` entry.
    pub fn to_json(&self) -> Json {
        json!({"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// `call_` and 24 hex digits (the Python server's `uuid4().hex[:24]`).
pub fn new_call_id() -> String {
    let a = crate::completions::uuid_like();
    let b = crate::completions::uuid_like();
    let hex: String = a.chars().chain(b.chars()).rev().take(24).collect();
    format!("call_{hex}")
}

fn empty_map() -> Value {
    Value::from_pairs(std::iter::empty::<(String, Value)>())
}

/// `json.dumps(v, ensure_ascii=False)`.
fn dumps(v: &Value) -> Option<String> {
    pyjson::dumps(v, &Style::new(None)).ok()
}

/// `json.loads(text)`, keys in their order.
fn loads(text: &str) -> Option<Value> {
    serde_json::from_str::<Value>(text).ok()
}

/// `(content, calls)` of a finished reply.
pub fn parse_reply(text: &str, plan: &ToolPlan) -> (Option<String>, Vec<ToolCall>) {
    let names = plan.names();
    let as_content = || (Some(text.to_string()), Vec::new());
    match plan.mode {
        ToolMode::Named => match loads(text).and_then(|v| dumps(&v)) {
            Some(args) => (
                None,
                vec![ToolCall::new(plan.name.clone().unwrap_or_default(), args)],
            ),
            None => as_content(),
        },
        ToolMode::Required => {
            let Some(v) = loads(text) else {
                return as_content();
            };
            let mut calls = Vec::new();
            if v.kind() == ValueKind::Seq {
                for c in v.try_iter().into_iter().flatten() {
                    if c.kind() != ValueKind::Map {
                        continue;
                    }
                    let Some(name) = c.get_attr("name").ok().filter(|n| !n.is_undefined()) else {
                        continue;
                    };
                    let params = c
                        .get_attr("parameters")
                        .ok()
                        .filter(|p| !p.is_undefined())
                        .unwrap_or_else(|| empty_map());
                    let name = name
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| name.to_string());
                    if let Some(args) = dumps(&params) {
                        calls.push(ToolCall::new(name, args));
                    }
                }
            }
            (None, calls)
        }
        ToolMode::Auto => match plan.parser {
            Some(ToolParser::Pythonic) => match parse_call_list(text, &names) {
                Some(calls) => (
                    None,
                    calls
                        .into_iter()
                        .map(|c| ToolCall::new(c.name, c.arguments))
                        .collect(),
                ),
                None => as_content(),
            },
            Some(ToolParser::Json) => match json_blocks(text, &names) {
                Some((content, calls)) => ((!content.is_empty()).then_some(content), calls),
                None => as_content(),
            },
            None => as_content(),
        },
        ToolMode::None => as_content(),
    }
}

pub(crate) const OPEN: &str = "<tool_call>";
pub(crate) const CLOSE: &str = "</tool_call>";

/// The text of each `<tool_call>\s*(.*?)\s*</tool_call>` block (Python's regex, DOTALL), and the
/// text with the blocks removed.
fn blocks(text: &str) -> (Vec<&str>, String) {
    let mut found = Vec::new();
    let mut rest = String::new();
    let mut at = 0;
    while let Some(k) = text[at..].find(OPEN) {
        let inner = at + k + OPEN.len();
        let Some(e) = text[inner..].find(CLOSE) else {
            break;
        };
        rest.push_str(&text[at..at + k]);
        found.push(text[inner..inner + e].trim_matches(py_space));
        at = inner + e + CLOSE.len();
    }
    rest.push_str(&text[at..]);
    (found, rest)
}

/// The json parser: `(content, calls)`, None when there is no block or one is not a call of a
/// known function.
fn json_blocks(text: &str, names: &[&str]) -> Option<(String, Vec<ToolCall>)> {
    let (found, rest) = blocks(text);
    if found.is_empty() {
        return None;
    }
    let mut calls = Vec::with_capacity(found.len());
    for b in found {
        let v = loads(b)?;
        if v.kind() != ValueKind::Map {
            return None;
        }
        let name = v.get_attr("name").ok()?;
        let name = name.as_str().filter(|n| names.contains(n))?.to_string();
        let args = ["arguments", "parameters"]
            .iter()
            .find_map(|k| v.get_attr(k).ok().filter(|a| !a.is_undefined()))
            .unwrap_or_else(|| empty_map());
        calls.push(ToolCall::new(name, dumps(&args)?));
    }
    Some((rest.trim_matches(py_space).to_string(), calls))
}
