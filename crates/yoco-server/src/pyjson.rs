//! `json.dumps` as Python writes it, for the `tojson` filter of chat templates.
//!
//! Hugging Face's `apply_chat_template` replaces Jinja's `tojson` with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, and templates
//! put that text into prompts (tool schemas). A prompt must be the same bytes as transformers
//! renders, so this reproduces Python's output exactly: `", "` and `": "` separators (`","` once
//! `indent` is set), floats as `repr` writes them (`1e+16`, `1e-05`, `1.0`), `NaN`/`Infinity`,
//! only `"`, `\` and control characters escaped (no HTML escaping), and map keys in insertion order.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// How to lay the text out (`json.dumps`' keyword arguments).
pub(crate) struct Style {
    /// Escape everything outside ASCII as `\uXXXX`.
    pub ensure_ascii: bool,
    /// Newline and this much indentation per level (None: one line).
    pub indent: Option<String>,
    /// Between items and between a key and its value.
    pub item_sep: String,
    /// Between a key and its value.
    pub key_sep: String,
    /// Keys in sorted order.
    pub sort_keys: bool,
}

impl Style {
    /// Python's defaults for the given `indent`.
    pub fn new(indent: Option<String>) -> Self {
        let item_sep = if indent.is_some() { "," } else { ", " };
        Self {
            ensure_ascii: false,
            indent,
            item_sep: item_sep.into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

/// Most nesting `dumps` walks (Python's recursion limit is near 1000; a template value this deep is
/// hostile).
const MAX_DEPTH: usize = 256;

/// `json.dumps(value, ...)`.
pub(crate) fn dumps(value: &Value, style: &Style) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

fn not_serializable(v: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", v.kind()),
    )
}

fn newline(out: &mut String, style: &Style, depth: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_value(out: &mut String, v: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v),
        ValueKind::String => write_str(out, v.as_str().unwrap_or(""), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, depth + 1);
                write_value(out, item, style, depth + 1)?;
            }
            newline(out, style, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            for k in v.try_iter()? {
                let key = key_text(&k)?;
                let val = v.get_item(&k)?;
                pairs.push((key, val));
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, val)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, depth + 1);
                write_str(out, k, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_value(out, val, style, depth + 1)?;
            }
            newline(out, style, depth);
            out.push('}');
        }
        _ => return Err(not_serializable(v)),
    }
    Ok(())
}

/// A map key as `json.dumps` converts it (strings as they are, numbers, booleans and None spelled).
fn key_text(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or("").to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, k);
            Ok(s)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                k.kind()
            ),
        )),
    }
}

fn write_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        let _ = write!(out, "{v}");
    } else {
        let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
        out.push_str(&float_repr(f));
    }
}

/// Python's `str(float)`: `repr` for finite values, `inf`/`nan` otherwise.
pub(crate) fn float_repr_str(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        float_repr(f)
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, fixed notation for exponents in
/// [-4, 16), scientific (`1e+16`, `1.5e-05`) outside, `.0` on integral values; `NaN`, `Infinity`.
pub(crate) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` writes the shortest round-tripping digits: "-1.2345e-5".
    let sci = format!("{f:e}");
    let (mant, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let mut out = String::with_capacity(digits.len() + 8);
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                for _ in digits.len()..int_len {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.unsigned_abs()
        );
    }
    out
}

/// A JSON string as Python's encoder writes it.
pub(crate) fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_python_repr_writes_them() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (-0.0, "-0.0"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn dumps_uses_pythons_separators_escapes_and_key_order() {
        let v: Value =
            serde_json::from_str(r#"{"z": [1, 2.0, "a\"b\n\u0001é<"], "a": {}, "m": []}"#).unwrap();
        assert_eq!(
            dumps(&v, &Style::new(None)).unwrap(),
            r#"{"z": [1, 2.0, "a\"b\n\u0001é<"], "a": {}, "m": []}"#
        );
        let mut st = Style::new(Some("  ".into()));
        st.sort_keys = true;
        st.ensure_ascii = true;
        assert_eq!(
            dumps(&v, &st).unwrap(),
            "{\n  \"a\": {},\n  \"m\": [],\n  \"z\": [\n    1,\n    2.0,\n    \"a\\\"b\\n\\u0001\\u00e9<\"\n  ]\n}"
        );
    }
}
