//! Pod Security admission: the Pod Security Standards (`privileged`, `baseline`,
//! `restricted`, Kubernetes' `k8s.io/pod-security-admission` checks for the fields Skiff
//! models), chosen per namespace by its labels `pod-security.kubernetes.io/enforce` (a pod
//! that violates it is refused) and `pod-security.kubernetes.io/warn` (the client is warned,
//! for pods and for the pod templates of Deployments and ReplicaSets). A namespace without a
//! label is `privileged`, as kube-apiserver's default configuration has it.
//!
//! Skiff's own rule on top: a `host` container runs the node's own commands outside any
//! image, and a directory image (`/some/dir`) makes a directory of the node the container's
//! read-write root, so both are allowed only where the enforced level is `privileged`.
//!
//! Enforced on create and on every update that changes a container's image
//! ([`significant_update`]), as kube-apiserver's PodSecurity plug-in does, by
//! [`crate::admission`].
//!
//! Messages are kube-apiserver's: `violates PodSecurity "restricted:latest": <check>
//! (<detail>), ...`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use skiff_api::api::{Container, ObjectMeta, PodSpec};

/// The label naming a namespace's enforced level.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// The label naming the level a namespace warns about.
pub const WARN_LABEL: &str = "pod-security.kubernetes.io/warn";
/// The image name of a container that runs the node's own commands.
pub const HOST_IMAGE: &str = "host";

/// Whether `image` names a directory of the node as the container's root filesystem (an
/// absolute path), which the node agent bind-mounts read-write as the root: as much of the
/// node as a `host` container gets, so it is allowed where `host` is.
pub fn is_directory_image(image: &str) -> bool {
    image.starts_with('/')
}

/// Whether an update of a pod is one Pod Security evaluates, as kube-apiserver's
/// `isSignificantPodUpdate`: any change of a container's image or of the number of
/// containers (the only spec changes a pod update may make that affect a check; the others
/// are refused by validation as immutable).
pub fn significant_update(new: &PodSpec, old: &PodSpec) -> bool {
    let images = |s: &PodSpec| -> Vec<(String, String)> {
        containers(s)
            .map(|c| (c.name.clone(), c.image.clone()))
            .collect()
    };
    images(new) != images(old)
}

/// A Pod Security Standard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// The level a namespace's label names (unset or unreadable: privileged; the namespace's
/// validation refuses unreadable values).
pub fn level(labels: &BTreeMap<String, String>, label: &str) -> Level {
    labels
        .get(label)
        .and_then(|v| Level::parse(v))
        .unwrap_or(Level::Privileged)
}

/// Capabilities baseline allows adding (kube-apiserver's list).
const BASELINE_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Every container of the pod, ephemeral ones included (`kubectl debug` must not add a
/// container the namespace's level forbids).
fn containers(spec: &PodSpec) -> impl Iterator<Item = Cow<'_, Container>> {
    spec.init_containers
        .iter()
        .chain(&spec.containers)
        .map(Cow::Borrowed)
        .chain(
            spec.ephemeral_containers
                .iter()
                .map(|e| Cow::Owned(e.to_container())),
        )
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "container" or "containers" with their quoted names.
fn which(names: &[String]) -> String {
    if names.len() == 1 {
        format!("container {}", quoted(names))
    } else {
        format!("containers {}", quoted(names))
    }
}

/// Every check of `level` the pod fails, as kube-apiserver words them.
pub fn violations(level: Level, spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    if level == Level::Privileged {
        return out;
    }
    // Skiff: containers that run the node's own commands.
    let host: Vec<String> = containers(spec)
        .filter(|c| c.image == HOST_IMAGE)
        .map(|c| c.name.clone())
        .collect();
    if !host.is_empty() {
        out.push(format!(
            "host image ({} must not use image \"host\", which runs the node's own commands; it \
             needs {ENFORCE_LABEL}=privileged)",
            which(&host)
        ));
    }
    // Skiff: containers whose root filesystem is a directory of the node (read-write).
    let directory: Vec<String> = containers(spec)
        .filter(|c| is_directory_image(&c.image))
        .map(|c| c.name.clone())
        .collect();
    if !directory.is_empty() {
        out.push(format!(
            "node directory image ({} must not use a directory of the node as its root \
             filesystem; it needs {ENFORCE_LABEL}=privileged)",
            which(&directory)
        ));
    }
    // baseline
    let mut ns = Vec::new();
    if spec.host_network {
        ns.push("hostNetwork=true");
    }
    if spec.host_pid {
        ns.push("hostPID=true");
    }
    if !ns.is_empty() {
        out.push(format!("host namespaces ({})", ns.join(", ")));
    }
    let privileged: Vec<String> = containers(spec)
        .filter(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true))
        .map(|c| c.name.clone())
        .collect();
    if !privileged.is_empty() {
        out.push(format!(
            "privileged ({} must not set securityContext.privileged=true)",
            which(&privileged)
        ));
    }
    let mut bad_caps = Vec::new();
    let mut caps_containers = Vec::new();
    for c in containers(spec) {
        let added: Vec<String> = c
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .map(|caps| {
                caps.add
                    .iter()
                    .filter(|a| !BASELINE_CAPS.contains(&a.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if !added.is_empty() {
            caps_containers.push(c.name.clone());
            for a in added {
                if !bad_caps.contains(&a) {
                    bad_caps.push(a);
                }
            }
        }
    }
    if !caps_containers.is_empty() {
        out.push(format!(
            "non-default capabilities ({} must not include {} in securityContext.capabilities.add)",
            which(&caps_containers),
            quoted(&bad_caps)
        ));
    }
    let host_path: Vec<String> = spec
        .volumes
        .iter()
        .filter(|v| v.host_path.is_some())
        .map(|v| v.name.clone())
        .collect();
    if !host_path.is_empty() {
        let noun = if host_path.len() == 1 {
            "volume"
        } else {
            "volumes"
        };
        out.push(format!("hostPath volumes ({noun} {})", quoted(&host_path)));
    }
    let mut ports = Vec::new();
    let mut port_containers = Vec::new();
    for c in containers(spec) {
        let hp: Vec<String> = c
            .ports
            .iter()
            .filter_map(|p| p.host_port.filter(|h| *h != 0))
            .map(|h| h.to_string())
            .collect();
        if !hp.is_empty() {
            port_containers.push(c.name.clone());
            ports.extend(hp);
        }
    }
    if !port_containers.is_empty() {
        let noun = if ports.len() == 1 {
            "hostPort"
        } else {
            "hostPorts"
        };
        out.push(format!(
            "hostPort ({} uses {noun} {})",
            which(&port_containers),
            ports.join(", ")
        ));
    }
    let unmasked: Vec<String> = containers(spec)
        .filter(|c| {
            c.security_context
                .as_ref()
                .is_some_and(|s| !s.proc_mount.is_empty() && s.proc_mount != "Default")
        })
        .map(|c| c.name.clone())
        .collect();
    if !unmasked.is_empty() {
        out.push(format!(
            "procMount ({} must not set securityContext.procMount to \"Unmasked\")",
            which(&unmasked)
        ));
    }
    let pod_seccomp = spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.r#type.clone());
    if pod_seccomp.as_deref() == Some("Unconfined") {
        out.push(
            "seccompProfile (pod must not set securityContext.seccompProfile.type to \"Unconfined\")"
                .to_string(),
        );
    }
    let unconfined: Vec<String> = containers(spec)
        .filter(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.seccomp_profile.as_ref())
                .is_some_and(|p| p.r#type == "Unconfined")
        })
        .map(|c| c.name.clone())
        .collect();
    if !unconfined.is_empty() {
        out.push(format!(
            "seccompProfile ({} must not set securityContext.seccompProfile.type to \"Unconfined\")",
            which(&unconfined)
        ));
    }
    if level == Level::Baseline {
        return out;
    }
    // restricted
    let restricted_volumes: Vec<String> = spec
        .volumes
        .iter()
        .filter(|v| v.host_path.is_some())
        .map(|v| v.name.clone())
        .collect();
    if !restricted_volumes.is_empty() {
        let noun = if restricted_volumes.len() == 1 {
            "volume"
        } else {
            "volumes"
        };
        out.push(format!(
            "restricted volume types ({noun} {} uses restricted volume type \"hostPath\")",
            quoted(&restricted_volumes)
        ));
    }
    let escalation: Vec<String> = containers(spec)
        .filter(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.allow_privilege_escalation)
                != Some(false)
        })
        .map(|c| c.name.clone())
        .collect();
    if !escalation.is_empty() {
        out.push(format!(
            "allowPrivilegeEscalation != false ({} must set securityContext.allowPrivilegeEscalation=false)",
            which(&escalation)
        ));
    }
    let no_drop: Vec<String> = containers(spec)
        .filter(|c| {
            !c.security_context
                .as_ref()
                .and_then(|s| s.capabilities.as_ref())
                .is_some_and(|caps| caps.drop.iter().any(|d| d == "ALL"))
        })
        .map(|c| c.name.clone())
        .collect();
    let added: Vec<String> = containers(spec)
        .filter(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.capabilities.as_ref())
                .is_some_and(|caps| caps.add.iter().any(|a| a != "NET_BIND_SERVICE"))
        })
        .map(|c| c.name.clone())
        .collect();
    if !no_drop.is_empty() || !added.is_empty() {
        let mut parts = Vec::new();
        if !no_drop.is_empty() {
            parts.push(format!(
                "{} must set securityContext.capabilities.drop=[\"ALL\"]",
                which(&no_drop)
            ));
        }
        if !added.is_empty() {
            parts.push(format!(
                "{} must not include capabilities other than \"NET_BIND_SERVICE\" in securityContext.capabilities.add",
                which(&added)
            ));
        }
        out.push(format!("unrestricted capabilities ({})", parts.join("; ")));
    }
    let pod_sc = spec.security_context.as_ref();
    let pod_non_root = pod_sc.and_then(|s| s.run_as_non_root);
    let root: Vec<String> = containers(spec)
        .filter(|c| {
            let own = c.security_context.as_ref().and_then(|s| s.run_as_non_root);
            own.or(pod_non_root) != Some(true)
        })
        .map(|c| c.name.clone())
        .collect();
    if pod_non_root == Some(false) || !root.is_empty() {
        let who = if root.is_empty() {
            "pod".to_string()
        } else {
            format!("pod or {}", which(&root))
        };
        out.push(format!(
            "runAsNonRoot != true ({who} must set securityContext.runAsNonRoot=true)"
        ));
    }
    let uid0: Vec<String> = containers(spec)
        .filter(|c| c.security_context.as_ref().and_then(|s| s.run_as_user) == Some(0))
        .map(|c| c.name.clone())
        .collect();
    if pod_sc.and_then(|s| s.run_as_user) == Some(0) {
        out.push("runAsUser=0 (pod must not set runAsUser=0)".to_string());
    }
    if !uid0.is_empty() {
        out.push(format!(
            "runAsUser=0 ({} must not set runAsUser=0)",
            which(&uid0)
        ));
    }
    let pod_profile_ok = matches!(pod_seccomp.as_deref(), Some("RuntimeDefault" | "Localhost"));
    let no_profile: Vec<String> = containers(spec)
        .filter(|c| {
            let own = c
                .security_context
                .as_ref()
                .and_then(|s| s.seccomp_profile.as_ref())
                .map(|p| p.r#type.as_str());
            match own {
                Some("RuntimeDefault" | "Localhost") => false,
                Some(_) => true,
                None => !pod_profile_ok,
            }
        })
        .map(|c| c.name.clone())
        .collect();
    if !no_profile.is_empty() {
        out.push(format!(
            "seccompProfile (pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")",
            which(&no_profile)
        ));
    }
    out
}

/// `violates PodSecurity "restricted:latest": a, b` (kube-apiserver's words), or `None`.
pub fn verdict(level: Level, spec: &PodSpec) -> Option<String> {
    let v = violations(level, spec);
    (!v.is_empty()).then(|| {
        format!(
            "violates PodSecurity \"{}:latest\": {}",
            level.name(),
            v.join(", ")
        )
    })
}

/// The warning a client gets for `spec` in a namespace with `labels` (the warn level), as
/// kube-apiserver words it.
pub fn warning(labels: &BTreeMap<String, String>, spec: &PodSpec) -> Option<String> {
    let warn = level(labels, WARN_LABEL);
    let v = violations(warn, spec);
    (!v.is_empty()).then(|| {
        format!(
            "would violate PodSecurity \"{}:latest\": {}",
            warn.name(),
            v.join(", ")
        )
    })
}

/// Checks a namespace's Pod Security labels (the values must be levels).
pub fn check_labels(meta: &ObjectMeta) -> Vec<crate::error::FieldError> {
    let mut out = Vec::new();
    for key in [
        ENFORCE_LABEL,
        WARN_LABEL,
        "pod-security.kubernetes.io/audit",
    ] {
        if let Some(v) = meta.labels.get(key)
            && Level::parse(v).is_none()
        {
            out.push(crate::error::FieldError::invalid(
                format!("metadata.labels[{key}]"),
                v,
                "must be one of privileged, baseline, restricted",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        Capabilities, HostPathVolumeSource, PodSecurityContext, SeccompProfile, SecurityContext,
        Volume,
    };

    fn container(name: &str, image: &str) -> Container {
        Container {
            name: name.into(),
            image: image.into(),
            ..Default::default()
        }
    }

    #[test]
    fn privileged_pods_fail_baseline_and_restricted_naming_fields() {
        let mut c = container("app", "busybox");
        c.security_context = Some(SecurityContext {
            privileged: Some(true),
            capabilities: Some(Capabilities {
                add: vec!["SYS_ADMIN".into()],
                drop: vec![],
            }),
            ..Default::default()
        });
        let spec = PodSpec {
            containers: vec![c],
            host_network: true,
            volumes: vec![Volume {
                name: "root".into(),
                host_path: Some(HostPathVolumeSource::default()),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(violations(Level::Privileged, &spec).is_empty());
        assert_eq!(
            verdict(Level::Baseline, &spec).unwrap(),
            "violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true), \
             privileged (container \"app\" must not set securityContext.privileged=true), \
             non-default capabilities (container \"app\" must not include \"SYS_ADMIN\" in \
             securityContext.capabilities.add), hostPath volumes (volume \"root\")"
        );
        let r = verdict(Level::Restricted, &spec).unwrap();
        for want in [
            "violates PodSecurity \"restricted:latest\"",
            "restricted volume types (volume \"root\" uses restricted volume type \"hostPath\")",
            "allowPrivilegeEscalation != false (container \"app\" must set securityContext.allowPrivilegeEscalation=false)",
            "runAsNonRoot != true (pod or container \"app\" must set securityContext.runAsNonRoot=true)",
            "seccompProfile (pod or container \"app\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")",
        ] {
            assert!(r.contains(want), "{want}\nnot in\n{r}");
        }
    }

    #[test]
    fn a_restricted_pod_passes_and_host_images_need_privileged() {
        let mut c = container("app", "registry/app:1");
        c.security_context = Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: vec!["NET_BIND_SERVICE".into()],
                drop: vec!["ALL".into()],
            }),
            ..Default::default()
        });
        let spec = PodSpec {
            containers: vec![c],
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                seccomp_profile: Some(SeccompProfile {
                    r#type: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(violations(Level::Restricted, &spec), Vec::<String>::new());
        let host = PodSpec {
            containers: vec![container("sh", HOST_IMAGE)],
            ..Default::default()
        };
        assert!(violations(Level::Privileged, &host).is_empty());
        assert!(violations(Level::Baseline, &host)[0].starts_with("host image (container \"sh\""));
        let dir = PodSpec {
            containers: vec![Container {
                name: "root".into(),
                image: "/var/lib".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(violations(Level::Privileged, &dir).is_empty());
        for level in [Level::Baseline, Level::Restricted] {
            assert!(
                violations(level, &dir)
                    .iter()
                    .any(|v| v.starts_with("node directory image (container \"root\"")),
                "{level:?}"
            );
        }
        let mut changed = dir.clone();
        assert!(!significant_update(&changed, &dir));
        changed.containers[0].image = "host".into();
        assert!(significant_update(&changed, &dir));
    }

    #[test]
    fn namespace_labels_must_name_levels() {
        let meta = ObjectMeta {
            labels: [(ENFORCE_LABEL.to_string(), "strict".to_string())].into(),
            ..Default::default()
        };
        let e = check_labels(&meta);
        assert_eq!(
            e[0].to_string(),
            "metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"strict\": must be one of privileged, baseline, restricted"
        );
        assert_eq!(level(&meta.labels, WARN_LABEL), Level::Privileged);
    }
}
