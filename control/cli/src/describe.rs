//! `skiff describe`: a readable multi-line view of objects and their events.

use std::process::ExitCode;

use anyhow::{Result, anyhow};
use chrono::{DateTime, Utc};
use serde_json::Value;
use skiff_api::api::{Container, ContainerState, ContainerStatus, Event, Pod};
use skiff_api::{DynKind, KindInfo};
use skiff_client::{Client, ListParams};

use crate::apply::LAST_APPLIED;
use crate::resources::Target;
use crate::table::{self, age};
use crate::{print_out, server_message};
use skiff_api::columns::{self, name_of, namespace_of, str_at};

/// Lines of `Key:  value`, with values aligned within each run of consecutive lines that
/// have one (like kubectl's tabwriter output).
#[derive(Debug, Default)]
pub struct Doc {
    lines: Vec<(String, Option<String>)>,
}

fn pad(indent: usize) -> String {
    " ".repeat(indent)
}

impl Doc {
    /// `Key:  value`.
    pub fn kv(&mut self, indent: usize, key: &str, value: impl Into<String>) {
        self.lines
            .push((format!("{}{key}:", pad(indent)), Some(value.into())));
    }

    /// `Key:` opening a nested block.
    pub fn section(&mut self, indent: usize, key: &str) {
        self.lines.push((format!("{}{key}:", pad(indent)), None));
    }

    /// `Key:  first`, then the other values aligned under it; `<none>` when empty.
    pub fn multi(&mut self, indent: usize, key: &str, values: &[String]) {
        let Some((first, rest)) = values.split_first() else {
            self.kv(indent, key, "<none>");
            return;
        };
        self.kv(indent, key, first.clone());
        for v in rest {
            self.lines.push((String::new(), Some(v.clone())));
        }
    }

    /// A line as is.
    pub fn raw(&mut self, line: String) {
        self.lines.push((line, None));
    }

    /// Renders the lines. Values line up within each top-level block (a block ends at a
    /// top-level `Key:` without a value, like `Containers:`).
    pub fn render(&self) -> String {
        let breaks = |(left, value): &(String, Option<String>)| {
            value.is_none() && !left.is_empty() && !left.starts_with(' ')
        };
        let mut out = Vec::with_capacity(self.lines.len());
        let mut i = 0;
        while i < self.lines.len() {
            if breaks(&self.lines[i]) {
                out.push(self.lines[i].0.clone());
                i += 1;
                continue;
            }
            let end = (i..self.lines.len())
                .find(|&j| breaks(&self.lines[j]))
                .unwrap_or(self.lines.len());
            let width = self.lines[i..end]
                .iter()
                .filter(|(_, v)| v.is_some())
                .map(|(l, _)| l.chars().count())
                .max()
                .unwrap_or(0);
            for (left, value) in &self.lines[i..end] {
                match value {
                    None => out.push(left.clone()),
                    Some(value) => {
                        let spaces = width - left.chars().count() + 2;
                        out.push(
                            format!("{left}{}{value}", " ".repeat(spaces))
                                .trim_end()
                                .to_string(),
                        );
                    }
                }
            }
            i = end;
        }
        out.join("\n")
    }
}

/// `restartPolicy` → `Restart Policy`, `clusterIP` → `Cluster IP`, `podIPs` → `Pod IPs`.
pub fn humanize(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if i > 0 && c.is_uppercase() {
            let prev = chars[i - 1];
            let next = chars.get(i + 1).copied();
            let after = chars.get(i + 2).copied();
            let plural_s = next == Some('s') && after.is_none_or(|a| a.is_uppercase());
            let starts_word = prev.is_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_uppercase() && next.is_some_and(|n| n.is_lowercase()) && !plural_s);
            if starts_word {
                out.push(' ');
            }
        }
        if i == 0 {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Fields whose values are maps of user data (not structures with field names).
const LABEL_MAPS: &[&str] = &[
    "labels",
    "annotations",
    "selector",
    "matchLabels",
    "nodeSelector",
];
const QUANTITY_MAPS: &[&str] = &["limits", "requests", "capacity", "allocatable"];

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "<none>".into(),
        other => other.to_string(),
    }
}

/// Renders any JSON value as indented `Key: value` lines.
pub fn render_value(doc: &mut Doc, indent: usize, key: &str, v: &Value) {
    let label = humanize(key);
    match v {
        Value::Object(m) if LABEL_MAPS.contains(&key) || QUANTITY_MAPS.contains(&key) => {
            let sep = if QUANTITY_MAPS.contains(&key) {
                ": "
            } else {
                "="
            };
            let values: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{k}{sep}{}", scalar(v)))
                .collect();
            doc.multi(indent, &label, &values);
        }
        Value::Object(m) => {
            if m.is_empty() {
                doc.kv(indent, &label, "<none>");
                return;
            }
            doc.section(indent, &label);
            for (k, v) in m {
                render_value(doc, indent + 2, k, v);
            }
        }
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            let values: Vec<String> = items.iter().map(scalar).collect();
            doc.kv(indent, &label, values.join(", "));
            if values.is_empty() {
                doc.lines.pop();
                doc.kv(indent, &label, "<none>");
            }
        }
        Value::Array(items) => {
            doc.section(indent, &label);
            for item in items {
                let start = doc.lines.len();
                match item {
                    Value::Object(m) => {
                        for (k, v) in m {
                            render_value(doc, indent + 4, k, v);
                        }
                    }
                    other => render_value(doc, indent + 4, "value", other),
                }
                // Mark where each element starts, YAML-style.
                if let Some((left, _)) = doc.lines.get_mut(start)
                    && left.len() >= indent + 4
                {
                    left.replace_range(indent + 2..indent + 4, "- ");
                }
            }
        }
        other => doc.kv(indent, &label, scalar(other)),
    }
}

/// `Mon, 01 Jan 2024 12:00:00 +0000`; the input as is when it isn't RFC 3339.
pub fn fmt_time(ts: &str) -> String {
    match DateTime::parse_from_rfc3339(ts) {
        Ok(t) => t.format("%a, %d %b %Y %H:%M:%S %z").to_string(),
        Err(_) if ts.is_empty() => "<unset>".into(),
        Err(_) => ts.to_string(),
    }
}

fn map_values(obj: &Value, pointer: &str, skip: &[&str]) -> Vec<String> {
    obj.pointer(pointer)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !skip.contains(&k.as_str()))
                .map(|(k, v)| format!("{k}={}", scalar(v)))
                .collect()
        })
        .unwrap_or_default()
}

fn header(doc: &mut Doc, info: &KindInfo, obj: &Value) {
    doc.kv(0, "Name", name_of(obj));
    if info.namespaced {
        doc.kv(0, "Namespace", namespace_of(obj));
    }
    doc.multi(0, "Labels", &map_values(obj, "/metadata/labels", &[]));
    doc.multi(
        0,
        "Annotations",
        &map_values(obj, "/metadata/annotations", &[LAST_APPLIED]),
    );
    doc.kv(
        0,
        "CreationTimestamp",
        fmt_time(str_at(obj, "/metadata/creationTimestamp")),
    );
    let deleting = str_at(obj, "/metadata/deletionTimestamp");
    if !deleting.is_empty() {
        doc.kv(0, "DeletionTimestamp", fmt_time(deleting));
    }
    if let Some(owner) = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|o| {
            o.iter()
                .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        })
    {
        doc.kv(
            0,
            "Controlled By",
            format!("{}/{}", str_at(owner, "/kind"), str_at(owner, "/name")),
        );
    }
}

fn describe_state(doc: &mut Doc, indent: usize, key: &str, state: Option<&ContainerState>) {
    let Some(s) = state else {
        doc.kv(indent, key, "Waiting");
        return;
    };
    if let Some(r) = &s.running {
        doc.kv(indent, key, "Running");
        doc.kv(indent + 2, "Started", fmt_time(&r.started_at));
    } else if let Some(t) = &s.terminated {
        doc.kv(indent, key, "Terminated");
        if !t.reason.is_empty() {
            doc.kv(indent + 2, "Reason", t.reason.clone());
        }
        if !t.message.is_empty() {
            doc.kv(indent + 2, "Message", t.message.clone());
        }
        doc.kv(indent + 2, "Exit Code", t.exit_code.to_string());
        if t.signal != 0 {
            doc.kv(indent + 2, "Signal", t.signal.to_string());
        }
        doc.kv(indent + 2, "Started", fmt_time(&t.started_at));
        doc.kv(indent + 2, "Finished", fmt_time(&t.finished_at));
    } else if let Some(w) = &s.waiting {
        doc.kv(indent, key, "Waiting");
        if !w.reason.is_empty() {
            doc.kv(indent + 2, "Reason", w.reason.clone());
        }
        if !w.message.is_empty() {
            doc.kv(indent + 2, "Message", w.message.clone());
        }
    } else {
        doc.kv(indent, key, "Waiting");
    }
}

fn describe_container(doc: &mut Doc, c: &Container, status: Option<&ContainerStatus>) {
    doc.section(2, &c.name);
    doc.kv(4, "Image", c.image.clone());
    for (key, list) in [("Command", &c.command), ("Args", &c.args)] {
        if !list.is_empty() {
            doc.section(4, key);
            for a in list {
                doc.raw(format!("      {a}"));
            }
        }
    }
    let ports: Vec<String> = c
        .ports
        .iter()
        .map(|p| {
            let proto = if p.protocol.is_empty() {
                "TCP"
            } else {
                &p.protocol
            };
            format!("{}/{proto}", p.container_port)
        })
        .collect();
    doc.kv(
        4,
        "Port",
        if ports.is_empty() {
            "<none>".into()
        } else {
            ports.join(", ")
        },
    );
    describe_state(doc, 4, "State", status.and_then(|s| s.state.as_ref()));
    if let Some(last) = status
        .and_then(|s| s.last_state.as_ref())
        .filter(|l| l.terminated.is_some())
    {
        describe_state(doc, 4, "Last State", Some(last));
    }
    doc.kv(
        4,
        "Ready",
        if status.is_some_and(|s| s.ready) {
            "True"
        } else {
            "False"
        },
    );
    doc.kv(
        4,
        "Restart Count",
        status.map(|s| s.restart_count).unwrap_or(0).to_string(),
    );
    if let Some(r) = &c.resources {
        for (key, m) in [("Limits", &r.limits), ("Requests", &r.requests)] {
            if !m.is_empty() {
                doc.section(4, key);
                for (k, v) in m {
                    doc.kv(6, k, v.clone());
                }
            }
        }
    }
    let env: Vec<String> = c
        .env
        .iter()
        .map(|e| format!("{}: {}", e.name, e.value))
        .collect();
    if env.is_empty() {
        doc.kv(4, "Environment", "<none>");
    } else {
        doc.section(4, "Environment");
        for e in env {
            doc.raw(format!("      {e}"));
        }
    }
}

fn describe_pod(doc: &mut Doc, obj: &Value) {
    let pod: Pod = serde_json::from_value(obj.clone()).unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let st = pod.status.clone().unwrap_or_default();
    let node = match (spec.node_name.as_str(), st.host_ip.as_str()) {
        ("", _) => "<none>".to_string(),
        (n, "") => n.to_string(),
        (n, ip) => format!("{n}/{ip}"),
    };
    doc.kv(0, "Node", node);
    if !st.start_time.is_empty() {
        doc.kv(0, "Start Time", fmt_time(&st.start_time));
    }
    doc.kv(0, "Status", columns::pod_status(&pod));
    if !st.reason.is_empty() {
        doc.kv(0, "Reason", st.reason.clone());
    }
    if !st.message.is_empty() {
        doc.kv(0, "Message", st.message.clone());
    }
    doc.kv(
        0,
        "IP",
        if st.pod_ip.is_empty() {
            "<none>".into()
        } else {
            st.pod_ip.clone()
        },
    );
    for (key, containers, statuses) in [
        (
            "Init Containers",
            &spec.init_containers,
            &st.init_container_statuses,
        ),
        ("Containers", &spec.containers, &st.container_statuses),
    ] {
        if containers.is_empty() {
            continue;
        }
        doc.section(0, key);
        for c in containers {
            describe_container(doc, c, statuses.iter().find(|s| s.name == c.name));
        }
    }
    if !st.conditions.is_empty() {
        doc.section(0, "Conditions");
        let headers = vec!["Type".to_string(), "Status".to_string()];
        let rows: Vec<Vec<String>> = st
            .conditions
            .iter()
            .map(|c| vec![c.r#type.clone(), c.status.clone()])
            .collect();
        let w = table::widths(&headers, &rows);
        for r in std::iter::once(&headers).chain(&rows) {
            doc.raw(format!("  {}", table::format_row_with(r, &w, 2)));
        }
    }
    doc.kv(
        0,
        "Restart Policy",
        if spec.restart_policy.is_empty() {
            "Always".to_string()
        } else {
            spec.restart_policy.clone()
        },
    );
    doc.multi(
        0,
        "Node-Selectors",
        &spec
            .node_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
    );
}

fn replicas_line(obj: &Value) -> String {
    let n = |p: &str| obj.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let desired = obj
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    format!(
        "{desired} desired | {} updated | {} total | {} available | {} unavailable",
        n("/status/updatedReplicas"),
        n("/status/replicas"),
        n("/status/availableReplicas"),
        n("/status/unavailableReplicas"),
    )
}

fn events_section(doc: &mut Doc, events: &[Value], now: DateTime<Utc>) {
    if events.is_empty() {
        doc.kv(0, "Events", "<none>");
        return;
    }
    doc.section(0, "Events");
    let headers: Vec<String> = ["Type", "Reason", "Age", "From", "Message"]
        .map(String::from)
        .to_vec();
    let mut evs: Vec<Event> = events
        .iter()
        .map(|e| serde_json::from_value(e.clone()).unwrap_or_default())
        .collect();
    evs.sort_by_cached_key(|e| DateTime::parse_from_rfc3339(columns::event_time(e)).ok());
    let rows: Vec<Vec<String>> = evs
        .iter()
        .map(|e| {
            let last = age(columns::event_time(e), now);
            let when = if e.count > 1 && !e.first_timestamp.is_empty() {
                format!(
                    "{last} (x{} over {})",
                    e.count,
                    age(&e.first_timestamp, now)
                )
            } else {
                last
            };
            let from = e
                .source
                .as_ref()
                .map(|s| s.component.clone())
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| e.reporting_component.clone());
            vec![
                e.r#type.clone(),
                e.reason.clone(),
                when,
                from,
                e.message.trim().to_string(),
            ]
        })
        .collect();
    // kubectl's rule lines, as it prints them.
    let dashes: Vec<String> = ["----", "------", "----", "----", "-------"]
        .map(String::from)
        .to_vec();
    let mut w = table::widths(&headers, &rows);
    table::grow(&mut w, &dashes);
    for r in [&headers, &dashes].into_iter().chain(&rows) {
        doc.raw(format!("  {}", table::format_row_with(r, &w, 2)));
    }
}

/// The description of one object, with the events about it.
pub fn describe(info: &KindInfo, obj: &Value, events: &[Value], now: DateTime<Utc>) -> String {
    let mut doc = Doc::default();
    header(&mut doc, info, obj);
    match info.kind {
        "Pod" => describe_pod(&mut doc, obj),
        kind => {
            if matches!(kind, "Deployment" | "ReplicaSet") {
                doc.kv(0, "Replicas", replicas_line(obj));
            }
            if let Some(m) = obj.as_object() {
                for (k, v) in m {
                    if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                        render_value(&mut doc, 0, k, v);
                    }
                }
            }
        }
    }
    events_section(&mut doc, events, now);
    doc.render()
}

async fn events_for(client: &Client, kind: &dyn DynKind, obj: &Value) -> Vec<Value> {
    let Some(ev_kind) = skiff_api::find_kind("events") else {
        return Vec::new();
    };
    let ns = namespace_of(obj);
    let api = client.dynamic(ev_kind, (!ns.is_empty()).then_some(ns));
    let lp = ListParams::default().fields(&format!(
        "involvedObject.name={},involvedObject.kind={}",
        name_of(obj),
        kind.info().kind
    ));
    match api.list(&lp).await {
        Ok(l) => l.items,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list events");
            Vec::new()
        }
    }
}

/// `skiff describe`.
pub async fn run(
    client: &Client,
    targets: &[Target],
    label_selector: &str,
    namespace: &str,
    all_namespaces: bool,
) -> Result<ExitCode> {
    let mut failed = false;
    let mut texts = Vec::new();
    let now = Utc::now();
    for t in targets {
        let info = t.kind.info();
        let scope = (info.namespaced && !all_namespaces).then_some(namespace);
        let api = client.dynamic(t.kind, scope);
        let objects = if t.names.is_empty() {
            let items = api
                .list(&ListParams::default().labels(label_selector))
                .await?
                .items;
            if items.is_empty() {
                match scope {
                    Some(ns) => eprintln!("No resources found in {ns} namespace."),
                    None => eprintln!("No resources found"),
                }
            }
            items
        } else {
            let mut items = Vec::new();
            for n in &t.names {
                match api.get(n).await {
                    Ok(o) => items.push(o),
                    Err(e) if e.is_unreachable() => return Err(anyhow!(e)),
                    Err(e) => {
                        eprintln!("error: {}", server_message(&e, n));
                        failed = true;
                    }
                }
            }
            items
        };
        for o in &objects {
            let events = events_for(client, t.kind, o).await;
            texts.push(describe(info, o, &events, now));
        }
    }
    if !texts.is_empty() {
        print_out(&texts.join("\n\n\n"))?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn humanizes_keys() {
        assert_eq!(humanize("restartPolicy"), "Restart Policy");
        assert_eq!(humanize("clusterIP"), "Cluster IP");
        assert_eq!(humanize("podIPs"), "Pod IPs");
        assert_eq!(humanize("ipFamilyPolicy"), "Ip Family Policy");
        assert_eq!(humanize("spec"), "Spec");
    }

    #[test]
    fn doc_aligns_runs() {
        let mut d = Doc::default();
        d.kv(0, "Name", "web");
        d.kv(0, "Namespace", "shop");
        d.multi(0, "Labels", &["a=1".into(), "b=2".into()]);
        d.section(0, "Spec");
        d.kv(2, "Replicas", "3");
        assert_eq!(
            d.render(),
            "Name:       web\nNamespace:  shop\nLabels:     a=1\n            b=2\nSpec:\n  Replicas:  3"
        );
    }

    #[test]
    fn describes_a_pod_with_events() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"},
                         "annotations": {LAST_APPLIED: "{}"},
                         "creationTimestamp": "2024-05-01T11:00:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "web", "image": "host",
                     "command": ["python3", "-m", "http.server"],
                     "ports": [{"containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "web", "ready": true, "restartCount": 1,
                           "state": {"running": {"startedAt": "2024-05-01T11:00:05Z"}}}]}
        });
        let ev = json!({"metadata": {"name": "e1"}, "type": "Normal", "reason": "Scheduled",
            "message": "assigned shop/web-1 to n1", "source": {"component": "scheduler"},
            "lastTimestamp": "2024-05-01T11:59:00Z", "involvedObject": {"kind": "Pod", "name": "web-1"}});
        let info = skiff_api::find_kind("pod").unwrap().info();
        let text = describe(info, &pod, &[ev], now());
        for want in [
            "Name:               web-1",
            "Namespace:          shop",
            "Labels:             app=web",
            "Annotations:        <none>",
            "Node:               n1",
            "Status:             Running",
            "IP:                 10.0.0.5",
            "Containers:",
            "  web:",
            "    Image:          host",
            "      python3",
            "    Port:           8080/TCP",
            "    State:          Running",
            "    Restart Count:  1",
            "  Type   Status",
            "  Ready  True",
            "Events:",
            "  Type    Reason     Age   From       Message",
            "  ----    ------     ----  ----       -------",
            "  Normal  Scheduled  60s   scheduler  assigned shop/web-1 to n1",
        ] {
            assert!(
                text.lines().any(|l| l == want),
                "missing {want:?} in:\n{text}"
            );
        }
    }

    #[test]
    fn describes_any_kind_generically() {
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.1", "selector": {"app": "web"},
                     "ports": [{"port": 80, "targetPort": 8080}]}});
        let info = skiff_api::find_kind("svc").unwrap().info();
        let text = describe(info, &svc, &[], now());
        assert!(text.contains("\nSpec:\n"), "{text}");
        assert!(text.contains("  Cluster IP:       10.96.0.1"), "{text}");
        assert!(text.contains("  Selector:         app=web"), "{text}");
        assert!(
            text.contains("  Ports:\n    - Port:         80\n      Target Port:  8080"),
            "{text}"
        );
        assert!(text.ends_with("Events:             <none>"), "{text}");
    }
}
