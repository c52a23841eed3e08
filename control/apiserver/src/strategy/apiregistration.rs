//! apiregistration.k8s.io/v1 APIService, defaulted and validated as kube-aggregator does
//! (pkg/apis/apiregistration/validation), with its messages: the name is
//! `<version>.<group>`; an empty group only for `v1`; the version a DNS-1035 label;
//! `groupPriorityMinimum` 1 to 20000 and `versionPriority` 1 to 1000; a local APIService (no
//! `service`) has neither `caBundle` nor `insecureSkipTLSVerify`; a Service reference names
//! a namespace, a name and a valid port (443 by default); `caBundle` and
//! `insecureSkipTLSVerify` exclude each other; a condition's status is True, False or
//! Unknown.
//!
//! Skiff adds one rule: a group this server serves itself (its built-in kinds' groups) may
//! not be proxied, so no APIService can shadow a built-in API (a custom kind's group-version
//! is shadowed neither: the local handler wins, see `crate::aggregator`).
//!
//! [`local_apiservices`] are the APIServices with no `service` that kube-apiserver lists for
//! its built-in group-versions (`v1.`, `v1.apps`, ...), with its priorities; the server
//! creates the missing ones at start, as kube-apiserver's autoregister controller does.

use skiff_api::api::ApiService;

use super::Strategy;
use crate::error::FieldError;
use crate::validation as v;

/// The port of a Service reference without one.
pub const DEFAULT_PORT: i32 = 443;

/// The groups this server serves itself: its typed kinds' and the metrics API's.
pub fn builtin_groups() -> std::collections::BTreeSet<&'static str> {
    let mut g: std::collections::BTreeSet<&'static str> = skiff_api::kinds()
        .iter()
        .map(|k| k.info().group())
        .collect();
    // Served by `rest::metrics`; in Kubernetes metrics-server's, here the server's own.
    g.insert("metrics.k8s.io");
    // The review and identity APIs answered by `rest::access`.
    g.insert("authorization.k8s.io");
    g.insert("authentication.k8s.io");
    g
}

/// kube-apiserver's (groupPriorityMinimum, versionPriority) of a built-in group-version
/// (`apiVersionPriorities`); this server's own groups rank below them.
fn builtin_priority(group: &str, version: &str) -> (i32, i32) {
    match (group, version) {
        ("", _) => (18000, 1),
        ("apiregistration.k8s.io", _) => (18000, 15),
        ("apps", _) => (17800, 15),
        ("authentication.k8s.io", _) => (17700, 15),
        ("authorization.k8s.io", _) => (17600, 15),
        ("autoscaling", "v2") => (17500, 30),
        ("autoscaling", _) => (17500, 15),
        ("batch", _) => (17400, 15),
        ("certificates.k8s.io", _) => (17300, 15),
        ("networking.k8s.io", _) => (17200, 15),
        ("policy", _) => (17100, 15),
        ("rbac.authorization.k8s.io", _) => (17000, 15),
        ("storage.k8s.io", _) => (16800, 15),
        ("apiextensions.k8s.io" | "admissionregistration.k8s.io", _) => (16700, 15),
        ("coordination.k8s.io", _) => (16500, 15),
        // metrics-server registers its group at these.
        ("metrics.k8s.io", _) => (100, 100),
        _ => (1000, 15),
    }
}

/// The label of APIServices the server keeps for its own group-versions (kube-apiserver's
/// autoregister controller's; `onstart`: written at start, an operator's change kept until
/// the next start).
pub const AUTOMANAGED_LABEL: &str = "kube-aggregator.kubernetes.io/automanaged";

/// The local APIServices (no `service`) kube-apiserver lists for its built-in
/// group-versions: `v1.` for the core group, `v1.apps`, ...; this server's typed kinds, the
/// metrics API and the review APIs.
pub fn local_apiservices() -> Vec<ApiService> {
    let mut gvs: std::collections::BTreeSet<(&str, &str)> = skiff_api::kinds()
        .iter()
        .map(|k| {
            let info = k.info();
            let version = info
                .api_version
                .rsplit('/')
                .next()
                .unwrap_or(info.api_version);
            (info.group(), version)
        })
        .collect();
    gvs.extend([
        ("metrics.k8s.io", "v1beta1"),
        ("authorization.k8s.io", "v1"),
        ("authentication.k8s.io", "v1"),
    ]);
    gvs.into_iter()
        .map(|(group, version)| {
            let (group_priority_minimum, version_priority) = builtin_priority(group, version);
            ApiService {
                metadata: Some(skiff_api::api::ObjectMeta {
                    name: format!("{version}.{group}"),
                    labels: [(AUTOMANAGED_LABEL.to_string(), "onstart".to_string())].into(),
                    ..Default::default()
                }),
                spec: Some(skiff_api::api::ApiServiceSpec {
                    group: group.into(),
                    version: version.into(),
                    group_priority_minimum,
                    version_priority,
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect()
}

impl Strategy for ApiService {
    const NAME_RULE: v::NameRule = v::NameRule::PathSegment;

    fn default(&mut self) {
        if let Some(svc) = self.spec.as_mut().and_then(|s| s.service.as_mut()) {
            svc.port.get_or_insert(DEFAULT_PORT);
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        for (i, c) in self.status.iter().flat_map(|s| &s.conditions).enumerate() {
            if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
                out.push(FieldError::not_supported(
                    format!("status.conditions[{i}].status"),
                    &c.status,
                    &["True", "False", "Unknown"],
                ));
            }
        }
        let spec = self.spec.clone().unwrap_or_default();
        let required = format!("{}.{}", spec.version, spec.group);
        let name = self.metadata.as_ref().map_or("", |m| m.name.as_str());
        if !name.is_empty() && v::path_segment(name).is_empty() && name != required {
            out.push(FieldError::invalid(
                "metadata.name",
                name,
                format!("must be `spec.version+\".\"+spec.group`: {required:?}"),
            ));
        }
        if spec.group.is_empty() && spec.version != "v1" {
            out.push(FieldError::required(
                "spec.group",
                "only v1 may have an empty group and it better be legacy kube",
            ));
        }
        if !spec.group.is_empty() {
            v::check_dns_subdomain(&mut out, "spec.group", &spec.group);
        }
        for e in skiff_api::names::dns1035_label(&spec.version) {
            out.push(FieldError::invalid("spec.version", &spec.version, e));
        }
        if !(1..=20000).contains(&spec.group_priority_minimum) {
            out.push(FieldError::invalid(
                "spec.groupPriorityMinimum",
                spec.group_priority_minimum,
                "must be positive and less than 20000",
            ));
        }
        if !(1..=1000).contains(&spec.version_priority) {
            out.push(FieldError::invalid(
                "spec.versionPriority",
                spec.version_priority,
                "must be positive and less than 1000",
            ));
        }
        let Some(svc) = &spec.service else {
            if !spec.ca_bundle.is_empty() {
                out.push(FieldError::invalid(
                    "spec.caBundle",
                    format!("{} bytes", spec.ca_bundle.len()),
                    "local APIServices may not have a caBundle",
                ));
            }
            if spec.insecure_skip_tls_verify {
                out.push(FieldError::invalid(
                    "spec.insecureSkipTLSVerify",
                    true,
                    "local APIServices may not have insecureSkipTLSVerify",
                ));
            }
            return out;
        };
        if svc.namespace.is_empty() {
            out.push(FieldError::required("spec.service.namespace", ""));
        }
        if svc.name.is_empty() {
            out.push(FieldError::required("spec.service.name", ""));
        }
        let port = svc.port.unwrap_or(DEFAULT_PORT);
        if !(1..=65535).contains(&port) {
            out.push(FieldError::invalid(
                "spec.service.port",
                port,
                "port is not valid: must be between 1 and 65535, inclusive",
            ));
        }
        if spec.insecure_skip_tls_verify && !spec.ca_bundle.is_empty() {
            out.push(FieldError::invalid(
                "spec.insecureSkipTLSVerify",
                true,
                "may not be true if caBundle is present",
            ));
        }
        if builtin_groups().contains(spec.group.as_str()) {
            out.push(FieldError::forbidden(
                "spec.service",
                format!(
                    "the group {:?} is served by this API server and may not be proxied",
                    spec.group
                ),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::Resource as _;
    use skiff_api::api::{ApiServiceReference, ApiServiceSpec, ObjectMeta};

    fn service(name: &str, spec: ApiServiceSpec) -> ApiService {
        let mut s = ApiService {
            metadata: Some(ObjectMeta {
                name: name.into(),
                ..Default::default()
            }),
            spec: Some(spec),
            ..Default::default()
        };
        Strategy::default(&mut s);
        s
    }

    fn wardle() -> ApiServiceSpec {
        ApiServiceSpec {
            service: Some(ApiServiceReference {
                namespace: "wardle".into(),
                name: "api".into(),
                port: None,
            }),
            group: "wardle.example.com".into(),
            version: "v1alpha1".into(),
            ca_bundle: b"-----BEGIN CERTIFICATE-----".to_vec(),
            group_priority_minimum: 1000,
            version_priority: 15,
            ..Default::default()
        }
    }

    fn messages(s: &ApiService) -> Vec<String> {
        s.validate().iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn a_good_one_is_defaulted_and_valid() {
        let s = service("v1alpha1.wardle.example.com", wardle());
        assert_eq!(messages(&s), Vec::<String>::new());
        let port = s.spec.as_ref().and_then(|s| s.service.as_ref()?.port);
        assert_eq!(port, Some(443));
        let local = service(
            "v1.local.example.com",
            ApiServiceSpec {
                group: "local.example.com".into(),
                version: "v1".into(),
                group_priority_minimum: 1,
                version_priority: 1,
                ..Default::default()
            },
        );
        assert_eq!(messages(&local), Vec::<String>::new());
    }

    #[test]
    fn kube_aggregator_messages() {
        let mut spec = wardle();
        spec.group_priority_minimum = 0;
        spec.version_priority = 1001;
        spec.insecure_skip_tls_verify = true;
        if let Some(s) = spec.service.as_mut() {
            s.port = Some(70000);
            s.namespace.clear();
        }
        let got = messages(&service("wardle", spec));
        for want in [
            "metadata.name: Invalid value: \"wardle\": must be `spec.version+\".\"+spec.group`: \"v1alpha1.wardle.example.com\"",
            "spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000",
            "spec.versionPriority: Invalid value: 1001: must be positive and less than 1000",
            "spec.service.namespace: Required value",
            "spec.service.port: Invalid value: 70000: port is not valid: must be between 1 and 65535, inclusive",
            "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present",
        ] {
            assert!(got.iter().any(|g| g == want), "missing {want:?} in {got:?}");
        }
        let mut spec = wardle();
        spec.group = String::new();
        spec.version = "V1".into();
        let got = messages(&service("V1.", spec));
        assert!(
            got.contains(&"spec.group: Required value: only v1 may have an empty group and it better be legacy kube".to_string()),
            "{got:?}"
        );
        assert!(
            got.iter().any(|g| g.starts_with("spec.version: Invalid value: \"V1\": a DNS-1035 label must consist of lower case alphanumeric characters or '-'")),
            "{got:?}"
        );
        let mut local = wardle();
        local.service = None;
        local.insecure_skip_tls_verify = true;
        let got = messages(&service("v1alpha1.wardle.example.com", local));
        assert!(
            got.contains(&"spec.caBundle: Invalid value: \"27 bytes\": local APIServices may not have a caBundle".to_string()),
            "{got:?}"
        );
        assert!(
            got.contains(&"spec.insecureSkipTLSVerify: Invalid value: true: local APIServices may not have insecureSkipTLSVerify".to_string()),
            "{got:?}"
        );
    }

    #[test]
    fn the_builtin_group_versions_are_local_apiservices() {
        let all = local_apiservices();
        let names: Vec<&str> = all.iter().map(|a| a.name()).collect();
        for want in [
            "v1.",
            "v1.apps",
            "v1.apiregistration.k8s.io",
            "v1beta1.metrics.k8s.io",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        for a in &all {
            assert_eq!(messages(a), Vec::<String>::new(), "{}", a.name());
            assert!(a.spec.as_ref().is_some_and(|s| s.service.is_none()));
        }
    }

    #[test]
    fn a_builtin_group_is_not_proxied() {
        let mut spec = wardle();
        spec.group = "apps".into();
        spec.version = "v1".into();
        let got = messages(&service("v1.apps", spec.clone()));
        assert_eq!(
            got,
            [
                "spec.service: Forbidden: the group \"apps\" is served by this API server and may not be proxied"
            ]
        );
        spec.service = None;
        spec.ca_bundle.clear();
        let mut local = service("v1.apps", spec);
        assert!(messages(&local).is_empty());
        local.status = Some(skiff_api::api::ApiServiceStatus {
            conditions: vec![skiff_api::api::ApiServiceCondition {
                r#type: "Available".into(),
                status: "Maybe".into(),
                ..Default::default()
            }],
        });
        assert_eq!(
            messages(&local),
            [
                "status.conditions[0].status: Unsupported value: \"Maybe\": supported values: \"True\", \"False\", \"Unknown\""
            ]
        );
    }
}
