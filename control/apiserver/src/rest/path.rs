//! What a REST request addresses, read from its path the way kube-apiserver's
//! `RequestInfoFactory` does: the API prefix, group and version, namespace, resource, name
//! and subresource.

/// The target of a request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/version`.
    Version,
    /// `/healthz`, `/livez`, `/readyz` (the check name).
    Health(&'static str),
    /// `/api`: the core group's versions.
    CoreVersions,
    /// `/apis`: every named group.
    Groups,
    /// `/apis/<group>`: one group.
    Group(String),
    /// `/api/v1` or `/apis/<group>/<version>`: the group-version's resources.
    GroupVersion { group: String, version: String },
    /// A resource, a collection of it, or a subresource.
    Resource(ResourcePath),
    /// `/openapi/v2`.
    OpenApiV2,
    /// `/openapi/v3`: the index of group-version documents.
    OpenApiV3Index,
    /// `/openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`.
    OpenApiV3 { group: String, version: String },
    /// `/.well-known/openid-configuration`: the ServiceAccount token issuer's discovery.
    OpenIdConfiguration,
    /// `/openid/v1/jwks`: the keys that sign ServiceAccount tokens.
    Jwks,
    /// `/skiff/v1/snapshot`: a consistent snapshot of the store (a non-resource URL).
    Snapshot,
    /// Anything else unknown.
    NotFound,
}

/// `/api/v1/namespaces/<ns>/<resource>/<name>/<subresource>` and its shorter forms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    /// `None` for cluster-scoped resources and lists over every namespace.
    pub namespace: Option<String>,
    /// The plural resource name, e.g. `deployments`.
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Subresources of `namespaces/<name>` (not resources inside the namespace).
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// Reads a request path (without the query string).
pub fn parse(path: &str) -> Target {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        ["version"] => Target::Version,
        [".well-known", "openid-configuration"] => Target::OpenIdConfiguration,
        ["openid", "v1", "jwks"] => Target::Jwks,
        ["skiff", "v1", "snapshot"] => Target::Snapshot,
        ["healthz", ..] => Target::Health("healthz"),
        ["livez", ..] => Target::Health("livez"),
        ["readyz", ..] => Target::Health("readyz"),
        ["api"] => Target::CoreVersions,
        ["apis"] => Target::Groups,
        ["apis", group] => Target::Group(group.to_string()),
        ["openapi", "v2"] => Target::OpenApiV2,
        ["openapi", "v3"] => Target::OpenApiV3Index,
        ["openapi", "v3", "api", version] => Target::OpenApiV3 {
            group: String::new(),
            version: version.to_string(),
        },
        ["openapi", "v3", "apis", group, version] => Target::OpenApiV3 {
            group: group.to_string(),
            version: version.to_string(),
        },
        ["api", version, rest @ ..] => resource("", version, rest),
        ["apis", group, version, rest @ ..] => resource(group, version, rest),
        _ => Target::NotFound,
    }
}

fn resource(group: &str, version: &str, rest: &[&str]) -> Target {
    if rest.is_empty() {
        return Target::GroupVersion {
            group: group.to_string(),
            version: version.to_string(),
        };
    }
    let mut p = ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        ..Default::default()
    };
    let mut rest = rest;
    if rest[0] == "namespaces" && rest.len() > 1 {
        p.namespace = Some(rest[1].to_string());
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
        } else {
            // `namespaces/<name>[/status]`: the namespace object itself.
            p.namespace = None;
        }
    }
    p.resource = rest[0].to_string();
    p.name = rest.get(1).map(|s| s.to_string());
    p.subresource = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 {
        return Target::NotFound;
    }
    Target::Resource(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse(path) {
            Target::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn kubernetes_paths() {
        let p = res("/api/v1/namespaces/shop/pods/web-1/log");
        assert_eq!(
            p,
            ResourcePath {
                group: String::new(),
                version: "v1".into(),
                namespace: Some("shop".into()),
                resource: "pods".into(),
                name: Some("web-1".into()),
                subresource: Some("log".into()),
            }
        );
        let d = res("/apis/apps/v1/namespaces/shop/deployments");
        assert_eq!(
            (d.group.as_str(), d.resource.as_str()),
            ("apps", "deployments")
        );
        assert_eq!(d.name, None);
        let all = res("/apis/apps/v1/deployments");
        assert_eq!(all.namespace, None);
        let node = res("/api/v1/nodes/n1/status");
        assert_eq!(
            (node.name.as_deref(), node.subresource.as_deref()),
            (Some("n1"), Some("status"))
        );
    }

    #[test]
    fn namespaces_themselves() {
        let ns = res("/api/v1/namespaces/shop");
        assert_eq!(
            (ns.namespace, ns.resource.as_str(), ns.name.as_deref()),
            (None, "namespaces", Some("shop"))
        );
        let st = res("/api/v1/namespaces/shop/status");
        assert_eq!(
            (
                st.resource.as_str(),
                st.name.as_deref(),
                st.subresource.as_deref()
            ),
            ("namespaces", Some("shop"), Some("status"))
        );
        let list = res("/api/v1/namespaces");
        assert_eq!((list.resource.as_str(), list.name), ("namespaces", None));
    }

    #[test]
    fn discovery_and_others() {
        assert_eq!(parse("/api"), Target::CoreVersions);
        assert_eq!(parse("/apis/"), Target::Groups);
        assert_eq!(parse("/apis/apps"), Target::Group("apps".into()));
        assert_eq!(
            parse("/apis/apps/v1"),
            Target::GroupVersion {
                group: "apps".into(),
                version: "v1".into()
            }
        );
        assert_eq!(parse("/version"), Target::Version);
        assert_eq!(parse("/readyz"), Target::Health("readyz"));
        assert_eq!(parse("/skiff/v1/snapshot"), Target::Snapshot);
        assert_eq!(
            parse("/openapi/v3/apis/apps/v1"),
            Target::OpenApiV3 {
                group: "apps".into(),
                version: "v1".into()
            }
        );
        assert_eq!(parse("/api/v1/namespaces/a/pods/b/c/d"), Target::NotFound);
        assert_eq!(parse("/nope"), Target::NotFound);
    }
}
