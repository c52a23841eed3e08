//! Validation of the RBAC kinds, with kube-apiserver's rules and messages
//! (`pkg/apis/rbac/validation`): names are path segments, every rule names verbs and either
//! resources with API groups or non-resource URLs (the latter only in ClusterRoles), a
//! binding's roleRef names a Role or ClusterRole of `rbac.authorization.k8s.io` and never
//! changes, and each subject is a User, Group or ServiceAccount with the fields its kind needs.

use skiff_api::api::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

use super::Strategy;
use crate::error::FieldError;
use crate::validation::{NameRule, path_segment};

/// The RBAC API group.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

fn rules(out: &mut Vec<FieldError>, rules: &[PolicyRule], cluster: bool) {
    for (i, r) in rules.iter().enumerate() {
        let p = format!("rules[{i}]");
        if r.verbs.is_empty() {
            out.push(FieldError::required(
                format!("{p}.verbs"),
                "verbs must contain at least one value",
            ));
        }
        if !r.non_resource_urls.is_empty() {
            if !cluster {
                out.push(FieldError::invalid(
                    format!("{p}.nonResourceURLs"),
                    &r.non_resource_urls,
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if !r.api_groups.is_empty() || !r.resources.is_empty() {
                out.push(FieldError::invalid(
                    format!("{p}.nonResourceURLs"),
                    &r.non_resource_urls,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if r.api_groups.is_empty() {
            out.push(FieldError::required(
                format!("{p}.apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if r.resources.is_empty() {
            out.push(FieldError::required(
                format!("{p}.resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
}

fn role_ref(out: &mut Vec<FieldError>, r: Option<&RoleRef>, cluster: bool) {
    let default = RoleRef::default();
    let r = r.unwrap_or(&default);
    if r.api_group != RBAC_GROUP {
        out.push(FieldError::not_supported(
            "roleRef.apiGroup",
            &r.api_group,
            &[RBAC_GROUP],
        ));
    }
    let kinds: &[&str] = if cluster {
        &["ClusterRole"]
    } else {
        &["Role", "ClusterRole"]
    };
    if !kinds.contains(&r.kind.as_str()) {
        out.push(FieldError::not_supported("roleRef.kind", &r.kind, kinds));
    }
    if r.name.is_empty() {
        out.push(FieldError::required("roleRef.name", ""));
    } else {
        for e in path_segment(&r.name) {
            out.push(FieldError::invalid("roleRef.name", &r.name, e));
        }
    }
}

fn subjects(out: &mut Vec<FieldError>, subjects: &[Subject], cluster: bool) {
    for (i, s) in subjects.iter().enumerate() {
        let p = format!("subjects[{i}]");
        if s.name.is_empty() {
            out.push(FieldError::required(format!("{p}.name"), ""));
        }
        match s.kind.as_str() {
            "ServiceAccount" => {
                if !s.api_group.is_empty() {
                    out.push(FieldError::not_supported(
                        format!("{p}.apiGroup"),
                        &s.api_group,
                        &[""],
                    ));
                }
                if cluster && s.namespace.is_empty() {
                    out.push(FieldError::required(format!("{p}.namespace"), ""));
                }
            }
            "User" | "Group" => {
                if s.api_group != RBAC_GROUP {
                    out.push(FieldError::not_supported(
                        format!("{p}.apiGroup"),
                        &s.api_group,
                        &[RBAC_GROUP],
                    ));
                }
            }
            other => out.push(FieldError::not_supported(
                format!("{p}.kind"),
                other,
                &["ServiceAccount", "User", "Group"],
            )),
        }
    }
}

fn role_ref_unchanged(new: Option<&RoleRef>, old: Option<&RoleRef>) -> Vec<FieldError> {
    if new == old {
        return Vec::new();
    }
    vec![FieldError::invalid(
        "roleRef",
        new.cloned().unwrap_or_default(),
        "cannot change roleRef",
    )]
}

/// Subjects written without `apiGroup` get the one their kind implies, as kubectl and
/// kube-apiserver's defaulting do.
fn default_subjects(subjects: &mut [Subject]) {
    for s in subjects {
        if s.api_group.is_empty() && matches!(s.kind.as_str(), "User" | "Group") {
            s.api_group = RBAC_GROUP.to_string();
        }
    }
}

impl Strategy for Role {
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        rules(&mut out, &self.rules, false);
        out
    }
}

impl Strategy for ClusterRole {
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        rules(&mut out, &self.rules, true);
        out
    }
}

impl Strategy for RoleBinding {
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn default(&mut self) {
        default_subjects(&mut self.subjects);
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        role_ref(&mut out, self.role_ref.as_ref(), false);
        subjects(&mut out, &self.subjects, false);
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        role_ref_unchanged(self.role_ref.as_ref(), old.role_ref.as_ref())
    }
}

impl Strategy for ClusterRoleBinding {
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn default(&mut self) {
        default_subjects(&mut self.subjects);
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        role_ref(&mut out, self.role_ref.as_ref(), true);
        subjects(&mut out, &self.subjects, true);
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        role_ref_unchanged(self.role_ref.as_ref(), old.role_ref.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(errs: Vec<FieldError>) -> Vec<String> {
        errs.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn rules_need_verbs_and_targets() {
        let role = Role {
            rules: vec![
                PolicyRule {
                    resources: vec!["pods".into()],
                    ..Default::default()
                },
                PolicyRule {
                    verbs: vec!["get".into()],
                    non_resource_urls: vec!["/healthz".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let m = msgs(role.validate());
        assert!(
            m.contains(
                &"rules[0].verbs: Required value: verbs must contain at least one value".into()
            ),
            "{m:?}"
        );
        assert!(
            m.contains(&"rules[0].apiGroups: Required value: resource rules must supply at least one api group".into()),
            "{m:?}"
        );
        assert!(
            m.iter()
                .any(|e| e.starts_with("rules[1].nonResourceURLs: Invalid value")
                    && e.ends_with("namespaced rules cannot apply to non-resource URLs")),
            "{m:?}"
        );
        let cr = ClusterRole {
            rules: role.rules[1..].to_vec(),
            ..Default::default()
        };
        assert!(cr.validate().is_empty());
    }

    #[test]
    fn bindings_check_role_ref_and_subjects() {
        let mut b = ClusterRoleBinding {
            role_ref: Some(RoleRef {
                api_group: RBAC_GROUP.into(),
                kind: "Role".into(),
                name: "x".into(),
            }),
            subjects: vec![
                Subject {
                    kind: "ServiceAccount".into(),
                    name: "sa".into(),
                    ..Default::default()
                },
                Subject {
                    kind: "Robot".into(),
                    name: "r".into(),
                    ..Default::default()
                },
                Subject {
                    kind: "User".into(),
                    name: "alice".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        b.default();
        let m = msgs(b.validate());
        assert_eq!(
            m,
            vec![
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[0].namespace: Required value",
                "subjects[1].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
            ]
        );
        let old = b.clone();
        b.role_ref = Some(RoleRef {
            api_group: RBAC_GROUP.into(),
            kind: "ClusterRole".into(),
            name: "y".into(),
        });
        let m = msgs(b.validate_update(&old));
        assert_eq!(m.len(), 1);
        assert!(
            m[0].starts_with("roleRef: Invalid value") && m[0].ends_with("cannot change roleRef"),
            "{m:?}"
        );
    }
}
