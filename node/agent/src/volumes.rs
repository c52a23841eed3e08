//! A pod's volumes on this node, as the kubelet's volume plugins make them, and the files
//! every container of a root filesystem image gets at /etc/hosts, /etc/hostname and
//! /etc/resolv.conf.
//!
//! Layout: `<state>/volumes/<pod uid>/<volume name>` for emptyDir (a directory, or a tmpfs
//! for `medium: Memory`), downwardAPI and secret (a tmpfs) volumes; `.../.etc/{hosts,hostname,resolv.conf}`
//! for the generated files (a volume name is a DNS label, so it never starts with a dot).
//! hostPath volumes are the node's own paths, checked against their `type`. The runtime
//! bind-mounts these into the container ([`mounts_for`]); nothing is mounted on the node
//! except the tmpfs of Memory and secret volumes, which [`Volumes::release_pod`] unmounts.
//!
//! Containers must not be able to turn a volume against the node (the kubelet's
//! CVE-2017-1002101, CVE-2017-1002102 and CVE-2021-25741 classes):
//!
//! * secret, configMap, projected and downwardAPI volumes are written by the runtime's
//!   AtomicWriter ([`skiff_runtime::volume::writer`]: timestamped directories behind a
//!   `..data` symlink swapped atomically, every step relative to the volume's directory
//!   descriptor, never following a symlink) and are mounted read-only into every container,
//!   whatever its volumeMount says, as in Kubernetes;
//! * a subPath is walked without following symlinks twice: here, to create missing
//!   directories and refuse a bad one as CreateContainerConfigError, and by the runtime right
//!   before it mounts, from the descriptor that walk ends on
//!   ([`skiff_runtime::volume::subpath`] explains why the runtime, not the agent, holds that
//!   descriptor).
//!
//! Set up before a pod's containers start: emptyDir with fsGroup ownership and setgid,
//! hostPath with the kubelet's type checks, downwardAPI files rewritten when the pod's labels
//! change, secret and configMap volumes with the object's keys as files (one path for both,
//! `KeyedKind`, read through the API at every reconcile), projected volumes with the files of
//! all their sources, ServiceAccount tokens among them (the pod worker asks for each with a
//! TokenRequest bound to the pod and asks again once 80% of its lifetime has passed). A
//! `persistentVolumeClaim` volume is the directory of the claim's bound volume (`hostPath`,
//! created when its type says so, or `local`), read from the API; until the claim is Bound
//! the pod waits with FailedMount. A failure is a FailedMount event with the kubelet's
//! message. [`resolv_conf`] writes the kubelet's resolv.conf from dnsPolicy and dnsConfig.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use skiff_api::Resource;
use skiff_api::api::{Container, DownwardApiVolumeFile, Pod, Secret, SecretVolumeSource, Volume};
use skiff_api::quantity;
use skiff_runtime::Mount;
use skiff_runtime::volume::{FileProjection, Payload, SubPath, writer};

/// Why a volume could not be set up: Kubernetes' `FailedMount` event message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\" : {message}")]
pub(crate) struct VolumeError {
    pub volume: String,
    pub message: String,
}

/// Where a pod's volumes are, once set up.
#[derive(Debug, Clone, Default)]
pub(crate) struct PodVolumes {
    /// Volume name → its directory (or file, for a hostPath) on the node.
    pub paths: BTreeMap<String, PathBuf>,
    /// The generated /etc files: `(file in the container, file on the node)`.
    pub etc: Vec<(&'static str, PathBuf)>,
    /// The volumes the AtomicWriter writes (secret, configMap, projected, downwardAPI):
    /// mounted read-only, subPaths resolved through their `..data` link.
    pub projected: BTreeSet<String>,
}

#[derive(Debug)]
pub(crate) struct Volumes {
    root: PathBuf,
    resolv_conf: PathBuf,
    /// The cluster DNS pods of dnsPolicy ClusterFirst use (`None`: the node's resolvers).
    cluster_dns: Option<ClusterDnsConfig>,
}

/// The cluster DNS a pod's resolv.conf names: the kube-dns Service's address and the
/// cluster domain (the kubelet's `--cluster-dns` and `--cluster-domain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDnsConfig {
    pub ip: IpAddr,
    pub domain: String,
}

/// The kubelet's resolv.conf for `pod` (pure): dnsPolicy ClusterFirst (the default; Default
/// for host-network pods unless ClusterFirstWithHostNet) names the cluster DNS with the
/// search path `<ns>.svc.<domain> svc.<domain> <domain>` and the node's search domains,
/// `options ndots:5`; Default copies the node's (`host`); None starts empty; `dnsConfig`
/// adds nameservers and searches and sets options by name.
pub fn resolv_conf(pod: &Pod, host: &str, dns: Option<&ClusterDnsConfig>) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut policy = if spec.dns_policy.is_empty() {
        "ClusterFirst"
    } else {
        spec.dns_policy.as_str()
    };
    if policy == "ClusterFirstWithHostNet" {
        policy = "ClusterFirst";
    } else if policy == "ClusterFirst" && spec.host_network {
        policy = "Default";
    }
    let field = |key: &str| -> Vec<String> {
        host.lines()
            .filter_map(|l| l.trim().strip_prefix(key))
            .flat_map(|rest| {
                rest.split_whitespace()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (mut nameservers, mut searches, mut options): (Vec<String>, Vec<String>, Vec<String>) =
        match (policy, dns) {
            ("None", _) => (Vec::new(), Vec::new(), Vec::new()),
            ("ClusterFirst", Some(d)) => {
                let ns = pod.namespace();
                let mut search = vec![
                    format!("{ns}.svc.{}", d.domain),
                    format!("svc.{}", d.domain),
                    d.domain.clone(),
                ];
                search.extend(field("search "));
                (vec![d.ip.to_string()], search, vec!["ndots:5".into()])
            }
            _ => (field("nameserver "), field("search "), field("options ")),
        };
    if let Some(cfg) = &spec.dns_config {
        for n in &cfg.nameservers {
            if !nameservers.contains(n) {
                nameservers.push(n.clone());
            }
        }
        for s in &cfg.searches {
            if !searches.contains(s) {
                searches.push(s.clone());
            }
        }
        for o in &cfg.options {
            options.retain(|x| x.split(':').next() != Some(o.name.as_str()));
            options.push(match &o.value {
                Some(v) => format!("{}:{v}", o.name),
                None => o.name.clone(),
            });
        }
    }
    let mut out = String::new();
    for n in nameservers {
        out.push_str(&format!("nameserver {n}\n"));
    }
    if !searches.is_empty() {
        out.push_str(&format!("search {}\n", searches.join(" ")));
    }
    if !options.is_empty() {
        out.push_str(&format!("options {}\n", options.join(" ")));
    }
    out
}

/// Where the volumes of the agent with state directory `state` live.
pub(crate) fn volumes_root(state: &Path) -> PathBuf {
    state.join("volumes")
}

impl Volumes {
    pub fn new(state: &Path) -> Volumes {
        Volumes {
            root: volumes_root(state),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            cluster_dns: None,
        }
    }

    /// Pods of dnsPolicy ClusterFirst resolve through `dns`.
    pub fn with_cluster_dns(mut self, dns: Option<ClusterDnsConfig>) -> Volumes {
        self.cluster_dns = dns;
        self
    }

    /// Sets up every volume of `pod` (idempotent: what exists is kept, downwardAPI files are
    /// rewritten when their content changes) and the /etc files.
    pub fn ensure(
        &self,
        uid: &str,
        pod: &Pod,
        pod_ip: Option<IpAddr>,
        secrets: &Secrets,
        tokens: &Tokens,
        claims: &Claims,
    ) -> Result<PodVolumes, VolumeError> {
        let dir = self.root.join(uid);
        let mut out = PodVolumes::default();
        let spec = pod.spec.clone().unwrap_or_default();
        let fs_group = spec
            .security_context
            .as_ref()
            .and_then(|s| s.fs_group)
            .and_then(|g| u32::try_from(g).ok());
        for v in &spec.volumes {
            let err = |message: String| VolumeError {
                volume: v.name.clone(),
                message,
            };
            let path = match &v.persistent_volume_claim {
                Some(c) => claim_volume(&c.claim_name, claims),
                None => volume(&dir, v, pod, fs_group, secrets, tokens),
            }
            .map_err(err)?;
            if v.secret.is_some()
                || v.config_map.is_some()
                || v.projected.is_some()
                || v.downward_api.is_some()
            {
                out.projected.insert(v.name.clone());
            }
            out.paths.insert(v.name.clone(), path);
        }
        let etc = dir.join(".etc");
        let err = |e: io::Error| VolumeError {
            volume: "etc-hosts".into(),
            message: format!("writing {}: {e}", etc.display()),
        };
        fs::create_dir_all(&etc).map_err(err)?;
        let hostname = hostname_of(pod);
        let files = [
            ("/etc/hosts", "hosts", hosts_file(pod, &hostname, pod_ip)),
            ("/etc/hostname", "hostname", format!("{hostname}\n")),
            (
                "/etc/resolv.conf",
                "resolv.conf",
                resolv_conf(
                    pod,
                    &fs::read_to_string(&self.resolv_conf).unwrap_or_default(),
                    self.cluster_dns.as_ref(),
                ),
            ),
        ];
        for (target, name, content) in files {
            let path = etc.join(name);
            write_if_changed(&path, content.as_bytes(), 0o644).map_err(err)?;
            out.etc.push((target, path));
        }
        Ok(out)
    }

    /// Unmounts (Memory volumes) and removes everything of pod `uid`.
    pub fn release_pod(&self, uid: &str) {
        crate::images::release_under(&self.root.join(uid));
    }
}

fn hostname_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .map(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod.name().to_string())
}

/// The kubelet's hosts file: localhost entries and the pod's own name at its IP (with its
/// fully qualified name when it has a subdomain).
fn hosts_file(pod: &Pod, hostname: &str, ip: Option<IpAddr>) -> String {
    let mut s = String::from(
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    if let Some(ip) = ip {
        let sub = pod
            .spec
            .as_ref()
            .map(|s| s.subdomain.clone())
            .unwrap_or_default();
        if sub.is_empty() {
            let _ = writeln!(s, "{ip}\t{hostname}");
        } else {
            let ns = pod.namespace();
            let _ = writeln!(
                s,
                "{ip}\t{hostname}.{sub}.{ns}.svc.cluster.local\t{hostname}"
            );
        }
    }
    s
}

/// Where keyed data comes from: a Secret or a ConfigMap of the pod's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum KeyedKind {
    Secret,
    ConfigMap,
}

impl KeyedKind {
    /// As the kubelet names it in messages (`secret "x" not found`).
    pub(crate) fn noun(self) -> &'static str {
        match self {
            KeyedKind::Secret => "secret",
            KeyedKind::ConfigMap => "configmap",
        }
    }
}

/// A Secret's or ConfigMap's keys and values (a ConfigMap's `data` and `binaryData`).
pub(crate) type KeyedData = BTreeMap<String, Vec<u8>>;

/// The Secrets and ConfigMaps the pod's volumes name, as read from the API: `None` for one
/// that does not exist.
pub(crate) type Secrets = BTreeMap<(KeyedKind, String), Option<KeyedData>>;

/// The keys of a Secret.
pub(crate) fn secret_data(s: Secret) -> KeyedData {
    s.data
}

/// The keys of a ConfigMap: `data` as UTF-8 bytes, then `binaryData`.
pub(crate) fn config_map_data(c: skiff_api::api::ConfigMap) -> KeyedData {
    let mut out: KeyedData = c
        .data
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    out.extend(c.binary_data);
    out
}

/// The Secrets and ConfigMaps `pod`'s volumes use.
pub(crate) fn secret_names(pod: &Pod) -> Vec<(KeyedKind, String)> {
    let mut out = Vec::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter()) {
        if let Some(s) = &v.secret {
            out.push((KeyedKind::Secret, s.secret_name.clone()));
        }
        if let Some(c) = &v.config_map {
            out.push((KeyedKind::ConfigMap, c.name.clone()));
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter()) {
            if let Some(s) = &src.secret {
                out.push((KeyedKind::Secret, s.name.clone()));
            }
            if let Some(c) = &src.config_map {
                out.push((KeyedKind::ConfigMap, c.name.clone()));
            }
        }
    }
    out
}

/// Mounts a tmpfs on `path` unless one is there (secrets never touch the disk).
fn tmpfs(path: &Path, opts: &str) -> Result<(), String> {
    fs::create_dir_all(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    if is_mountpoint(path) {
        return Ok(());
    }
    nix::mount::mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(opts),
    )
    .map_err(|e| format!("mounting tmpfs on {}: {e}", path.display()))
}

/// What a secret or configMap volume projects.
struct KeyedVolume<'a> {
    kind: KeyedKind,
    name: &'a str,
    items: &'a [skiff_api::api::KeyToPath],
    default_mode: Option<i32>,
    optional: bool,
}

impl<'a> KeyedVolume<'a> {
    fn of_secret(sv: &'a SecretVolumeSource) -> Self {
        KeyedVolume {
            kind: KeyedKind::Secret,
            name: &sv.secret_name,
            items: &sv.items,
            default_mode: sv.default_mode,
            optional: sv.optional == Some(true),
        }
    }

    fn of_config_map(cv: &'a skiff_api::api::ConfigMapVolumeSource) -> Self {
        KeyedVolume {
            kind: KeyedKind::ConfigMap,
            name: &cv.name,
            items: &cv.items,
            default_mode: cv.default_mode,
            optional: cv.optional == Some(true),
        }
    }
}

/// A secret or configMap volume: the keys (or `items`) as files on a tmpfs, rewritten when
/// the object changes, files of removed keys deleted. Messages name keys, never values.
fn keyed_volume(
    path: &Path,
    sv: &KeyedVolume<'_>,
    secrets: &Secrets,
    fs_group: Option<u32>,
) -> Result<(), String> {
    let default_mode = sv.default_mode.unwrap_or(0o644) as u32 & 0o777;
    let mut files = Payload::new();
    keyed_files(&mut files, sv, secrets, default_mode)?;
    tmpfs(path, "mode=0755,size=4m")?;
    write_payload(path, &files, fs_group)
}

/// Writes a volume's files with the AtomicWriter.
fn write_payload(path: &Path, files: &Payload<'_>, fs_group: Option<u32>) -> Result<(), String> {
    writer::write_payload(path, files, fs_group)
        .map(drop)
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// One file of a volume.
fn file<'a>(data: impl Into<std::borrow::Cow<'a, [u8]>>, mode: u32) -> FileProjection<'a> {
    FileProjection {
        data: data.into(),
        mode,
    }
}

/// Adds the files of a Secret's or ConfigMap's keys (or `items`) to `files`.
fn keyed_files<'a>(
    files: &mut Payload<'a>,
    sv: &KeyedVolume<'_>,
    secrets: &'a Secrets,
    default_mode: u32,
) -> Result<(), String> {
    let optional = sv.optional;
    let secret = secrets
        .get(&(sv.kind, sv.name.to_string()))
        .and_then(Option::as_ref);
    if secret.is_none() && !optional {
        return Err(format!("{} \"{}\" not found", sv.kind.noun(), sv.name));
    }
    let Some(secret) = secret else {
        return Ok(());
    };
    if sv.items.is_empty() {
        for (k, v) in secret {
            files.insert(k.into(), file(v.as_slice(), default_mode));
        }
        return Ok(());
    }
    for item in sv.items {
        let Some(v) = secret.get(&item.key) else {
            if optional {
                continue;
            }
            return Err(match sv.kind {
                KeyedKind::Secret => format!("references non-existent secret key: {}", item.key),
                KeyedKind::ConfigMap => {
                    format!("configmap references non-existent config key: {}", item.key)
                }
            });
        };
        let rel = relative(&item.path)
            .ok_or_else(|| format!("item path {:?} must be relative without '..'", item.path))?;
        let mode = item.mode.map(|m| m as u32 & 0o777).unwrap_or(default_mode);
        files.insert(rel.into(), file(v.as_slice(), mode));
    }
    Ok(())
}

/// ServiceAccount tokens of projected volumes, by (volume name, source index), fetched by the
/// pod worker before the volumes are set up.
pub(crate) type Tokens = BTreeMap<(String, usize), String>;

/// Where the volume bound to each claim the pod names lives on this node, or why it cannot
/// be used yet (claim not found, not bound, volume of another kind).
pub(crate) type Claims = BTreeMap<String, Result<ClaimVolume, String>>;

/// The node directory of a bound claim's volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimVolume {
    pub path: String,
    /// The hostPath type to check (`local` volumes: `Directory`, they must exist).
    pub ty: String,
}

/// A claim's volume: its directory on the node, checked (or created) like a hostPath.
fn claim_volume(claim: &str, claims: &Claims) -> Result<PathBuf, String> {
    let v = claims
        .get(claim)
        .cloned()
        .unwrap_or_else(|| Err(format!("persistentvolumeclaim {claim:?} was not looked up")))?;
    host_path(&v.path, &v.ty)?;
    Ok(v.path.into())
}

/// A projected volume: every source's files in one tmpfs (Secret and ConfigMap keys, pod
/// fields, ServiceAccount tokens), rewritten when they change.
fn projected_volume(
    path: &Path,
    vol: &str,
    p: &skiff_api::api::ProjectedVolumeSource,
    pod: &Pod,
    secrets: &Secrets,
    tokens: &Tokens,
    fs_group: Option<u32>,
) -> Result<(), String> {
    let default_mode = p.default_mode.unwrap_or(0o644) as u32 & 0o777;
    let mut files = Payload::new();
    for (i, src) in p.sources.iter().enumerate() {
        let keyed = [
            src.secret
                .as_ref()
                .map(|s| (KeyedKind::Secret, &s.name, &s.items, s.optional)),
            src.config_map
                .as_ref()
                .map(|c| (KeyedKind::ConfigMap, &c.name, &c.items, c.optional)),
        ];
        for (kind, name, items, optional) in keyed.into_iter().flatten() {
            let kv = KeyedVolume {
                kind,
                name,
                items,
                default_mode: None,
                optional: optional == Some(true),
            };
            keyed_files(&mut files, &kv, secrets, default_mode)?;
        }
        if let Some(d) = &src.downward_api {
            for item in &d.items {
                let value = downward_value(pod, item)?;
                let rel = relative(&item.path).ok_or_else(|| {
                    format!(
                        "downwardAPI path {:?} must be relative without '..'",
                        item.path
                    )
                })?;
                let mode = item.mode.map(|m| m as u32 & 0o777).unwrap_or(default_mode);
                files.insert(rel.into(), file(value.into_bytes(), mode));
            }
        }
        if let Some(t) = &src.service_account_token {
            let token = tokens
                .get(&(vol.to_string(), i))
                .ok_or_else(|| format!("no ServiceAccount token for {:?} yet", t.path))?;
            let rel = relative(&t.path).ok_or_else(|| {
                format!(
                    "serviceAccountToken path {:?} must be relative without '..'",
                    t.path
                )
            })?;
            files.insert(rel.into(), file(token.as_bytes(), default_mode));
        }
    }
    tmpfs(path, "mode=0755,size=4m")?;
    write_payload(path, &files, fs_group)
}

/// Sets up one volume; returns its path on the node.
fn volume(
    dir: &Path,
    v: &Volume,
    pod: &Pod,
    fs_group: Option<u32>,
    secrets: &Secrets,
    tokens: &Tokens,
) -> Result<PathBuf, String> {
    if let Some(h) = &v.host_path {
        return host_path(&h.path, h.r#type.as_deref().unwrap_or(""))
            .map(|()| h.path.clone().into());
    }
    let path = dir.join(&v.name);
    let io = |what: &str| {
        let p = path.clone();
        let what = what.to_string();
        move |e: io::Error| format!("{what} {}: {e}", p.display())
    };
    if let Some(e) = &v.empty_dir {
        fs::create_dir_all(&path).map_err(io("creating"))?;
        if e.medium == "Memory" {
            let mut opts = "mode=0777".to_string();
            if let Some(limit) = e.size_limit.as_deref().filter(|l| !l.is_empty()) {
                let bytes =
                    quantity::parse_value(limit).map_err(|e| format!("emptyDir.sizeLimit: {e}"))?;
                let _ = write!(opts, ",size={bytes}");
            }
            tmpfs(&path, &opts)?;
        }
        // Kubernetes' emptyDir is world-writable; with an fsGroup it belongs to the group,
        // and files made in it inherit the group (setgid).
        let mut mode = 0o777;
        if let Some(g) = fs_group {
            std::os::unix::fs::chown(&path, None, Some(g)).map_err(io("chown"))?;
            mode |= 0o2000;
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(io("chmod"))?;
        return Ok(path);
    }
    if let Some(sv) = &v.secret {
        keyed_volume(&path, &KeyedVolume::of_secret(sv), secrets, fs_group)?;
        return Ok(path);
    }
    if let Some(cv) = &v.config_map {
        keyed_volume(&path, &KeyedVolume::of_config_map(cv), secrets, fs_group)?;
        return Ok(path);
    }
    if let Some(p) = &v.projected {
        projected_volume(&path, &v.name, p, pod, secrets, tokens, fs_group)?;
        return Ok(path);
    }
    if let Some(d) = &v.downward_api {
        fs::create_dir_all(&path).map_err(io("creating"))?;
        let default_mode = d.default_mode.unwrap_or(0o644);
        let mut files = Payload::new();
        for item in &d.items {
            let value = downward_value(pod, item)?;
            let rel = relative(&item.path).ok_or_else(|| {
                format!(
                    "downwardAPI path {:?} must be relative without '..'",
                    item.path
                )
            })?;
            let mode = item.mode.unwrap_or(default_mode) as u32 & 0o777;
            files.insert(rel.into(), file(value.into_bytes(), mode));
        }
        write_payload(&path, &files, fs_group)?;
        return Ok(path);
    }
    Err(
        "the volume has no source Skiff supports (emptyDir, hostPath, downwardAPI, secret, \
         configMap, projected)"
            .into(),
    )
}

/// The kubelet's hostPath type checks; `DirectoryOrCreate`/`FileOrCreate` create what is
/// missing (a file's parent directory must exist).
fn host_path(path: &str, ty: &str) -> Result<(), String> {
    let p = Path::new(path);
    let meta = fs::metadata(p);
    let is = |what: &str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(format!(
                "hostPath type check failed: {path} is not a {what}"
            ))
        }
    };
    match ty {
        "" => Ok(()),
        "DirectoryOrCreate" if meta.is_err() => {
            fs::create_dir_all(p).map_err(|e| format!("creating {path}: {e}"))?;
            fs::set_permissions(p, fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("chmod {path}: {e}"))
        }
        "FileOrCreate" if meta.is_err() => fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(p)
            .map(drop)
            .map_err(|e| format!("creating {path}: {e}")),
        "DirectoryOrCreate" | "Directory" => is("directory", meta.is_ok_and(|m| m.is_dir())),
        "FileOrCreate" | "File" => is("file", meta.is_ok_and(|m| m.is_file())),
        "Socket" => is("socket", meta.is_ok_and(|m| m.file_type().is_socket())),
        "CharDevice" => is(
            "character device",
            meta.is_ok_and(|m| m.file_type().is_char_device()),
        ),
        "BlockDevice" => is(
            "block device",
            meta.is_ok_and(|m| m.file_type().is_block_device()),
        ),
        other => Err(format!("hostPath type {other:?} is not supported")),
    }
}

fn is_mountpoint(path: &Path) -> bool {
    skiff_runtime::mountinfo::read()
        .map(|ms| ms.iter().any(|m| m.mount_point == path))
        .unwrap_or(false)
}

/// A relative path without `..` (a downwardAPI item, a subPath).
fn relative(p: &str) -> Option<&Path> {
    let path = Path::new(p);
    (!p.is_empty()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir)))
    .then_some(path)
}

/// Go's `%q` of a string, as the kubelet quotes label and annotation values.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The content of a downwardAPI file.
fn downward_value(pod: &Pod, item: &DownwardApiVolumeFile) -> Result<String, String> {
    if let Some(f) = &item.field_ref {
        let map = |m: &BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| format!("{k}={}\n", go_quote(v)))
                .collect::<String>()
                .trim_end_matches('\n')
                .to_string()
        };
        let meta = pod.metadata.clone().unwrap_or_default();
        return match f.field_path.as_str() {
            "metadata.labels" => Ok(map(&meta.labels)),
            "metadata.annotations" => Ok(map(&meta.annotations)),
            p if p.starts_with("metadata.") => pod_field(pod, p, None, None)
                .ok_or_else(|| format!("downwardAPI fieldRef {p:?} is not supported")),
            p => Err(format!("downwardAPI fieldRef {p:?} is not supported")),
        };
    }
    if let Some(r) = &item.resource_field_ref {
        return resource_value(pod, &r.container_name, &r.resource, r.divisor.as_deref());
    }
    Err(format!(
        "downwardAPI item {:?} has neither fieldRef nor resourceFieldRef",
        item.path
    ))
}

/// A field of the pod as `fieldRef` names it (`metadata.name`, `metadata.labels['k']`,
/// `spec.nodeName`, `status.podIP`, ...): for environment variables and downwardAPI files.
/// `None` for a path that is not one of these.
pub(crate) fn pod_field(
    pod: &Pod,
    path: &str,
    pod_ip: Option<IpAddr>,
    host_ip: Option<&str>,
) -> Option<String> {
    let meta = pod.metadata.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_string)
    };
    Some(match path {
        "metadata.name" => meta.name,
        "metadata.namespace" => meta.namespace,
        "metadata.uid" => meta.uid,
        "spec.nodeName" => spec.node_name,
        "spec.serviceAccountName" => spec.service_account_name,
        "status.podIP" => pod_ip.map(|i| i.to_string()).unwrap_or_default(),
        "status.hostIP" => host_ip.unwrap_or_default().to_string(),
        _ => {
            if let Some(k) = keyed("metadata.labels['") {
                meta.labels.get(&k).cloned().unwrap_or_default()
            } else if let Some(k) = keyed("metadata.annotations['") {
                meta.annotations.get(&k).cloned().unwrap_or_default()
            } else {
                return None;
            }
        }
    })
}

/// `limits.cpu` and friends of a container, divided by the divisor and rounded up; a limit
/// that is not set is the node's capacity, as in Kubernetes.
pub(crate) fn resource_value(
    pod: &Pod,
    container: &str,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, String> {
    let c: Option<&Container> = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == container));
    let Some(c) = c else {
        return Err(format!("resourceFieldRef: no container {container:?}"));
    };
    let (section, name) = resource
        .split_once('.')
        .ok_or_else(|| format!("resourceFieldRef: unsupported resource {resource:?}"))?;
    let res = c.resources.clone().unwrap_or_default();
    let table = match section {
        "limits" => &res.limits,
        "requests" => &res.requests,
        _ => {
            return Err(format!(
                "resourceFieldRef: unsupported resource {resource:?}"
            ));
        }
    };
    let bad = |e: quantity::QuantityError| format!("resourceFieldRef {resource}: {e}");
    match name {
        "cpu" => {
            let milli = match table.get("cpu") {
                Some(q) => quantity::parse_milli(q).map_err(bad)?,
                None => super::node::cpus() as i64 * 1000,
            };
            let div = quantity::parse_milli(divisor.filter(|d| !d.is_empty()).unwrap_or("1"))
                .map_err(bad)?
                .max(1);
            Ok(((milli + div - 1) / div).to_string())
        }
        "memory" | "ephemeral-storage" => {
            let bytes = match table.get(name) {
                Some(q) => quantity::parse_value(q).map_err(bad)?,
                None if name == "memory" => {
                    super::node::meminfo_total_kib().map_or(0, |k| k as i64 * 1024)
                }
                None => 0,
            };
            let div = quantity::parse_value(divisor.filter(|d| !d.is_empty()).unwrap_or("1"))
                .map_err(bad)?
                .max(1);
            Ok(((bytes + div - 1) / div).to_string())
        }
        _ => Err(format!(
            "resourceFieldRef: unsupported resource {resource:?}"
        )),
    }
}

/// Writes `data` to `path` atomically (a temporary file renamed over it) unless it already
/// holds exactly that, then sets `mode`.
fn write_if_changed(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    if fs::read(path).is_ok_and(|old| old == data) {
        return fs::set_permissions(path, fs::Permissions::from_mode(mode));
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("no file name"))?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, data)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))?;
    fs::rename(&tmp, path)
}

/// The bind mounts of container `c`: its volumeMounts (with subPath), then the generated
/// /etc files it does not mount a volume over.
pub(crate) fn mounts_for(c: &Container, vols: &PodVolumes) -> Result<Vec<Mount>, String> {
    let mut out = Vec::new();
    for (i, m) in c.volume_mounts.iter().enumerate() {
        let field = format!("containers[{}].volumeMounts[{i}]", c.name);
        let Some(base) = vols.paths.get(&m.name) else {
            return Err(format!("{field}.name: no volume {:?} in the pod", m.name));
        };
        let projected = vols.projected.contains(&m.name);
        let sub_path = if m.sub_path.is_empty() {
            None
        } else {
            let rel = relative(&m.sub_path).ok_or_else(|| {
                format!(
                    "{field}.subPath: {:?} must be a relative path without '..'",
                    m.sub_path
                )
            })?;
            let sub = SubPath {
                path: rel.into(),
                data_link: projected,
            };
            // Creates what is missing and refuses a symlink now, for a clear error; the
            // runtime walks it again right before it mounts, and mounts what it checked.
            skiff_runtime::volume::subpath::prepare(base, &sub)
                .map_err(|e| format!("{field}.subPath: {e}"))?;
            Some(sub)
        };
        out.push(Mount {
            source: base.clone(),
            destination: m.mount_path.clone().into(),
            // The agent rewrites these volumes: a container never writes into them.
            read_only: m.read_only || projected,
            sub_path,
        });
    }
    for (target, file) in &vols.etc {
        if !out.iter().any(|m| m.destination == Path::new(target)) {
            out.push(Mount {
                source: file.clone(),
                destination: target.into(),
                read_only: false,
                sub_path: None,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_follows_dns_policy_and_config() {
        let host = "nameserver 192.0.2.53\nsearch corp.example\noptions timeout:2\n";
        let dns = ClusterDnsConfig {
            ip: "10.96.0.10".parse().unwrap(),
            domain: "cluster.local".into(),
        };
        let mut pod = Pod {
            metadata: Some(skiff_api::api::ObjectMeta {
                name: "p".into(),
                namespace: "shop".into(),
                ..Default::default()
            }),
            spec: Some(skiff_api::api::PodSpec::default()),
            ..Default::default()
        };
        assert_eq!(
            resolv_conf(&pod, host, Some(&dns)),
            "nameserver 10.96.0.10\nsearch shop.svc.cluster.local svc.cluster.local cluster.local corp.example\noptions ndots:5\n"
        );
        let spec = pod.spec.as_mut().unwrap();
        spec.dns_policy = "Default".into();
        assert_eq!(resolv_conf(&pod, host, Some(&dns)), host);
        let spec = pod.spec.as_mut().unwrap();
        spec.dns_policy = "None".into();
        spec.dns_config = Some(skiff_api::api::PodDnsConfig {
            nameservers: vec!["192.0.2.1".into()],
            searches: vec!["a.example".into()],
            options: vec![skiff_api::api::PodDnsConfigOption {
                name: "ndots".into(),
                value: Some("2".into()),
            }],
        });
        assert_eq!(
            resolv_conf(&pod, host, Some(&dns)),
            "nameserver 192.0.2.1\nsearch a.example\noptions ndots:2\n"
        );
        // Host network: the node's unless ClusterFirstWithHostNet.
        let spec = pod.spec.as_mut().unwrap();
        spec.dns_config = None;
        spec.dns_policy = "ClusterFirst".into();
        spec.host_network = true;
        assert_eq!(resolv_conf(&pod, host, Some(&dns)), host);
        pod.spec.as_mut().unwrap().dns_policy = "ClusterFirstWithHostNet".into();
        assert!(resolv_conf(&pod, host, Some(&dns)).starts_with("nameserver 10.96.0.10\n"));
    }
    use skiff_api::api::{
        DownwardApiVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource, ObjectFieldSelector,
        ObjectMeta, PodSpec, ResourceFieldSelector, ResourceRequirements, VolumeMount,
    };

    fn pod(volumes: Vec<Volume>) -> Pod {
        Pod {
            metadata: Some(ObjectMeta {
                name: "web-1".into(),
                namespace: "shop".into(),
                uid: "u-1".into(),
                labels: [
                    ("app".to_string(), "web".to_string()),
                    ("tier".into(), "a\"b".into()),
                ]
                .into(),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        limits: [("memory".to_string(), "64Mi".to_string())].into(),
                        requests: [("cpu".to_string(), "250m".to_string())].into(),
                    }),
                    ..Default::default()
                }],
                volumes,
                subdomain: "svc".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn field(path: &str, field_path: &str) -> DownwardApiVolumeFile {
        DownwardApiVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn empty_dir_downward_api_and_etc_files() {
        let tmp = tempfile::tempdir().unwrap();
        let vols = Volumes {
            root: tmp.path().join("volumes"),
            resolv_conf: tmp.path().join("resolv.conf"),
            cluster_dns: None,
        };
        fs::write(&vols.resolv_conf, "nameserver 192.0.2.53\n").unwrap();
        let mut p = pod(scratch_and_info_volumes());
        let got = vols
            .ensure(
                "u-1",
                &p,
                Some("10.1.0.7".parse().unwrap()),
                &Secrets::new(),
                &Tokens::new(),
                &Claims::new(),
            )
            .unwrap();
        let scratch = &got.paths["scratch"];
        assert_eq!(
            fs::metadata(scratch).unwrap().permissions().mode() & 0o7777,
            0o777
        );
        let info = &got.paths["info"];
        let read = |f: &str| fs::read_to_string(info.join(f)).unwrap();
        assert_eq!(read("labels"), "app=\"web\"\ntier=\"a\\\"b\"");
        assert_eq!(read("meta/name"), "web-1");
        assert_eq!(read("app"), "web");
        assert_eq!(read("mem"), "64");
        assert_eq!(read("cpu"), "250");
        // Label changes reach the file.
        p.metadata
            .as_mut()
            .unwrap()
            .labels
            .insert("app".into(), "shop".into());
        vols.ensure(
            "u-1",
            &p,
            Some("10.1.0.7".parse().unwrap()),
            &Secrets::new(),
            &Tokens::new(),
            &Claims::new(),
        )
        .unwrap();
        assert_eq!(read("app"), "shop");
        let etc: BTreeMap<_, _> = got.etc.iter().cloned().collect();
        let hosts = fs::read_to_string(&etc["/etc/hosts"]).unwrap();
        assert!(hosts.contains("127.0.0.1\tlocalhost\n"), "{hosts}");
        assert!(
            hosts.ends_with("10.1.0.7\tweb-1.svc.shop.svc.cluster.local\tweb-1\n"),
            "{hosts}"
        );
        assert_eq!(
            fs::read_to_string(&etc["/etc/hostname"]).unwrap(),
            "web-1\n"
        );
        assert_eq!(
            fs::read_to_string(&etc["/etc/resolv.conf"]).unwrap(),
            "nameserver 192.0.2.53\n"
        );

        assert_mounts(&got);
    }

    /// Mounts: subPath made inside the volume; a symlink planted there is refused.
    fn assert_mounts(got: &PodVolumes) {
        let scratch = &got.paths["scratch"];
        let c = Container {
            name: "c".into(),
            volume_mounts: vec![
                VolumeMount {
                    name: "scratch".into(),
                    mount_path: "/cache".into(),
                    sub_path: "a/b".into(),
                    ..Default::default()
                },
                VolumeMount {
                    name: "info".into(),
                    mount_path: "/etc/hostname".into(),
                    read_only: true,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let mounts = mounts_for(&c, got).unwrap();
        assert_eq!(mounts[0].source, *scratch);
        assert_eq!(
            mounts[0].sub_path,
            Some(SubPath {
                path: "a/b".into(),
                data_link: false
            })
        );
        assert!(scratch.join("a/b").is_dir());
        assert!(mounts[1].read_only);
        // A downwardAPI volume is read-only whatever the volumeMount says, and its subPath
        // goes through `..data`.
        let mut writable = c.clone();
        writable.volume_mounts[1].read_only = false;
        writable.volume_mounts[1].sub_path = "meta/name".into();
        let m = &mounts_for(&writable, got).unwrap()[1];
        assert!(m.read_only);
        assert!(m.sub_path.as_ref().is_some_and(|s| s.data_link));
        let targets: Vec<_> = mounts.iter().map(|m| m.destination.clone()).collect();
        assert_eq!(
            targets,
            ["/cache", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf"]
                .map(PathBuf::from)
                .to_vec(),
            "the volume over /etc/hostname replaces the generated file"
        );
        std::os::unix::fs::symlink("/etc", scratch.join("evil")).unwrap();
        let mut bad = c.clone();
        bad.volume_mounts[0].sub_path = "evil/x".into();
        let e = mounts_for(&bad, got).unwrap_err();
        assert!(e.contains("subPath") && e.contains("symbolic link"), "{e}");
        assert!(!Path::new("/etc/x").exists());
        bad.volume_mounts[0].sub_path = "../x".into();
        assert!(mounts_for(&bad, got).unwrap_err().contains("without '..'"));
        bad.volume_mounts[0].name = "nope".into();
        assert!(
            mounts_for(&bad, got)
                .unwrap_err()
                .contains("no volume \"nope\"")
        );
    }

    /// An emptyDir `scratch` and a downwardAPI volume `info` of labels, name and resources.
    fn scratch_and_info_volumes() -> Vec<Volume> {
        vec![
            Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            Volume {
                name: "info".into(),
                downward_api: Some(DownwardApiVolumeSource {
                    items: vec![
                        field("labels", "metadata.labels"),
                        field("meta/name", "metadata.name"),
                        field("app", "metadata.labels['app']"),
                        DownwardApiVolumeFile {
                            path: "mem".into(),
                            resource_field_ref: Some(ResourceFieldSelector {
                                container_name: "c".into(),
                                resource: "limits.memory".into(),
                                divisor: Some("1Mi".into()),
                            }),
                            ..Default::default()
                        },
                        DownwardApiVolumeFile {
                            path: "cpu".into(),
                            resource_field_ref: Some(ResourceFieldSelector {
                                container_name: "c".into(),
                                resource: "requests.cpu".into(),
                                divisor: Some("1m".into()),
                            }),
                            ..Default::default()
                        },
                    ],
                    default_mode: None,
                }),
                ..Default::default()
            },
        ]
    }

    #[test]
    fn host_path_types_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        let file = tmp.path().join("f");
        let d = dir.to_str().unwrap();
        let f = file.to_str().unwrap();
        assert!(
            host_path(d, "Directory")
                .unwrap_err()
                .contains("is not a directory")
        );
        host_path(d, "DirectoryOrCreate").unwrap();
        assert!(dir.is_dir());
        host_path(d, "Directory").unwrap();
        assert_eq!(
            host_path(d, "File").unwrap_err(),
            format!("hostPath type check failed: {d} is not a file")
        );
        host_path(f, "FileOrCreate").unwrap();
        assert!(file.is_file());
        host_path(f, "File").unwrap();
        assert!(
            host_path(f, "Socket")
                .unwrap_err()
                .contains("is not a socket")
        );
        host_path("/dev/null", "CharDevice").unwrap();
        assert!(host_path(f, "Weird").unwrap_err().contains("not supported"));
        let vols = Volumes {
            root: tmp.path().join("volumes"),
            resolv_conf: tmp.path().join("none"),
            cluster_dns: None,
        };
        let e = vols
            .ensure(
                "u-1",
                &pod(vec![Volume {
                    name: "node-logs".into(),
                    host_path: Some(HostPathVolumeSource {
                        path: tmp.path().join("missing").display().to_string(),
                        r#type: Some("Directory".into()),
                    }),
                    ..Default::default()
                }]),
                None,
                &Secrets::new(),
                &Tokens::new(),
                &Claims::new(),
            )
            .unwrap_err();
        assert_eq!(e.volume, "node-logs");
        assert!(
            e.to_string().starts_with(
                "MountVolume.SetUp failed for volume \"node-logs\" : hostPath type check failed: "
            ),
            "{e}"
        );
    }
}
