//! A cluster's PKI directory, made in one step on first start and kept valid on every later
//! one (as k3s does):
//!
//! ```text
//! <dir>/ca.crt, ca.key                  the cluster CA (10 years)
//! <dir>/apiserver.crt, apiserver.key    the API server's serving certificate (1 year, SANs)
//! <dir>/admin.kubeconfig                system:admin in system:masters
//! <dir>/scheduler.kubeconfig            system:kube-scheduler
//! <dir>/controller-manager.kubeconfig   system:kube-controller-manager
//! <dir>/service-account.key             signs ServiceAccount tokens (never rotated here)
//! <dir>/front-proxy-ca.crt, .key        the front-proxy CA (10 years): extension API servers
//!                                       trust requests it vouches for (kubeadm's)
//! <dir>/front-proxy-client.crt, .key    the API server's client certificate towards them
//!                                       (CN `front-proxy-client`, 1 year)
//! ```
//!
//! A leaf (serving certificate or a kubeconfig's client certificate) is issued again when it is
//! missing, unreadable, not signed by the CA, within [`crate::RENEW_BEFORE`] of expiry, or (the
//! serving one) lacks a SAN now asked for; a kubeconfig is rewritten when the server URL
//! changed. The CA is never replaced: a missing key with an existing certificate is an error.
//! Private keys and kubeconfigs are written mode 0600, atomically (a temporary with a random
//! name beside the file, renamed over it); the directory is kept at mode 0700.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tracing::info;

use crate::kubeconfig::Kubeconfig;
use crate::{Ca, Identity, LeafSpec, PkiError, RENEW_BEFORE, parse_pem};

/// The cluster's name in generated kubeconfigs.
pub const CLUSTER_NAME: &str = "skiff";
/// The administrator's user and group (k3s' `system:admin` in `system:masters`).
pub const ADMIN_USER: &str = "system:admin";
pub const MASTERS_GROUP: &str = "system:masters";
pub const SCHEDULER_USER: &str = "system:kube-scheduler";
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
/// The common name of the API server's front-proxy client certificate (kubeadm's), which
/// extension API servers accept (`requestheader-allowed-names`).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// The kubeconfigs [`ClusterPki::ensure`] writes: file name, user, groups.
pub const KUBECONFIGS: &[(&str, &str, &[&str])] = &[
    ("admin.kubeconfig", ADMIN_USER, &[MASTERS_GROUP]),
    ("scheduler.kubeconfig", SCHEDULER_USER, &[]),
    (
        "controller-manager.kubeconfig",
        CONTROLLER_MANAGER_USER,
        &[],
    ),
];

/// What the PKI must cover.
#[derive(Debug, Clone, Default)]
pub struct BootstrapOptions {
    /// The URL written into the kubeconfigs (`https://127.0.0.1:7443`).
    pub server_url: String,
    /// Every name and address the serving certificate must be valid for.
    pub sans: Vec<String>,
}

/// The default SANs of the API server's serving certificate: loopback names, the in-cluster
/// names of the `kubernetes` Service, and the machine's host name.
pub fn default_sans() -> Vec<String> {
    let mut sans: Vec<String> = [
        "localhost",
        "127.0.0.1",
        "::1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() && !sans.iter().any(|s| s == h) {
            sans.push(h.to_string());
        }
    }
    sans
}

/// A PKI directory.
#[derive(Debug, Clone)]
pub struct ClusterPki {
    pub dir: PathBuf,
}

/// What [`ClusterPki::ensure`] left in place.
#[derive(Debug)]
pub struct Ensured {
    pub ca: Ca,
    /// The ServiceAccount token key.
    pub sa_key: crate::sa_token::SigningKey,
    /// The API server's serving certificate and key.
    pub serving: Identity,
    /// The front-proxy CA's certificate (what extension API servers trust).
    pub front_proxy_ca_pem: String,
    /// The API server's client certificate towards extension API servers.
    pub front_proxy_client: Identity,
    /// Files written this time (for the log).
    pub written: Vec<PathBuf>,
}

impl Ensured {
    /// What the API server presents: its certificate followed by the CA's, so that a
    /// joining node can pin the CA by its hash (`skiff-node join --ca-cert-hash`) before it
    /// trusts anything the server says.
    pub fn serving_chain(&self) -> Identity {
        Identity {
            cert_pem: format!(
                "{}\n{}",
                self.serving.cert_pem.trim_end(),
                self.ca.cert_pem().trim_end()
            ) + "\n",
            key_pem: self.serving.key_pem.clone(),
        }
    }
}

impl ClusterPki {
    pub fn new(dir: impl Into<PathBuf>) -> ClusterPki {
        ClusterPki { dir: dir.into() }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The admin kubeconfig's path.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.path("admin.kubeconfig")
    }

    /// Loads the CA (without creating it).
    pub fn load_ca(&self) -> Result<Ca, PkiError> {
        let cert = read(&self.path("ca.crt"))?;
        let key = read(&self.path("ca.key"))?;
        Ca::from_pem(&cert, &key)
    }

    /// Creates what is missing and renews what is due (see the module docs).
    pub fn ensure(&self, opts: &BootstrapOptions) -> Result<Ensured, PkiError> {
        crate::files::private_dir(&self.dir).map_err(|source| PkiError::Io {
            action: "create",
            path: self.dir.display().to_string(),
            source,
        })?;
        let mut written = Vec::new();
        let ca = self.ensure_ca("ca", "skiff-ca", &mut written)?;
        let serving = self.ensure_leaf(
            &ca,
            "apiserver",
            &LeafSpec::server("skiff-apiserver", &opts.sans),
            |cert| covers(cert, &opts.sans),
            &mut written,
        )?;
        let front_proxy_ca =
            self.ensure_ca("front-proxy-ca", "skiff-front-proxy-ca", &mut written)?;
        let front_proxy_client = self.ensure_leaf(
            &front_proxy_ca,
            "front-proxy-client",
            &LeafSpec::client(FRONT_PROXY_CLIENT, &[]),
            |_| true,
            &mut written,
        )?;
        let sa_path = self.path("service-account.key");
        let sa_pem = match std::fs::read_to_string(&sa_path) {
            Ok(pem) => pem,
            Err(_) => {
                let pem = crate::sa_token::SigningKey::generate_pem()?;
                write_private(&sa_path, pem.as_bytes())?;
                written.push(sa_path);
                pem
            }
        };
        let sa_key = crate::sa_token::SigningKey::from_pem(&sa_pem)?;
        for (file, user, groups) in KUBECONFIGS {
            let path = self.path(file);
            if self.kubeconfig_is_current(&ca, &path, &opts.server_url) {
                continue;
            }
            self.write_kubeconfig(&ca, &path, &opts.server_url, user, groups)?;
            written.push(path);
        }
        for p in &written {
            info!(path = %p.display(), "wrote PKI file");
        }
        Ok(Ensured {
            ca,
            sa_key,
            serving,
            front_proxy_ca_pem: front_proxy_ca.cert_pem().to_string(),
            front_proxy_client,
            written,
        })
    }

    /// The CA `<stem>.crt`/`.key`, made when neither exists (never replaced).
    fn ensure_ca(
        &self,
        stem: &str,
        name: &str,
        written: &mut Vec<PathBuf>,
    ) -> Result<Ca, PkiError> {
        let (crt, key) = (
            self.path(&format!("{stem}.crt")),
            self.path(&format!("{stem}.key")),
        );
        if crt.exists() || key.exists() {
            return Ca::from_pem(&read(&crt)?, &read(&key)?);
        }
        let ca = Ca::generate(name)?;
        write_private(&key, ca.key_pem().as_bytes())?;
        write_public(&crt, ca.cert_pem().as_bytes())?;
        written.extend([key, crt]);
        Ok(ca)
    }

    /// The leaf `<stem>.crt`/`.key` of `ca`, issued again unless current and `fits`.
    fn ensure_leaf(
        &self,
        ca: &Ca,
        stem: &str,
        spec: &LeafSpec,
        fits: impl Fn(&str) -> bool,
        written: &mut Vec<PathBuf>,
    ) -> Result<Identity, PkiError> {
        let (crt, key) = (
            self.path(&format!("{stem}.crt")),
            self.path(&format!("{stem}.key")),
        );
        let current = match (std::fs::read_to_string(&crt), std::fs::read_to_string(&key)) {
            (Ok(cert_pem), Ok(key_pem)) => Some(Identity { cert_pem, key_pem }),
            _ => None,
        };
        if let Some(id) =
            current.filter(|id| leaf_is_current(ca, &id.cert_pem) && fits(&id.cert_pem))
        {
            return Ok(id);
        }
        let id = ca.issue(spec)?;
        write_private(&key, id.key_pem.as_bytes())?;
        write_public(&crt, id.cert_pem.as_bytes())?;
        written.extend([key, crt]);
        Ok(id)
    }

    fn kubeconfig_is_current(&self, ca: &Ca, path: &Path, server: &str) -> bool {
        let Ok(r) = crate::kubeconfig::load(path) else {
            return false;
        };
        r.server == server
            && r.ca_pem.as_deref() == Some(ca.cert_pem())
            && r.identity
                .as_ref()
                .is_some_and(|id| leaf_is_current(ca, &id.cert_pem))
    }

    /// Writes a kubeconfig at `path` for `user` in `groups`, with a client certificate the CA
    /// signs now (like `kubeadm kubeconfig user`).
    pub fn write_kubeconfig(
        &self,
        ca: &Ca,
        path: &Path,
        server: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<(), PkiError> {
        let id = ca.issue(&LeafSpec::client(user, groups))?;
        Kubeconfig::single(CLUSTER_NAME, server, ca.cert_pem(), user, Some(&id), None).write(path)
    }
}

/// Whether a leaf certificate was signed by this CA (same issuer key: checked by the issuer
/// name and a successful parse; a CA is never replaced, so a new CA means new files) and is
/// not due for renewal.
pub(crate) fn leaf_is_current(ca: &Ca, cert_pem: &str) -> bool {
    let Ok(info) = parse_pem(cert_pem, "certificate") else {
        return false;
    };
    let Ok(der) = crate::pem_certificates(cert_pem, "certificate") else {
        return false;
    };
    let signed_by_ca = der
        .first()
        .is_some_and(|d| crate::tls::verify_chain(ca.cert_pem(), d, &[]).is_ok());
    signed_by_ca && !info.expires_within(SystemTime::now(), RENEW_BEFORE)
}

/// Whether a certificate's SANs include every one of `sans`.
pub(crate) fn covers(cert_pem: &str, sans: &[String]) -> bool {
    parse_pem(cert_pem, "certificate")
        .map(|info| sans.iter().all(|s| info.sans.contains(s)))
        .unwrap_or(false)
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io {
        action: "read",
        path: path.display().to_string(),
        source,
    })
}

fn write_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PkiError> {
    crate::files::write_with_mode(path, bytes, mode).map_err(|source| PkiError::Io {
        action: "write",
        path: path.display().to_string(),
        source,
    })
}

/// Writes a file only its owner can read (keys, kubeconfigs, tokens), atomically.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), PkiError> {
    write_mode(path, bytes, 0o600)
}

/// Writes a file anyone may read (certificates), atomically.
pub fn write_public(path: &Path, bytes: &[u8]) -> Result<(), PkiError> {
    write_mode(path, bytes, 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn opts(url: &str) -> BootstrapOptions {
        BootstrapOptions {
            server_url: url.into(),
            sans: vec!["localhost".into(), "127.0.0.1".into()],
        }
    }

    #[test]
    fn first_start_creates_everything_later_starts_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ClusterPki::new(dir.path().join("pki"));
        let first = pki.ensure(&opts("https://127.0.0.1:7443")).unwrap();
        assert_eq!(first.written.len(), 9 + KUBECONFIGS.len());
        let mode = |n: &str| std::fs::metadata(pki.path(n)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("ca.key"), 0o600);
        assert_eq!(mode("apiserver.key"), 0o600);
        assert_eq!(mode("admin.kubeconfig"), 0o600);
        assert_eq!(mode(""), 0o700, "the PKI directory");
        assert_eq!(mode("service-account.key"), 0o600);
        let left: Vec<_> = std::fs::read_dir(pki.path(""))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.') || n.contains("tmp"))
            .collect();
        assert!(left.is_empty(), "temporaries left: {left:?}");
        assert_eq!(mode("ca.crt"), 0o644);
        let again = pki.ensure(&opts("https://127.0.0.1:7443")).unwrap();
        assert!(again.written.is_empty(), "{:?}", again.written);
        assert_eq!(again.serving, first.serving);
        let admin = crate::kubeconfig::load(&pki.admin_kubeconfig()).unwrap();
        let info = parse_pem(&admin.identity.unwrap().cert_pem, "admin").unwrap();
        assert_eq!(info.common_name, ADMIN_USER);
        assert_eq!(info.organizations, vec![MASTERS_GROUP]);
        // The front-proxy client certificate, of its own CA.
        assert_eq!(mode("front-proxy-ca.key"), 0o600);
        assert_eq!(mode("front-proxy-client.key"), 0o600);
        assert_eq!(again.front_proxy_client, first.front_proxy_client);
        let client = parse_pem(&first.front_proxy_client.cert_pem, "front proxy").unwrap();
        assert_eq!(client.common_name, FRONT_PROXY_CLIENT);
        assert_ne!(first.front_proxy_ca_pem, first.ca.cert_pem());
    }

    #[test]
    fn new_sans_and_urls_renew_only_what_they_touch() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ClusterPki::new(dir.path());
        let first = pki.ensure(&opts("https://127.0.0.1:7443")).unwrap();
        let mut o = opts("https://127.0.0.1:7443");
        o.sans.push("10.96.0.1".into());
        let second = pki.ensure(&o).unwrap();
        assert_eq!(
            second.written,
            vec![pki.path("apiserver.key"), pki.path("apiserver.crt")]
        );
        assert_ne!(second.serving, first.serving);
        assert_eq!(second.ca.hash().unwrap(), first.ca.hash().unwrap());
        o.server_url = "https://127.0.0.1:9000".into();
        let third = pki.ensure(&o).unwrap();
        assert_eq!(third.written.len(), KUBECONFIGS.len());
    }

    #[test]
    fn a_leaf_of_another_ca_is_replaced_and_a_ca_without_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ClusterPki::new(dir.path());
        pki.ensure(&opts("https://x")).unwrap();
        let other = Ca::generate("other").unwrap();
        let foreign = other
            .issue(&LeafSpec::server(
                "x",
                &["localhost".into(), "127.0.0.1".into()],
            ))
            .unwrap();
        std::fs::write(pki.path("apiserver.crt"), &foreign.cert_pem).unwrap();
        std::fs::write(pki.path("apiserver.key"), &foreign.key_pem).unwrap();
        let e = pki.ensure(&opts("https://x")).unwrap();
        assert!(e.written.contains(&pki.path("apiserver.crt")));
        std::fs::remove_file(pki.path("ca.key")).unwrap();
        let err = pki.ensure(&opts("https://x")).unwrap_err().to_string();
        assert!(err.contains("ca.key"), "{err}");
    }
}
