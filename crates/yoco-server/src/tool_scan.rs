//! The incremental scanners of streamed tool calls, one per reply format: JSON call objects (the
//! `json` parser's `<tool_call>` bodies and `required`'s call list) and pythonic call lists. Each
//! takes the reply's text delta by delta and reports calls and argument fragments to [`Calls`] as
//! soon as they are complete. They only look at ASCII structure characters, so byte offsets into
//! the UTF-8 text are always character boundaries.

use crate::pylit::{kwarg_json, py_space};
use crate::tool_delta::Calls;

/// Incremental scan of JSON call objects `{"name": ..., ARGS: <value>}` at `depth` (1: the text
/// is one object; 2: a list of them).
pub(crate) struct JsonCallScanner {
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
    pub(crate) fn new(depth: usize, arg_keys: &'static [&'static str]) -> Self {
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

    pub(crate) fn feed(&mut self, delta: &str, out: &mut Calls) {
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
            let frag = if !out.has_args(call) {
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
pub(crate) struct PythonicScanner {
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
    pub(crate) fn new(names: Vec<String>) -> Self {
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

    pub(crate) fn feed(&mut self, delta: &str, out: &mut Calls) {
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
        let first = !out.has_args(call);
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
