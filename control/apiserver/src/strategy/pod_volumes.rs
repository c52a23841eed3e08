//! Validation of a pod spec's volumes, volume mounts and security contexts, with
//! Kubernetes' field paths and messages.

use std::collections::BTreeSet;
use std::path::{Component, Path};

use skiff_api::api::{
    Container, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext, Volume,
};
use skiff_api::quantity;

use crate::error::FieldError;
use crate::validation as v;

/// The hostPath types, in the (sorted) order kube-apiserver lists them.
const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];
const MEDIA: &[&str] = &["", "Memory"];
const SECCOMP_TYPES: &[&str] = &["RuntimeDefault", "Unconfined", "Localhost"];
const PROC_MOUNTS: &[&str] = &["Default", "Unmasked"];
/// The fields a downwardAPI volume can expose.
const DOWNWARD_FIELDS: &[&str] = &[
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
];
const DOWNWARD_RESOURCES: &[&str] = &[
    "limits.cpu",
    "limits.ephemeral-storage",
    "limits.memory",
    "requests.cpu",
    "requests.ephemeral-storage",
    "requests.memory",
];

/// `..` anywhere, the way Kubernetes refuses it in relative paths.
fn has_dot_dot(p: &str) -> bool {
    Path::new(p)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
}

fn check_relative(out: &mut Vec<FieldError>, path: &str, value: &str) {
    if value.starts_with('/') {
        out.push(FieldError::invalid(path, value, "must be a relative path"));
    }
    if has_dot_dot(value) {
        out.push(FieldError::invalid(path, value, "must not contain '..'"));
    }
}

fn check_id(out: &mut Vec<FieldError>, path: &str, id: Option<i64>) {
    if let Some(id) = id
        && !(0..=i64::from(i32::MAX)).contains(&id)
    {
        out.push(FieldError::invalid(
            path,
            id,
            "must be between 0 and 2147483647, inclusive",
        ));
    }
}

fn check_mode(out: &mut Vec<FieldError>, path: &str, mode: Option<i32>) {
    if let Some(m) = mode
        && !(0..=0o777).contains(&m)
    {
        out.push(FieldError::invalid(
            path,
            m,
            "must be a number between 0 and 0777 (octal), both inclusive",
        ));
    }
}

fn check_seccomp(out: &mut Vec<FieldError>, path: &str, p: Option<&SeccompProfile>) {
    let Some(p) = p else { return };
    if !SECCOMP_TYPES.contains(&p.r#type.as_str()) {
        out.push(FieldError::not_supported(
            format!("{path}.type"),
            &p.r#type,
            SECCOMP_TYPES,
        ));
    }
    let local = p.localhost_profile.as_deref().unwrap_or("");
    if p.r#type == "Localhost" && local.is_empty() {
        out.push(FieldError::required(
            format!("{path}.localhostProfile"),
            "must be set when seccomp type is Localhost",
        ));
    }
    if p.r#type != "Localhost" && !local.is_empty() {
        out.push(FieldError::invalid(
            format!("{path}.localhostProfile"),
            local,
            "can only be set when seccomp type is Localhost",
        ));
    }
}

/// The `items` of a secret or configMap volume.
fn check_items(out: &mut Vec<FieldError>, path: &str, items: &[skiff_api::api::KeyToPath]) {
    for (i, item) in items.iter().enumerate() {
        let ip = format!("{path}.items[{i}]");
        if item.key.is_empty() {
            out.push(FieldError::required(format!("{ip}.key"), ""));
        }
        if item.path.is_empty() {
            out.push(FieldError::required(format!("{ip}.path"), ""));
        } else {
            check_relative(out, &format!("{ip}.path"), &item.path);
        }
        check_mode(out, &format!("{ip}.mode"), item.mode);
    }
}

/// `validateHostPathVolumeSource`: a path without `..` and a known type (a pod's volume and a
/// PersistentVolume's source alike).
pub(crate) fn check_host_path(
    out: &mut Vec<FieldError>,
    path: &str,
    h: &skiff_api::api::HostPathVolumeSource,
) {
    if h.path.is_empty() {
        out.push(FieldError::required(format!("{path}.path"), ""));
        return;
    }
    if has_dot_dot(&h.path) {
        out.push(FieldError::invalid(
            format!("{path}.path"),
            &h.path,
            "must not contain '..'",
        ));
    }
    let ty = h.r#type.as_deref().unwrap_or("");
    if !HOST_PATH_TYPES.contains(&ty) {
        out.push(FieldError::not_supported(
            format!("{path}.type"),
            ty,
            HOST_PATH_TYPES,
        ));
    }
}

/// One volume: exactly one source, counted in kube-apiserver's order (`validateVolumeSource`):
/// the first is validated, each further one is refused at its own path (a downwardAPI one
/// at `downwarAPI`, kube-apiserver's spelling) and not looked into.
fn check_volume(out: &mut Vec<FieldError>, path: &str, vol: &Volume) {
    let sources = [
        ("emptyDir", vol.empty_dir.is_some()),
        ("hostPath", vol.host_path.is_some()),
        ("secret", vol.secret.is_some()),
        (
            "persistentVolumeClaim",
            vol.persistent_volume_claim.is_some(),
        ),
        ("downwarAPI", vol.downward_api.is_some()),
        ("configMap", vol.config_map.is_some()),
        ("projected", vol.projected.is_some()),
    ];
    let mut present = sources
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name);
    let Some(first) = present.next() else {
        out.push(FieldError::required(path, "must specify a volume type"));
        return;
    };
    for extra in present {
        out.push(FieldError::forbidden(
            format!("{path}.{extra}"),
            "may not specify more than 1 volume type",
        ));
    }
    match first {
        "emptyDir" => {
            if let Some(e) = &vol.empty_dir {
                check_empty_dir(out, &format!("{path}.emptyDir"), e);
            }
        }
        "hostPath" => {
            if let Some(h) = &vol.host_path {
                check_host_path(out, &format!("{path}.hostPath"), h);
            }
        }
        "persistentVolumeClaim" => {
            if let Some(c) = &vol.persistent_volume_claim
                && c.claim_name.is_empty()
            {
                out.push(FieldError::required(
                    format!("{path}.persistentVolumeClaim.claimName"),
                    "",
                ));
            }
        }
        "secret" => check_secret_volume(out, path, vol),
        "configMap" => check_config_map_volume(out, path, vol),
        "downwarAPI" => {
            if let Some(d) = &vol.downward_api {
                check_mode(
                    out,
                    &format!("{path}.downwardAPI.defaultMode"),
                    d.default_mode,
                );
                check_downward_items(out, &format!("{path}.downwardAPI"), &d.items);
            }
        }
        _ => {
            if let Some(p) = &vol.projected {
                check_projected(out, &format!("{path}.projected"), p);
            }
        }
    }
}

fn check_empty_dir(
    out: &mut Vec<FieldError>,
    path: &str,
    e: &skiff_api::api::EmptyDirVolumeSource,
) {
    if !MEDIA.contains(&e.medium.as_str()) {
        out.push(FieldError::not_supported(
            format!("{path}.medium"),
            &e.medium,
            MEDIA,
        ));
    }
    if let Some(l) = &e.size_limit
        && let Err(err) = quantity::parse_value(l)
    {
        out.push(FieldError::invalid(
            format!("{path}.sizeLimit"),
            l,
            err.to_string(),
        ));
    }
}

fn check_secret_volume(out: &mut Vec<FieldError>, path: &str, vol: &Volume) {
    let Some(sv) = &vol.secret else { return };
    if sv.secret_name.is_empty() {
        out.push(FieldError::required(
            format!("{path}.secret.secretName"),
            "",
        ));
    } else {
        v::check_dns_subdomain(out, &format!("{path}.secret.secretName"), &sv.secret_name);
    }
    check_mode(out, &format!("{path}.secret.defaultMode"), sv.default_mode);
    check_items(out, &format!("{path}.secret"), &sv.items);
}

fn check_config_map_volume(out: &mut Vec<FieldError>, path: &str, vol: &Volume) {
    let Some(cm) = &vol.config_map else { return };
    if cm.name.is_empty() {
        out.push(FieldError::required(format!("{path}.configMap.name"), ""));
    } else {
        v::check_dns_subdomain(out, &format!("{path}.configMap.name"), &cm.name);
    }
    check_mode(
        out,
        &format!("{path}.configMap.defaultMode"),
        cm.default_mode,
    );
    check_items(out, &format!("{path}.configMap"), &cm.items);
}

/// A projected volume's sources: exactly one kind each, names and paths as in their own
/// volume types, token lifetimes of at least 10 minutes.
fn check_projected(
    out: &mut Vec<FieldError>,
    path: &str,
    p: &skiff_api::api::ProjectedVolumeSource,
) {
    check_mode(out, &format!("{path}.defaultMode"), p.default_mode);
    for (i, src) in p.sources.iter().enumerate() {
        let sp = format!("{path}.sources[{i}]");
        let kinds = usize::from(src.secret.is_some())
            + usize::from(src.config_map.is_some())
            + usize::from(src.downward_api.is_some())
            + usize::from(src.service_account_token.is_some());
        if kinds != 1 {
            out.push(FieldError::forbidden(
                sp.clone(),
                "may not specify more than 1 volume type per source",
            ));
        }
        for (field, keyed) in [
            ("secret", src.secret.as_ref().map(|x| (&x.name, &x.items))),
            (
                "configMap",
                src.config_map.as_ref().map(|x| (&x.name, &x.items)),
            ),
        ] {
            let Some((name, items)) = keyed else { continue };
            if name.is_empty() {
                out.push(FieldError::required(format!("{sp}.{field}.name"), ""));
            }
            check_items(out, &format!("{sp}.{field}"), items);
        }
        if let Some(d) = &src.downward_api {
            check_downward_items(out, &format!("{sp}.downwardAPI"), &d.items);
        }
        if let Some(t) = &src.service_account_token {
            let tp = format!("{sp}.serviceAccountToken");
            if t.path.is_empty() {
                out.push(FieldError::required(format!("{tp}.path"), ""));
            } else {
                check_relative(out, &format!("{tp}.path"), &t.path);
            }
            if let Some(e) = t.expiration_seconds
                && e < 600
            {
                out.push(FieldError::invalid(
                    format!("{tp}.expirationSeconds"),
                    e,
                    "may not specify a duration less than 10 minutes",
                ));
            }
        }
    }
}

/// The items of a downwardAPI volume or projection.
fn check_downward_items(
    out: &mut Vec<FieldError>,
    path: &str,
    items: &[skiff_api::api::DownwardApiVolumeFile],
) {
    let mut seen = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let ip = format!("{path}.items[{i}]");
        if item.path.is_empty() {
            out.push(FieldError::required(format!("{ip}.path"), ""));
        } else {
            check_relative(out, &format!("{ip}.path"), &item.path);
            if item.path.starts_with("..") {
                out.push(FieldError::invalid(
                    format!("{ip}.path"),
                    &item.path,
                    "must not start with '..'",
                ));
            }
            if !seen.insert(item.path.as_str()) {
                out.push(FieldError::duplicate(format!("{ip}.path"), &item.path));
            }
        }
        check_mode(out, &format!("{ip}.mode"), item.mode);
        match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), None) => {
                let fp = f.field_path.as_str();
                let keyed = ["metadata.labels['", "metadata.annotations['"]
                    .iter()
                    .any(|p| fp.starts_with(p) && fp.ends_with("']") && fp.len() > p.len() + 2);
                if !DOWNWARD_FIELDS.contains(&fp) && !keyed {
                    out.push(FieldError::not_supported(
                        format!("{ip}.fieldRef.fieldPath"),
                        fp,
                        DOWNWARD_FIELDS,
                    ));
                }
            }
            (None, Some(r)) => {
                if !DOWNWARD_RESOURCES.contains(&r.resource.as_str()) {
                    out.push(FieldError::not_supported(
                        format!("{ip}.resourceFieldRef.resource"),
                        &r.resource,
                        DOWNWARD_RESOURCES,
                    ));
                }
                if r.container_name.is_empty() {
                    out.push(FieldError::required(
                        format!("{ip}.resourceFieldRef.containerName"),
                        "",
                    ));
                }
            }
            (None, None) => out.push(FieldError::required(
                ip.clone(),
                "one of fieldRef and resourceFieldRef is required",
            )),
            (Some(_), Some(_)) => out.push(FieldError::invalid(
                ip.clone(),
                "fieldRef and resourceFieldRef",
                "fieldRef and resourceFieldRef can not be specified simultaneously",
            )),
        }
    }
}

/// The fields an environment variable can take from the pod (`valueFrom.fieldRef`).
const ENV_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.podIP",
];

/// `env[i].valueFrom`.
pub(crate) fn validate_env_source(
    out: &mut Vec<FieldError>,
    path: &str,
    e: &skiff_api::api::EnvVar,
) {
    let Some(from) = &e.value_from else { return };
    if !e.value.is_empty() {
        out.push(FieldError::invalid(
            format!("{path}.valueFrom"),
            "",
            "may not be specified when `value` is not empty",
        ));
    }
    let sources = usize::from(from.field_ref.is_some())
        + usize::from(from.resource_field_ref.is_some())
        + usize::from(from.secret_key_ref.is_some())
        + usize::from(from.config_map_key_ref.is_some());
    match sources {
        0 => out.push(FieldError::invalid(
            format!("{path}.valueFrom"),
            "",
            "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or \
             `secretKeyRef`",
        )),
        1 => {}
        _ => out.push(FieldError::invalid(
            format!("{path}.valueFrom"),
            "",
            "may not have more than one field specified at a time",
        )),
    }
    if let Some(f) = &from.field_ref {
        let fp = f.field_path.as_str();
        let keyed = ["metadata.labels['", "metadata.annotations['"]
            .iter()
            .any(|p| fp.starts_with(p) && fp.ends_with("']") && fp.len() > p.len() + 2);
        if !ENV_FIELDS.contains(&fp) && !keyed {
            out.push(FieldError::not_supported(
                format!("{path}.valueFrom.fieldRef.fieldPath"),
                fp,
                ENV_FIELDS,
            ));
        }
    }
    if let Some(r) = &from.resource_field_ref
        && !DOWNWARD_RESOURCES.contains(&r.resource.as_str())
    {
        out.push(FieldError::not_supported(
            format!("{path}.valueFrom.resourceFieldRef.resource"),
            &r.resource,
            DOWNWARD_RESOURCES,
        ));
    }
    let refs = [
        (
            "secretKeyRef",
            from.secret_key_ref.as_ref().map(|k| (&k.name, &k.key)),
        ),
        (
            "configMapKeyRef",
            from.config_map_key_ref.as_ref().map(|k| (&k.name, &k.key)),
        ),
    ];
    for (field, keyed) in refs {
        let Some((name, key)) = keyed else { continue };
        if name.is_empty() {
            out.push(FieldError::required(
                format!("{path}.valueFrom.{field}.name"),
                "",
            ));
        }
        if key.is_empty() {
            out.push(FieldError::required(
                format!("{path}.valueFrom.{field}.key"),
                "",
            ));
        }
    }
}

/// `spec.volumes`; returns the volume names.
pub(crate) fn validate_volumes<'a>(
    out: &mut Vec<FieldError>,
    path: &str,
    spec: &'a PodSpec,
) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    for (i, vol) in spec.volumes.iter().enumerate() {
        let vp = format!("{path}.volumes[{i}]");
        if vol.name.is_empty() {
            out.push(FieldError::required(format!("{vp}.name"), ""));
        } else {
            v::check_dns_label(out, &format!("{vp}.name"), &vol.name);
            if !names.insert(vol.name.as_str()) {
                out.push(FieldError::duplicate(format!("{vp}.name"), &vol.name));
            }
        }
        check_volume(out, &vp, vol);
    }
    names
}

/// A container's volumeMounts and securityContext.
pub(crate) fn validate_container_extras(
    out: &mut Vec<FieldError>,
    path: &str,
    c: &Container,
    volumes: &BTreeSet<&str>,
) {
    let mut mount_paths = BTreeSet::new();
    for (i, m) in c.volume_mounts.iter().enumerate() {
        let mp = format!("{path}.volumeMounts[{i}]");
        if m.name.is_empty() {
            out.push(FieldError::required(format!("{mp}.name"), ""));
        } else if !volumes.contains(m.name.as_str()) {
            out.push(FieldError::not_found(format!("{mp}.name"), &m.name));
        }
        if m.mount_path.is_empty() {
            out.push(FieldError::required(format!("{mp}.mountPath"), ""));
        } else if !mount_paths.insert(m.mount_path.as_str()) {
            out.push(FieldError::invalid(
                format!("{mp}.mountPath"),
                &m.mount_path,
                "must be unique",
            ));
        }
        if !m.sub_path.is_empty() {
            check_relative(out, &format!("{mp}.subPath"), &m.sub_path);
        }
        if !matches!(m.mount_propagation.as_str(), "" | "None") {
            out.push(FieldError::not_supported(
                format!("{mp}.mountPropagation"),
                &m.mount_propagation,
                &["None"],
            ));
        }
    }
    if let Some(sc) = &c.security_context {
        validate_security_context(out, &format!("{path}.securityContext"), sc);
    }
}

fn validate_security_context(out: &mut Vec<FieldError>, path: &str, sc: &SecurityContext) {
    check_id(out, &format!("{path}.runAsUser"), sc.run_as_user);
    check_id(out, &format!("{path}.runAsGroup"), sc.run_as_group);
    check_seccomp(
        out,
        &format!("{path}.seccompProfile"),
        sc.seccomp_profile.as_ref(),
    );
    if !sc.proc_mount.is_empty() && !PROC_MOUNTS.contains(&sc.proc_mount.as_str()) {
        out.push(FieldError::not_supported(
            format!("{path}.procMount"),
            &sc.proc_mount,
            PROC_MOUNTS,
        ));
    }
    if sc.privileged == Some(true) && sc.allow_privilege_escalation == Some(false) {
        out.push(FieldError::invalid(
            path,
            "",
            "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
        ));
    }
    if let Some(caps) = &sc.capabilities {
        for (field, list) in [("add", &caps.add), ("drop", &caps.drop)] {
            for (i, name) in list.iter().enumerate() {
                if name.is_empty() {
                    out.push(FieldError::required(
                        format!("{path}.capabilities.{field}[{i}]"),
                        "",
                    ));
                }
            }
        }
    }
}

/// `spec.securityContext`.
pub(crate) fn validate_pod_security_context(
    out: &mut Vec<FieldError>,
    path: &str,
    psc: Option<&PodSecurityContext>,
) {
    let Some(psc) = psc else { return };
    let p = format!("{path}.securityContext");
    check_id(out, &format!("{p}.runAsUser"), psc.run_as_user);
    check_id(out, &format!("{p}.runAsGroup"), psc.run_as_group);
    check_id(out, &format!("{p}.fsGroup"), psc.fs_group);
    for (i, g) in psc.supplemental_groups.iter().enumerate() {
        check_id(out, &format!("{p}.supplementalGroups[{i}]"), Some(*g));
    }
    check_seccomp(
        out,
        &format!("{p}.seccompProfile"),
        psc.seccomp_profile.as_ref(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        Capabilities, DownwardApiVolumeFile, DownwardApiVolumeSource, EmptyDirVolumeSource,
        HostPathVolumeSource, ObjectFieldSelector, VolumeMount,
    };

    fn messages(out: &[FieldError]) -> Vec<String> {
        out.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn volumes_and_mounts_are_checked_like_kubernetes() {
        let spec = PodSpec {
            volumes: vec![
                Volume {
                    name: "data".into(),
                    empty_dir: Some(EmptyDirVolumeSource {
                        medium: "Disk".into(),
                        size_limit: Some("lots".into()),
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "data".into(),
                    ..Default::default()
                },
                Volume {
                    name: "node".into(),
                    host_path: Some(HostPathVolumeSource {
                        path: "/var/log".into(),
                        r#type: Some("Folder".into()),
                    }),
                    downward_api: Some(DownwardApiVolumeSource::default()),
                    ..Default::default()
                },
                Volume {
                    name: "info".into(),
                    downward_api: Some(DownwardApiVolumeSource {
                        items: vec![DownwardApiVolumeFile {
                            path: "../x".into(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "spec.nodeName".into(),
                                ..Default::default()
                            }),
                            mode: Some(0o1777),
                            ..Default::default()
                        }],
                        default_mode: None,
                    }),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let mut out = Vec::new();
        let names = validate_volumes(&mut out, "spec", &spec);
        let m = messages(&out);
        for want in [
            "spec.volumes[0].emptyDir.medium: Unsupported value: \"Disk\": supported values: \"\", \"Memory\"",
            "spec.volumes[1].name: Duplicate value: \"data\"",
            "spec.volumes[1]: Required value: must specify a volume type",
            "spec.volumes[2].downwarAPI: Forbidden: may not specify more than 1 volume type",
            "spec.volumes[3].downwardAPI.items[0].path: Invalid value: \"../x\": must not contain '..'",
            "spec.volumes[3].downwardAPI.items[0].mode: Invalid value: 1023: must be a number between 0 and 0777 (octal), both inclusive",
        ] {
            assert!(m.iter().any(|x| x == want), "{want} not in {m:#?}");
        }
        assert!(
            m.iter()
                .any(|x| x
                    .starts_with("spec.volumes[0].emptyDir.sizeLimit: Invalid value: \"lots\"")),
            "{m:#?}"
        );
        assert!(
            m.iter()
                .any(|x| x
                    .starts_with("spec.volumes[2].hostPath.type: Unsupported value: \"Folder\"")),
            "{m:#?}"
        );
        assert!(m.iter().any(|x| x.starts_with("spec.volumes[3].downwardAPI.items[0].fieldRef.fieldPath: Unsupported value: \"spec.nodeName\"")), "{m:#?}");

        let c = Container {
            name: "web".into(),
            volume_mounts: vec![
                VolumeMount {
                    name: "nope".into(),
                    mount_path: "/a".into(),
                    sub_path: "/abs".into(),
                    ..Default::default()
                },
                VolumeMount {
                    name: "data".into(),
                    mount_path: "/a".into(),
                    ..Default::default()
                },
            ],
            security_context: Some(SecurityContext {
                run_as_user: Some(-1),
                privileged: Some(true),
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    add: vec![String::new()],
                    drop: vec![],
                }),
                seccomp_profile: Some(SeccompProfile {
                    r#type: "Localhost".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut out = Vec::new();
        validate_container_extras(&mut out, "spec.containers[0]", &c, &names);
        let m = messages(&out);
        for want in [
            "spec.containers[0].volumeMounts[0].name: Not found: \"nope\"",
            "spec.containers[0].volumeMounts[0].subPath: Invalid value: \"/abs\": must be a relative path",
            "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/a\": must be unique",
            "spec.containers[0].securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive",
            "spec.containers[0].securityContext: Invalid value: \"\": cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
            "spec.containers[0].securityContext.capabilities.add[0]: Required value",
            "spec.containers[0].securityContext.seccompProfile.localhostProfile: Required value: must be set when seccomp type is Localhost",
        ] {
            assert!(m.iter().any(|x| x == want), "{want} not in {m:#?}");
        }
        assert_eq!(out[0].cause_reason(), "FieldValueNotFound");
    }

    #[test]
    fn persistent_volume_claims_are_a_volume_source() {
        use skiff_api::api::{PersistentVolumeClaimVolumeSource, SecretVolumeSource};
        let claim = |name: &str| {
            Some(PersistentVolumeClaimVolumeSource {
                claim_name: name.into(),
                read_only: false,
            })
        };
        let spec = PodSpec {
            volumes: vec![
                Volume {
                    name: "nameless".into(),
                    persistent_volume_claim: claim(""),
                    ..Default::default()
                },
                Volume {
                    name: "data".into(),
                    persistent_volume_claim: claim("data"),
                    ..Default::default()
                },
                // Kubernetes counts secret before persistentVolumeClaim: the claim is the
                // extra source, refused at its own path and not looked into.
                Volume {
                    name: "both".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: "s".into(),
                        ..Default::default()
                    }),
                    persistent_volume_claim: claim(""),
                    ..Default::default()
                },
                Volume {
                    name: "three".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    persistent_volume_claim: claim("c"),
                    projected: Some(Default::default()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let mut out = Vec::new();
        let names = validate_volumes(&mut out, "spec", &spec);
        assert_eq!(
            messages(&out),
            [
                "spec.volumes[0].persistentVolumeClaim.claimName: Required value",
                "spec.volumes[2].persistentVolumeClaim: Forbidden: may not specify more than 1 volume type",
                "spec.volumes[3].persistentVolumeClaim: Forbidden: may not specify more than 1 volume type",
                "spec.volumes[3].projected: Forbidden: may not specify more than 1 volume type",
            ]
        );
        assert!(names.contains("data"));
    }

    #[test]
    fn env_sources_are_checked() {
        use skiff_api::api::{EnvVar, EnvVarSource, SecretKeySelector};
        let e = EnvVar {
            name: "X".into(),
            value: "v".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "spec.containers".into(),
                    ..Default::default()
                }),
                secret_key_ref: Some(SecretKeySelector::default()),
                ..Default::default()
            }),
        };
        let mut out = Vec::new();
        validate_env_source(&mut out, "spec.containers[0].env[0]", &e);
        let m = messages(&out);
        for want in [
            "spec.containers[0].env[0].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty",
            "spec.containers[0].env[0].valueFrom: Invalid value: \"\": may not have more than one field specified at a time",
            "spec.containers[0].env[0].valueFrom.secretKeyRef.name: Required value",
            "spec.containers[0].env[0].valueFrom.secretKeyRef.key: Required value",
        ] {
            assert!(m.iter().any(|x| x == want), "{want} not in {m:#?}");
        }
        assert!(m.iter().any(|x| x.starts_with(
            "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Unsupported value: \"spec.containers\""
        )), "{m:#?}");
        // No source at all.
        let none = EnvVar {
            name: "Y".into(),
            value: String::new(),
            value_from: Some(EnvVarSource::default()),
        };
        let mut out = Vec::new();
        validate_env_source(&mut out, "spec.containers[0].env[1]", &none);
        assert_eq!(
            messages(&out),
            [
                "spec.containers[0].env[1].valueFrom: Invalid value: \"\": must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
            ]
        );
    }
}
