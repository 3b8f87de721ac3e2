//! Tool calling for `/v1/chat/completions` (OpenAI's `tools` / `tool_choice`), as the Python server
//! does it (`serve/tools.py`, vLLM's behaviour): the plan of a request (validated, 400s naming the
//! field with the Python server's wording), the grammar that forces `required` / a named function,
//! and the finish reason of a reply that called tools.
//!
//! - `none`: the tools still reach the template, nothing is forced or parsed;
//! - `required`: the output is constrained to `[{"name": ..., "parameters": {...}}, ...]`, each
//!   call's `parameters` following its tool's JSON Schema (`finish_reason: "tool_calls"`);
//! - a named function: the output is constrained to that tool's parameters (one call,
//!   `finish_reason: "stop"`, as OpenAI answers a forced function);
//! - `auto` (the default when tools are given; needs `--enable-auto-tool-choice` and
//!   `--tool-call-parser`): the model decides, [`crate::tool_parse`] reads its text.

use serde_json::{json, Map, Value as Json};

use crate::openai::ApiError;
use crate::structured::{json_text, py_repr, Constraint};

/// How tool calls look in a model's text (`--tool-call-parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParser {
    /// `[name(arg=value, ...), ...]` with Python literals (vLLM's parser for Gemma 3).
    Pythonic,
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks.
    Json,
}

impl ToolParser {
    /// The flag's value (`pythonic` / `json`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "pythonic" => Some(Self::Pythonic),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// Server-wide tool settings.
#[derive(Debug, Clone, Default)]
pub struct ToolConfig {
    /// `tool_choice: "auto"` allowed (`--enable-auto-tool-choice`; needs `parser`).
    pub auto_enabled: bool,
    /// `--tool-call-parser`.
    pub parser: Option<ToolParser>,
    /// The template a request with tools renders with when it sends none of its own
    /// (`--chat-template`, else the shipped `gemma3n_tools.jinja`); None: the chat template.
    pub template: Option<String>,
}

/// What a request does with its tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolMode {
    /// No tools, or `tool_choice: "none"`.
    None,
    /// The model decides; the reply is parsed.
    Auto,
    /// At least one call, forced by a grammar.
    Required,
    /// The one named function, forced by a grammar.
    Named,
}

/// A request's tools and what to do with them.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The mode.
    pub mode: ToolMode,
    /// The functions, `{"name", "description"?, "parameters"?}` in the client's key order.
    pub tools: Vec<Json>,
    /// The forced function (named).
    pub name: Option<String>,
    /// The server's parser (auto).
    pub parser: Option<ToolParser>,
    /// `parallel_tool_calls` (default true); false: `required` makes exactly one call.
    pub parallel: bool,
}

impl ToolPlan {
    fn off() -> Self {
        Self {
            mode: ToolMode::None,
            tools: Vec::new(),
            name: None,
            parser: None,
            parallel: true,
        }
    }

    /// Tools are parsed from (or forced on) the reply.
    pub fn active(&self) -> bool {
        self.mode != ToolMode::None
    }

    /// The tools' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.tools
            .iter()
            .filter_map(|f| f.get("name").and_then(Json::as_str))
            .collect()
    }

    /// The tools as the template sees them: `[{"type": "function", "function": f}, ...]`.
    pub fn template_tools(&self) -> Json {
        Json::Array(
            self.tools
                .iter()
                .map(|f| json!({"type": "function", "function": f}))
                .collect(),
        )
    }
}

fn bad(msg: String, field: &str) -> ApiError {
    ApiError::bad(msg, Some(field))
}

fn py_list(names: &[&str]) -> String {
    let items: Vec<String> = names.iter().map(|n| py_repr(&json!(n))).collect();
    format!("[{}]", items.join(", "))
}

const CHOICES: &str = "'none', 'auto', 'required'";

/// Validates `tools` / `tool_choice` / `parallel_tool_calls` and decides the mode.
pub fn plan_tools(
    tools: Option<&Json>,
    choice: Option<&Json>,
    parallel: Option<bool>,
    cfg: &ToolConfig,
) -> Result<ToolPlan, ApiError> {
    let choice = choice.filter(|c| !c.is_null());
    let tools = match tools.filter(|t| !t.is_null()) {
        None => &[][..],
        Some(Json::Array(a)) => a.as_slice(),
        Some(_) => return Err(bad("tools must be a list".into(), "tools")),
    };
    if tools.is_empty() {
        if choice.is_some_and(|c| c.as_str() != Some("none")) {
            return Err(bad(
                "tool_choice needs tools: give at least one tool or omit tool_choice".into(),
                "tool_choice",
            ));
        }
        return Ok(ToolPlan::off());
    }
    let mut fns = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let typed = t
            .as_object()
            .is_some_and(|o| o.get("type").map_or(true, |ty| ty == "function"));
        let f = t
            .get("function")
            .filter(|_| typed)
            .and_then(Json::as_object);
        let Some(f) = f.filter(|f| {
            f.get("name")
                .and_then(Json::as_str)
                .is_some_and(|n| !n.is_empty())
        }) else {
            return Err(bad(
                format!(
                    "tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}"
                ),
                "tools",
            ));
        };
        if f.get("parameters")
            .is_some_and(|p| !p.is_null() && !p.is_object())
        {
            return Err(bad(
                format!("tools[{i}].function.parameters must be a JSON Schema object"),
                "tools",
            ));
        }
        let kept: Map<String, Json> = f
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "name" | "description" | "parameters"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        fns.push(Json::Object(kept));
    }
    let mut plan = ToolPlan {
        mode: ToolMode::None,
        tools: fns,
        name: None,
        parser: cfg.parser,
        parallel: parallel != Some(false),
    };
    let names: Vec<String> = plan.names().into_iter().map(str::to_string).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    for (i, n) in refs.iter().enumerate() {
        if refs[..i].contains(n) {
            return Err(bad(
                format!("tools have duplicate names: {}", py_list(&refs)),
                "tools",
            ));
        }
    }
    // OpenAI and vLLM: tools without tool_choice mean "auto" (never silently ignored).
    let choice = choice.cloned().unwrap_or_else(|| json!("auto"));
    plan.mode = match choice.as_str() {
        Some("none") => ToolMode::None,
        Some("auto") => {
            if !(cfg.auto_enabled && cfg.parser.is_some()) {
                return Err(bad(
                    "\"auto\" tool choice requires the server to run with --enable-auto-tool-choice and \
                     --tool-call-parser"
                        .into(),
                    "tool_choice",
                ));
            }
            ToolMode::Auto
        }
        Some("required") => ToolMode::Required,
        Some(_) => {
            return Err(bad(
                format!(
                    "tool_choice must be {CHOICES} or a named function, got {}",
                    py_repr(&choice)
                ),
                "tool_choice",
            ))
        }
        None if choice.is_object() => {
            let name = (choice.get("type").and_then(Json::as_str) == Some("function"))
                .then(|| choice.get("function").and_then(|f| f.get("name")))
                .flatten()
                .and_then(Json::as_str);
            let Some(name) = name else {
                return Err(bad(
                    format!(
                        "tool_choice must be {CHOICES} or {{'type': 'function', 'function': {{'name': ...}}}}"
                    ),
                    "tool_choice",
                ));
            };
            if !refs.contains(&name) {
                return Err(bad(
                    format!(
                        "tool_choice names function {}, which is not among the tools {}",
                        py_repr(&json!(name)),
                        py_list(&refs)
                    ),
                    "tool_choice",
                ));
            }
            plan.name = Some(name.to_string());
            ToolMode::Named
        }
        None => {
            return Err(bad(
                format!(
                    "tool_choice must be {CHOICES} or a named function, got {}",
                    py_repr(&choice)
                ),
                "tool_choice",
            ))
        }
    };
    Ok(plan)
}

fn params_schema(f: &Json) -> Json {
    match f.get("parameters") {
        Some(p) if p.as_object().is_some_and(|o| !o.is_empty()) => p.clone(),
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// The JSON Schema that enforces `required` / a named function (vLLM's), None otherwise.
pub fn tool_schema(plan: &ToolPlan) -> Option<Json> {
    match plan.mode {
        ToolMode::Named => {
            let f = plan
                .tools
                .iter()
                .find(|f| f.get("name").and_then(Json::as_str) == plan.name.as_deref())?;
            Some(params_schema(f))
        }
        ToolMode::Required => {
            let one: Vec<Json> = plan
                .tools
                .iter()
                .map(|f| {
                    json!({"type": "object",
                           "properties": {"name": {"type": "string", "enum": [f["name"].clone()]},
                                          "parameters": params_schema(f)},
                           "required": ["name", "parameters"], "additionalProperties": false})
                })
                .collect();
            let items = if one.len() == 1 {
                one[0].clone()
            } else {
                json!({"anyOf": one})
            };
            let mut calls = json!({"type": "array", "minItems": 1, "items": items});
            if !plan.parallel {
                calls["maxItems"] = json!(1);
            }
            Some(calls)
        }
        ToolMode::None | ToolMode::Auto => None,
    }
}

/// [`tool_schema`] as a constraint (counted with the request's own structured-output fields:
/// only one per request). `compact`: the server's `disable_any_whitespace`.
pub(crate) fn tool_constraint(plan: &ToolPlan, compact: bool) -> Option<Constraint> {
    let schema = tool_schema(plan)?;
    let (kind, text) = json_text(&schema, compact, false);
    Some(Constraint {
        field: "tool_choice",
        kind,
        text,
    })
}

/// `tool_calls` when the model ended by calling tools (auto / required), else the engine's reason.
pub fn finish_reason<'a>(reason: &'a str, plan: &ToolPlan, called: bool) -> &'a str {
    if called && reason == "stop" && matches!(plan.mode, ToolMode::Auto | ToolMode::Required) {
        "tool_calls"
    } else {
        reason
    }
}
