//! Streamed tool calls: a reply's text deltas turned into OpenAI `tool_calls` deltas as they
//! arrive, as the Python server's `serve/tool_stream.py` (and vLLM) sends them: a call's first
//! delta carries `index`, `id`, `type` and `function.name` (`arguments: ""`), later deltas carry
//! fragments of `function.arguments` whose concatenation is the call's arguments JSON. Text that
//! is not a call is streamed as `content`.
//!
//! Per mode:
//! - named: every text delta is an arguments fragment of the one call;
//! - required: `[{"name": ..., "parameters": {...}}, ...]` is scanned incrementally: a call
//!   starts when its `name` string is complete, its `parameters` value streams verbatim;
//! - auto, `json`: content outside `<tool_call>...</tool_call>`, inside the same scan of
//!   `{"name": ..., "arguments": {...}}` (a marker split across deltas is held back);
//! - auto, `pythonic`: a reply starting with `[` is held as a possible call list; a call starts at
//!   `name(`, each keyword argument is one fragment once its value is complete. A reply that turns
//!   out not to be a call list is sent as content when it ends (if nothing was sent as a call).
//!
//! The scanners only look at ASCII structure characters, so byte offsets into the UTF-8 text are
//! always character boundaries.

use serde_json::{json, Value as Json};

use crate::pylit::{kwarg_json, py_space};
use crate::tool_parse::{new_call_id, CLOSE, OPEN};
use crate::tools::{ToolMode, ToolParser, ToolPlan};

/// One entry of a chunk's `delta.tool_calls`.
#[derive(Debug, Clone, PartialEq)]
pub struct CallDelta {
    /// The call's position in the reply.
    pub index: usize,
    /// `(id, name)` on a call's first delta.
    pub header: Option<(String, String)>,
    /// A fragment of the arguments JSON.
    pub arguments: String,
}

impl CallDelta {
    /// The delta's JSON, as OpenAI streams it.
    pub fn to_json(&self) -> Json {
        match &self.header {
            Some((id, name)) => json!({"index": self.index, "id": id, "type": "function",
                                       "function": {"name": name, "arguments": self.arguments}}),
            None => json!({"index": self.index, "function": {"arguments": self.arguments}}),
        }
    }
}

/// One entry per call index (a call's header and its first fragments sent together).
pub fn merge_deltas(deltas: Vec<CallDelta>) -> Vec<CallDelta> {
    let mut out: Vec<CallDelta> = Vec::with_capacity(deltas.len());
    for d in deltas {
        match out.last_mut() {
            Some(last) if last.index == d.index => last.arguments.push_str(&d.arguments),
            _ => out.push(d),
        }
    }
    out
}

#[derive(Default)]
struct Slot {
    index: Option<usize>,
    id: String,
    args: String,
    held: String,
}

/// The calls of one reply and the deltas waiting to be sent.
#[derive(Default)]
struct Calls {
    slots: Vec<Slot>,
    started: usize,
    pending: Vec<CallDelta>,
}

impl Calls {
    fn new_call(&mut self) -> usize {
        self.slots.push(Slot::default());
        self.slots.len() - 1
    }

    fn start(&mut self, call: usize, name: &str) {
        if self.slots[call].index.is_some() {
            return;
        }
        let index = self.started;
        self.started += 1;
        let id = new_call_id();
        let slot = &mut self.slots[call];
        slot.index = Some(index);
        slot.id = id.clone();
        self.pending.push(CallDelta {
            index,
            header: Some((id, name.to_string())),
            arguments: String::new(),
        });
        let held = std::mem::take(&mut self.slots[call].held);
        self.args(call, &held);
    }

    fn args(&mut self, call: usize, frag: &str) {
        if frag.is_empty() {
            return;
        }
        let slot = &mut self.slots[call];
        let Some(index) = slot.index else {
            slot.held.push_str(frag); // arguments before the name: held until the call starts
            return;
        };
        slot.args.push_str(frag);
        self.pending.push(CallDelta {
            index,
            header: None,
            arguments: frag.to_string(),
        });
    }

    fn finish(&mut self, call: usize) {
        let s = &self.slots[call];
        if s.index.is_some() && s.args.is_empty() {
            self.args(call, "{}");
        }
    }

    fn take(&mut self) -> Vec<CallDelta> {
        std::mem::take(&mut self.pending)
    }
}

/// Incremental scan of JSON call objects `{"name": ..., ARGS: <value>}` at `depth` (1: the text
/// is one object; 2: a list of them).
struct JsonCallScanner {
    depth: usize,
    arg_keys: &'static [&'static str],
    text: String,
    pos: usize,
    stack: Vec<u8>,
    in_str: bool,
    esc: bool,
    str_start: usize,
    expect_key: bool,
    key: Option<String>,
    val_start: Option<usize>,
    args_sent: Option<usize>,
    call: Option<usize>,
}

impl JsonCallScanner {
    fn new(depth: usize, arg_keys: &'static [&'static str]) -> Self {
        Self {
            depth,
            arg_keys,
            text: String::new(),
            pos: 0,
            stack: Vec::new(),
            in_str: false,
            esc: false,
            str_start: 0,
            expect_key: false,
            key: None,
            val_start: None,
            args_sent: None,
            call: None,
        }
    }

    fn at_object(&self) -> bool {
        self.stack.len() == self.depth && self.stack.last() == Some(&b'{')
    }

    fn feed(&mut self, delta: &str, out: &mut Calls) {
        self.text.push_str(delta);
        while self.pos < self.text.len() {
            let i = self.pos;
            let c = self.text.as_bytes()[i];
            self.pos += 1;
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if c == b'\\' {
                    self.esc = true;
                } else if c == b'"' {
                    self.in_str = false;
                    if self.at_object() {
                        let raw = &self.text[self.str_start..i + 1];
                        let s = serde_json::from_str::<String>(raw).ok();
                        if self.expect_key {
                            self.key = s;
                            self.expect_key = false;
                        } else if self.key.as_deref() == Some("name")
                            && self.call.is_some()
                            && self.val_start.is_some()
                        {
                            if let (Some(name), Some(call)) = (s, self.call) {
                                out.start(call, &name);
                            }
                            self.val_start = None;
                        }
                    }
                }
                continue;
            }
            if c == b'"' {
                self.in_str = true;
                self.str_start = i;
                if self.at_object()
                    && !self.expect_key
                    && self.key.as_deref() == Some("name")
                    && self.call.is_some()
                {
                    self.val_start = Some(i);
                }
                continue;
            }
            let at_call = self.at_object();
            if at_call && (c == b',' || c == b'}') {
                self.end_value(i, out);
                if c == b',' {
                    self.expect_key = true;
                    self.key = None;
                }
            }
            match c {
                b'[' | b'{' => {
                    self.stack.push(c);
                    if self.stack.len() == self.depth && c == b'{' {
                        self.call = Some(out.new_call());
                        self.expect_key = true;
                        self.key = None;
                    }
                }
                b']' | b'}' => {
                    self.stack.pop();
                    if at_call && c == b'}' {
                        if let Some(call) = self.call.take() {
                            out.finish(call);
                        }
                    }
                }
                b':' if at_call
                    && self.call.is_some()
                    && self
                        .key
                        .as_deref()
                        .is_some_and(|k| self.arg_keys.contains(&k)) =>
                {
                    self.args_sent = Some(self.pos); // the value starts after the colon
                }
                _ => {}
            }
        }
        let end = self.text.len();
        self.send_args(end, out);
    }

    fn end_value(&mut self, end: usize, out: &mut Calls) {
        if self.args_sent.is_some() {
            self.send_args(end, out);
            self.args_sent = None;
        }
    }

    fn send_args(&mut self, upto: usize, out: &mut Calls) {
        let (Some(from), Some(call)) = (self.args_sent, self.call) else {
            return;
        };
        if upto > from {
            let frag = &self.text[from..upto];
            let frag = if out.slots[call].args.is_empty() {
                frag.trim_start_matches(py_space)
            } else {
                frag
            };
            out.args(call, frag);
            self.args_sent = Some(upto);
        }
    }
}

fn is_identifier(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && cs.all(|c| c == '_' || c.is_alphanumeric())
}

/// Incremental scan of `[name(k=v, ...), ...]`: Python strings, brackets and top-level commas
/// tracked; a keyword argument is read once the comma or parenthesis after it arrives.
struct PythonicScanner {
    names: Vec<String>,
    text: String,
    pos: usize,
    depth: i64,
    quote: Option<u8>,
    esc: bool,
    call: Option<usize>,
    seg_start: usize,
    name_start: Option<usize>,
}

impl PythonicScanner {
    fn new(names: Vec<String>) -> Self {
        Self {
            names,
            text: String::new(),
            pos: 0,
            depth: 0,
            quote: None,
            esc: false,
            call: None,
            seg_start: 0,
            name_start: None,
        }
    }

    fn feed(&mut self, delta: &str, out: &mut Calls) {
        self.text.push_str(delta);
        while self.pos < self.text.len() {
            let i = self.pos;
            let c = self.text.as_bytes()[i];
            self.pos += 1;
            if let Some(q) = self.quote {
                if self.esc {
                    self.esc = false;
                } else if c == b'\\' {
                    self.esc = true;
                } else if c == q {
                    self.quote = None;
                }
                continue;
            }
            match c {
                b'\'' | b'"' => self.quote = Some(c),
                b'(' | b'[' | b'{' => {
                    self.depth += 1;
                    if c == b'(' && self.depth == 2 {
                        let name = self
                            .name_start
                            .map(|s| self.text[s..i].trim_matches(py_space))
                            .unwrap_or("");
                        if is_identifier(name) && self.names.iter().any(|n| n == name) {
                            let name = name.to_string();
                            let call = out.new_call();
                            out.start(call, &name);
                            self.call = Some(call);
                        }
                        self.seg_start = self.pos;
                    }
                    if c == b'[' && self.depth == 1 {
                        self.name_start = Some(self.pos);
                    }
                }
                b')' | b']' | b'}' => {
                    if c == b')' && self.depth == 2 {
                        self.kwarg(self.seg_start, i, true, out);
                        self.call = None;
                    }
                    self.depth -= 1;
                }
                b',' if self.depth == 2 => {
                    self.kwarg(self.seg_start, i, false, out);
                    self.seg_start = self.pos;
                }
                b',' if self.depth == 1 => self.name_start = Some(self.pos),
                _ => {}
            }
        }
    }

    fn kwarg(&mut self, from: usize, to: usize, last: bool, out: &mut Calls) {
        let Some(call) = self.call else {
            return;
        };
        let seg = self.text[from..to.max(from)].trim_matches(py_space);
        let first = out.slots[call].args.is_empty();
        let mut frag = String::new();
        if !seg.is_empty() {
            if let Some((k, v)) = kwarg_json(seg) {
                frag = format!("{}{k}: {v}", if first { "{" } else { ", " });
            }
        }
        if last {
            frag.push_str(if !first || !frag.is_empty() {
                "}"
            } else {
                "{}"
            });
        }
        out.args(call, &frag);
    }
}

/// The longest suffix of `s` that is a proper prefix of `marker` (bytes; markers are ASCII).
fn partial_suffix(s: &str, marker: &str) -> usize {
    let n = s.len().min(marker.len() - 1);
    (1..=n)
        .rev()
        .find(|&k| s.as_bytes().ends_with(&marker.as_bytes()[..k]))
        .unwrap_or(0)
}

/// One choice's streamed reply under a tool plan: [`feed`](Self::feed) and [`end`](Self::end)
/// return what to send as `(content, tool_call_deltas)`.
pub struct ToolCallStream {
    mode: ToolMode,
    parser: Option<ToolParser>,
    name: String,
    c: Calls,
    text: String,
    sent: usize,
    scanner: Option<JsonCallScanner>,
    py: Option<PythonicScanner>,
    py_content: Option<bool>,
    named: Option<usize>,
    named_started: bool,
}

impl ToolCallStream {
    /// A stream for one choice of a request with `plan`.
    pub fn new(plan: &ToolPlan) -> Self {
        let mut st = Self {
            mode: plan.mode,
            parser: plan.parser,
            name: plan.name.clone().unwrap_or_default(),
            c: Calls::default(),
            text: String::new(),
            sent: 0,
            scanner: None,
            py: (plan.parser == Some(ToolParser::Pythonic)).then(|| {
                PythonicScanner::new(plan.names().into_iter().map(String::from).collect())
            }),
            py_content: None,
            named: None,
            named_started: false,
        };
        match plan.mode {
            ToolMode::Named => {
                let call = st.c.new_call();
                let name = st.name.clone();
                st.c.start(call, &name);
                st.c.take(); // sent with the first text, so an empty reply sends nothing
                st.named = Some(call);
            }
            ToolMode::Required => st.scanner = Some(JsonCallScanner::new(2, &["parameters"])),
            _ => {}
        }
        st
    }

    /// Whether any call was sent (for the finish reason).
    pub fn called(&self) -> bool {
        self.c.started > 0
    }

    /// What to send for the next text delta.
    pub fn feed(&mut self, delta: &str) -> (String, Vec<CallDelta>) {
        if delta.is_empty() {
            return (String::new(), Vec::new());
        }
        match (self.mode, self.parser) {
            (ToolMode::Named, _) => {
                let call = self.named.unwrap_or(0);
                let mut out = Vec::with_capacity(2);
                if !self.named_started {
                    self.named_started = true;
                    out.push(CallDelta {
                        index: 0,
                        header: Some((self.c.slots[call].id.clone(), self.name.clone())),
                        arguments: String::new(),
                    });
                }
                self.c.slots[call].args.push_str(delta);
                out.push(CallDelta {
                    index: 0,
                    header: None,
                    arguments: delta.to_string(),
                });
                (String::new(), merge_deltas(out))
            }
            (ToolMode::Required, _) => {
                if let Some(sc) = self.scanner.as_mut() {
                    sc.feed(delta, &mut self.c);
                }
                (String::new(), merge_deltas(self.c.take()))
            }
            (ToolMode::Auto, Some(ToolParser::Json)) => {
                let content = self.feed_json(delta);
                (content, merge_deltas(self.c.take()))
            }
            (ToolMode::Auto, Some(ToolParser::Pythonic)) => {
                self.text.push_str(delta);
                match self.py_content {
                    None => {
                        let s = self.text.trim_start_matches(py_space);
                        if s.is_empty() {
                            return (String::new(), Vec::new());
                        }
                        let content = !s.starts_with('[');
                        self.py_content = Some(content);
                        if content {
                            return (self.text.clone(), Vec::new());
                        }
                        let all = self.text.clone();
                        if let Some(py) = self.py.as_mut() {
                            py.feed(&all, &mut self.c);
                        }
                        (String::new(), merge_deltas(self.c.take()))
                    }
                    Some(true) => (delta.to_string(), Vec::new()),
                    Some(false) => {
                        if let Some(py) = self.py.as_mut() {
                            py.feed(delta, &mut self.c);
                        }
                        (String::new(), merge_deltas(self.c.take()))
                    }
                }
            }
            _ => (delta.to_string(), Vec::new()),
        }
    }

    /// What is left to send when the reply ends.
    pub fn end(&mut self) -> (String, Vec<CallDelta>) {
        match (self.mode, self.parser) {
            (ToolMode::Auto, Some(ToolParser::Json)) => {
                let mut rest = self.text[self.sent..].to_string();
                if let Some(sc) = self.scanner.as_mut() {
                    // An unterminated block: what was not a call is content.
                    sc.feed("", &mut self.c);
                    if self.c.started > 0 {
                        rest.clear();
                    }
                }
                self.sent = self.text.len();
                (rest, merge_deltas(self.c.take()))
            }
            (ToolMode::Auto, Some(ToolParser::Pythonic))
                if self.py_content == Some(false) && self.c.started == 0 =>
            {
                (self.text.clone(), Vec::new()) // held as a possible call list, which it was not
            }
            _ => (String::new(), merge_deltas(self.c.take())),
        }
    }

    fn feed_json(&mut self, delta: &str) -> String {
        self.text.push_str(delta);
        let mut out = String::new();
        loop {
            let rest = &self.text[self.sent..];
            match self.scanner.as_mut() {
                None => match rest.find(OPEN) {
                    None => {
                        let keep = partial_suffix(rest, OPEN);
                        let n = rest.len() - keep;
                        out.push_str(&rest[..n]);
                        self.sent += n;
                        break;
                    }
                    Some(k) => {
                        out.push_str(&rest[..k]);
                        self.sent += k + OPEN.len();
                        self.scanner = Some(JsonCallScanner::new(1, &["arguments", "parameters"]));
                    }
                },
                Some(sc) => match rest.find(CLOSE) {
                    None => {
                        let keep = partial_suffix(rest, CLOSE);
                        let n = rest.len() - keep;
                        sc.feed(&rest[..n], &mut self.c);
                        self.sent += n;
                        break;
                    }
                    Some(k) => {
                        sc.feed(&rest[..k], &mut self.c);
                        self.sent += k + CLOSE.len();
                        self.scanner = None;
                    }
                },
            }
        }
        out
    }
}
