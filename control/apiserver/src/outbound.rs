//! Calls from the API server to servers that extend it: admission webhooks named by a
//! `WebhookClientConfig` ([`Outbound`]), and aggregated API servers ([`ProxyClient`], for
//! `crate::aggregator`: the front-proxy client certificate, `insecureSkipTLSVerify`, answers
//! streamed rather than capped).
//!
//! A `service` reference is resolved the way kube-apiserver does with
//! `--enable-aggregator-routing`: the Service's port (443 by default) to one of its ready
//! endpoints, dialled at the pod's address, while TLS checks the certificate for
//! `<service>.<namespace>.svc` against the configuration's `caBundle` and nothing else. (The
//! control plane's machines need not run the data plane, so a ClusterIP is not dialled.) A
//! `url` is dialled as written.
//!
//! Written over hyper's connection API rather than a pooled client crate because every call
//! has its own trust roots and a server name that is not the address dialled. Webhook
//! connections are kept alive and reused per (address, server name, CA bundle). Redirects are
//! never followed and an answer other than 200 is an error that does not repeat the body (the
//! CVE-2020-8561 class: a webhook must not make the API server fetch or log what it points
//! at); answers are capped at [`MAX_RESPONSE_BYTES`]; the whole call, connecting included,
//! ends at its deadline. A proxied call ([`ProxyClient::send`]) has a connection of its own
//! (a watch may hold it for long) and a deadline for connecting and the answer's headers
//! only; what it does with the answer is the aggregator's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use skiff_api::api::{Endpoints, Service, WebhookClientConfig};
use skiff_store::Store;

use crate::error::ApiError;

/// The largest answer read from an extension server.
pub const MAX_RESPONSE_BYTES: usize = 3 << 20;
/// Idle connections kept per server.
const MAX_IDLE_PER_SERVER: usize = 16;

/// Why a call failed, worded as kube-apiserver's webhook client words it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// No client can be made (the CA bundle is not PEM).
    #[error("could not get REST client: {0}")]
    Client(String),
    /// The Service reference leads nowhere.
    #[error("failed to call webhook: {0}")]
    Resolve(String),
    /// Connecting, TLS, the exchange or the deadline.
    #[error("failed to call webhook: Post {url:?}: {reason}")]
    Call { url: String, reason: String },
}

impl CallError {
    /// What went wrong, without the webhook framing (`Post "<url>": <reason>`), for callers
    /// that word their own (conversion webhooks).
    pub fn reason(&self) -> String {
        match self {
            CallError::Client(m) => format!("could not get REST client: {m}"),
            CallError::Resolve(m) => m.clone(),
            CallError::Call { url, reason } => format!("Post {url:?}: {reason}"),
        }
    }
}

/// Where one call goes.
#[derive(Debug, Clone)]
pub struct Target {
    /// The address dialled.
    pub addr: SocketAddr,
    /// The name the server's certificate must carry (and the Host header).
    pub server_name: String,
    /// Path (and nothing else) of the request.
    pub path: String,
    /// `https://<server name>:<port><path>`, for messages.
    pub url: String,
}

/// Resolves a client configuration to an address (for a Service: one of its ready endpoints).
pub async fn resolve(store: &dyn Store, cc: &WebhookClientConfig) -> Result<Target, CallError> {
    match (&cc.url, &cc.service) {
        (Some(url), _) => resolve_url(url).await,
        (None, Some(svc)) => {
            let port = svc.port.unwrap_or(443);
            let path = svc.path.clone().unwrap_or_default();
            let path = if path.is_empty() {
                "/".to_string()
            } else {
                path
            };
            let server_name = format!("{}.{}.svc", svc.name, svc.namespace);
            let addr = service_endpoint(store, &svc.namespace, &svc.name, port).await?;
            Ok(Target {
                addr,
                url: format!("https://{server_name}:{port}{path}"),
                server_name,
                path,
            })
        }
        (None, None) => Err(CallError::Resolve(
            "neither url nor service is set".to_string(),
        )),
    }
}

async fn resolve_url(url: &str) -> Result<Target, CallError> {
    let bad = |reason: String| CallError::Resolve(format!("{url:?}: {reason}"));
    let u = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    if u.scheme() != "https" {
        return Err(bad("only https is allowed".into()));
    }
    let host = u
        .host_str()
        .ok_or_else(|| bad("no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = u.port().unwrap_or(443);
    let addr = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| bad(e.to_string()))?
            .next()
            .ok_or_else(|| bad(format!("no address for {host}")))?,
    };
    let path = u.path().to_string();
    Ok(Target {
        addr,
        url: url.to_string(),
        server_name: host,
        path,
    })
}

/// A ready endpoint of the Service's `port`.
async fn service_endpoint(
    store: &dyn Store,
    namespace: &str,
    name: &str,
    port: i32,
) -> Result<SocketAddr, CallError> {
    let read = |e: ApiError| CallError::Resolve(e.to_string());
    let svc = crate::stored::get::<Service>(store, namespace, name)
        .await
        .map_err(read)?
        .ok_or_else(|| CallError::Resolve(format!("service {name:?} not found")))?;
    let endpoints = crate::stored::get::<Endpoints>(store, namespace, name)
        .await
        .map_err(read)?;
    pick_endpoint(&svc, endpoints.as_ref(), port)
}

/// One of the ready endpoints (at random) of `svc`'s `port`, from its Endpoints.
pub fn pick_endpoint(
    svc: &Service,
    endpoints: Option<&Endpoints>,
    port: i32,
) -> Result<SocketAddr, CallError> {
    let name = svc.metadata.as_ref().map_or("", |m| m.name.as_str());
    let spec = svc.spec.clone().unwrap_or_default();
    if spec.r#type == "ExternalName" {
        return Err(CallError::Resolve(format!(
            "service {name:?} is an ExternalName service, which is not dialled"
        )));
    }
    let svc_port = spec.ports.iter().find(|p| p.port == port).ok_or_else(|| {
        CallError::Resolve(format!("no service port {port} found for service {name:?}"))
    })?;
    let no_endpoints =
        || CallError::Resolve(format!("no endpoints available for service {name:?}"));
    let endpoints = endpoints.ok_or_else(no_endpoints)?;
    let mut candidates = Vec::new();
    for subset in &endpoints.subsets {
        let ep_port = if svc_port.name.is_empty() && subset.ports.len() == 1 {
            subset.ports.first()
        } else {
            subset.ports.iter().find(|p| p.name == svc_port.name)
        };
        let Some(ep_port) = ep_port else { continue };
        let Ok(p) = u16::try_from(ep_port.port) else {
            continue;
        };
        for a in &subset.addresses {
            if let Ok(ip) = a.ip.parse::<std::net::IpAddr>() {
                candidates.push(SocketAddr::new(ip, p));
            }
        }
    }
    if candidates.is_empty() {
        return Err(no_endpoints());
    }
    let i = rand::random_range(0..candidates.len());
    Ok(candidates[i])
}

type PoolKey = (SocketAddr, String, TrustKey);

/// The client: TLS configurations per CA bundle and idle connections per server.
#[derive(Default)]
pub struct Outbound {
    tls: TlsConfigs,
    idle: Mutex<HashMap<PoolKey, Vec<SendRequest<Full<Bytes>>>>>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound").finish_non_exhaustive()
    }
}

impl Outbound {
    /// POSTs `body` (JSON) to `target` over TLS trusting only `ca_bundle`, with the
    /// `?timeout=` kube-apiserver adds; the answer's body when the status is 200.
    pub async fn post(
        &self,
        target: &Target,
        ca_bundle: &[u8],
        body: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        // A webhook's bundle must hold a certificate (an empty one trusts nothing).
        if ca_bundle.is_empty() {
            return Err(unparsable());
        }
        let (hash, tls) = self.tls.get(Trust::Bundle(ca_bundle))?;
        let query = format!("timeout={}s", timeout.as_secs().max(1));
        let url = format!("{}?{query}", target.url);
        let fail = |reason: String| CallError::Call {
            url: url.clone(),
            reason,
        };
        let key: PoolKey = (target.addr, target.server_name.clone(), hash);
        let path = format!("{}?{query}", target.path);
        let exchange = async {
            let mut sender = match self.idle_sender(&key).await {
                Some(s) => s,
                None => self.connect(target, tls).await.map_err(&fail)?,
            };
            let req = hyper::Request::post(path.as_str())
                .header(hyper::header::HOST, &target.server_name)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .header(hyper::header::ACCEPT, "application/json")
                .body(Full::new(body))
                .map_err(|e| fail(e.to_string()))?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| fail(e.to_string()))?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| fail(format!("reading the answer: {e}")))?
                .to_bytes();
            self.keep(key.clone(), sender);
            if status != hyper::StatusCode::OK {
                return Err(fail(format!(
                    "the server answered {} (only 200 is accepted; redirects are not followed)",
                    status.as_u16()
                )));
            }
            Ok(body)
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| Err(fail("context deadline exceeded".into())))
    }

    /// A kept connection that is still open, if any.
    async fn idle_sender(&self, key: &PoolKey) -> Option<SendRequest<Full<Bytes>>> {
        loop {
            let candidate = {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                idle.get_mut(key).and_then(Vec::pop)
            }?;
            let mut s = candidate;
            if !s.is_closed() && s.ready().await.is_ok() {
                return Some(s);
            }
        }
    }

    fn keep(&self, key: PoolKey, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(key).or_default();
        if list.len() < MAX_IDLE_PER_SERVER {
            list.push(sender);
        }
    }

    async fn connect(
        &self,
        target: &Target,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<SendRequest<Full<Bytes>>, String> {
        handshake(target.addr, &target.server_name, tls).await
    }
}

/// A new HTTP/1 connection to `addr` over TLS for `server_name` (its driver spawned).
async fn handshake<B>(
    addr: SocketAddr,
    server_name: &str,
    tls: Arc<rustls::ClientConfig>,
) -> Result<SendRequest<B>, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("dial tcp {addr}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| format!("server name {server_name:?}: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "extension server connection");
        }
    });
    Ok(sender)
}

/// kube-apiserver's message for a CA bundle that is not PEM.
fn unparsable() -> CallError {
    CallError::Client("unable to load root certificates: unable to parse bytes as PEM block".into())
}

/// What an aggregated API's server certificate is checked against.
#[derive(Debug, Clone, Copy)]
pub enum Trust<'a> {
    /// Exactly these PEM roots (an empty bundle trusts nothing: no system roots here).
    Bundle(&'a [u8]),
    /// Nothing checked (`insecureSkipTLSVerify`): the handshake's signatures are still
    /// verified, the certificate and its name are not.
    Insecure,
}

/// The client for aggregated APIs: TLS per trust, presenting the front-proxy client
/// certificate when there is one; each call on a connection of its own, its answer streamed.
pub struct ProxyClient {
    tls: TlsConfigs,
}

/// A trust's cache key: the CA bundle's hash, and whether nothing is verified.
type TrustKey = ([u8; 32], bool);

impl std::fmt::Debug for ProxyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyClient")
            .field(
                "client_certificate",
                &self
                    .tls
                    .identity
                    .read()
                    .map(|i| i.is_some())
                    .unwrap_or(false),
            )
            .finish_non_exhaustive()
    }
}

/// TLS client configurations by trust (cached), presenting a client certificate when one
/// is set; HTTP/1.1 only.
#[derive(Default)]
struct TlsConfigs {
    identity: std::sync::RwLock<Option<skiff_pki::Identity>>,
    cache: Mutex<HashMap<TrustKey, Arc<rustls::ClientConfig>>>,
}

impl TlsConfigs {
    fn set_identity(&self, identity: skiff_pki::Identity) {
        if let Ok(mut i) = self.identity.write() {
            *i = Some(identity);
        }
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn get(&self, trust: Trust<'_>) -> Result<(TrustKey, Arc<rustls::ClientConfig>), CallError> {
        use sha2::Digest;
        let key: TrustKey = match trust {
            Trust::Bundle(b) => (sha2::Sha256::digest(b).into(), false),
            Trust::Insecure => ([0; 32], true),
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.get(&key) {
            return Ok((key, Arc::clone(c)));
        }
        let client_err = |e: String| CallError::Client(e);
        let identity = self.identity.read().map(|i| i.clone()).unwrap_or(None);
        let mut config = match trust {
            Trust::Bundle(pem) if !pem.is_empty() => {
                let text = std::str::from_utf8(pem).map_err(|_| unparsable())?;
                let ders =
                    skiff_pki::pem_certificates(text, "the caBundle").map_err(|_| unparsable())?;
                if ders.is_empty() {
                    return Err(unparsable());
                }
                skiff_pki::tls::client_config(text, identity.as_ref())
                    .map_err(|e| client_err(e.to_string()))?
            }
            // No roots: nothing is trusted.
            Trust::Bundle(_) | Trust::Insecure => {
                let provider = skiff_pki::tls::provider();
                let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
                    .with_safe_default_protocol_versions()
                    .map_err(|e| client_err(e.to_string()))?;
                let builder = match trust {
                    Trust::Insecure => builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(AnyServer(provider))),
                    Trust::Bundle(_) => {
                        builder.with_root_certificates(rustls::RootCertStore::empty())
                    }
                };
                match &identity {
                    Some(id) => {
                        let certs =
                            skiff_pki::tls::certs(&id.cert_pem, "the proxy client certificate")
                                .map_err(|e| client_err(e.to_string()))?;
                        let key = skiff_pki::tls::key(&id.key_pem, "the proxy client key")
                            .map_err(|e| client_err(e.to_string()))?;
                        builder
                            .with_client_auth_cert(certs, key)
                            .map_err(|e| client_err(e.to_string()))?
                    }
                    None => builder.with_no_client_auth(),
                }
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        cache.insert(key, Arc::clone(&config));
        Ok((key, config))
    }
}

impl ProxyClient {
    /// A client presenting `identity` (the front-proxy client certificate), if any.
    pub fn new(identity: Option<skiff_pki::Identity>) -> ProxyClient {
        ProxyClient {
            tls: TlsConfigs {
                identity: std::sync::RwLock::new(identity),
                cache: Mutex::default(),
            },
        }
    }

    /// Presents `identity` from the next connection on (a renewed certificate).
    pub fn set_identity(&self, identity: skiff_pki::Identity) {
        self.tls.set_identity(identity);
    }

    /// The TLS configuration for `trust` (cached).
    pub fn tls_for(&self, trust: Trust<'_>) -> Result<Arc<rustls::ClientConfig>, CallError> {
        self.tls.get(trust).map(|(_, c)| c)
    }

    /// Sends `req` to `addr` over TLS for `server_name` on a new connection and returns the
    /// answer as soon as its headers arrived (its body streams from the connection, with no
    /// cap and no deadline). Connecting, TLS and the headers must come within `deadline`.
    pub async fn send<B>(
        &self,
        addr: SocketAddr,
        server_name: &str,
        tls: Arc<rustls::ClientConfig>,
        req: hyper::Request<B>,
        deadline: Duration,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let exchange = async {
            let mut sender = handshake(addr, server_name, tls).await?;
            sender.send_request(req).await.map_err(|e| e.to_string())
        };
        tokio::time::timeout(deadline, exchange)
            .await
            .unwrap_or_else(|_| Err("context deadline exceeded".into()))
    }
}

/// `insecureSkipTLSVerify`: any certificate for any name; the handshake's signatures are
/// verified with the provider's algorithms (so the peer still holds the key it presents).
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
