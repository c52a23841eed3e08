//! `meta.k8s.io/v1` Tables: the columns `kubectl get` shows for each kind (from
//! [`skiff_api::columns`], the same the `skiff` CLI prints; for a custom kind, its
//! definition's additionalPrinterColumns, or Age), with `rows[].object` so kubectl can add
//! the NAMESPACE column (`-A`) and labels (`--show-labels`).

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use skiff_api::KindInfo;
use skiff_api::columns;

use super::query::Query;
use crate::custom::Column;

/// The columns of a custom kind without printer columns of its own (kube-apiserver's).
fn default_custom_columns() -> Vec<Column> {
    vec![Column {
        name: "Age".into(),
        r#type: "date".into(),
        json_path: ".metadata.creationTimestamp".into(),
        priority: 0,
    }]
}

/// The cell of a printer column: the first value its JSONPath (kubectl's dialect, without
/// the leading `$`) selects; `date` columns as an age, as kube-apiserver renders them.
fn custom_cell(column: &Column, obj: &Value, now: DateTime<Utc>) -> Value {
    let path = format!("${}", column.json_path);
    let Ok(parsed) = serde_json_path::JsonPath::parse(&path) else {
        return Value::Null;
    };
    let Some(found) = parsed.query(obj).all().into_iter().next().cloned() else {
        return Value::Null;
    };
    match (column.r#type.as_str(), &found) {
        ("date", Value::String(t)) => columns::age(t, now).into(),
        ("string", Value::String(_)) | ("integer" | "number", Value::Number(_)) => found,
        ("boolean", Value::Bool(_)) => found,
        (_, Value::String(_)) => found,
        (_, other) => other.to_string().into(),
    }
}

/// A Table of `objects` of kind `info`, with a custom kind's `printer` columns.
pub fn of(info: &KindInfo, printer: Option<&[Column]>, objects: &[Value], query: &Query) -> Value {
    if let Some(printer) = printer {
        return custom(printer, objects, query);
    }
    let base = columns::headers(info.kind, false).len();
    let headers = columns::headers(info.kind, true);
    let definitions: Vec<Value> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            json!({
                "name": h,
                "type": "string",
                "format": if i == 0 && h == "NAME" { "name" } else { "" },
                "description": "",
                "priority": if i < base { 0 } else { 1 },
            })
        })
        .collect();
    let now = Utc::now();
    let cells: Vec<Value> = objects
        .iter()
        .map(|obj| json!(columns::cells(info.kind, obj, true, now)))
        .collect();
    table(definitions, objects, cells, query)
}

fn custom(printer: &[Column], objects: &[Value], query: &Query) -> Value {
    let columns = if printer.is_empty() {
        default_custom_columns()
    } else {
        printer.to_vec()
    };
    let mut definitions = vec![json!({
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": "Name must be unique within a namespace.",
        "priority": 0,
    })];
    definitions.extend(columns.iter().map(|c| {
        json!({
            "name": c.name,
            "type": c.r#type,
            "format": "",
            "description": "",
            "priority": c.priority,
        })
    }));
    let now = Utc::now();
    let cells: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut row = vec![obj["metadata"]["name"].clone()];
            row.extend(columns.iter().map(|c| custom_cell(c, obj, now)));
            Value::Array(row)
        })
        .collect();
    table(definitions, objects, cells, query)
}

fn table(definitions: Vec<Value>, objects: &[Value], cells: Vec<Value>, query: &Query) -> Value {
    let include = query.get("includeObject").unwrap_or("Metadata");
    let rows: Vec<Value> = objects
        .iter()
        .zip(cells)
        .map(|(obj, cells)| {
            let mut row = json!({"cells": cells});
            match include {
                "None" => {}
                "Object" => row["object"] = obj.clone(),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj.get("metadata").cloned().unwrap_or(Value::Null),
                    })
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::Resource;
    use skiff_api::api::Pod;

    #[test]
    fn pods_have_kubectl_columns_and_metadata_rows() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"},
                         "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": "10.244.1.5",
                       "containerStatuses": [{"name": "c", "ready": true, "restartCount": 2}]}});
        let t = of(&Pod::INFO, None, &[pod], &Query::default());
        let names: Vec<(&str, i64)> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap(), c["priority"].as_i64().unwrap()))
            .collect();
        assert_eq!(
            &names[..5],
            [
                ("NAME", 0),
                ("READY", 0),
                ("STATUS", 0),
                ("RESTARTS", 0),
                ("AGE", 0)
            ]
        );
        assert!(names.contains(&("IP", 1)) && names.contains(&("NODE", 1)));
        let row = &t["rows"][0];
        assert_eq!(row["cells"][0], "web-1");
        assert_eq!(row["cells"][1], "1/1");
        assert_eq!(row["cells"][2], "Running");
        assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(row["object"]["metadata"]["namespace"], "shop");
        let none = of(
            &Pod::INFO,
            None,
            &[json!({})],
            &Query::parse(Some("includeObject=None")),
        );
        assert!(none["rows"][0].get("object").is_none());
    }

    #[test]
    fn custom_kinds_print_their_columns() {
        let widget = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w1", "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"size": 3, "color": "red"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let columns = vec![
            Column {
                name: "Size".into(),
                r#type: "integer".into(),
                json_path: ".spec.size".into(),
                priority: 0,
            },
            Column {
                name: "Ready".into(),
                r#type: "string".into(),
                json_path: ".status.conditions[?(@.type==\"Ready\")].status".into(),
                priority: 0,
            },
            Column {
                name: "Missing".into(),
                r#type: "string".into(),
                json_path: ".spec.nope".into(),
                priority: 1,
            },
        ];
        let t = of(
            &Pod::INFO,
            Some(&columns),
            std::slice::from_ref(&widget),
            &Query::default(),
        );
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "Size", "Ready", "Missing"]);
        assert_eq!(t["rows"][0]["cells"], json!(["w1", 3, "True", null]));
        let aged = of(&Pod::INFO, Some(&[]), &[widget], &Query::default());
        assert_eq!(aged["columnDefinitions"][1]["name"], "Age");
        assert!(aged["rows"][0]["cells"][1].as_str().unwrap().ends_with('d'));
    }
}
