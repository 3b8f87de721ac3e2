//! A small, total reader of Python call lists, `[name(key=literal, ...), ...]`, for the `pythonic`
//! tool-call parser: what `ast.parse` + `ast.literal_eval` accept of that shape, with each call's
//! keyword arguments written as `json.dumps(args, ensure_ascii=False)` writes them.
//!
//! Literals: strings (`'...'`, `"..."`, `r`/`u` prefixes, Python's escapes, adjacent strings
//! joined), decimal integers of any length, floats, one leading sign on a number, `True`, `False`,
//! `None`, lists, tuples (JSON arrays), dicts (keys as `json.dumps` converts them). What Python
//! accepts but JSON cannot hold (sets, bytes, complex: the Python server fails on them with a 500)
//! and rarer spellings (triple quotes, hex,
//! `1_000`, comments) make the text not a call list, as a `SyntaxError` would. The reader never
//! panics: every index is checked, nesting is bounded by [`MAX_DEPTH`], and the work is linear
//! in the text.

use std::fmt::Write;

use crate::pyjson::{float_repr, write_str};

/// Deepest nesting of brackets a literal may have.
pub const MAX_DEPTH: usize = 64;

const KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// A Python literal as JSON holds it.
#[derive(Debug, Clone, PartialEq)]
enum Lit {
    Null,
    Bool(bool),
    /// Decimal digits, with a leading `-` when negative (never `-0`).
    Int(String),
    Float(f64),
    Str(String),
    List(Vec<Lit>),
    /// Keys already as `json.dumps` writes them (strings); a repeated key keeps its first place
    /// and its last value, as a Python dict does.
    Dict(Vec<(String, Lit)>),
}

/// One parsed call: the function's name and its keyword arguments as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct PyCall {
    /// The function.
    pub name: String,
    /// `json.dumps({kw: value, ...}, ensure_ascii=False)`.
    pub arguments: String,
}

struct Reader<'a> {
    s: &'a [char],
    i: usize,
}

/// Python's `str.isspace` on the characters this reader meets between tokens.
fn blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c')
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(blank) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        self.ws();
        let start = self.i;
        match self.peek() {
            Some(c) if c == '_' || c.is_alphabetic() => self.i += 1,
            _ => return None,
        }
        while self.peek().is_some_and(|c| c == '_' || c.is_alphanumeric()) {
            self.i += 1;
        }
        Some(self.s[start..self.i].iter().collect())
    }

    fn call(&mut self, names: &[&str]) -> Option<PyCall> {
        let name = self.ident()?;
        if KEYWORDS.contains(&name.as_str()) || !names.contains(&name.as_str()) {
            return None;
        }
        if !self.eat('(') {
            return None;
        }
        let mut args: Vec<(String, Lit)> = Vec::new();
        loop {
            if self.eat(')') {
                break;
            }
            let key = self.ident()?;
            if KEYWORDS.contains(&key.as_str()) {
                return None; // Python: SyntaxError
            }
            if !self.eat('=') {
                return None; // a positional argument or `**kw`: not a call list
            }
            let v = self.literal(1)?;
            // A repeated keyword: `ast.parse` accepts it and the dict keeps the last value.
            match args.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = v,
                None => args.push((key, v)),
            }
            if self.eat(',') {
                continue;
            }
            if self.eat(')') {
                break;
            }
            return None;
        }
        let mut out = String::new();
        write_lit(&mut out, &Lit::Dict(args));
        Some(PyCall {
            name,
            arguments: out,
        })
    }

    fn literal(&mut self, depth: usize) -> Option<Lit> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        let c = self.peek()?;
        match c {
            '[' => {
                self.i += 1;
                Some(Lit::List(self.items(']', depth)?))
            }
            '(' => {
                self.i += 1;
                if self.eat(')') {
                    return Some(Lit::List(Vec::new()));
                }
                let first = self.literal(depth + 1)?;
                if self.eat(')') {
                    return Some(first); // parentheses around one value
                }
                if !self.eat(',') {
                    return None;
                }
                let mut rest = self.items(')', depth)?;
                rest.insert(0, first);
                Some(Lit::List(rest))
            }
            '{' => {
                self.i += 1;
                self.dict(depth)
            }
            '\'' | '"' => self.strings(),
            '-' | '+' => {
                self.i += 1;
                self.ws();
                match self.number()? {
                    Lit::Int(d) if c == '-' && d != "0" => Some(Lit::Int(format!("-{d}"))),
                    Lit::Float(f) if c == '-' => Some(Lit::Float(-f)),
                    n => Some(n),
                }
            }
            c if c.is_ascii_digit() || c == '.' => self.number(),
            _ => {
                let word = self.ident()?;
                match word.as_str() {
                    "True" => Some(Lit::Bool(true)),
                    "False" => Some(Lit::Bool(false)),
                    "None" => Some(Lit::Null),
                    "r" | "R" | "u" | "U" if matches!(self.peek(), Some('\'' | '"')) => {
                        self.i -= 1;
                        self.strings()
                    }
                    _ => None,
                }
            }
        }
    }

    /// Values up to `close` (a trailing comma allowed), the opener already read.
    fn items(&mut self, close: char, depth: usize) -> Option<Vec<Lit>> {
        let mut out = Vec::new();
        loop {
            if self.eat(close) {
                return Some(out);
            }
            out.push(self.literal(depth + 1)?);
            if self.eat(',') {
                continue;
            }
            if self.eat(close) {
                return Some(out);
            }
            return None;
        }
    }

    fn dict(&mut self, depth: usize) -> Option<Lit> {
        let mut out: Vec<(String, Lit)> = Vec::new();
        loop {
            if self.eat('}') {
                return Some(Lit::Dict(out));
            }
            let key = match self.literal(depth + 1)? {
                Lit::Str(s) => s,
                Lit::Int(d) => d,
                Lit::Float(f) => float_repr(f),
                Lit::Bool(b) => if b { "true" } else { "false" }.into(),
                Lit::Null => "null".into(),
                _ => return None, // unhashable, or not a JSON key
            };
            if !self.eat(':') {
                return None; // a set: not JSON serializable
            }
            let v = self.literal(depth + 1)?;
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = v,
                None => out.push((key, v)),
            }
            if self.eat(',') {
                continue;
            }
            if self.eat('}') {
                return Some(Lit::Dict(out));
            }
            return None;
        }
    }

    /// One or more adjacent string literals, joined.
    fn strings(&mut self) -> Option<Lit> {
        let mut out = String::new();
        loop {
            self.ws();
            let raw = match self.peek() {
                Some('r' | 'R') => {
                    self.i += 1;
                    true
                }
                Some('u' | 'U') => {
                    self.i += 1;
                    false
                }
                _ => false,
            };
            let q = self.peek().filter(|c| *c == '\'' || *c == '"')?;
            self.i += 1;
            if self.s.get(self.i) == Some(&q) && self.s.get(self.i + 1) == Some(&q) {
                return None; // triple quotes: not read here
            }
            self.string_body(q, raw, &mut out)?;
            self.ws();
            match self.peek() {
                Some('\'' | '"') => continue,
                Some('r' | 'R' | 'u' | 'U')
                    if matches!(self.s.get(self.i + 1), Some('\'' | '"')) =>
                {
                    continue
                }
                _ => return Some(Lit::Str(out)),
            }
        }
    }

    fn string_body(&mut self, q: char, raw: bool, out: &mut String) -> Option<()> {
        loop {
            let c = self.peek()?;
            self.i += 1;
            match c {
                c if c == q => return Some(()),
                '\n' | '\r' => return None,
                '\\' if raw => {
                    let n = self.peek()?;
                    self.i += 1;
                    if n == '\n' || n == '\r' {
                        return None;
                    }
                    out.push('\\');
                    out.push(n);
                }
                '\\' => self.escape(out)?,
                c => out.push(c),
            }
        }
    }

    fn hex(&mut self, n: usize) -> Option<u32> {
        let mut v = 0u32;
        for _ in 0..n {
            let d = self.peek()?.to_digit(16)?;
            self.i += 1;
            v = v * 16 + d;
        }
        Some(v)
    }

    fn escape(&mut self, out: &mut String) -> Option<()> {
        let c = self.peek()?;
        self.i += 1;
        let ch = match c {
            '\n' => return Some(()), // a line continuation
            '\\' => '\\',
            '\'' => '\'',
            '"' => '"',
            'a' => '\x07',
            'b' => '\x08',
            'f' => '\x0c',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'v' => '\x0b',
            'x' => char::from_u32(self.hex(2)?)?,
            'u' => char::from_u32(self.hex(4)?)?, // a lone surrogate cannot be sent: refused
            'U' => char::from_u32(self.hex(8)?)?,
            '0'..='7' => {
                let mut v = c.to_digit(8)?;
                for _ in 0..2 {
                    match self.peek().and_then(|d| d.to_digit(8)) {
                        Some(d) => {
                            self.i += 1;
                            v = v * 8 + d;
                        }
                        None => break,
                    }
                }
                char::from_u32(v)?
            }
            'N' => return None, // named escapes are not read here
            other => {
                out.push('\\'); // Python keeps unknown escapes as they are
                other
            }
        };
        out.push(ch);
        Some(())
    }

    fn number(&mut self) -> Option<Lit> {
        let start = self.i;
        let digits = |r: &mut Self| {
            let s = r.i;
            while r.peek().is_some_and(|c| c.is_ascii_digit()) {
                r.i += 1;
            }
            r.i - s
        };
        let int_len = digits(self);
        let mut float = false;
        let mut frac_len = 0;
        if self.peek() == Some('.') {
            self.i += 1;
            float = true;
            frac_len = digits(self);
        }
        if int_len + frac_len == 0 {
            return None;
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            self.i += 1;
            if matches!(self.peek(), Some('+' | '-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return None;
            }
            float = true;
        }
        if self
            .peek()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
        {
            return None; // 1j, 0x1f, 1_000, 1.2.3: not read here
        }
        let text: String = self.s[start..self.i].iter().collect();
        if float {
            return text.parse::<f64>().ok().map(Lit::Float);
        }
        let trimmed = text.trim_start_matches('0');
        if trimmed.len() != text.len() && !trimmed.is_empty() {
            return None; // 007: a SyntaxError in Python 3
        }
        Some(Lit::Int(if trimmed.is_empty() {
            "0".into()
        } else {
            trimmed.into()
        }))
    }
}

fn write_lit(out: &mut String, v: &Lit) {
    match v {
        Lit::Null => out.push_str("null"),
        Lit::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Lit::Int(d) => out.push_str(d),
        Lit::Float(f) => out.push_str(&float_repr(*f)),
        Lit::Str(s) => write_str(out, s, false),
        Lit::List(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_lit(out, x);
            }
            out.push(']');
        }
        Lit::Dict(items) => {
            out.push('{');
            for (i, (k, x)) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, k, false);
                let _ = write!(out, ": ");
                write_lit(out, x);
            }
            out.push('}');
        }
    }
}

/// Python's `str.strip()` whitespace.
pub(crate) fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// The calls of a reply that is exactly `[name(k=v, ...), ...]` (after stripping whitespace), each
/// name among `names`; None when it is anything else (then the reply is content).
pub fn parse_call_list(text: &str, names: &[&str]) -> Option<Vec<PyCall>> {
    let s = text.trim_matches(py_space);
    if !(s.starts_with('[') && s.ends_with(']')) {
        return None;
    }
    let chars: Vec<char> = s.chars().collect();
    let mut r = Reader { s: &chars, i: 1 };
    let mut calls = Vec::new();
    loop {
        if r.eat(']') {
            break;
        }
        calls.push(r.call(names)?);
        if r.eat(',') {
            continue;
        }
        if r.eat(']') {
            break;
        }
        return None;
    }
    r.ws();
    (r.i == chars.len() && !calls.is_empty()).then_some(calls)
}

/// One keyword argument's text (`key=value`, as a streamed call list splits it) as the JSON
/// fragment `"key": value`, or None when it is not one.
pub fn kwarg_json(seg: &str) -> Option<(String, String)> {
    let chars: Vec<char> = seg.chars().collect();
    let mut r = Reader { s: &chars, i: 0 };
    let key = r.ident()?;
    if KEYWORDS.contains(&key.as_str()) || !r.eat('=') {
        return None;
    }
    let v = r.literal(1)?;
    r.ws();
    if r.i != chars.len() {
        return None;
    }
    let mut k = String::new();
    write_str(&mut k, &key, false);
    let mut out = String::new();
    write_lit(&mut out, &v);
    Some((k, out))
}
