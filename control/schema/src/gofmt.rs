//! Go-compatible formatting of values, so that error strings read exactly as
//! Kubernetes (written in Go) prints them.

use serde_json::Value;

/// Go's `strconv.Quote`: a double-quoted string with Go escapes.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// An approximation of Go's `unicode.IsPrint`.
fn is_go_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    // Private use, unassigned surrogates and format characters are rare in
    // object data; treat the common invisible format characters as unprintable.
    !matches!(c as u32, 0x200b..=0x200f | 0x2028..=0x202e | 0x2060..=0x2064 | 0xfeff)
}

/// Go's `%v` of a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`: the
/// shortest representation, in exponent form below 1e-4 and from 1e6 on).
pub(crate) fn float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // Shortest round-trip digits in scientific form, e.g. "1.2345e6".
    let sci = format!("{f:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m.to_string(), e.parse::<i32>().unwrap_or(0)),
        None => (sci.clone(), 0),
    };
    // Go: %e is used if the exponent is < -4 or >= the precision, and the
    // precision deciding this for the shortest form is 6.
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        format!("{f}")
    }
}

/// How Kubernetes' `field.Error` prints a bad value decoded from JSON
/// (`ErrorBody` in k8s.io/apimachinery/pkg/util/validation/field/errors.go):
/// numbers and booleans bare, strings quoted, anything else with Go's `%#v`.
pub(crate) fn bad_value(v: &Value) -> String {
    match v {
        Value::String(s) => quote(s),
        Value::Number(_) | Value::Bool(_) => sharp_v(v),
        Value::Null => "null".to_string(),
        _ => sharp_v(v),
    }
}

/// Go's `%#v` of an unstructured JSON value (`map[string]interface {}`,
/// `[]interface {}`, int64, float64, string, bool, nil).
pub(crate) fn sharp_v(v: &Value) -> String {
    let mut out = String::new();
    sharp_v_into(v, &mut out, true);
    out
}

fn sharp_v_into(v: &Value, out: &mut String, top: bool) {
    match v {
        Value::Null => out.push_str(if top { "<nil>" } else { "interface {}(nil)" }),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(n)),
        Value::String(s) => out.push_str(&quote(s)),
        Value::Array(items) => {
            out.push_str("[]interface {}{");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                sharp_v_into(item, out, false);
            }
            out.push('}');
        }
        Value::Object(map) => {
            out.push_str("map[string]interface {}{");
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&quote(k));
                out.push(':');
                if let Some(val) = map.get(*k) {
                    sharp_v_into(val, out, false);
                }
            }
            out.push('}');
        }
    }
}

/// A JSON number as Go prints the int64 or float64 it decodes to.
pub(crate) fn number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else {
        float(n.as_f64().unwrap_or(0.0))
    }
}

/// JSON text of a value as Go's `encoding/json` writes it (used for enum
/// values that are not strings).
pub(crate) fn json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quotes_like_go() {
        assert_eq!(quote("a\"b\n"), r#""a\"b\n""#);
        assert_eq!(quote("é"), "\"é\"");
        assert_eq!(quote("\u{1}"), r#""\x01""#);
    }

    #[test]
    fn floats_like_go() {
        assert_eq!(float(10.0), "10");
        assert_eq!(float(0.5), "0.5");
        assert_eq!(float(1e21), "1e+21");
        assert_eq!(float(0.00001), "1e-05");
        assert_eq!(float(123456.0), "123456");
        assert_eq!(float(1e6), "1e+06");
        assert_eq!(float(1234567.0), "1.234567e+06");
    }

    #[test]
    fn sharp_v_like_go() {
        assert_eq!(
            sharp_v(&json!({"port": 80, "name": "a"})),
            r#"map[string]interface {}{"name":"a", "port":80}"#
        );
        assert_eq!(
            sharp_v(&json!(["a", 1.5, null])),
            r#"[]interface {}{"a", 1.5, interface {}(nil)}"#
        );
    }
}
