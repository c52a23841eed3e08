//! Generic validation helpers: DNS names, label and annotation keys and values, object
//! metadata. Per-kind rules live in [`crate::strategy`].

use std::collections::BTreeMap;

use skiff_api::api::{LabelSelector, NodeSelector, NodeSelectorRequirement, ObjectMeta};
use skiff_api::selector::Selector;

use crate::error::FieldError;

/// The name rules live with the types (label selectors check them too).
pub use skiff_api::names::{
    DNS1123_LABEL_MAX, DNS1123_SUBDOMAIN_MAX, dns1123_label, dns1123_subdomain, is_label_shape,
    label_value, qualified_name,
};
/// Kubernetes caps the total size of annotations at 256 KiB.
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

fn push_all(out: &mut Vec<FieldError>, path: &str, value: &str, errs: Vec<String>) {
    out.extend(
        errs.into_iter()
            .map(|e| FieldError::invalid(path.to_string(), value, e)),
    );
}

/// Validates a DNS label at `path`.
pub fn check_dns_label(out: &mut Vec<FieldError>, path: &str, value: &str) {
    push_all(out, path, value, dns1123_label(value));
}

/// Validates a DNS subdomain at `path`.
pub fn check_dns_subdomain(out: &mut Vec<FieldError>, path: &str, value: &str) {
    push_all(out, path, value, dns1123_subdomain(value));
}

/// Validates a qualified name at `path`.
pub fn check_qualified_name(out: &mut Vec<FieldError>, path: &str, value: &str) {
    push_all(out, path, value, qualified_name(value));
}

/// Validates label keys and values (`path` is e.g. `metadata.labels`). Both are reported at
/// `path`, the map, as kube-apiserver's `ValidateLabels` does (the value names the entry).
pub fn check_labels(out: &mut Vec<FieldError>, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        push_all(out, path, k, qualified_name(k));
        push_all(out, path, v, label_value(v));
    }
}

/// Validates annotation keys and their total size.
pub fn check_annotations(
    out: &mut Vec<FieldError>,
    path: &str,
    annotations: &BTreeMap<String, String>,
) {
    let mut total = 0usize;
    for (k, v) in annotations {
        push_all(out, path, k, qualified_name(&k.to_ascii_lowercase()));
        total += k.len() + v.len();
    }
    if total > ANNOTATIONS_MAX_BYTES {
        out.push(FieldError::too_long(path, ANNOTATIONS_MAX_BYTES));
    }
}

/// Which DNS rule a kind's names follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain (most kinds).
    Subdomain,
    /// RFC 1123 label (Namespace, Service: their names become DNS labels).
    Label,
    /// Any path segment (RBAC kinds: `system:kube-scheduler`): not `.` or `..`, no `/`
    /// or `%` (kube-apiserver's `ValidatePathSegmentName`).
    PathSegment,
}

/// kube-apiserver's `IsValidPathSegmentName` messages.
pub fn path_segment(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    match name {
        "." => out.push("may not be '.'".to_string()),
        ".." => out.push("may not be '..'".to_string()),
        _ => {
            if name.contains('/') {
                out.push("may not contain '/'".to_string());
            }
            if name.contains('%') {
                out.push("may not contain '%'".to_string());
            }
        }
    }
    out
}

/// Generic object-metadata validation: name, labels, annotations, finalizers, owner
/// references. `generated` says the name came from `generateName` (errors then name that
/// field).
pub fn check_object_meta(
    out: &mut Vec<FieldError>,
    meta: &ObjectMeta,
    rule: NameRule,
    generated: bool,
) {
    let name_path = if generated {
        "metadata.generateName"
    } else {
        "metadata.name"
    };
    if meta.name.is_empty() {
        out.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        let value = if generated {
            &meta.generate_name
        } else {
            &meta.name
        };
        // Validate the full (possibly generated) name, report the user's input.
        let errs = match rule {
            NameRule::Subdomain => dns1123_subdomain(&meta.name),
            NameRule::Label => dns1123_label(&meta.name),
            NameRule::PathSegment => path_segment(&meta.name),
        };
        push_all(out, name_path, value, errs);
    }
    check_labels(out, "metadata.labels", &meta.labels);
    check_annotations(out, "metadata.annotations", &meta.annotations);
    for (i, f) in meta.finalizers.iter().enumerate() {
        check_qualified_name(out, &format!("metadata.finalizers[{i}]"), f);
    }
    for (i, o) in meta.owner_references.iter().enumerate() {
        let p = format!("metadata.ownerReferences[{i}]");
        if o.api_version.is_empty() {
            out.push(FieldError::required(format!("{p}.apiVersion"), ""));
        }
        if o.kind.is_empty() {
            out.push(FieldError::required(format!("{p}.kind"), ""));
        }
        if o.name.is_empty() {
            out.push(FieldError::required(format!("{p}.name"), ""));
        }
        if o.uid.is_empty() {
            out.push(FieldError::required(format!("{p}.uid"), ""));
        }
    }
    if meta
        .owner_references
        .iter()
        .filter(|o| o.controller == Some(true))
        .count()
        > 1
    {
        out.push(FieldError::invalid(
            "metadata.ownerReferences",
            meta.owner_references.len(),
            "only one reference can have Controller set to true",
        ));
    }
}

/// Validates a selector plus the labels of the template it must select (Deployment,
/// ReplicaSet): required, non-empty, well formed, and matching the template's labels.
pub fn check_selector_matches_template(
    out: &mut Vec<FieldError>,
    selector: Option<&LabelSelector>,
    template_labels: &BTreeMap<String, String>,
) {
    let Some(sel) = selector else {
        out.push(FieldError::required("spec.selector", ""));
        return;
    };
    if sel.match_labels.is_empty() && sel.match_expressions.is_empty() {
        out.push(FieldError::invalid(
            "spec.selector",
            "{}",
            "empty selector is invalid for this resource",
        ));
        return;
    }
    if let Some(parsed) = check_label_selector(out, "spec.selector", sel)
        && !parsed.matches(template_labels)
    {
        out.push(FieldError::invalid(
            "spec.template.metadata.labels",
            GoMap(template_labels),
            "`selector` does not match template `labels`",
        ));
    }
}

/// Go's `%#v` of a `map[string]string`, the value Kubernetes shows for bad labels.
struct GoMap<'a>(&'a BTreeMap<String, String>);

impl std::fmt::Debug for GoMap<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let items: Vec<String> = self.0.iter().map(|(k, v)| format!("{k:?}:{v:?}")).collect();
        write!(f, "map[string]string{{{}}}", items.join(", "))
    }
}

/// Validates a label selector at `path` as kube-apiserver's `ValidateLabelSelector` does,
/// with its paths and messages (`matchLabels`; each expression's operator, values, key and
/// label values); the parsed selector when it is well formed.
pub fn check_label_selector(
    out: &mut Vec<FieldError>,
    path: &str,
    sel: &LabelSelector,
) -> Option<Selector> {
    let before = out.len();
    check_labels(out, &format!("{path}.matchLabels"), &sel.match_labels);
    for (i, e) in sel.match_expressions.iter().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        match e.operator.as_str() {
            "In" | "NotIn" if e.values.is_empty() => out.push(FieldError::required(
                format!("{p}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if !e.values.is_empty() => out.push(FieldError::forbidden(
                format!("{p}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            op => out.push(FieldError::invalid(
                format!("{p}.operator"),
                op,
                "not a valid selector operator",
            )),
        }
        check_qualified_name(out, &format!("{p}.key"), &e.key);
        for (j, value) in e.values.iter().enumerate() {
            push_all(out, &format!("{p}.values[{j}]"), value, label_value(value));
        }
    }
    if out.len() > before {
        return None;
    }
    // Everything the parser refuses was reported above; this guards against the two
    // drifting apart.
    match Selector::from_label_selector(sel) {
        Err(e) => {
            out.push(FieldError::invalid(path, e.selector, e.reason));
            None
        }
        Ok(parsed) => Some(parsed),
    }
}

/// Validates a node selector at `path` as kube-apiserver's `ValidateNodeSelector` does (a
/// PersistentVolume's `nodeAffinity.required`): at least one term; each `matchExpressions`
/// requirement a known operator with the values it needs, a label key and label values; each
/// `matchFields` requirement `metadata.name` with `In`/`NotIn` and one node name.
pub fn check_node_selector(out: &mut Vec<FieldError>, path: &str, sel: &NodeSelector) {
    let terms = format!("{path}.nodeSelectorTerms");
    if sel.node_selector_terms.is_empty() {
        out.push(FieldError::required(
            terms,
            "must have at least one node selector term",
        ));
        return;
    }
    for (i, term) in sel.node_selector_terms.iter().enumerate() {
        for (j, req) in term.match_expressions.iter().enumerate() {
            check_node_selector_requirement(
                out,
                &format!("{terms}[{i}].matchExpressions[{j}]"),
                req,
            );
        }
        for (j, req) in term.match_fields.iter().enumerate() {
            check_node_field_requirement(out, &format!("{terms}[{i}].matchFields[{j}]"), req);
        }
    }
}

/// `ValidateNodeSelectorRequirement`.
fn check_node_selector_requirement(
    out: &mut Vec<FieldError>,
    path: &str,
    req: &NodeSelectorRequirement,
) {
    let values = format!("{path}.values");
    match req.operator.as_str() {
        "In" | "NotIn" if req.values.is_empty() => out.push(FieldError::required(
            values.clone(),
            "must be specified when `operator` is 'In' or 'NotIn'",
        )),
        "Exists" | "DoesNotExist" if !req.values.is_empty() => out.push(FieldError::forbidden(
            values.clone(),
            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        "Gt" | "Lt" if req.values.len() != 1 => out.push(FieldError::required(
            values.clone(),
            "must be specified single value when `operator` is 'Lt' or 'Gt'",
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => {}
        op => out.push(FieldError::invalid(
            format!("{path}.operator"),
            op,
            "not a valid selector operator",
        )),
    }
    check_qualified_name(out, &format!("{path}.key"), &req.key);
    for (i, value) in req.values.iter().enumerate() {
        push_all(out, &format!("{values}[{i}]"), value, label_value(value));
    }
}

/// `ValidateNodeFieldSelectorRequirement`: only `metadata.name`, with one value.
fn check_node_field_requirement(
    out: &mut Vec<FieldError>,
    path: &str,
    req: &NodeSelectorRequirement,
) {
    match req.operator.as_str() {
        "In" | "NotIn" if req.values.len() != 1 => out.push(FieldError::required(
            format!("{path}.values"),
            "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
        )),
        "In" | "NotIn" => {}
        op => out.push(FieldError::invalid(
            format!("{path}.operator"),
            op,
            "not a valid selector operator",
        )),
    }
    if req.key == "metadata.name" {
        for (i, value) in req.values.iter().enumerate() {
            check_dns_subdomain(out, &format!("{path}.values[{i}]"), value);
        }
    } else {
        out.push(FieldError::invalid(
            format!("{path}.key"),
            &req.key,
            "not a valid field selector key",
        ));
    }
}

/// Validates an IntOrString that must be a port number (1–65535) or an IANA service name.
pub fn check_port_or_name(out: &mut Vec<FieldError>, path: &str, value: &str) {
    if value.is_empty() {
        out.push(FieldError::required(path, ""));
    } else if let Ok(n) = value.parse::<i64>() {
        check_port_number(out, path, n);
    } else {
        check_port_name(out, path, value);
    }
}

/// 1–65535.
pub fn check_port_number(out: &mut Vec<FieldError>, path: &str, port: i64) {
    if !(1..=65535).contains(&port) {
        out.push(FieldError::invalid(
            path,
            port,
            "must be between 1 and 65535, inclusive",
        ));
    }
}

/// An IANA service name, with kube-apiserver's `IsValidPortName` messages (every rule
/// broken is one error): at most 15 characters of `a-z`, `0-9` and `-`, at least one
/// letter, no `--`, no `-` at either end.
pub fn check_port_name(out: &mut Vec<FieldError>, path: &str, name: &str) {
    let mut errs = Vec::new();
    if name.len() > 15 {
        errs.push("must be no more than 15 characters".to_string());
    }
    let charset = !name.is_empty()
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    if !charset {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    } else if !name.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".into());
    }
    if name.contains("--") {
        errs.push("must not contain consecutive hyphens".into());
    }
    if name.starts_with('-') || name.ends_with('-') {
        errs.push("must not begin or end with a hyphen".into());
    }
    push_all(out, path, name, errs);
}

/// Non-negative integer check.
pub fn check_non_negative(out: &mut Vec<FieldError>, path: &str, v: i64) {
    if v < 0 {
        out.push(FieldError::invalid(
            path,
            v,
            "must be greater than or equal to 0",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_and_subdomains() {
        assert!(dns1123_label("web-1").is_empty());
        assert!(!dns1123_label("Web").is_empty());
        assert!(!dns1123_label("-web").is_empty());
        assert!(!dns1123_label("a.b").is_empty());
        assert!(!dns1123_label(&"a".repeat(64)).is_empty());
        assert!(dns1123_subdomain("a.b-c.d").is_empty());
        assert!(!dns1123_subdomain("a..b").is_empty());
        assert!(!dns1123_subdomain("").is_empty());
        assert!(!dns1123_subdomain(&"a".repeat(254)).is_empty());
    }

    #[test]
    fn label_keys_and_values() {
        for ok in ["app", "app.kubernetes.io/name", "A_b.c-D", "x/y"] {
            assert!(qualified_name(ok).is_empty(), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "bad key",
            "-a",
            "Example.com/a",
            "a/b/c",
            &"a".repeat(64),
        ] {
            assert!(!qualified_name(bad).is_empty(), "{bad}");
        }
        assert!(label_value("").is_empty());
        assert!(label_value("v1.2_3-x").is_empty());
        assert!(!label_value("-x").is_empty());
        assert!(!label_value(&"v".repeat(64)).is_empty());
    }

    #[test]
    fn metadata_errors_name_the_field() {
        let mut meta = ObjectMeta {
            name: "Bad_Name".into(),
            ..Default::default()
        };
        meta.labels.insert("bad key".into(), "v".into());
        let mut out = Vec::new();
        check_object_meta(&mut out, &meta, NameRule::Subdomain, false);
        let text: Vec<String> = out.iter().map(ToString::to_string).collect();
        assert!(
            text.iter()
                .any(|t| t.starts_with("metadata.name: Invalid value: \"Bad_Name\""))
        );
        assert!(
            text.iter()
                .any(|t| t.starts_with("metadata.labels: Invalid value: \"bad key\""))
        );

        let mut out = Vec::new();
        check_object_meta(&mut out, &ObjectMeta::default(), NameRule::Label, false);
        assert_eq!(
            out[0].to_string(),
            "metadata.name: Required value: name or generateName is required"
        );
    }

    #[test]
    fn ports() {
        let mut out = Vec::new();
        check_port_or_name(&mut out, "p", "8080");
        check_port_or_name(&mut out, "p", "http");
        assert!(out.is_empty());
        check_port_or_name(&mut out, "p", "0");
        check_port_or_name(&mut out, "p", "70000");
        check_port_or_name(&mut out, "p", "HTTP");
        assert_eq!(out.len(), 3);
        let names = |n: &str| {
            let mut out = Vec::new();
            check_port_name(&mut out, "p", n);
            out.iter().map(ToString::to_string).collect::<Vec<_>>()
        };
        assert!(names("web-80").is_empty());
        assert_eq!(
            names("HTTP"),
            [
                "p: Invalid value: \"HTTP\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"
            ]
        );
        assert_eq!(
            names("8080"),
            ["p: Invalid value: \"8080\": must contain at least one letter (a-z)"]
        );
        assert_eq!(
            names("-a--very-long-name"),
            [
                "p: Invalid value: \"-a--very-long-name\": must be no more than 15 characters",
                "p: Invalid value: \"-a--very-long-name\": must not contain consecutive hyphens",
                "p: Invalid value: \"-a--very-long-name\": must not begin or end with a hyphen",
            ]
        );
    }

    #[test]
    fn node_selectors_as_kubernetes() {
        let sel: NodeSelector = serde_json::from_value(serde_json::json!({
            "nodeSelectorTerms": [{
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]},
                    {"key": "zone", "operator": "In"},
                    {"key": "disk", "operator": "Exists", "values": ["ssd"]},
                    {"key": "cpus", "operator": "Gt", "values": ["1", "2"]},
                    {"key": "bad key", "operator": "Near", "values": ["-x"]},
                ],
                "matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]},
                    {"key": "spec.nodeName", "operator": "Exists"},
                ],
            }]
        }))
        .unwrap();
        let mut out = Vec::new();
        check_node_selector(&mut out, "spec.nodeAffinity.required", &sel);
        let text: Vec<String> = out.iter().map(ToString::to_string).collect();
        let p = "spec.nodeAffinity.required.nodeSelectorTerms[0]";
        let want = [
            format!(
                "{p}.matchExpressions[1].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
            ),
            format!(
                "{p}.matchExpressions[2].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            ),
            format!(
                "{p}.matchExpressions[3].values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'"
            ),
            format!(
                "{p}.matchExpressions[4].operator: Invalid value: \"Near\": not a valid selector operator"
            ),
            format!(
                "{p}.matchExpressions[4].key: Invalid value: \"bad key\": name part must consist of"
            ),
            format!(
                "{p}.matchExpressions[4].values[0]: Invalid value: \"-x\": a valid label must be"
            ),
            format!(
                "{p}.matchFields[0].values: Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field selector"
            ),
            format!(
                "{p}.matchFields[1].operator: Invalid value: \"Exists\": not a valid selector operator"
            ),
            format!(
                "{p}.matchFields[1].key: Invalid value: \"spec.nodeName\": not a valid field selector key"
            ),
        ];
        assert_eq!(text.len(), want.len(), "{text:#?}");
        for (t, w) in text.iter().zip(&want) {
            assert!(t.starts_with(w.as_str()), "{t}\n  wanted {w}");
        }
        let mut out = Vec::new();
        check_node_selector(&mut out, "s", &NodeSelector::default());
        assert_eq!(
            out[0].to_string(),
            "s.nodeSelectorTerms: Required value: must have at least one node selector term"
        );
    }

    #[test]
    fn label_selectors_as_kubernetes() {
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "-web"},
            "matchExpressions": [
                {"key": "tier", "operator": "Equals", "values": ["a"]},
                {"key": "tier", "operator": "In"},
                {"key": "bad key", "operator": "Exists", "values": ["x"]},
                {"key": "env", "operator": "NotIn", "values": ["ok", "no way"]},
            ]
        }))
        .unwrap();
        let mut out = Vec::new();
        assert!(check_label_selector(&mut out, "spec.podSelector", &sel).is_none());
        let text: Vec<String> = out.iter().map(ToString::to_string).collect();
        let want = [
            "spec.podSelector.matchLabels: Invalid value: \"-web\": a valid label must be",
            "spec.podSelector.matchExpressions[0].operator: Invalid value: \"Equals\": not a valid selector operator",
            "spec.podSelector.matchExpressions[1].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
            "spec.podSelector.matchExpressions[2].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            "spec.podSelector.matchExpressions[2].key: Invalid value: \"bad key\": name part must consist of",
            "spec.podSelector.matchExpressions[3].values[1]: Invalid value: \"no way\": a valid label must be",
        ];
        assert_eq!(text.len(), want.len(), "{text:#?}");
        for (t, w) in text.iter().zip(want) {
            assert!(t.starts_with(w), "{t}");
        }
        let ok: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                 {"key": "x", "operator": "DoesNotExist"}]
        }))
        .unwrap();
        let mut out = Vec::new();
        assert!(check_label_selector(&mut out, "s", &ok).is_some());
        assert!(check_label_selector(&mut out, "s", &LabelSelector::default()).is_some());
        assert!(out.is_empty(), "{out:?}");
    }
}
