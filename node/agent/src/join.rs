//! `skiff-node join`: a new node's way into the cluster with nothing but the API server's
//! URL, a bootstrap token and the CA's hash, as `kubeadm join` and k3s agents do:
//!
//! 1. the cluster CA is found in the server's TLS chain and accepted only if its public key
//!    hashes to `--ca-cert-hash` (nothing, the token least of all, is sent before);
//! 2. a new key and a CertificateSigningRequest for `system:node:<name>` in `system:nodes`
//!    (signer `kubernetes.io/kube-apiserver-client-kubelet`) are sent, authenticated by the
//!    token over a connection that verifies the server against that CA;
//! 3. the controller manager approves and signs it; the agent watches the request until the
//!    certificate is there (or the request is denied, fails, or the time runs out);
//! 4. a kubeconfig with the certificate and key is written (mode 0600) and the agent runs
//!    with it. A node that restarts with a current certificate skips 2 and 3.
//!
//! The token is never logged or put in an error. Renewal ([`renew_when_due`], run beside the
//! agent): every `--cert-check-interval` the kubeconfig's client certificate is checked; within
//! [`skiff_pki::RENEW_BEFORE`] of expiry the same request goes out as the node itself (the
//! Node authorizer lets nodes create and watch requests; the approver approves a node renewing
//! itself), the kubeconfig is rewritten, and the agent shuts down as on SIGTERM (pods keep
//! running) and execs its own command line again, adopting its pods.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use skiff_api::api::{CertificateSigningRequest, CertificateSigningRequestSpec, ObjectMeta};
use skiff_client::{Client, ClientConfig, ClientError, ListParams, WatchEvent};
use skiff_pki::{Identity, Kubeconfig, PkiError};

use skiff_api::wellknown::{KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER};
const NODES_GROUP: &str = "system:nodes";

/// What `join` needs.
#[derive(Clone)]
pub struct JoinOptions {
    /// `https://host:port` of the API server.
    pub server: String,
    /// The bootstrap token, `<id>.<secret>`.
    pub token: String,
    /// `sha256:<hex>` of the cluster CA's public key.
    pub ca_cert_hash: String,
    pub node_name: String,
    /// Where the node's kubeconfig is written (and found on restart).
    pub kubeconfig: PathBuf,
    /// How long to wait for the certificate.
    pub timeout: Duration,
}

impl std::fmt::Debug for JoinOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinOptions")
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .field("ca_cert_hash", &self.ca_cert_hash)
            .field("node_name", &self.node_name)
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

/// Why a join failed. No variant carries the token.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("--server {0:?} is not an https:// URL with a host")]
    BadServer(String),
    #[error("discovering the cluster CA: {0}")]
    Discovery(#[source] PkiError),
    #[error(
        "the API server refused the bootstrap token (401 Unauthorized): it is wrong, expired, \
         or its Secret kube-system/bootstrap-token-<id> is gone"
    )]
    TokenRefused,
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: ClientError,
    },
    #[error("the certificate request {name} was {verdict}: {message}")]
    NotIssued {
        name: String,
        verdict: String,
        message: String,
    },
    #[error(
        "no certificate for {name} within {timeout:?}: is the controller manager running with \
         --cluster-signing-cert-file and --cluster-signing-key-file?"
    )]
    Timeout { name: String, timeout: Duration },
    #[error("{0}")]
    Pki(#[from] PkiError),
}

/// What `join` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// A certificate was issued now, through this request.
    Issued { request: String },
    /// The kubeconfig already held a current certificate of this CA.
    AlreadyJoined,
}

/// `host` and `host:port` of an `https://` URL.
fn host_of(server: &str) -> Result<(String, String), JoinError> {
    let bad = || JoinError::BadServer(server.to_string());
    let uri: axum::http::Uri = server.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("https") {
        return Err(bad());
    }
    let host = uri.host().filter(|h| !h.is_empty()).ok_or_else(bad)?;
    let port = uri.port_u16().unwrap_or(443);
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let addr = if bare.contains(':') {
        format!("[{bare}]:{port}")
    } else {
        format!("{bare}:{port}")
    };
    Ok((bare, addr))
}

/// The certificate chain a TLS server at `addr` presents to `server_name`, without trusting
/// it (blocking; nothing is written beyond the handshake).
fn fetch_chain(
    addr: &str,
    server_name: &str,
    timeout: Duration,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, PkiError> {
    use std::net::ToSocketAddrs;
    let err = |m: String| PkiError::Discovery(m);
    let config = skiff_pki::discovery::unverified_client_config()?;
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| err(format!("{server_name:?} is not a server name: {e}")))?;
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
        .map_err(|e| PkiError::Tls(e.to_string()))?;
    let sock_addr = addr
        .to_socket_addrs()
        .map_err(|e| err(format!("cannot resolve {addr}: {e}")))?
        .next()
        .ok_or_else(|| err(format!("{addr} resolves to no address")))?;
    let mut sock = std::net::TcpStream::connect_timeout(&sock_addr, timeout)
        .map_err(|e| err(format!("cannot connect to {addr}: {e}")))?;
    sock.set_read_timeout(Some(timeout))
        .and_then(|()| sock.set_write_timeout(Some(timeout)))
        .map_err(|e| err(format!("{addr}: {e}")))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)
            .map_err(|e| err(format!("TLS handshake with {addr}: {e}")))?;
    }
    let chain: Vec<_> = conn
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    conn.send_close_notify();
    let _ = conn.complete_io(&mut sock);
    if chain.is_empty() {
        return Err(err(format!("{addr} presented no certificate")));
    }
    Ok(chain)
}

/// The cluster CA (PEM), pinned by hash.
async fn discover(opts: &JoinOptions) -> Result<String, JoinError> {
    let pinned =
        skiff_pki::discovery::parse_ca_hash(&opts.ca_cert_hash).map_err(JoinError::Discovery)?;
    let (host, addr) = host_of(&opts.server)?;
    let name = host.clone();
    let chain =
        tokio::task::spawn_blocking(move || fetch_chain(&addr, &name, Duration::from_secs(10)))
            .await
            .map_err(|e| JoinError::Discovery(PkiError::Discovery(e.to_string())))?
            .map_err(JoinError::Discovery)?;
    skiff_pki::discovery::pinned_ca(&chain, &pinned, &host).map_err(JoinError::Discovery)
}

/// Whether the kubeconfig at the path is this node's, of this CA, and not due for renewal.
fn current(opts: &JoinOptions, ca_pem: &str) -> bool {
    let Ok(r) = skiff_pki::kubeconfig::load(&opts.kubeconfig) else {
        return false;
    };
    let Some(id) = r.identity else {
        return false;
    };
    let Ok(info) = skiff_pki::parse_pem(&id.cert_pem, "the node's certificate") else {
        return false;
    };
    let Ok(der) = skiff_pki::pem_certificates(&id.cert_pem, "the node's certificate") else {
        return false;
    };
    r.ca_pem.as_deref() == Some(ca_pem)
        && info.common_name == format!("system:node:{}", opts.node_name)
        && der.first().is_some_and(|d| {
            skiff_pki::tls::verify_chain_for(ca_pem, d, &[], skiff_pki::Usage::Client).is_ok()
        })
        && !info.expires_within(std::time::SystemTime::now(), skiff_pki::RENEW_BEFORE)
}

fn api_err(action: impl Into<String>) -> impl FnOnce(ClientError) -> JoinError {
    let action = action.into();
    move |source| match source {
        ClientError::Unauthorized { .. } => JoinError::TokenRefused,
        source => JoinError::Api { action, source },
    }
}

/// Joins: see the module docs. The kubeconfig is written only once a certificate is issued.
pub async fn join(opts: &JoinOptions) -> Result<Joined, JoinError> {
    let ca_pem = discover(opts).await?;
    tracing::info!(server = %opts.server, ca = %opts.ca_cert_hash, "the server's CA matches the pinned hash");
    if current(opts, &ca_pem) {
        return Ok(Joined::AlreadyJoined);
    }
    let user = format!("system:node:{}", opts.node_name);
    let config = ClientConfig {
        ca_pem: Some(ca_pem.clone()),
        token: Some(opts.token.clone()),
        ..ClientConfig::plain(&opts.server)
    };
    let client = Client::connect_with(&config)
        .await
        .map_err(api_err("connecting to the API server"))?;
    let (identity, name) =
        request_certificate(&client, &opts.node_name, NodeCert::Client, opts.timeout).await?;
    Kubeconfig::single("skiff", &opts.server, &ca_pem, &user, Some(&identity), None)
        .write(&opts.kubeconfig)?;
    tracing::info!(kubeconfig = %opts.kubeconfig.display(), "wrote the node's kubeconfig");
    Ok(Joined::Issued { request: name })
}

/// Which certificate a node asks the cluster CA for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NodeCert<'a> {
    /// Its client certificate (signer `kubernetes.io/kube-apiserver-client-kubelet`).
    Client,
    /// Its API's serving certificate for these addresses (signer
    /// `kubernetes.io/kubelet-serving`).
    Serving { sans: &'a [String] },
}

/// A new key and a certificate for `system:node:<node>` in `system:nodes` through a
/// CertificateSigningRequest sent by `client` (the bootstrap token's, or the node's own when
/// it renews or asks for a serving certificate), waited for up to `timeout`: the identity and
/// the request's name.
pub(crate) async fn request_certificate(
    client: &Client,
    node: &str,
    kind: NodeCert<'_>,
    timeout: Duration,
) -> Result<(Identity, String), JoinError> {
    let user = format!("system:node:{node}");
    let groups = [NODES_GROUP.to_string()];
    let (key_pem, request_pem, signer, usage, what) = match kind {
        NodeCert::Client => {
            let (key, req) = skiff_pki::new_request(&user, &groups)?;
            (key, req, KUBELET_CLIENT_SIGNER, "client auth", "a client")
        }
        NodeCert::Serving { sans } => {
            let (key, req) = skiff_pki::new_server_request(&user, &groups, sans)?;
            (key, req, KUBELET_SERVING_SIGNER, "server auth", "a serving")
        }
    };
    let api = client.cluster::<CertificateSigningRequest>();
    let csr = CertificateSigningRequest {
        metadata: Some(ObjectMeta {
            generate_name: "node-csr-".into(),
            ..Default::default()
        }),
        spec: Some(CertificateSigningRequestSpec {
            request: request_pem.into_bytes(),
            signer_name: signer.into(),
            usages: vec![
                "digital signature".into(),
                "key encipherment".into(),
                usage.into(),
            ],
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = api
        .create(&csr)
        .await
        .map_err(api_err("creating the CertificateSigningRequest"))?;
    let meta = created.metadata.clone().unwrap_or_default();
    let name = meta.name.clone();
    tracing::info!(request = %name, node, "asked for {what} certificate");
    let cert_pem = tokio::time::timeout(
        timeout,
        wait_for_certificate(&api, &name, &meta.resource_version),
    )
    .await
    .map_err(|_| JoinError::Timeout {
        name: name.clone(),
        timeout,
    })??;
    Ok((Identity { cert_pem, key_pem }, name))
}

/// Whether the client certificate of the kubeconfig at `path` is due for renewal: within
/// [`skiff_pki::RENEW_BEFORE`] of its expiry (as k3s renews its certificates). `Ok(false)`
/// for a kubeconfig without a client certificate (nothing to renew).
pub fn renewal_due(path: &Path) -> Result<bool, JoinError> {
    let config = skiff_pki::kubeconfig::load(path)?;
    let Some(identity) = config.identity else {
        return Ok(false);
    };
    let info = skiff_pki::parse_pem(&identity.cert_pem, "the node's client certificate")?;
    Ok(info.expires_within(SystemTime::now(), skiff_pki::RENEW_BEFORE))
}

/// Renews the node's client certificate with its current one (kubelet's certificate
/// rotation): a new key and a CertificateSigningRequest for the same identity through
/// `client` (authenticated as the node; the controller manager approves a node renewing
/// itself), then the kubeconfig at `path` rewritten with it (same server and CA, mode
/// 0600). Returns the request's name.
pub async fn renew(
    client: &Client,
    path: &Path,
    node: &str,
    timeout: Duration,
) -> Result<String, JoinError> {
    let config = skiff_pki::kubeconfig::load(path)?;
    let ca_pem = config.ca_pem.clone().unwrap_or_default();
    let (identity, name) = request_certificate(client, node, NodeCert::Client, timeout).await?;
    Kubeconfig::single(
        "skiff",
        &config.server,
        &ca_pem,
        &format!("system:node:{node}"),
        Some(&identity),
        None,
    )
    .write(path)?;
    Ok(name)
}

/// Checks every `every` whether the certificate of the kubeconfig at `path` is due
/// ([`renewal_due`]) and renews it ([`renew`]); returns once a renewed certificate is written
/// (the agent then starts again with it). Failures are logged and tried again at the next
/// check.
pub async fn renew_when_due(client: &Client, path: &Path, node: &str, every: Duration) {
    loop {
        match renewal_due(path) {
            Ok(true) => match renew(client, path, node, RENEW_TIMEOUT).await {
                Ok(request) => {
                    tracing::info!(%request, kubeconfig = %path.display(), "renewed the node's client certificate");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the node's client certificate failed; trying again later")
                }
            },
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, kubeconfig = %path.display(), "reading the node's client certificate")
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// How long a renewal waits for its certificate.
pub(crate) const RENEW_TIMEOUT: Duration = Duration::from_secs(300);

/// What the request says now: its certificate, a refusal, or nothing yet.
fn outcome(r: &CertificateSigningRequest) -> Option<Result<String, JoinError>> {
    let status = r.status.as_ref()?;
    if !status.certificate.is_empty() {
        return Some(Ok(String::from_utf8_lossy(&status.certificate).into_owned()));
    }
    let refusal = status
        .conditions
        .iter()
        .find(|c| (c.r#type == "Denied" || c.r#type == "Failed") && c.status == "True")?;
    Some(Err(JoinError::NotIssued {
        name: r
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
        verdict: refusal.r#type.to_lowercase(),
        message: format!("{}: {}", refusal.reason, refusal.message),
    }))
}

/// Watches the request until it has a certificate or is refused (re-watching from a fresh
/// read when a watch ends).
async fn wait_for_certificate(
    api: &skiff_client::Api<CertificateSigningRequest>,
    name: &str,
    resource_version: &str,
) -> Result<String, JoinError> {
    let lp = ListParams::default().fields(&format!("metadata.name={name}"));
    let mut rv = resource_version.to_string();
    loop {
        let mut events = api.watch(&lp, &rv);
        while let Some(ev) = events.next().await {
            let ev = ev.map_err(api_err(format!("watching {name}")))?;
            if let WatchEvent::Deleted(_) = ev {
                return Err(JoinError::NotIssued {
                    name: name.into(),
                    verdict: "deleted".into(),
                    message: "the request was deleted before a certificate was issued".into(),
                });
            }
            let r = ev.into_object();
            if let Some(done) = outcome(&r) {
                return done;
            }
        }
        // The watch ended: read the request again and watch on from there.
        let r = api
            .get(name)
            .await
            .map_err(api_err(format!("reading {name}")))?;
        if let Some(done) = outcome(&r) {
            return done;
        }
        rv = r.metadata.map(|m| m.resource_version).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_must_be_https_urls() {
        assert_eq!(
            host_of("https://127.0.0.1:7443").unwrap(),
            ("127.0.0.1".into(), "127.0.0.1:7443".into())
        );
        assert_eq!(
            host_of("https://[::1]:6443/").unwrap(),
            ("::1".into(), "[::1]:6443".into())
        );
        assert_eq!(host_of("https://cp.example").unwrap().1, "cp.example:443");
        for bad in ["http://127.0.0.1:7443", "127.0.0.1:7443", "https://", ""] {
            assert!(host_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_token_is_never_shown() {
        let o = JoinOptions {
            server: "https://h:1".into(),
            token: "abcdef.0123456789abcdef".into(),
            ca_cert_hash: String::new(),
            node_name: "n".into(),
            kubeconfig: PathBuf::new(),
            timeout: Duration::ZERO,
        };
        assert!(!format!("{o:?}").contains("0123456789abcdef"));
    }
}
