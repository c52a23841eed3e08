//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`, cluster-scoped): what one
//! definition can be checked for alone, with kube-apiserver's messages
//! (apiextensions-apiserver's `ValidateCustomResourceDefinition`): the name is
//! `<plural>.<group>`, the group a domain with a dot, the scope Cluster or Namespaced,
//! version names DNS-1035 labels and unique, exactly one storage version, every version with
//! a structural schema (`skiff_schema`), printer columns and scale paths well formed, a
//! conversion webhook with exactly one of url or service. Group and plural never change;
//! scope and kind not once the definition is Established.
//!
//! Defaults: singular (the lowercased kind), listKind (`<kind>List`), conversion strategy
//! None. The status's storedVersions start with the storage version and gain each new one.
//! A delete adds the cleanup finalizer and the Terminating condition; the API server's
//! definition loop (`crate::definitions`) then deletes the objects and the finalizer.

use async_trait::async_trait;
use skiff_api::api::{
    Condition, CustomResourceConversion, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionStatus, CustomResourceSubresources,
};
use skiff_api::names::{dns1035_label, dns1123_subdomain};

use super::{DeleteContext, DeleteDecision, Strategy, now_rfc3339};
use crate::error::{ApiError, FieldError, FieldErrorKind};

/// The finalizer with which the API server removes a definition's objects before the
/// definition itself.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

fn schema_error(e: skiff_schema::FieldError) -> FieldError {
    use skiff_schema::ErrorKind as K;
    let kind = match e.kind {
        K::Required => FieldErrorKind::Required,
        K::NotSupported => FieldErrorKind::NotSupported,
        K::Duplicate => FieldErrorKind::Duplicate,
        K::Forbidden => FieldErrorKind::Forbidden,
        K::TooLong => FieldErrorKind::TooLong,
        K::TooMany => FieldErrorKind::TooMany,
        K::NotFound => FieldErrorKind::NotFound,
        K::Invalid => FieldErrorKind::Invalid,
        K::TypeInvalid => FieldErrorKind::TypeInvalid,
    };
    FieldError {
        path: e.path,
        kind,
        value: e.value,
        detail: e.detail,
    }
}

/// Schema errors as the API server's field errors.
pub fn schema_errors(errors: Vec<skiff_schema::FieldError>) -> Vec<FieldError> {
    errors.into_iter().map(schema_error).collect()
}

const PRINTER_TYPES: [&str; 5] = ["boolean", "date", "integer", "number", "string"];
const PRINTER_FORMATS: [&str; 8] = [
    "byte",
    "date",
    "date-time",
    "double",
    "float",
    "int32",
    "int64",
    "password",
];

/// Sets (or replaces, keeping its transition time when the status is unchanged) a
/// condition of a definition's status.
pub fn set_condition(status: &mut CustomResourceDefinitionStatus, cond: Condition) {
    match status
        .conditions
        .iter_mut()
        .find(|c| c.r#type == cond.r#type)
    {
        Some(c) => {
            let time = if c.status == cond.status && !c.last_transition_time.is_empty() {
                c.last_transition_time.clone()
            } else {
                now_rfc3339()
            };
            *c = Condition {
                last_transition_time: time,
                ..cond
            };
        }
        None => status.conditions.push(Condition {
            last_transition_time: now_rfc3339(),
            ..cond
        }),
    }
}

/// Whether the definition's condition `ty` is True.
pub fn condition_true(crd: &CustomResourceDefinition, ty: &str) -> bool {
    crd.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == ty && c.status == "True")
    })
}

fn invalid_all(out: &mut Vec<FieldError>, path: &str, value: &str, errs: Vec<String>) {
    if !errs.is_empty() {
        out.push(FieldError::invalid(path, value, errs.join(",")));
    }
}

fn check_names(out: &mut Vec<FieldError>, names: &CustomResourceDefinitionNames, path: &str) {
    if !names.plural.is_empty() {
        invalid_all(
            out,
            &format!("{path}.plural"),
            &names.plural,
            dns1035_label(&names.plural),
        );
    }
    if !names.singular.is_empty() {
        invalid_all(
            out,
            &format!("{path}.singular"),
            &names.singular,
            dns1035_label(&names.singular),
        );
    }
    for (field, value) in [("kind", &names.kind), ("listKind", &names.list_kind)] {
        let errs = dns1035_label(&value.to_lowercase());
        if !value.is_empty() && !errs.is_empty() {
            out.push(FieldError::invalid(
                format!("{path}.{field}"),
                value,
                format!(
                    "may have mixed case, but should otherwise match: {}",
                    errs.join(",")
                ),
            ));
        }
    }
    for (i, s) in names.short_names.iter().enumerate() {
        invalid_all(out, &format!("{path}.shortNames[{i}]"), s, dns1035_label(s));
    }
    if !names.kind.is_empty() && names.kind == names.list_kind {
        out.push(FieldError::invalid(
            format!("{path}.listKind"),
            &names.list_kind,
            "kind and listKind may not be the same",
        ));
    }
    for (i, c) in names.categories.iter().enumerate() {
        invalid_all(out, &format!("{path}.categories[{i}]"), c, dns1035_label(c));
    }
}

/// `.spec.replicas`-style paths: start with a dot.
fn check_simple_path(out: &mut Vec<FieldError>, path: &str, value: &str) -> bool {
    if value.is_empty() {
        out.push(FieldError::invalid(path, value, "must not be empty"));
        false
    } else if !value.starts_with('.') {
        out.push(FieldError::invalid(
            path,
            value,
            "must be a simple json path starting with .",
        ));
        false
    } else {
        true
    }
}

fn check_subresources(out: &mut Vec<FieldError>, sub: &CustomResourceSubresources, path: &str) {
    let Some(scale) = &sub.scale else {
        return;
    };
    for (field, value, under) in [
        ("specReplicasPath", &scale.spec_replicas_path, ".spec"),
        ("statusReplicasPath", &scale.status_replicas_path, ".status"),
    ] {
        let p = format!("{path}.scale.{field}");
        if value.is_empty() {
            out.push(FieldError::required(p, ""));
        } else if check_simple_path(out, &p, value) && !value.starts_with(&format!("{under}.")) {
            out.push(FieldError::invalid(
                p,
                value,
                format!("should be a json path under {under}"),
            ));
        }
    }
    if let Some(sel) = scale
        .label_selector_path
        .as_deref()
        .filter(|s| !s.is_empty())
    {
        let p = format!("{path}.scale.labelSelectorPath");
        if check_simple_path(out, &p, sel) && !sel.starts_with(".status.") {
            out.push(FieldError::invalid(
                p,
                sel,
                "should be a json path under .status",
            ));
        }
    }
}

fn check_conversion(out: &mut Vec<FieldError>, conv: &CustomResourceConversion, path: &str) {
    match conv.strategy.as_str() {
        "" => out.push(FieldError::required(format!("{path}.strategy"), "")),
        "None" | "Webhook" => {}
        other => out.push(FieldError::not_supported(
            format!("{path}.strategy"),
            other,
            &["None", "Webhook"],
        )),
    }
    let config = conv.webhook.as_ref().and_then(|w| w.client_config.as_ref());
    if conv.strategy == "Webhook" {
        let Some(cc) = config else {
            out.push(FieldError::required(
                format!("{path}.webhook"),
                "must be set when strategy is set to Webhook",
            ));
            return;
        };
        super::admissionregistration::check_client_config(
            out,
            cc,
            &format!("{path}.webhook.clientConfig"),
        );
        let versions = conv
            .webhook
            .as_ref()
            .map(|w| w.conversion_review_versions.clone())
            .unwrap_or_default();
        if !versions.iter().any(|v| v == "v1" || v == "v1beta1") {
            out.push(FieldError::invalid(
                format!("{path}.webhook.conversionReviewVersions"),
                versions.join(","),
                "must include at least one of v1, v1beta1",
            ));
        }
    } else if config.is_some() {
        out.push(FieldError::forbidden(
            format!("{path}.webhook"),
            "should not be set when strategy is not set to Webhook",
        ));
    }
}

#[async_trait]
impl Strategy for CustomResourceDefinition {
    fn default(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        let names = spec.names.get_or_insert_with(Default::default);
        if names.singular.is_empty() && !names.kind.is_empty() {
            names.singular = names.kind.to_lowercase();
        }
        if names.list_kind.is_empty() && !names.kind.is_empty() {
            names.list_kind = format!("{}List", names.kind);
        }
        let conv = spec.conversion.get_or_insert_with(Default::default);
        if conv.strategy.is_empty() {
            conv.strategy = "None".into();
        }
        if let Some(w) = conv.webhook.as_mut()
            && w.conversion_review_versions.is_empty()
        {
            w.conversion_review_versions = vec!["v1beta1".into()];
        }
    }

    /// storedVersions starts as the storage version.
    fn prepare_create(&mut self) {
        let storage = self.spec.as_ref().and_then(|s| {
            s.versions
                .iter()
                .find(|v| v.storage)
                .map(|v| v.name.clone())
        });
        let status = self.status.get_or_insert_with(Default::default);
        status.stored_versions = storage.into_iter().collect();
    }

    /// The status is the server's; a new storage version joins storedVersions.
    fn prepare_update(&mut self, _old: &Self) {
        let storage = self.spec.as_ref().and_then(|s| {
            s.versions
                .iter()
                .find(|v| v.storage)
                .map(|v| v.name.clone())
        });
        let status = self.status.get_or_insert_with(Default::default);
        if let Some(storage) = storage
            && !status.stored_versions.contains(&storage)
        {
            status.stored_versions.push(storage);
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        let names = spec.names.clone().unwrap_or_default();
        let name = self
            .metadata
            .as_ref()
            .map(|m| m.name.as_str())
            .unwrap_or("");
        if !name.is_empty() && name != format!("{}.{}", names.plural, spec.group) {
            out.push(FieldError::invalid(
                "metadata.name",
                name,
                "must be spec.names.plural+\".\"+spec.group",
            ));
        }
        if spec.group.is_empty() {
            out.push(FieldError::required("spec.group", ""));
        } else {
            let errs = dns1123_subdomain(&spec.group);
            if !errs.is_empty() {
                invalid_all(&mut out, "spec.group", &spec.group, errs);
            } else if !spec.group.contains('.') {
                out.push(FieldError::invalid(
                    "spec.group",
                    &spec.group,
                    "should be a domain with at least one dot",
                ));
            }
        }
        match spec.scope.as_str() {
            "" => out.push(FieldError::required("spec.scope", "")),
            "Cluster" | "Namespaced" => {}
            other => out.push(FieldError::not_supported(
                "spec.scope",
                other,
                &["Cluster", "Namespaced"],
            )),
        }
        if spec.versions.is_empty() {
            out.push(FieldError::invalid(
                "spec.versions",
                "",
                "must have exactly one version marked as storage version",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        let mut unique = true;
        for (i, v) in spec.versions.iter().enumerate() {
            let vp = format!("spec.versions[{i}]");
            unique &= seen.insert(v.name.as_str());
            invalid_all(
                &mut out,
                &format!("{vp}.name"),
                &v.name,
                dns1035_label(&v.name),
            );
            let schema = v
                .schema
                .as_ref()
                .map(|s| s.open_api_v3_schema.as_str())
                .filter(|s| !s.is_empty() && *s != "{}");
            let sp = format!("{vp}.schema.openAPIV3Schema");
            match schema {
                None => out.push(FieldError::required(sp, "schemas are required")),
                Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
                    Err(e) => out.push(FieldError::invalid(sp, "", e.to_string())),
                    Ok(raw) => {
                        if let Err(errs) = skiff_schema::Schema::new(&raw, &sp) {
                            out.extend(schema_errors(errs));
                        }
                    }
                },
            }
            if let Some(sub) = &v.subresources {
                check_subresources(&mut out, sub, &format!("{vp}.subresources"));
            }
            for (j, c) in v.additional_printer_columns.iter().enumerate() {
                let cp = format!("{vp}.additionalPrinterColumns[{j}]");
                if c.name.is_empty() {
                    out.push(FieldError::required(format!("{cp}.name"), ""));
                }
                let types = format!("must be one of {}", PRINTER_TYPES.join(","));
                if c.r#type.is_empty() {
                    out.push(FieldError::required(format!("{cp}.type"), types));
                } else if !PRINTER_TYPES.contains(&c.r#type.as_str()) {
                    out.push(FieldError::invalid(format!("{cp}.type"), &c.r#type, types));
                }
                if !c.format.is_empty() && !PRINTER_FORMATS.contains(&c.format.as_str()) {
                    out.push(FieldError::invalid(
                        format!("{cp}.format"),
                        &c.format,
                        format!("must be one of {}", PRINTER_FORMATS.join(",")),
                    ));
                }
                if c.json_path.is_empty() {
                    out.push(FieldError::required(format!("{cp}.jsonPath"), ""));
                } else {
                    check_simple_path(&mut out, &format!("{cp}.jsonPath"), &c.json_path);
                }
            }
            for (j, f) in v.selectable_fields.iter().enumerate() {
                let fp = format!("{vp}.selectableFields[{j}].jsonPath");
                if f.json_path.is_empty() {
                    out.push(FieldError::required(fp, ""));
                } else {
                    check_simple_path(&mut out, &fp, &f.json_path);
                }
            }
        }
        if !unique {
            out.push(FieldError::invalid(
                "spec.versions",
                "",
                "must contain unique version names",
            ));
        }
        let storage = spec.versions.iter().filter(|v| v.storage).count();
        if !spec.versions.is_empty() && storage != 1 {
            out.push(FieldError::invalid(
                "spec.versions",
                "",
                "must have exactly one version marked as storage version",
            ));
        }
        for (field, value) in [
            ("plural", &names.plural),
            ("singular", &names.singular),
            ("kind", &names.kind),
            ("listKind", &names.list_kind),
        ] {
            if value.is_empty() {
                out.push(FieldError::required(format!("spec.names.{field}"), ""));
            }
        }
        check_names(&mut out, &names, "spec.names");
        if let Some(conv) = &spec.conversion {
            check_conversion(&mut out, conv, "spec.conversion");
        }
        if spec.preserve_unknown_fields {
            out.push(FieldError::invalid(
                "spec.preserveUnknownFields",
                true,
                "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in \
                 spec.versions[*].schema instead",
            ));
        }
        if let Some(status) = &self.status {
            if let Some(accepted) = &status.accepted_names {
                check_names(&mut out, accepted, "status.acceptedNames");
            }
            check_stored_versions(&mut out, status, &spec.versions);
        }
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let (Some(spec), Some(old_spec)) = (&self.spec, &old.spec) else {
            return out;
        };
        let names = spec.names.clone().unwrap_or_default();
        let old_names = old_spec.names.clone().unwrap_or_default();
        if condition_true(old, "Established") {
            if spec.scope != old_spec.scope {
                out.push(FieldError::immutable("spec.scope", &spec.scope));
            }
            if names.kind != old_names.kind {
                out.push(FieldError::immutable("spec.names.kind", &names.kind));
            }
        }
        if spec.group != old_spec.group {
            out.push(FieldError::immutable("spec.group", &spec.group));
        }
        if names.plural != old_names.plural {
            out.push(FieldError::immutable("spec.names.plural", &names.plural));
        }
        out
    }

    /// A delete keeps the definition until its objects are gone: the cleanup finalizer and
    /// the Terminating condition (kube-apiserver's CRD storage does the same).
    async fn delete_decision(
        &mut self,
        _ctx: &DeleteContext<'_>,
    ) -> Result<DeleteDecision, ApiError> {
        let meta = self.metadata.get_or_insert_with(Default::default);
        if meta.deletion_timestamp.is_empty()
            && !meta.finalizers.iter().any(|f| f == CLEANUP_FINALIZER)
        {
            meta.finalizers.push(CLEANUP_FINALIZER.to_string());
        }
        if meta.finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
            set_condition(
                self.status.get_or_insert_with(Default::default),
                Condition {
                    r#type: "Terminating".into(),
                    status: "True".into(),
                    reason: "InstanceDeletionPending".into(),
                    message: "CustomResourceDefinition marked for deletion; CustomResource \
                              deletion will begin soon"
                        .into(),
                    ..Default::default()
                },
            );
        }
        Ok(DeleteDecision::Now)
    }
}

/// `status.storedVersions`: not empty, holding the storage version, every entry a version
/// of the spec.
fn check_stored_versions(
    out: &mut Vec<FieldError>,
    status: &CustomResourceDefinitionStatus,
    versions: &[skiff_api::api::CustomResourceDefinitionVersion],
) {
    let path = "status.storedVersions";
    if status.stored_versions.is_empty() {
        out.push(FieldError::invalid(
            path,
            "[]",
            "must have at least one stored version",
        ));
        return;
    }
    for v in versions.iter().filter(|v| v.storage) {
        if !status.stored_versions.contains(&v.name) {
            out.push(FieldError::invalid(
                path,
                &v.name,
                format!("must have the storage version {}", v.name),
            ));
        }
    }
    for (i, s) in status.stored_versions.iter().enumerate() {
        if !versions.iter().any(|v| &v.name == s) {
            out.push(FieldError::invalid(
                format!("{path}[{i}]"),
                s,
                "must appear in spec.versions",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceValidation,
        ObjectMeta,
    };

    fn crd(name: &str, group: &str, plural: &str, kind: &str) -> CustomResourceDefinition {
        let mut c = CustomResourceDefinition {
            metadata: Some(ObjectMeta {
                name: name.into(),
                ..Default::default()
            }),
            spec: Some(CustomResourceDefinitionSpec {
                group: group.into(),
                scope: "Namespaced".into(),
                names: Some(CustomResourceDefinitionNames {
                    plural: plural.into(),
                    kind: kind.into(),
                    ..Default::default()
                }),
                versions: vec![CustomResourceDefinitionVersion {
                    name: "v1".into(),
                    served: true,
                    storage: true,
                    schema: Some(CustomResourceValidation {
                        open_api_v3_schema: r#"{"type":"object","properties":{"spec":{"type":"object","properties":{"size":{"type":"integer"}}}}}"#.into(),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        Strategy::default(&mut c);
        c.prepare_create();
        c
    }

    fn messages(c: &CustomResourceDefinition) -> Vec<String> {
        c.validate().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_well_formed_definition_is_defaulted_and_valid() {
        let c = crd("widgets.example.com", "example.com", "widgets", "Widget");
        assert_eq!(messages(&c), Vec::<String>::new());
        let names = c
            .spec
            .as_ref()
            .and_then(|s| s.names.clone())
            .unwrap_or_default();
        assert_eq!(names.singular, "widget");
        assert_eq!(names.list_kind, "WidgetList");
        assert_eq!(
            c.status.as_ref().map(|s| s.stored_versions.clone()),
            Some(vec!["v1".to_string()])
        );
    }

    #[test]
    fn names_groups_and_versions_get_kubernetes_messages() {
        let c = crd("widget.example.com", "example", "widgets", "Widget");
        let m = messages(&c);
        assert!(
            m.contains(
                &"metadata.name: Invalid value: \"widget.example.com\": must be \
                  spec.names.plural+\".\"+spec.group"
                    .to_string()
            ),
            "{m:?}"
        );
        assert!(
            m.contains(
                &"spec.group: Invalid value: \"example\": should be a domain with at least one \
                  dot"
                .to_string()
            ),
            "{m:?}"
        );
        let mut two = crd("widgets.example.com", "example.com", "widgets", "Widget");
        let spec = two.spec.as_mut().expect("spec");
        let mut second = spec.versions[0].clone();
        second.name = "v2".into();
        spec.versions.push(second);
        assert!(
            messages(&two).iter().any(|e| e
                == "spec.versions: Invalid value: \"\": must have exactly one version marked as \
                    storage version"),
            "{:?}",
            messages(&two)
        );
        let mut no_schema = crd("widgets.example.com", "example.com", "widgets", "Widget");
        no_schema.spec.as_mut().expect("spec").versions[0].schema = None;
        assert!(
            messages(&no_schema).contains(
                &"spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required"
                    .to_string()
            )
        );
    }

    #[test]
    fn a_non_structural_schema_is_refused_at_its_path() {
        let mut c = crd("widgets.example.com", "example.com", "widgets", "Widget");
        c.spec.as_mut().expect("spec").versions[0].schema = Some(CustomResourceValidation {
            open_api_v3_schema:
                r#"{"type":"object","properties":{"spec":{"properties":{"a":{"type":"string"}}}}}"#
                    .into(),
        });
        let m = messages(&c);
        assert!(
            m.iter().any(|e| e.starts_with(
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value"
            )),
            "{m:?}"
        );
    }

    #[test]
    fn group_and_plural_never_change_and_scope_not_once_established() {
        let old = crd("widgets.example.com", "example.com", "widgets", "Widget");
        let mut new = old.clone();
        new.spec.as_mut().expect("spec").scope = "Cluster".into();
        assert!(new.validate_update(&old).is_empty());
        let mut established = old.clone();
        set_condition(
            established.status.get_or_insert_with(Default::default),
            Condition {
                r#type: "Established".into(),
                status: "True".into(),
                ..Default::default()
            },
        );
        let m: Vec<String> = new
            .validate_update(&established)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            m,
            vec!["spec.scope: Invalid value: \"Cluster\": field is immutable".to_string()]
        );
        let mut regrouped = old.clone();
        regrouped.spec.as_mut().expect("spec").group = "other.com".into();
        assert!(
            regrouped
                .validate_update(&old)
                .iter()
                .any(|e| e.path == "spec.group")
        );
    }
}
