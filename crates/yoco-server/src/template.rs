//! Chat templates: Hugging Face Jinja templates rendered with minijinja the way transformers'
//! `apply_chat_template` renders them, under a budget, off the async workers.
//!
//! The environment matches transformers' (`ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True, extensions=[loopcontrols])`): `raise_exception(msg)`, `strftime_now(fmt)`,
//! a `tojson` that is Python's `json.dumps` (no HTML escaping, see [`crate::pyjson`]), Python's
//! string methods (minijinja-contrib's pycompat, with `strip`/`lstrip`/`rstrip` and the `trim`
//! filter on Python's whitespace, which counts `\x1c`..`\x1f`), and the variables `messages`,
//! `tools`, `documents`, `add_generation_prompt`, `bos_token`, `eos_token`, `pad_token`,
//! `unk_token` plus the request's `chat_template_kwargs`.
//!
//! A template is code, and the conversation it renders is the client's: one rendering gets a fuel
//! budget (minijinja charges every instruction and every byte a template creates, so nested loops,
//! doubling strings and `'x' * 10**9` all stop), an output cap, and a deadline checked at every
//! call into a filter, function or method and on every write. Rendering runs on tokio's blocking
//! pool behind a small semaphore, so a slow template never holds an async worker and a flood of
//! them queues instead of taking every core; the handler stops waiting at the deadline.

use std::cell::{Cell, RefCell};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State, UndefinedBehavior};
use tokio::sync::Semaphore;

use crate::content_format::{self, ContentFormat};
use crate::openai::ApiError;
use crate::pyjson::{self, Style};

/// Trusted request templates kept compiled (the oldest is dropped past this).
const MAX_CACHED: usize = 32;
/// Renderings running at once on the blocking pool.
const MAX_CONCURRENT: usize = 2;

/// Limits of one rendering.
#[derive(Debug, Clone)]
pub struct TemplateBudget {
    /// minijinja fuel: one unit per instruction, one per 64 bytes created or written.
    pub fuel: u64,
    /// Longest output, bytes.
    pub max_output_bytes: usize,
    /// Wall time (`--chat-template-timeout`).
    pub timeout: Duration,
}

impl TemplateBudget {
    /// The budget for prompts of at most `max_output_bytes`: fuel for a million instructions plus
    /// every output byte touched eight times (a template concatenates, trims and copies content).
    pub fn for_output(max_output_bytes: usize, timeout: Duration) -> Self {
        let max_output_bytes = max_output_bytes.max(1 << 16);
        Self {
            fuel: 1_000_000 + (max_output_bytes as u64 / 64) * 8,
            max_output_bytes,
            timeout,
        }
    }
}

/// The checkpoint's special tokens as templates see them.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    /// `bos_token`.
    pub bos: String,
    /// `eos_token`.
    pub eos: String,
    /// `pad_token`.
    pub pad: String,
    /// `unk_token`.
    pub unk: String,
}

/// What one rendering takes: the conversation as template values and the switches.
pub(crate) struct Conversation {
    /// `messages`.
    pub messages: Vec<Value>,
    /// `add_generation_prompt`.
    pub add_generation_prompt: bool,
    /// Cut the output after the last message's text, as transformers does (its content, if so).
    pub continue_final: Option<String>,
    /// `chat_template_kwargs` (reserved names already removed).
    pub kwargs: Vec<(String, Value)>,
}

/// One compiled template (its own environment: templates do not see each other) and how it wants
/// a list of text parts ([`content_format`]).
struct Compiled {
    env: Environment<'static>,
    format: ContentFormat,
}

/// The server's template and the trusted request templates, with the budget.
pub(crate) struct ChatTemplates {
    default: Option<Arc<Compiled>>,
    cache: Mutex<Vec<(String, Arc<Compiled>)>>,
    /// `--chat-template-content-format` when not `auto`.
    forced_format: Option<ContentFormat>,
    tokens: SpecialTokens,
    budget: TemplateBudget,
    gate: Arc<Semaphore>,
}

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Why the rendering on this thread stopped, when it was the budget or `raise_exception`
    /// (minijinja's error then only says where).
    static FAILURE: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn fail(msg: String) -> Error {
    FAILURE.with(|f| *f.borrow_mut() = Some(msg.clone()));
    Error::new(ErrorKind::InvalidOperation, msg)
}

/// The deadline, checked at every call a template makes into Rust.
fn check_deadline() -> Result<(), Error> {
    match DEADLINE.with(Cell::get) {
        Some(t) if Instant::now() > t => Err(fail(
            "chat template rendering took longer than its time budget".into(),
        )),
        _ => Ok(()),
    }
}

/// Python's `str.isspace()` (Unicode whitespace plus the separators U+001C..U+001F).
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip(chars)` / `lstrip` / `rstrip`.
fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let pred = |c: char| match chars {
        Some(set) => set.contains(c),
        None => py_space(c),
    };
    let s = if left { s.trim_start_matches(pred) } else { s };
    if right {
        s.trim_end_matches(pred)
    } else {
        s
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    check_deadline()?;
    Err(fail(format!("chat template error: {msg}")))
}

fn strftime_now(fmt: String) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    check_deadline()?;
    let items: Vec<Item<'_>> = StrftimeItems::new(&fmt).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(fail(format!(
            "chat template error: strftime_now: bad format {fmt:?}"
        )));
    }
    let mut out = String::new();
    use std::fmt::Write;
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| {
        fail(format!(
            "chat template error: strftime_now: bad format {fmt:?}"
        ))
    })?;
    Ok(Value::from(out))
}

/// Jinja's `trim` filter on Python's whitespace (`value.strip(chars)`).
fn trim(value: &Value, chars: Option<String>) -> Result<Value, Error> {
    check_deadline()?;
    let s = match value.as_str() {
        Some(s) => s.to_string(),
        None => value.to_string(),
    };
    Ok(Value::from(py_strip(&s, chars.as_deref(), true, true)))
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// positional arguments in that order too.
fn tojson(state: &State, value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    check_deadline()?;
    let mut positional: Vec<Value> = args.0;
    if positional.len() > 4 {
        return Err(fail(
            "chat template error: tojson takes at most 4 arguments".into(),
        ));
    }
    positional.resize(4, Value::UNDEFINED);
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    let mut opts: Vec<Option<Value>> = Vec::with_capacity(4);
    for (pos, name) in positional.into_iter().zip(names) {
        let kw: Option<Value> = kwargs.get(name)?;
        let v = if pos.is_undefined() { kw } else { Some(pos) };
        opts.push(v.filter(|v| !v.is_none() && !v.is_undefined()));
    }
    kwargs.assert_all_used()?;
    let ensure_ascii = opts[0].as_ref().is_some_and(Value::is_true);
    let indent = match &opts[1] {
        None => None,
        Some(v) if v.is_integer() => {
            let n = v.as_i64().unwrap_or(0);
            if n > 64 {
                return Err(fail(format!(
                    "chat template error: tojson indent {n} is over 64"
                )));
            }
            Some(" ".repeat(n.max(0) as usize))
        }
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        Some(v) => return Err(fail(format!("chat template error: tojson: bad indent {v}"))),
    };
    let mut style = Style::new(indent);
    style.ensure_ascii = ensure_ascii;
    if let Some(sep) = &opts[2] {
        let parts: Vec<Value> = sep.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                style.item_sep = a.as_str().unwrap_or("").to_string();
                style.key_sep = b.as_str().unwrap_or("").to_string();
            }
            _ => {
                return Err(fail(
                    "chat template error: tojson separators must be two strings".into(),
                ))
            }
        }
    }
    style.sort_keys = opts[3].as_ref().is_some_and(Value::is_true);
    let out = pyjson::dumps(value, &style)?;
    // Serializing walks the whole value: pay for what it wrote.
    state.consume_fuel(out.len() as u64 / 16)?;
    Ok(Value::from(out))
}

/// Values printed as Python's `str` prints them (`True`, `None`, `1e+16`); the rest as minijinja.
fn formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    let py = match value.kind() {
        ValueKind::Bool => Some(if value.is_true() {
            "True".to_string()
        } else {
            "False".to_string()
        }),
        ValueKind::None => Some("None".to_string()),
        ValueKind::Number if !value.is_integer() => f64::try_from(value.clone())
            .ok()
            .map(pyjson::float_repr_str),
        _ => None,
    };
    match py {
        Some(s) => std::fmt::Write::write_str(out, &s)
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "write failed")),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// pycompat's methods, with Python's whitespace for the strip family.
fn methods(state: &mut State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    check_deadline()?;
    if let (Some(s), "strip" | "lstrip" | "rstrip") = (value.as_str(), method) {
        let chars = match args {
            [] => None,
            [c] if c.is_none() => None,
            [c] if c.as_str().is_some() => c.as_str(),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{method}() takes one optional string argument"),
                ))
            }
        };
        let (l, r) = match method {
            "strip" => (true, true),
            "lstrip" => (true, false),
            _ => (false, true),
        };
        return Ok(Value::from(py_strip(s, chars, l, r)));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

impl Compiled {
    fn new(source: &str, fuel: u64, forced: Option<ContentFormat>) -> Result<Self, Error> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_fuel(Some(fuel));
        env.set_unknown_method_callback(methods);
        env.set_formatter(formatter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("trim", trim);
        env.add_template_owned("chat", source.to_string())?;
        let format = forced.unwrap_or_else(|| {
            let f = content_format::detect(&env);
            FAILURE.with(|f| *f.borrow_mut() = None); // a probe's raise_exception is not a request's
            f
        });
        Ok(Self { env, format })
    }
}

/// An `io::Write` that refuses to grow past the output budget or the deadline.
struct Capped {
    out: Vec<u8>,
    cap: usize,
}

impl io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.out.len() + buf.len() > self.cap {
            let _ = fail(format!(
                "chat template output is over its budget of {} bytes",
                self.cap
            ));
            return Err(io::Error::other("over budget"));
        }
        if check_deadline().is_err() {
            return Err(io::Error::other("over time"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The message of a failed rendering, for a 400.
fn describe(e: &Error) -> String {
    if let Some(m) = FAILURE.with(|f| f.borrow_mut().take()) {
        return m;
    }
    if e.kind() == ErrorKind::OutOfFuel {
        return "chat template rendering ran out of its budget (too much work or data)".into();
    }
    let mut msg = format!("chat template error: {e}");
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    msg
}

impl ChatTemplates {
    /// `default`: the server's template (`--chat-template`, else the checkpoint's); a syntax
    /// error in it is a start-up error.
    /// `forced_format`: `--chat-template-content-format` (None: detect per template).
    pub fn new(
        default: Option<&str>,
        tokens: SpecialTokens,
        budget: TemplateBudget,
        forced_format: Option<ContentFormat>,
    ) -> Result<Self, String> {
        let default = match default {
            None => None,
            Some(src) => Some(Arc::new(
                Compiled::new(src, budget.fuel, forced_format)
                    .map_err(|e| format!("the chat template does not compile: {e}"))?,
            )),
        };
        Ok(Self {
            default,
            cache: Mutex::new(Vec::new()),
            forced_format,
            tokens,
            budget,
            gate: Arc::new(Semaphore::new(MAX_CONCURRENT)),
        })
    }

    fn compiled(&self, request_template: Option<&str>) -> Result<Arc<Compiled>, ApiError> {
        let Some(src) = request_template else {
            return self.default.clone().ok_or_else(|| {
                ApiError::bad(
                    "this model has no chat template: start the server with --chat-template, or send one \
                     (with --trust-request-chat-template)",
                    Some("messages"),
                )
            });
        };
        let mut cache = self.cache.lock().unwrap();
        if let Some((_, c)) = cache.iter().find(|(s, _)| s == src) {
            return Ok(c.clone());
        }
        // A template that does not compile is the request's fault, like one that fails to render
        // (the Python server names `messages` for both).
        let c = Arc::new(
            Compiled::new(src, self.budget.fuel, self.forced_format).map_err(|e| {
                ApiError::bad(format!("chat template error: {e}"), Some("messages"))
            })?,
        );
        if cache.len() >= MAX_CACHED {
            cache.remove(0);
        }
        cache.push((src.to_string(), c.clone()));
        Ok(c)
    }

    /// Renders `conv` with the server's template, or `request_template` (the caller checked it is
    /// trusted). Template errors and a blown budget are 400s naming `messages`.
    pub async fn render(
        &self,
        request_template: Option<&str>,
        conv: Conversation,
    ) -> Result<String, ApiError> {
        let compiled = self.compiled(request_template)?;
        let permit = self.gate.clone().acquire_owned().await.map_err(|_| {
            ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping")
        })?;
        let tokens = self.tokens.clone();
        let budget = self.budget.clone();
        let timeout = budget.timeout;
        let job = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            render_now(&compiled, &tokens, &budget, conv)
        });
        // The deadline is also checked inside; this bounds the wait when a single operation runs
        // long (the thread then finishes on its own, within its fuel, holding its permit).
        match tokio::time::timeout(timeout + Duration::from_millis(250), job).await {
            Ok(Ok(r)) => r.map_err(|m| ApiError::bad(m, Some("messages"))),
            Ok(Err(e)) => Err(ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("chat template rendering failed: {e}"),
            )),
            Err(_) => Err(ApiError::bad(
                format!(
                    "chat template rendering took longer than its budget of {} s",
                    timeout.as_secs_f64()
                ),
                Some("messages"),
            )),
        }
    }
}

/// One rendering on the current thread (the blocking pool's).
fn render_now(
    c: &Compiled,
    tokens: &SpecialTokens,
    budget: &TemplateBudget,
    conv: Conversation,
) -> Result<String, String> {
    FAILURE.with(|f| *f.borrow_mut() = None);
    DEADLINE.with(|d| d.set(Some(Instant::now() + budget.timeout)));
    let result = (|| {
        let tmpl = c.env.get_template("chat").map_err(|e| describe(&e))?;
        let continue_final = conv
            .continue_final
            .map(|joined| content_format::final_text(&conv.messages, c.format, joined));
        let messages = content_format::apply(conv.messages, c.format);
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(messages)),
            ("tools".into(), Value::from(())),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(conv.add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(tokens.bos.as_str())),
            ("eos_token".into(), Value::from(tokens.eos.as_str())),
            ("pad_token".into(), Value::from(tokens.pad.as_str())),
            ("unk_token".into(), Value::from(tokens.unk.as_str())),
        ];
        for (k, v) in conv.kwargs {
            match ctx.iter_mut().find(|(n, _)| *n == k) {
                Some(slot) => slot.1 = v,
                None => ctx.push((k, v)),
            }
        }
        let root = Value::from_pairs(ctx);
        let mut w = Capped {
            out: Vec::new(),
            cap: budget.max_output_bytes,
        };
        tmpl.render_captured_to(root, &mut w)
            .map_err(|e| describe(&e))?;
        let text = String::from_utf8(w.out).map_err(|e| format!("chat template error: {e}"))?;
        match continue_final {
            Some(last) => continue_final_cut(text, &last),
            None => Ok(text),
        }
    })();
    DEADLINE.with(|d| d.set(None));
    result
}

/// transformers' `continue_final_message`: cut the rendering right after the last message's text
/// (keeping its trailing whitespace where the template kept it), so the model continues it.
fn continue_final_cut(text: String, last: &str) -> Result<String, String> {
    let stripped = py_strip(last, None, true, true);
    let Some(loc) = text.rfind(stripped) else {
        return Err(
            "continue_final_message is set but the final message does not appear in the chat after \
             applying the chat template (the template may strip or rewrite it)"
                .into(),
        );
    };
    let lstripped = py_strip(last, None, true, false);
    let end = if text.get(loc..loc + lstripped.len()) == Some(last) {
        loc + lstripped.len()
    } else {
        loc + stripped.len()
    };
    Ok(text[..end].to_string())
}

/// A checkpoint directory's chat template and special tokens, as transformers reads them:
/// `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates: `default`),
/// else a `chat_template.jinja` file; `bos_token`... as strings or `{"content": ...}` objects.
pub fn load_checkpoint_template(dir: &std::path::Path) -> (Option<String>, SpecialTokens) {
    let cfg: serde_json::Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let token = |k: &str| -> String {
        match cfg.get(k) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v
                .get("content")
                .and_then(|c| c.as_str())
                .unwrap_or("")
                .to_string(),
            None => String::new(),
        }
    };
    let tokens = SpecialTokens {
        bos: token("bos_token"),
        eos: token("eos_token"),
        pad: token("pad_token"),
        unk: token("unk_token"),
    };
    let template = match cfg.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(named)) => {
            let pick = |n: &str| {
                named
                    .iter()
                    .find(|t| t.get("name").and_then(|x| x.as_str()) == Some(n))
            };
            pick("default")
                .or(named.first())
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_string)
        }
        _ => std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
    };
    (template, tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, conv: Conversation) -> Result<String, String> {
        let budget = TemplateBudget::for_output(1 << 20, Duration::from_secs(2));
        let c = Compiled::new(src, budget.fuel, None).map_err(|e| e.to_string())?;
        let tokens = SpecialTokens {
            bos: "<bos>".into(),
            eos: "<eos>".into(),
            ..Default::default()
        };
        render_now(&c, &tokens, &budget, conv)
    }

    fn msgs(json: &str) -> Vec<Value> {
        serde_json::from_str(json).unwrap()
    }

    fn conv(json: &str) -> Conversation {
        Conversation {
            messages: msgs(json),
            add_generation_prompt: true,
            continue_final: None,
            kwargs: Vec::new(),
        }
    }

    #[test]
    fn blocks_trim_and_strip_as_transformers_environment_does() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n  {{ m.role }}:{{ m.content | trim }}|{{ m.content.strip() }}\n{% endfor %}\n{% if add_generation_prompt %}go{% endif %}\n";
        let out = render(src, conv(r#"[{"role":"user","content":"\u001c hi \n"}]"#)).unwrap();
        // trim_blocks eats the newline after a block tag, lstrip_blocks the indentation before it,
        // the trailing newline of the source is dropped; \x1c is whitespace to Python.
        assert_eq!(out, "<bos>\n  user:hi|hi\ngo");
    }

    #[test]
    fn raise_exception_loop_controls_and_namespace_work() {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}\
                   {% if m.role == 'system' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}\
                   {% if messages[-1].role == 'bad' %}{{ raise_exception('roles must alternate') }}{% endif %}";
        let ok = render(
            src,
            conv(r#"[{"role":"system"},{"role":"user"},{"role":"user"}]"#),
        );
        assert_eq!(ok.unwrap(), "1");
        let err = render(src, conv(r#"[{"role":"bad"}]"#)).unwrap_err();
        assert_eq!(err, "chat template error: roles must alternate");
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let src = "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ '<&>' | tojson }}";
        let mut c = conv("[]");
        c.kwargs = vec![(
            "tools".into(),
            serde_json::from_str(r#"[{"name":"f","p":{"x":1.5,"a":[true,null]}}]"#).unwrap(),
        )];
        let out = render(src, c).unwrap();
        assert_eq!(
            out,
            "[{\"name\": \"f\", \"p\": {\"x\": 1.5, \"a\": [true, null]}}]|{\n  \"name\": \"f\",\n  \"p\": {\n    \
             \"x\": 1.5,\n    \"a\": [\n      true,\n      null\n    ]\n  }\n}|\"<&>\""
        );
    }

    #[test]
    fn tools_and_documents_are_none_unless_given() {
        let out = render(
            "{{ tools is none }}{{ documents is none }}{{ tools }}|{{ 1e16 }}|{{ 2.5 }}|{{ 3 }}",
            conv("[]"),
        )
        .unwrap();
        // Printed as Python prints them.
        assert_eq!(out, "TrueTrueNone|1e+16|2.5|3");
    }

    #[test]
    fn strftime_now_formats_local_time_and_refuses_bad_formats() {
        let out = render("{{ strftime_now('%Y-%m-%d') }}", conv("[]")).unwrap();
        let today = chrono::Local::now().format("%Y-%m-%d").to_string();
        assert_eq!(out, today);
        let err = render("{{ strftime_now('%Q%') }}", conv("[]")).unwrap_err();
        assert!(err.contains("strftime_now"), "{err}");
    }

    #[test]
    fn continue_final_message_cuts_after_the_last_text() {
        let src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}";
        let mut c =
            conv(r#"[{"role":"user","content":"q"},{"role":"assistant","content":"Once upon "}]"#);
        c.add_generation_prompt = false;
        c.continue_final = Some("Once upon ".into());
        assert_eq!(
            render(src, c).unwrap(),
            "<user>q</user><assistant>Once upon "
        );
        let trims = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}";
        let mut c = conv(r#"[{"role":"assistant","content":"Once upon "}]"#);
        c.continue_final = Some("Once upon ".into());
        assert_eq!(render(trims, c).unwrap(), "<assistant>Once upon");
        let mut c = conv(r#"[{"role":"assistant","content":"x"}]"#);
        c.continue_final = Some("x".into());
        assert!(render("nothing", c)
            .unwrap_err()
            .contains("continue_final_message"));
    }

    #[test]
    fn bombs_stop_on_the_budget_quickly() {
        let bombs = [
            "{% for a in range(100000) %}{% for b in range(100000) %}{{ b }}{% endfor %}{% endfor %}",
            "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}{% endfor %}{% endfor %}",
            "{{ 'x' * 1000000000 }}",
            "{{ 'x' | center(1000000000) }}",
            "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            "{{ 7 ** 99999999 }}",
            "{% set n = 99999999 %}{{ 7 ** n }}",
            "{% macro f(s, n) %}{{ f(s ~ s, n - 1) if n else s }}{% endmacro %}{{ f('ab', 60) }}",
            "{{ 'ab'.replace('a', 'aaaaaaaaaaaaaaaa') * 100000 }}",
        ];
        for b in bombs {
            let t = Instant::now();
            let err = render(b, conv("[]")).unwrap_err();
            assert!(err.starts_with("chat template"), "{b}: {err}");
            // Fuel stops most bombs in milliseconds; an unoptimized build on a loaded machine may
            // reach the 2 s deadline first, which is the budget too: the bound allows the deadline
            // plus the last instruction, not a render that ignores both.
            assert!(
                t.elapsed() < Duration::from_millis(2500),
                "{b}: {:?}",
                t.elapsed()
            );
        }
    }
}
