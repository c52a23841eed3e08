//! A container's securityContext (and its pod's) as the runtime's [`Security`], with the
//! rules of Kubernetes and containerd: the container's settings override the pod's;
//! `runAsUser`/`runAsGroup` override the image's `User`, whose names are looked up in the
//! image's /etc/passwd and /etc/group; `runAsNonRoot` is checked against the user that will
//! run; unprivileged containers get containerd's default capabilities (plus `add`, minus
//! `drop`), masked paths, a read-only /sys and a PID namespace of their own; privileged ones
//! get everything and no seccomp filter.
//!
//! A `host` container (a node command) keeps the node's view: only the identity
//! (`runAsUser`, `runAsGroup`, groups), `capabilities`, `allowPrivilegeEscalation` and
//! `seccompProfile` apply to it.

use std::fs;
use std::path::Path;

use skiff_api::api::{Capabilities, Container, PodSecurityContext, PodSpec, SeccompProfile};
use skiff_runtime::{Seccomp, Security};

/// The image's `User` resolved against its root filesystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ImageUser {
    /// `None`: a user name the image's /etc/passwd does not have.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The supplementary groups /etc/group lists for the user.
    pub groups: Vec<u32>,
    pub home: Option<String>,
    /// The `User` as written, for messages.
    pub spec: String,
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

/// Reads `etc/<file>` of a root filesystem, refusing symlinks (an image could point them
/// at the node's files).
fn read_etc(rootfs: &Path, file: &str) -> String {
    let etc = rootfs.join("etc");
    let path = etc.join(file);
    for p in [&etc, &path] {
        match fs::symlink_metadata(p) {
            Ok(m) if !m.file_type().is_symlink() => {}
            _ => return String::new(),
        }
    }
    fs::read_to_string(path).unwrap_or_default()
}

fn passwd(rootfs: &Path) -> Vec<PasswdEntry> {
    read_etc(rootfs, "passwd")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 {
                return None;
            }
            Some(PasswdEntry {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: f[5].to_string(),
            })
        })
        .collect()
}

/// `(name, gid, members)` of the image's /etc/group.
fn groups(rootfs: &Path) -> Vec<(String, u32, Vec<String>)> {
    read_etc(rootfs, "group")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 4).then(|| {
                Some((
                    f[0].to_string(),
                    f[2].parse().ok()?,
                    f[3].split(',')
                        .filter(|m| !m.is_empty())
                        .map(String::from)
                        .collect(),
                ))
            })?
        })
        .collect()
}

/// Resolves an image `User` (`uid`, `name`, `uid:gid`, `name:group`, or empty = root) in a
/// root filesystem. `Err` for a group name the image does not have.
pub(crate) fn image_user(user: Option<&str>, rootfs: Option<&Path>) -> Result<ImageUser, String> {
    let spec = user.unwrap_or("").to_string();
    let users = rootfs.map(passwd).unwrap_or_default();
    let all_groups = rootfs.map(groups).unwrap_or_default();
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec.as_str(), None),
    };
    let entry = if u.is_empty() {
        users.iter().find(|e| e.uid == 0)
    } else {
        match u.parse::<u32>() {
            Ok(n) => users.iter().find(|e| e.uid == n),
            Err(_) => users.iter().find(|e| e.name == u),
        }
    };
    let uid = match u.parse::<u32>() {
        Ok(n) => Some(n),
        Err(_) if u.is_empty() => Some(0),
        Err(_) => entry.map(|e| e.uid),
    };
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => Some(
                all_groups
                    .iter()
                    .find(|(name, _, _)| name == g)
                    .map(|(_, id, _)| *id)
                    .ok_or_else(|| format!("the image's group {g:?} is not in its /etc/group"))?,
            ),
        },
        None => Some(entry.map(|e| e.gid).unwrap_or(0)),
    };
    let name = entry.map(|e| e.name.clone());
    let groups = name
        .as_deref()
        .map(|n| {
            all_groups
                .iter()
                .filter(|(_, _, members)| members.iter().any(|m| m == n))
                .map(|(_, id, _)| *id)
                .collect()
        })
        .unwrap_or_default();
    Ok(ImageUser {
        uid,
        gid,
        groups,
        home: entry.map(|e| e.home.clone()).filter(|h| !h.is_empty()),
        spec,
    })
}

/// A capability name as the runtime spells it: `NET_ADMIN` → `CAP_NET_ADMIN`.
fn cap_name(n: &str) -> String {
    let up = n.to_ascii_uppercase();
    if up.starts_with("CAP_") {
        up
    } else {
        format!("CAP_{up}")
    }
}

/// containerd's default set, then `drop` (`ALL` drops everything), then `add` (`ALL` adds
/// every capability the kernel knows).
fn capabilities(caps: Option<&Capabilities>) -> Result<Vec<String>, String> {
    let mut set: Vec<String> = Security::DEFAULT_CAPABILITIES
        .iter()
        .map(|c| c.to_string())
        .collect();
    let Some(caps) = caps else { return Ok(set) };
    for d in &caps.drop {
        if d.eq_ignore_ascii_case("ALL") {
            set.clear();
        } else {
            let n = cap_name(d);
            set.retain(|c| *c != n);
        }
    }
    for a in &caps.add {
        if a.eq_ignore_ascii_case("ALL") {
            set = skiff_runtime::all_capabilities();
        } else {
            let n = cap_name(a);
            if !set.contains(&n) {
                set.push(n);
            }
        }
    }
    skiff_runtime::capability_names(&set).map_err(|m| format!("capabilities: {m}"))?;
    Ok(set)
}

fn seccomp(profile: Option<&SeccompProfile>) -> Result<Seccomp, String> {
    match profile.map(|p| p.r#type.as_str()) {
        None | Some("" | "Unconfined") => Ok(Seccomp::Unconfined),
        Some("RuntimeDefault") => Ok(Seccomp::RuntimeDefault),
        Some("Localhost") => Err(
            "seccompProfile: type Localhost is not supported by Skiff (use RuntimeDefault)".into(),
        ),
        Some(other) => Err(format!("seccompProfile: unknown type {other:?}")),
    }
}

/// What the container runs as, and how confined: the runtime's [`Security`] and the `HOME`
/// the process gets when its environment has none. `Err` is a CreateContainerConfigError
/// message.
pub(crate) fn security(
    pod: &PodSpec,
    c: &Container,
    image: &ImageUser,
    rootfs: Option<&Path>,
    pod_name: &str,
) -> Result<(Security, String), String> {
    let psc = pod.security_context.clone().unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let privileged = sc.privileged == Some(true);
    let run_as_user = sc.run_as_user.or(psc.run_as_user);
    let run_as_group = sc.run_as_group.or(psc.run_as_group);
    let non_root = sc.run_as_non_root.or(psc.run_as_non_root) == Some(true);
    let id = |v: i64, field: &str| {
        u32::try_from(v).map_err(|_| format!("securityContext.{field}: {v} is not a valid id"))
    };
    let (uid, home) = match run_as_user {
        Some(u) => {
            let uid = id(u, "runAsUser")?;
            let entry = rootfs.map(passwd).unwrap_or_default();
            let home = entry.into_iter().find(|e| e.uid == uid).map(|e| e.home);
            (Some(uid), home)
        }
        None => (image.uid, image.home.clone()),
    };
    let Some(uid) = uid else {
        return Err(format!(
            "failed to resolve the image's user {:?}: it is not in the image's /etc/passwd",
            image.spec
        ));
    };
    if non_root && uid == 0 {
        return Err(
            if run_as_user.is_none() && image.spec.parse::<u32>().is_err() && !image.spec.is_empty()
            {
                format!(
                    "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root (pod: {pod_name:?}, container: {})",
                    image.spec, c.name
                )
            } else {
                format!(
                    "container has runAsNonRoot and image will run as root (pod: {pod_name:?}, container: {})",
                    c.name
                )
            },
        );
    }
    let gid = match run_as_group {
        Some(g) => id(g, "runAsGroup")?,
        None if run_as_user.is_some() => rootfs
            .map(passwd)
            .unwrap_or_default()
            .into_iter()
            .find(|e| e.uid == uid)
            .map(|e| e.gid)
            .unwrap_or(0),
        None => image.gid.unwrap_or(0),
    };
    let mut groups: Vec<u32> = if run_as_user.is_none() {
        image.groups.clone()
    } else {
        Vec::new()
    };
    let extra = psc
        .supplemental_groups
        .iter()
        .chain(psc.fs_group.as_ref())
        .map(|g| id(*g, "supplementalGroups"))
        .collect::<Result<Vec<_>, _>>()?;
    for g in extra {
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let profile = sc.seccomp_profile.as_ref().or(psc.seccomp_profile.as_ref());
    let mut s = if privileged {
        Security {
            pid_namespace: true,
            ..Security::default()
        }
    } else {
        Security {
            capabilities: Some(capabilities(sc.capabilities.as_ref())?),
            seccomp: seccomp(profile)?,
            mask_paths: sc.proc_mount != "Unmasked",
            ..Security::restricted()
        }
    };
    s.uid = Some(uid);
    s.gid = Some(gid);
    s.groups = groups;
    s.no_new_privs = sc.allow_privilege_escalation == Some(false);
    s.read_only_root = sc.read_only_root_filesystem == Some(true);
    if pod.host_pid {
        s.pid_namespace = false;
    }
    Ok((s, home.unwrap_or_else(|| "/".into())))
}

/// The confinement of a `host` container: the node's view, with the identity and the
/// privilege settings its securityContext asks for (nothing else applies to a node command).
pub(crate) fn host_security(
    pod: &PodSpec,
    c: &Container,
    pod_name: &str,
) -> Result<Security, String> {
    let sc = c.security_context.clone().unwrap_or_default();
    if sc.read_only_root_filesystem == Some(true) {
        return Err(format!(
            "containers[{}].securityContext.readOnlyRootFilesystem: needs a root filesystem image (not \"host\")",
            c.name
        ));
    }
    let psc: PodSecurityContext = pod.security_context.clone().unwrap_or_default();
    let asks_identity = sc.run_as_user.or(psc.run_as_user).is_some()
        || sc.run_as_group.or(psc.run_as_group).is_some()
        || !psc.supplemental_groups.is_empty()
        || psc.fs_group.is_some();
    let (mut s, _) = security(
        pod,
        c,
        &ImageUser {
            uid: Some(0),
            gid: Some(0),
            ..Default::default()
        },
        None,
        pod_name,
    )?;
    let mut out = Security {
        no_new_privs: s.no_new_privs,
        seccomp: s.seccomp,
        capabilities: if sc.capabilities.is_some() && sc.privileged != Some(true) {
            s.capabilities.take()
        } else {
            None
        },
        ..Security::default()
    };
    if asks_identity {
        out.uid = s.uid;
        out.gid = s.gid;
        out.groups = s.groups;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::SecurityContext;

    fn rootfs() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("etc")).unwrap();
        fs::write(
            t.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\nweb:x:1000:1000::/home/web:/bin/sh\n",
        )
        .unwrap();
        fs::write(
            t.path().join("etc/group"),
            "root:x:0:\nweb:x:1000:\nwww-data:x:33:web\naudio:x:29:web,root\n",
        )
        .unwrap();
        t
    }

    fn container(sc: SecurityContext) -> Container {
        Container {
            name: "app".into(),
            security_context: Some(sc),
            ..Default::default()
        }
    }

    #[test]
    fn image_users_resolve_in_the_image() {
        let t = rootfs();
        let r = Some(t.path());
        let web = image_user(Some("web"), r).unwrap();
        assert_eq!(
            (web.uid, web.gid, web.groups.clone()),
            (Some(1000), Some(1000), vec![33, 29])
        );
        assert_eq!(web.home.as_deref(), Some("/home/web"));
        let root = image_user(None, r).unwrap();
        assert_eq!(
            (root.uid, root.gid, root.home.as_deref()),
            (Some(0), Some(0), Some("/root"))
        );
        let num = image_user(Some("4242:33"), r).unwrap();
        assert_eq!((num.uid, num.gid), (Some(4242), Some(33)));
        let named_group = image_user(Some("1000:www-data"), r).unwrap();
        assert_eq!(named_group.gid, Some(33));
        assert!(
            image_user(Some("web:nogroup"), r)
                .unwrap_err()
                .contains("nogroup")
        );
        assert_eq!(image_user(Some("ghost"), r).unwrap().uid, None);
        // A symlinked /etc/passwd is not read.
        fs::remove_file(t.path().join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.path().join("etc/passwd")).unwrap();
        assert_eq!(image_user(Some("web"), r).unwrap().uid, None);
    }

    #[test]
    fn security_contexts_follow_kubernetes() {
        let t = rootfs();
        let r = Some(t.path());
        let pod = PodSpec {
            security_context: Some(PodSecurityContext {
                run_as_user: Some(2000),
                supplemental_groups: vec![5000],
                fs_group: Some(6000),
                seccomp_profile: Some(SeccompProfile {
                    r#type: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let image = image_user(Some("web"), r).unwrap();
        // The container's runAsUser wins over the pod's; its primary group comes from passwd.
        let c = container(SecurityContext {
            run_as_user: Some(1000),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                add: vec!["NET_ADMIN".into()],
                drop: vec!["net_raw".into(), "CAP_KILL".into()],
            }),
            ..Default::default()
        });
        let (s, home) = security(&pod, &c, &image, r, "p").unwrap();
        assert_eq!(
            (s.uid, s.gid, home.as_str()),
            (Some(1000), Some(1000), "/home/web")
        );
        assert_eq!(s.groups, vec![5000, 6000]);
        assert!(s.no_new_privs && s.read_only_root && s.mask_paths && s.read_only_sys);
        assert_eq!(s.seccomp, Seccomp::RuntimeDefault);
        let caps = s.capabilities.unwrap();
        assert!(caps.contains(&"CAP_NET_ADMIN".to_string()));
        assert!(
            !caps.contains(&"CAP_NET_RAW".to_string()) && !caps.contains(&"CAP_KILL".to_string())
        );
        assert_eq!(caps.len(), 13);
        // The pod's user applies when the container has none; the image's groups do not.
        let (s, home) =
            security(&pod, &container(SecurityContext::default()), &image, r, "p").unwrap();
        assert_eq!((s.uid, s.gid, home.as_str()), (Some(2000), Some(0), "/"));
        // drop ALL.
        let c = container(SecurityContext {
            capabilities: Some(Capabilities {
                add: vec![],
                drop: vec!["ALL".into()],
            }),
            ..Default::default()
        });
        assert_eq!(
            security(&pod, &c, &image, r, "p").unwrap().0.capabilities,
            Some(vec![])
        );
        // Privileged: everything, no filter.
        let c = container(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        let (s, _) = security(&pod, &c, &image, r, "p").unwrap();
        assert_eq!(
            (s.capabilities, s.mask_paths, s.read_only_sys, s.seccomp),
            (None, false, false, Seccomp::Unconfined)
        );
        // An unknown capability and Localhost seccomp are refused with the field.
        let c = container(SecurityContext {
            capabilities: Some(Capabilities {
                add: vec!["FLY".into()],
                drop: vec![],
            }),
            ..Default::default()
        });
        assert_eq!(
            security(&pod, &c, &image, r, "p").unwrap_err(),
            "capabilities: unknown capability \"CAP_FLY\""
        );
        let c = container(SecurityContext {
            seccomp_profile: Some(SeccompProfile {
                r#type: "Localhost".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(
            security(&pod, &c, &image, r, "p")
                .unwrap_err()
                .contains("Localhost")
        );
    }

    #[test]
    fn run_as_non_root_is_checked_like_the_kubelet() {
        let t = rootfs();
        let r = Some(t.path());
        let pod = PodSpec::default();
        let c = container(SecurityContext {
            run_as_non_root: Some(true),
            ..Default::default()
        });
        let root = image_user(None, r).unwrap();
        assert_eq!(
            security(&pod, &c, &root, r, "shop/web").unwrap_err(),
            "container has runAsNonRoot and image will run as root (pod: \"shop/web\", container: app)"
        );
        let named = ImageUser {
            uid: Some(0),
            spec: "admin".into(),
            ..Default::default()
        };
        assert!(
            security(&pod, &c, &named, r, "p")
                .unwrap_err()
                .contains("non-numeric user (admin)")
        );
        let web = image_user(Some("web"), r).unwrap();
        assert_eq!(security(&pod, &c, &web, r, "p").unwrap().0.uid, Some(1000));
        let ghost = image_user(Some("ghost"), r).unwrap();
        assert!(
            security(&pod, &container(SecurityContext::default()), &ghost, r, "p")
                .unwrap_err()
                .contains("ghost")
        );
    }

    #[test]
    fn host_containers_keep_the_nodes_view() {
        let pod = PodSpec::default();
        let s = host_security(&pod, &Container::default(), "p").unwrap();
        assert_eq!(s, Security::default());
        let c = container(SecurityContext {
            run_as_user: Some(1000),
            allow_privilege_escalation: Some(false),
            ..Default::default()
        });
        let s = host_security(&pod, &c, "p").unwrap();
        assert_eq!(
            (s.uid, s.gid, s.no_new_privs, s.capabilities.clone()),
            (Some(1000), Some(0), true, None)
        );
        assert!(!s.mask_paths && !s.pid_namespace);
        let c = container(SecurityContext {
            read_only_root_filesystem: Some(true),
            ..Default::default()
        });
        assert!(
            host_security(&pod, &c, "p")
                .unwrap_err()
                .contains("readOnlyRootFilesystem")
        );
    }
}
