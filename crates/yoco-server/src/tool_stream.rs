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

use crate::pylit::py_space;
use crate::tool_delta::Calls;
pub use crate::tool_delta::{merge_deltas, CallDelta};
use crate::tool_parse::{CLOSE, OPEN};
use crate::tool_scan::{JsonCallScanner, PythonicScanner};
use crate::tools::{ToolMode, ToolParser, ToolPlan};

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
        self.c.any_started()
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
                        header: Some((self.c.id(call).to_string(), self.name.clone())),
                        arguments: String::new(),
                    });
                }
                self.c.record_args(call, delta);
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
                    if self.c.any_started() {
                        rest.clear();
                    }
                }
                self.sent = self.text.len();
                (rest, merge_deltas(self.c.take()))
            }
            (ToolMode::Auto, Some(ToolParser::Pythonic))
                if self.py_content == Some(false) && !self.c.any_started() =>
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
