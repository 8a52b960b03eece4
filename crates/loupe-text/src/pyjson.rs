//! Python's `json.dumps` over template values, for the `tojson` filter.
//!
//! transformers replaces Jinja's `tojson` with `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)` (overridable per call). That output differs from
//! minijinja's built-in `tojson` (which is compact and HTML-escapes `<`, `>`, `&`, `'`), and tool
//! schemas rendered into prompts go through it, so the exact format matters: `", "` and `": "`
//! separators, Python float repr, `NaN`/`Infinity`, control characters as `\u00XX`.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Options of `json.dumps` that templates pass.
#[derive(Debug, Clone)]
pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    /// `indent`: None is one line; an int n indents by n spaces, a string by itself.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl DumpOptions {
    /// Reads `tojson(ensure_ascii=, indent=, separators=, sort_keys=)`.
    pub fn from_kwargs(kwargs: &Kwargs) -> Result<Self, Error> {
        let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
        let indent: Option<Value> = kwargs.get("indent")?;
        let separators: Option<Value> = kwargs.get("separators")?;
        let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
        kwargs.assert_all_used()?;
        let indent = match indent {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) if v.is_integer() => {
                let n = v.as_i64().unwrap_or(0);
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
            Some(v) => match v.as_str() {
                Some(s) => Some(s.to_owned()),
                None => {
                    return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an int or a string"))
                }
            },
        };
        // Python's defaults: ", " on one line, "," when indenting (no trailing spaces).
        let (mut item, mut key) = (if indent.is_some() { "," } else { ", " }.to_owned(), ": ".to_owned());
        if let Some(seps) = separators.filter(|v| !v.is_none()) {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    item = a.as_str().unwrap_or_default().to_owned();
                    key = b.as_str().unwrap_or_default().to_owned();
                }
                _ => {
                    return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair of strings"))
                }
            }
        }
        Ok(Self {
            ensure_ascii: ensure_ascii.unwrap_or(false),
            indent,
            item_separator: item,
            key_separator: key,
            sort_keys: sort_keys.unwrap_or(false),
        })
    }
}

/// `json.dumps(value, **options)`.
pub(crate) fn dumps(value: &Value, options: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, options, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value, o: &DumpOptions, depth: usize) -> Result<(), Error> {
    // Python's default recursion guard is about 1000 frames; refuse earlier than a stack overflow.
    if depth > 512 {
        return Err(Error::new(ErrorKind::InvalidOperation, "tojson: value nested too deeply"));
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, o, depth, '[', ']', items.len(), |out, i| write_value(out, &items[i], o, depth + 1))?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if o.sort_keys {
                keys.sort();
            }
            let mut entries = Vec::with_capacity(keys.len());
            for key in keys {
                let item = value.get_item(&key)?;
                entries.push((key, item));
            }
            write_container(out, o, depth, '{', '}', entries.len(), |out, i| {
                let (key, item) = &entries[i];
                write_key(out, key, o)?;
                out.push_str(&o.key_separator);
                write_value(out, item, o, depth + 1)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of kind {} is not JSON serializable", value.kind()),
            ))
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    o: &DumpOptions,
    depth: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&o.item_separator);
        }
        if let Some(indent) = &o.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(indent) = &o.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// JSON object keys: strings as is; Python converts int, float, bool and None keys to strings.
fn write_key(out: &mut String, key: &Value, o: &DumpOptions) -> Result<(), Error> {
    match key.kind() {
        ValueKind::String => write_string(out, key.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Number | ValueKind::Bool | ValueKind::None => {
            let mut text = String::new();
            write_value(&mut text, key, o, 0)?;
            write_string(out, &text, o.ensure_ascii);
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {other}"),
            ))
        }
    }
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        match i128::try_from(value.clone()) {
            Ok(i) => {
                let _ = write!(out, "{i}");
            }
            Err(_) => out.push_str(&value.to_string()),
        }
    } else {
        let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
        out.push_str(&float_repr(f));
    }
}

/// Python's `float.__repr__` (as `json.dumps` uses it): the shortest round-trip digits, fixed
/// notation for exponents in [-4, 16), otherwise `d.ddde+XX`.
pub(crate) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "1.5e-5", "-1e16".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if (point as usize) >= digits.len() {
            format!("{sign}{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7E => {
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

    fn opts() -> DumpOptions {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }

    #[test]
    fn floats_like_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789.125, "123456789.125"),
            (1e15, "1000000000000000.0"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "Infinity"),
            (2.5e300, "2.5e+300"),
        ] {
            assert_eq!(float_repr(f), s, "{f}");
        }
    }

    #[test]
    fn dumps_like_python() {
        let v: Value = serde_json::from_str(r#"{"b": [1, 2.5, null, true], "a": "x\"é\n\u0001", "e": {}}"#).unwrap();
        assert_eq!(dumps(&v, &opts()).unwrap(), r#"{"b": [1, 2.5, null, true], "a": "x\"é\n\u0001", "e": {}}"#);
        let o = DumpOptions { indent: Some("  ".into()), item_separator: ",".into(), sort_keys: true, ..opts() };
        assert_eq!(
            dumps(&v, &o).unwrap(),
            "{\n  \"a\": \"x\\\"é\\n\\u0001\",\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"e\": {}\n}"
        );
        let o = DumpOptions { ensure_ascii: true, ..opts() };
        assert_eq!(dumps(&Value::from("é😀"), &o).unwrap(), r#""\u00e9\ud83d\ude00""#);
    }
}
