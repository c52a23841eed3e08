//! `meta.k8s.io/v1` Tables: the columns `kubectl get` shows for each kind (from
//! [`skiff_api::columns`], the same the `skiff` CLI prints), with `rows[].object` so kubectl
//! can add the NAMESPACE column (`-A`) and labels (`--show-labels`).

use chrono::Utc;
use serde_json::{Value, json};
use skiff_api::KindInfo;
use skiff_api::columns;

use super::query::Query;

/// A Table of `objects` of kind `info`.
pub fn of(info: &KindInfo, objects: &[Value], _namespace: &str, query: &Query) -> Value {
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
    let include = query.get("includeObject").unwrap_or("Metadata");
    let now = Utc::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut row = json!({"cells": columns::cells(info.kind, obj, true, now)});
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
        let t = of(&Pod::INFO, &[pod], "shop", &Query::default());
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
            &[json!({})],
            "",
            &Query::parse(Some("includeObject=None")),
        );
        assert!(none["rows"][0].get("object").is_none());
    }
}
