//! API discovery as kubectl and client-go read it: the legacy documents (`/api`,
//! `/apis`, one `APIResourceList` per group-version) and aggregated discovery
//! (`apidiscovery.k8s.io/v2`, chosen by the Accept header), both from the registry's kinds.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use skiff_api::KindInfo;

use crate::aggregator::RemoteVersion;

/// The Kubernetes version Skiff speaks (kubectl compares it with its own).
pub const KUBERNETES_MAJOR: &str = "1";
pub const KUBERNETES_MINOR: &str = "32";

/// Verbs of every resource (one generic handler serves them all).
pub const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// A subresource as discovery lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subresource {
    pub name: &'static str,
    pub verbs: &'static [&'static str],
    /// (group, version, kind) of what it answers; `None`: the parent's kind.
    pub response: Option<(&'static str, &'static str, &'static str)>,
}

/// The verbs a kind serves (the metrics API's are read-only).
fn verbs_of(info: &KindInfo) -> &'static [&'static str] {
    if info.group() == super::metrics::GROUP {
        &super::metrics::VERBS
    } else {
        &VERBS
    }
}

/// Whether a typed kind serves the `scale` subresource (its `spec.replicas`).
pub fn scalable(info: &KindInfo) -> bool {
    matches!(
        info.plural,
        "deployments" | "replicasets" | "statefulsets" | "replicationcontrollers"
    )
}

/// A served kind as discovery and OpenAPI describe it: a typed kind, or a custom kind with
/// what its definition says.
#[derive(Debug, Clone)]
pub struct Served {
    pub info: &'static KindInfo,
    pub singular: String,
    pub categories: Vec<String>,
    /// Whether it serves the `scale` subresource.
    pub scale: bool,
    /// A custom kind's OpenAPI v3 schema (typed kinds' come from their messages).
    pub schema: Option<Value>,
}

impl Served {
    pub fn typed(info: &'static KindInfo) -> Served {
        Served {
            info,
            singular: info.kind.to_lowercase(),
            categories: categories(info).iter().map(|c| c.to_string()).collect(),
            scale: scalable(info),
            schema: None,
        }
    }
}

/// The subresources a kind serves.
pub fn subresources(served: &Served) -> Vec<Subresource> {
    let info = served.info;
    let mut out = Vec::new();
    if info.has_status {
        out.push(Subresource {
            name: "status",
            verbs: &["get", "patch", "update"],
            response: None,
        });
    }
    if served.scale {
        out.push(Subresource {
            name: "scale",
            verbs: &["get", "patch", "update"],
            response: Some(("autoscaling", "v1", "Scale")),
        });
    }
    if info.plural == "pods" && info.group().is_empty() {
        out.extend([
            Subresource {
                name: "binding",
                verbs: &["create"],
                response: Some(("", "v1", "Binding")),
            },
            Subresource {
                name: "eviction",
                verbs: &["create"],
                response: Some(("policy", "v1", "Eviction")),
            },
            Subresource {
                name: "exec",
                verbs: &["create", "get"],
                response: Some(("", "v1", "PodExecOptions")),
            },
            Subresource {
                name: "attach",
                verbs: &["create", "get"],
                response: Some(("", "v1", "PodAttachOptions")),
            },
            Subresource {
                name: "ephemeralcontainers",
                verbs: &["get", "patch", "update"],
                response: None,
            },
            Subresource {
                name: "portforward",
                verbs: &["create", "get"],
                response: Some(("", "v1", "PodPortForwardOptions")),
            },
            Subresource {
                name: "log",
                verbs: &["get"],
                response: None,
            },
        ]);
    }
    out
}

/// kubectl's `all` category holds the workload kinds, as kube-apiserver's: pods and
/// services, the apps controllers, jobs, cronjobs and autoscalers (not, say, the metrics
/// API's `pods`).
fn categories(info: &KindInfo) -> &'static [&'static str] {
    match (info.group(), info.plural) {
        ("", "pods" | "services" | "replicationcontrollers")
        | ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets")
        | ("batch", "jobs" | "cronjobs")
        | ("autoscaling", "horizontalpodautoscalers") => &["all"],
        _ => &[],
    }
}

fn version_of(info: &KindInfo) -> &'static str {
    info.api_version
        .rsplit_once('/')
        .map_or(info.api_version, |(_, v)| v)
}

/// Group → versions → kinds, core group `""` included.
pub fn groups(infos: &[Served]) -> BTreeMap<&'static str, BTreeMap<&'static str, Vec<&Served>>> {
    let mut g: BTreeMap<_, BTreeMap<_, Vec<_>>> = BTreeMap::new();
    for s in infos {
        g.entry(s.info.group())
            .or_default()
            .entry(version_of(s.info))
            .or_default()
            .push(s);
    }
    g
}

/// `GET /api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    })
}

/// Kubernetes' version priority (`k8s.io/apimachinery/pkg/version.CompareKubeAwareVersionStrings`):
/// GA before beta before alpha, higher numbers first, then other names alphabetically.
fn version_priority(v: &str) -> (u8, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>, String) {
    let other = (3, std::cmp::Reverse(0), std::cmp::Reverse(0), v.to_string());
    let Some(rest) = v.strip_prefix('v') else {
        return other;
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Ok(major) = digits.parse::<u64>() else {
        return other;
    };
    let tail = &rest[digits.len()..];
    let (tier, minor) = if tail.is_empty() {
        (0, "0")
    } else if let Some(m) = tail.strip_prefix("beta") {
        (1, m)
    } else if let Some(m) = tail.strip_prefix("alpha") {
        (2, m)
    } else {
        return other;
    };
    let Ok(minor) = minor.parse::<u64>() else {
        return other;
    };
    (
        tier,
        std::cmp::Reverse(major),
        std::cmp::Reverse(minor),
        String::new(),
    )
}

/// A group's versions, preferred first.
fn ordered<'a, T>(versions: &'a BTreeMap<&'static str, T>) -> Vec<(&'static str, &'a T)> {
    let mut out: Vec<(&'static str, &T)> = versions.iter().map(|(v, t)| (*v, t)).collect();
    out.sort_by_key(|(v, _)| version_priority(v));
    out
}

fn group_doc(name: &str, versions: &BTreeMap<&'static str, Vec<&Served>>) -> Value {
    let vs: Vec<Value> = ordered(versions)
        .into_iter()
        .map(|(v, _)| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `GET /apis`.
pub fn group_list(infos: &[Served]) -> Value {
    let groups: Vec<Value> = groups(infos)
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`, `None` if no such group.
pub fn group(infos: &[Served], name: &str) -> Option<Value> {
    let all = groups(infos);
    let vs = all.get(name).filter(|_| !name.is_empty())?;
    let mut doc = group_doc(name, vs);
    doc["kind"] = "APIGroup".into();
    doc["apiVersion"] = "v1".into();
    Some(doc)
}

/// `GET /api/v1` or `/apis/<group>/<version>`, `None` if no such group-version.
pub fn resource_list(infos: &[Served], group: &str, version: &str) -> Option<Value> {
    let all = groups(infos);
    let kinds = all.get(group)?.get(version)?;
    let mut resources = Vec::new();
    for served in kinds {
        let i = served.info;
        let mut r = json!({
            "name": i.plural,
            "singularName": served.singular,
            "namespaced": i.namespaced,
            "kind": i.kind,
            "verbs": verbs_of(i),
        });
        if !i.short_names.is_empty() {
            r["shortNames"] = json!(i.short_names);
        }
        if !served.categories.is_empty() {
            r["categories"] = json!(served.categories);
        }
        resources.push(r);
        for s in subresources(served) {
            let mut sub = json!({
                "name": format!("{}/{}", i.plural, s.name),
                "singularName": "",
                "namespaced": i.namespaced,
                "kind": s.response.map_or(i.kind, |(_, _, k)| k),
                "verbs": s.verbs,
            });
            if let Some((g, v, _)) = s.response
                && (g != group || v != version)
            {
                sub["group"] = g.into();
                sub["version"] = v.into();
            }
            resources.push(sub);
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

/// Aggregated discovery (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`) of the core group
/// (`core == true`, for `/api`) or of every named group (`/apis`).
pub fn aggregated(infos: &[Served], core: bool) -> Value {
    let items: Vec<Value> = groups(infos)
        .iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(g, vs)| {
            let versions: Vec<Value> = ordered(vs)
                .into_iter()
                .map(|(v, kinds)| {
                    let resources: Vec<Value> = kinds
                        .iter()
                        .map(|served| {
                            let i = served.info;
                            let mut r = json!({
                                "resource": i.plural,
                                "responseKind": {"group": g, "version": v, "kind": i.kind},
                                "scope": if i.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": served.singular,
                                "verbs": verbs_of(i),
                            });
                            if !i.short_names.is_empty() {
                                r["shortNames"] = json!(i.short_names);
                            }
                            if !served.categories.is_empty() {
                                r["categories"] = json!(served.categories);
                            }
                            let subs: Vec<Value> = subresources(served)
                                .iter()
                                .map(|s| {
                                    let (rg, rv, rk) = s.response.unwrap_or((g, v, i.kind));
                                    json!({
                                        "subresource": s.name,
                                        "responseKind": {"group": rg, "version": rv, "kind": rk},
                                        "verbs": s.verbs,
                                    })
                                })
                                .collect();
                            if !subs.is_empty() {
                                r["subresources"] = Value::Array(subs);
                            }
                            r
                        })
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": g}, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

/// Aggregated group-versions by group, each group's versions in Kubernetes' order
/// (`versionPriority` highest first, then by version name as Kubernetes ranks them), the
/// groups by their highest `groupPriorityMinimum`, then by name.
fn remote_by_group(remote: &[RemoteVersion]) -> Vec<(&str, Vec<&RemoteVersion>)> {
    let mut groups: BTreeMap<&str, Vec<&RemoteVersion>> = BTreeMap::new();
    for v in remote {
        groups.entry(v.group.as_str()).or_default().push(v);
    }
    let mut out: Vec<(&str, Vec<&RemoteVersion>)> = groups.into_iter().collect();
    for (_, vs) in &mut out {
        vs.sort_by_key(|v| {
            (
                std::cmp::Reverse(v.version_priority),
                version_priority(&v.version),
            )
        });
    }
    out.sort_by_key(|(g, vs)| {
        let top = vs
            .iter()
            .map(|v| v.group_priority_minimum)
            .max()
            .unwrap_or(0);
        (std::cmp::Reverse(top), g.to_string())
    });
    out
}

fn remote_group_doc(name: &str, versions: &[&RemoteVersion]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{}", v.version), "version": v.version}))
        .collect();
    json!({
        "name": name,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `GET /apis` with the aggregated groups: their versions join a local group of the same
/// name, other groups follow the local ones in priority order.
pub fn add_remote_groups(doc: &mut Value, remote: &[RemoteVersion]) {
    let Some(groups) = doc["groups"].as_array_mut() else {
        return;
    };
    for (name, versions) in remote_by_group(remote) {
        let fresh = remote_group_doc(name, &versions);
        match groups.iter_mut().find(|g| g["name"] == name) {
            Some(local) => {
                if let (Some(have), Some(more)) = (
                    local["versions"].as_array_mut(),
                    fresh["versions"].as_array(),
                ) {
                    have.extend(more.iter().cloned());
                }
            }
            None => groups.push(fresh),
        }
    }
}

/// `GET /apis/<group>`: a local group with the versions aggregated APIs add to it, or a
/// group only aggregated APIs serve; `None` if neither.
pub fn group_with_remote(infos: &[Served], remote: &[RemoteVersion], name: &str) -> Option<Value> {
    let Some(local) = group(infos, name) else {
        return remote_group(remote, name);
    };
    let mut list = json!({"groups": [local]});
    add_remote_groups(&mut list, remote);
    Some(list["groups"][0].take())
}

/// `GET /apis/<group>` of a group only aggregated APIs serve.
pub fn remote_group(remote: &[RemoteVersion], name: &str) -> Option<Value> {
    let (_, versions) = remote_by_group(remote)
        .into_iter()
        .find(|(g, _)| *g == name)?;
    let mut doc = remote_group_doc(name, &versions);
    doc["kind"] = "APIGroup".into();
    doc["apiVersion"] = "v1".into();
    Some(doc)
}

/// An extension server's `APIResourceList` resources as aggregated discovery's: each
/// resource with its subresources (`flunders/status`) folded in.
pub fn remote_resources(resources: &[Value], group: &str, version: &str) -> Vec<Value> {
    let kind_of = |r: &Value| {
        json!({
            "group": r["group"].as_str().unwrap_or(group),
            "version": r["version"].as_str().unwrap_or(version),
            "kind": r["kind"].as_str().unwrap_or(""),
        })
    };
    let mut out: Vec<Value> = Vec::new();
    for r in resources {
        let Some(name) = r["name"].as_str() else {
            continue;
        };
        if name.contains('/') {
            continue;
        }
        let mut v = json!({
            "resource": name,
            "responseKind": kind_of(r),
            "scope": if r["namespaced"].as_bool().unwrap_or(false) { "Namespaced" } else { "Cluster" },
            "singularResource": r["singularName"].as_str().unwrap_or(""),
            "verbs": r["verbs"].clone(),
        });
        for key in ["shortNames", "categories"] {
            if r[key].as_array().is_some_and(|a| !a.is_empty()) {
                v[key] = r[key].clone();
            }
        }
        out.push(v);
    }
    for r in resources {
        let Some((parent, sub)) = r["name"].as_str().and_then(|n| n.split_once('/')) else {
            continue;
        };
        if let Some(p) = out.iter_mut().find(|p| p["resource"] == parent) {
            let entry = json!({"subresource": sub, "responseKind": kind_of(r), "verbs": r["verbs"].clone()});
            match p["subresources"].as_array_mut() {
                Some(list) => list.push(entry),
                None => p["subresources"] = json!([entry]),
            }
        }
    }
    out
}

/// Aggregated discovery with the aggregated group-versions: each version with the resources
/// its server last listed, `freshness: Stale` when the last check failed (kube-aggregator's
/// discovery manager: a server never reached is listed with no resources).
pub fn add_remote_aggregated(doc: &mut Value, remote: &[RemoteVersion]) {
    let Some(items) = doc["items"].as_array_mut() else {
        return;
    };
    for (name, versions) in remote_by_group(remote) {
        let vs: Vec<Value> = versions
            .iter()
            .map(|v| {
                let resources = v
                    .resources
                    .as_deref()
                    .map(|r| remote_resources(r, name, &v.version))
                    .unwrap_or_default();
                json!({
                    "version": v.version,
                    "resources": resources,
                    "freshness": if v.fresh { "Current" } else { "Stale" },
                })
            })
            .collect();
        match items.iter_mut().find(|g| g["metadata"]["name"] == name) {
            Some(local) => {
                if let Some(have) = local["versions"].as_array_mut() {
                    have.extend(vs);
                }
            }
            None => items.push(json!({"metadata": {"name": name}, "versions": vs})),
        }
    }
}

/// The Content-Type of aggregated discovery documents.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

#[cfg(test)]
mod tests {
    use super::*;

    fn infos() -> Vec<Served> {
        skiff_api::kinds()
            .iter()
            .map(|k| Served::typed(k.info()))
            .collect()
    }

    #[test]
    fn legacy_documents() {
        let i = infos();
        let core = resource_list(&i, "", "v1").expect("v1");
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(
            names.contains(&"pods") && names.contains(&"pods/status"),
            "{names:?}"
        );
        assert!(names.contains(&"pods/binding"));
        // kubectl drain evicts only when discovery lists pods/eviction as a policy Eviction.
        let eviction = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .expect("pods/eviction");
        assert_eq!(
            (eviction["group"].as_str(), eviction["kind"].as_str()),
            (Some("policy"), Some("Eviction"))
        );
        assert!(names.contains(&"pods/log"));
        let apps = resource_list(&i, "apps", "v1").expect("apps/v1");
        let scale = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .expect("scale");
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(scale["group"], "autoscaling");
        let deploy = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments")
            .expect("deployments");
        assert_eq!(deploy["shortNames"], json!(["deploy"]));
        assert_eq!(deploy["categories"], json!(["all"]));
        // kubectl get all: every workload kind, not the metrics API's pods.
        let in_all = |group: &str, version: &str, name: &str| {
            resource_list(&i, group, version)
                .and_then(|l| {
                    l["resources"]
                        .as_array()?
                        .iter()
                        .find(|r| r["name"] == name)
                        .map(|r| r["categories"] == json!(["all"]))
                })
                .unwrap_or_else(|| panic!("{group}/{version} {name}"))
        };
        assert!(in_all("apps", "v1", "statefulsets"));
        assert!(in_all("apps", "v1", "daemonsets"));
        assert!(in_all("batch", "v1", "cronjobs"));
        let pod_metrics = KindInfo {
            api_version: "metrics.k8s.io/v1beta1",
            kind: "PodMetrics",
            plural: "pods",
            short_names: &[],
            namespaced: true,
            has_status: false,
        };
        assert!(categories(&pod_metrics).is_empty());
        let groups = group_list(&i);
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "apps" && g["preferredVersion"]["groupVersion"] == "apps/v1")
        );
        assert!(resource_list(&i, "apps", "v2").is_none());
        assert!(group(&i, "apps").is_some() && group(&i, "nope").is_none());
    }

    #[test]
    fn versions_are_in_kubernetes_priority() {
        let mut v = vec![
            "v1alpha1", "v2beta1", "v1", "v1beta2", "v2", "v1beta1", "foo", "v10",
        ];
        v.sort_by_key(|x| version_priority(x));
        assert_eq!(
            v,
            [
                "v10", "v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"
            ]
        );
    }

    fn remote(group: &str, version: &str, gp: i32, vp: i32) -> RemoteVersion {
        RemoteVersion {
            group: group.into(),
            version: version.into(),
            group_priority_minimum: gp,
            version_priority: vp,
            resources: None,
            fresh: false,
        }
    }

    #[test]
    fn aggregated_groups_in_kubernetes_priority() {
        let remote = vec![
            remote("wardle.example.com", "v1alpha1", 1000, 15),
            remote("wardle.example.com", "v1beta1", 1000, 15),
            remote("wardle.example.com", "v1", 900, 5),
            remote("a.example.com", "v1", 100, 10),
            remote("z.example.com", "v1", 2000, 10),
            remote("apps", "v2", 100, 10),
        ];
        let mut doc = group_list(&infos());
        add_remote_groups(&mut doc, &remote);
        let names: Vec<&str> = doc["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|g| g["name"].as_str())
            .collect();
        let tail = &names[names.len() - 3..];
        assert_eq!(
            tail,
            ["z.example.com", "wardle.example.com", "a.example.com"]
        );
        let wardle = remote_group(&remote, "wardle.example.com").unwrap();
        let versions: Vec<&str> = wardle["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["version"].as_str())
            .collect();
        // versionPriority first; equal priorities in Kubernetes' version order.
        assert_eq!(versions, ["v1beta1", "v1alpha1", "v1"]);
        assert_eq!(
            wardle["preferredVersion"]["groupVersion"],
            "wardle.example.com/v1beta1"
        );
        // A version of a local group joins it, in /apis and in /apis/apps.
        let merged = group_with_remote(&infos(), &remote, "apps").unwrap();
        assert_eq!(merged["kind"], "APIGroup");
        assert_eq!(merged["versions"][1]["groupVersion"], "apps/v2");
        assert!(group_with_remote(&infos(), &remote, "nope.example.com").is_none());
        assert!(group_with_remote(&infos(), &remote, "a.example.com").is_some());
        let apps = doc["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "apps")
            .unwrap();
        assert_eq!(apps["versions"][1]["groupVersion"], "apps/v2");
        assert_eq!(apps["preferredVersion"]["groupVersion"], "apps/v1");
    }

    #[test]
    fn aggregated_discovery_merges_what_servers_listed() {
        let mut fresh = remote("wardle.example.com", "v1alpha1", 1000, 15);
        fresh.fresh = true;
        fresh.resources = Some(vec![
            json!({"name": "flunders", "singularName": "flunder", "namespaced": true,
                   "kind": "Flunder", "verbs": ["get", "list"], "shortNames": ["fl"]}),
            json!({"name": "flunders/status", "singularName": "", "namespaced": true,
                   "kind": "Flunder", "verbs": ["get"]}),
        ]);
        let stale = remote("down.example.com", "v1", 100, 10);
        let mut doc = aggregated(&infos(), false);
        add_remote_aggregated(&mut doc, &[fresh, stale]);
        let items = doc["items"].as_array().unwrap();
        let wardle = items
            .iter()
            .find(|g| g["metadata"]["name"] == "wardle.example.com")
            .unwrap();
        let v = &wardle["versions"][0];
        assert_eq!(v["freshness"], "Current");
        assert_eq!(v["resources"][0]["resource"], "flunders");
        assert_eq!(v["resources"][0]["scope"], "Namespaced");
        assert_eq!(v["resources"][0]["shortNames"], json!(["fl"]));
        assert_eq!(
            v["resources"][0]["responseKind"],
            json!({"group": "wardle.example.com", "version": "v1alpha1", "kind": "Flunder"})
        );
        assert_eq!(
            v["resources"][0]["subresources"][0]["subresource"],
            "status"
        );
        let down = items
            .iter()
            .find(|g| g["metadata"]["name"] == "down.example.com")
            .unwrap();
        assert_eq!(down["versions"][0]["freshness"], "Stale");
        assert_eq!(down["versions"][0]["resources"], json!([]));
    }

    #[test]
    fn aggregated_documents() {
        let i = infos();
        let core = aggregated(&i, true);
        assert_eq!(core["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(core["items"][0]["metadata"]["name"], "");
        let named = aggregated(&i, false);
        let apps = named["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["metadata"]["name"] == "apps")
            .expect("apps");
        let deploy = &apps["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "deployments")
            .cloned()
            .expect("deployments");
        assert_eq!(deploy["scope"], "Namespaced");
        assert_eq!(deploy["subresources"][1]["subresource"], "scale");
        assert_eq!(
            deploy["subresources"][1]["responseKind"]["group"],
            "autoscaling"
        );
    }
}
