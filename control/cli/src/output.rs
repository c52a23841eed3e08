//! YAML and JSON output of objects and lists.

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{Value, json};

/// A `kind: List` holding `items`, like kubectl prints several objects.
pub fn list(items: Vec<Value>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": items,
        "metadata": {"resourceVersion": ""},
    })
}

pub fn to_yaml(v: &Value) -> Result<String> {
    yaml_serde::to_string(v).context("formatting YAML")
}

/// Pretty JSON with kubectl's four-space indentation and a final newline.
pub fn to_json(v: &Value) -> Result<String> {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    v.serialize(&mut ser).context("formatting JSON")?;
    buf.push(b'\n');
    String::from_utf8(buf).context("formatting JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_and_formats() {
        let l = list(vec![json!({"kind": "Pod"})]);
        assert_eq!(l["kind"], "List");
        assert_eq!(l["items"][0]["kind"], "Pod");
        let y = to_yaml(&json!({"a": {"b": 1}})).unwrap();
        assert_eq!(y, "a:\n  b: 1\n");
        let j = to_json(&json!({"a": 1})).unwrap();
        assert_eq!(j, "{\n    \"a\": 1\n}\n");
    }
}
