//! Skiff's API server: Kubernetes-style semantics for every resource type over one generic
//! code path, stored in a [`skiff_store::Store`] and served over gRPC (`skiff.rpc.Api`) and
//! the Kubernetes REST API on one port.
//!
//! A request's way through: `pipeline` (authentication, audit, impersonation, limits, then
//! the front end's authorization) → a front end (`rest` or `service`) → [`registry`]
//! (`Handler<T>` implements every verb once for every type) → [`admission`] (the one ordered
//! list of plug-ins) → [`strategy`] (per-kind defaulting and validation) → `stored` (the
//! store's keys and encoding); `cache` serves every watch from one store watch per type;
//! `status` writes every answer. A request to an aggregated group-version (an APIService with
//! a `service`) leaves the REST front end once authorized: [`aggregator`] proxies it to the
//! extension API server and it never reaches the registry.
//!
//! The modules are layered, lowest first; a module uses only its own layer and those below,
//! and no two modules use each other (checked by `cargo test -p xtask modules`):
//!
//! <!-- module-layers: checked by `cargo test -p xtask modules` -->
//! ```text
//! error, request, object                # leaf types: errors; who asks, for what, audit record; objects
//! validation, stored, status, audit     # names and metadata; store layout; answers; audit log
//! strategy                              # per-kind rules
//! outbound, conversion                  # calls to extension servers; conversion webhooks
//! custom                                # custom kinds and their objects
//! cache, encryption, admission::interface  # watch cache; at-rest transformer; what admission is
//! registry                              # every verb once for every kind
//! auth                                  # authenticators, authorizers (RBAC, Node), escalation
//! definitions, aggregator               # custom kinds served while their definitions live; aggregated APIs
//! admission                             # the plug-ins and their order
//! limits, pipeline                      # the handler chain
//! rest, service, kubernetes_service, serve  # front ends, the `kubernetes` Service, the listener
//! crate                                 # composition: `spawn`
//! ```
//!
//! The `skiff-apiserver` binary serves only TLS (`serve`'s accept loop; in-process servers
//! of tests and benchmarks may serve plain HTTP through it, with
//! [`ApiServerOptions::security`] unset). On first start it fills `--pki-dir`
//! ([`Security::bootstrap`], shared with the auth benchmark), renews due leaves on every start
//! and, while it runs ([`Renewal`], every `--cert-check-seconds`), swaps a renewed serving
//! certificate in for new handshakes. The serving chain includes the CA certificate, so that
//! `skiff-node join` can pin the CA by hash. The server talks to node agents as
//! `system:kube-apiserver`, with a client certificate made at start and kept in memory
//! ([`Security::agent_client`]).
//!
//! This crate is the only one that touches the Store. It runs no control loop (that is the
//! controllers' job), serves nothing but the public API, and uses `skiff-client` only to
//! reach node agents.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use skiff_apiserver::{ApiServerOptions, spawn};
//! use skiff_store::{EmbeddedOptions, EmbeddedStore};
//!
//! let store = Arc::new(EmbeddedStore::open(std::path::Path::new("/tmp/skiff.redb"), EmbeddedOptions::default())?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let server = spawn(store, listener, ApiServerOptions::default()).await?;
//! println!("serving on {}", server.endpoint());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{Namespace, ObjectMeta};
use skiff_api::rpc::api_server::ApiServer;
use skiff_store::{Store, StoreError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub mod admission;
pub mod aggregator;
pub mod audit;
pub mod auth;
mod cache;
mod conversion;
pub mod custom;
mod definitions;
pub mod encryption;
pub mod error;
pub mod kubernetes_service;
pub mod limits;
pub mod object;
mod outbound;
pub mod registry;
pub mod request;
mod rest;
mod stored;
pub use rest::AgentClient;
/// The REST request decoders for `cargo fuzz` (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub use rest::fuzzing;
mod pipeline;
mod serve;
mod service;
mod status;
pub mod strategy;
pub mod validation;

pub use error::{ApiError, FieldError, FieldErrorKind, REASON_KEY};
pub use registry::{FOREGROUND_FINALIZER, ORPHAN_FINALIZER};

/// The Services' clusterIP range when none is configured (the controller manager's default).
pub const DEFAULT_SERVICE_CLUSTER_IP_RANGE: skiff_cidr::Ipv4Cidr =
    skiff_cidr::Ipv4Cidr::from_octets([10, 96, 0, 0], 16);
/// Default capacity of each resource type's watch-cache event buffer.
pub const DEFAULT_WATCH_CACHE_CAPACITY: usize = 10_000;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ApiServerOptions {
    /// Events each resource type's watch cache keeps; a watch from an older revision gets
    /// `OutOfRange` ("too old resource version").
    pub watch_cache_capacity: usize,
    /// Namespaces created at start when missing (`default`, `kube-system`).
    pub bootstrap_namespaces: Vec<String>,
    /// How long [`ServerHandle::shutdown`] waits for open calls before aborting them.
    pub shutdown_timeout: Duration,
    /// TLS and authentication. `None` serves plain HTTP to anyone: only for in-process
    /// servers of tests and benchmarks; the `skiff-apiserver` binary always sets it.
    pub security: Option<Security>,
    /// The `kubernetes` Service in `default` and its Endpoints, kept in place while the
    /// server runs (the binary always sets it; `None` for in-process test servers).
    pub kubernetes_service: Option<kubernetes_service::KubernetesService>,
    /// The Services' clusterIP range: admission refuses clusterIPs outside it.
    pub service_cluster_ip_range: skiff_cidr::Ipv4Cidr,
    /// The pods' addresses (the controller manager's `--cluster-cidr`): no
    /// LoadBalancerIPPool may overlap them. `None`: not checked.
    pub cluster_cidr: Option<skiff_cidr::Ipv4Cidr>,
    /// Inflight and watch limits (with `security` only: they count per user).
    pub limits: limits::Limits,
    /// How long a client may take to send a request's headers (HTTP/1; slowloris): 32 s,
    /// kube-apiserver's `ReadHeaderTimeout`.
    pub header_read_timeout: Duration,
    /// A private directory (0700) where `GET /skiff/v1/snapshot` writes a snapshot before
    /// sending it (never the shared temporary directory); `None` refuses snapshots.
    pub snapshot_dir: Option<std::path::PathBuf>,
}

/// The user the API server is to node agents (the agents' `API_SERVER_USER`).
pub const AGENT_CLIENT_USER: &str = "system:kube-apiserver";

/// How the port is protected: TLS with this configuration, every request authenticated.
#[derive(Clone)]
pub struct Security {
    pub tls: Arc<rustls::ServerConfig>,
    pub authenticator: Arc<auth::Authenticator>,
    /// The audit log, if one is kept.
    pub audit: Option<audit::AuditLog>,
    /// Renews the PKI's due certificates while the server runs.
    pub renewal: Option<Renewal>,
    /// How the server speaks to node agents (logs, exec, port-forward, metrics).
    pub agent_client: Option<AgentClient>,
    /// The client certificate presented to aggregated API servers and what they are told
    /// to trust (`--proxy-client-cert-file` and the `--requestheader-*` flags); `None`:
    /// aggregated APIs are proxied without one.
    pub front_proxy: Option<aggregator::FrontProxy>,
}

/// Certificate renewal while the server runs: every `every`, the PKI is checked as at start
/// ([`skiff_pki::ClusterPki::ensure`]) and a renewed serving certificate is presented from
/// the next handshake on (connections already open keep theirs).
#[derive(Debug, Clone)]
pub struct Renewal {
    pub pki: skiff_pki::ClusterPki,
    pub options: skiff_pki::BootstrapOptions,
    pub serving: Arc<skiff_pki::tls::ServingCert>,
    pub every: Duration,
}

impl Renewal {
    /// Renews what is due; whether the serving certificate changed.
    pub fn check(&self) -> Result<bool, skiff_pki::PkiError> {
        let ensured = self.pki.ensure(&self.options)?;
        let crt = self.pki.path("apiserver.crt");
        if ensured.written.contains(&crt) {
            self.serving.replace(&ensured.serving_chain())?;
            info!(path = %crt.display(), "renewed the serving certificate");
            return Ok(true);
        }
        Ok(false)
    }

    async fn run(self) {
        loop {
            tokio::time::sleep(self.every).await;
            if let Err(e) = self.check() {
                warn!(error = %e, "certificate renewal failed; retrying at the next check");
            }
        }
    }
}

/// What [`Security::bootstrap`] needs.
#[derive(Debug, Clone, Default)]
pub struct SecurityOptions {
    /// The PKI directory (created on first use, renewed when due).
    pub pki_dir: std::path::PathBuf,
    /// The URL written into the kubeconfigs.
    pub server_url: String,
    /// Names and addresses the serving certificate must cover.
    pub sans: Vec<String>,
    /// kube-apiserver's static token file.
    pub token_auth_file: Option<std::path::PathBuf>,
    /// The audit log, if one is kept.
    pub audit: Option<audit::AuditOptions>,
    /// How often due certificates are renewed while running (default 1 h).
    pub renew_every: Option<Duration>,
}

/// Why [`Security::bootstrap`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("cannot set up the PKI in {dir}: {source}")]
    Pki {
        dir: String,
        #[source]
        source: skiff_pki::PkiError,
    },
    #[error(transparent)]
    Tokens(#[from] auth::TokenFileError),
    #[error("cannot open the audit log {path}: {source}")]
    Audit {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Security {
    /// The PKI made or renewed in `opts.pki_dir` (CA, serving certificate, kubeconfigs),
    /// TLS with client certificates of its CA, the token file, the audit log. Must run in a
    /// tokio runtime (the audit log's writer is a task).
    pub fn bootstrap(opts: &SecurityOptions) -> Result<Security, SecurityError> {
        let pki = skiff_pki::ClusterPki::new(&opts.pki_dir);
        let pki_err = |source| SecurityError::Pki {
            dir: opts.pki_dir.display().to_string(),
            source,
        };
        let ensured = pki
            .ensure(&skiff_pki::BootstrapOptions {
                server_url: opts.server_url.clone(),
                sans: opts.sans.clone(),
            })
            .map_err(pki_err)?;
        let serving =
            skiff_pki::tls::ServingCert::new(&ensured.serving_chain()).map_err(pki_err)?;
        let tls =
            skiff_pki::tls::server_config_with(Arc::clone(&serving), Some(ensured.ca.cert_pem()))
                .map_err(pki_err)?;
        let renewal = Renewal {
            pki: pki.clone(),
            options: skiff_pki::BootstrapOptions {
                server_url: opts.server_url.clone(),
                sans: opts.sans.clone(),
            },
            serving,
            every: opts.renew_every.unwrap_or(Duration::from_secs(3600)),
        };
        let tokens = match &opts.token_auth_file {
            Some(p) => auth::TokenFile::read(p)?,
            None => auth::TokenFile::default(),
        };
        let audit =
            match &opts.audit {
                Some(a) => Some(audit::AuditLog::start(a.clone()).map_err(|source| {
                    SecurityError::Audit {
                        path: a.path.display().to_string(),
                        source,
                    }
                })?),
                None => None,
            };
        info!(
            pki = %opts.pki_dir.display(),
            ca = %ensured.ca.hash().unwrap_or_default(),
            tokens = tokens.len(),
            admin_kubeconfig = %pki.admin_kubeconfig().display(),
            "TLS and authentication ready"
        );
        let agent_client = ensured
            .ca
            .issue(&skiff_pki::LeafSpec::client(AGENT_CLIENT_USER, &[]))
            .map_err(pki_err)?;
        Ok(Security {
            agent_client: Some(AgentClient {
                identity: Arc::new(agent_client),
                ca_pem: ensured.ca.cert_pem().into(),
                preferred_address_types: Arc::from(Vec::new()),
            }),
            tls: Arc::new(tls),
            authenticator: Arc::new(auth::Authenticator {
                client_ca_pem: Some(ensured.ca.cert_pem().to_string()),
                tokens,
                sa_key: Some(Arc::new(ensured.sa_key)),
                bootstrap: Default::default(),
            }),
            audit,
            renewal: Some(renewal),
            front_proxy: None,
        })
    }
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("authenticator", &self.authenticator)
            .finish_non_exhaustive()
    }
}

impl Default for ApiServerOptions {
    fn default() -> Self {
        ApiServerOptions {
            watch_cache_capacity: DEFAULT_WATCH_CACHE_CAPACITY,
            bootstrap_namespaces: vec![
                "default".into(),
                "kube-system".into(),
                "kube-node-lease".into(),
            ],
            shutdown_timeout: Duration::from_secs(5),
            security: None,
            kubernetes_service: None,
            service_cluster_ip_range: DEFAULT_SERVICE_CLUSTER_IP_RANGE,
            cluster_cidr: None,
            limits: limits::Limits::default(),
            header_read_timeout: Duration::from_secs(32),
            snapshot_dir: None,
        }
    }
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("cannot read the listener's address: {0}")]
    Listener(#[source] std::io::Error),
    #[error("cannot start the watch caches: {0}")]
    Store(#[from] StoreError),
    #[error("cannot create {object}: {source}")]
    Bootstrap {
        object: String,
        #[source]
        source: ApiError,
    },
    #[error("resource types without a handler: {0:?}")]
    MissingKinds(Vec<&'static str>),
    #[error("the server failed: {0}")]
    Serve(#[from] std::io::Error),
    #[error("the server task failed: {0}")]
    Task(String),
}

/// A running API server. Dropping it stops the server at once (aborting open calls);
/// [`ServerHandle::shutdown`] stops it gracefully.
pub struct ServerHandle {
    addr: SocketAddr,
    tls: bool,
    /// The certificate renewal task, stopped with the server.
    renewal: Option<JoinHandle<()>>,
    /// The `kubernetes` Service's reconciler, stopped with the server.
    kubernetes_service: Option<JoinHandle<()>>,
    /// The APIServices' availability loop, stopped with the server.
    aggregator: Option<JoinHandle<()>>,
    registry: Arc<registry::Registry>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    shutdown_timeout: Duration,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ServerHandle {
    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (`https://` with TLS), for `Client::connect`.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Store watches opened so far, over all resource types (one per type unless a store
    /// watch failed and was reopened).
    pub fn store_watches(&self) -> u64 {
        self.registry.store_watches().values().sum()
    }

    /// Store watches opened by one resource type's watch cache.
    pub fn store_watches_for(&self, resource: &str) -> Option<u64> {
        self.registry
            .handler(resource)
            .ok()
            .map(|h| h.store_watches())
    }

    /// Waits until the server stops on its own (it only does on a transport error).
    pub async fn wait(&mut self) -> Result<(), ApiServerError> {
        match self.task.as_mut() {
            None => Ok(()),
            Some(task) => {
                let r = task.await;
                self.task = None;
                match r {
                    Ok(r) => r.map_err(ApiServerError::from),
                    Err(e) => Err(ApiServerError::Task(e.to_string())),
                }
            }
        }
    }

    /// Stops accepting calls, ends every watch (with `Unavailable`), waits for open calls up
    /// to the shutdown timeout, then aborts what is left.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.registry.stop();
        if let Some(mut task) = self.task.take() {
            match tokio::time::timeout(self.shutdown_timeout, &mut task).await {
                Ok(Ok(Ok(()))) => info!(addr = %self.addr, "API server stopped"),
                Ok(Ok(Err(e))) => warn!(error = %e, "API server stopped with an error"),
                Ok(Err(e)) => warn!(error = %e, "API server task failed"),
                Err(_) => {
                    warn!("API server did not stop in time; aborting open calls");
                    task.abort();
                }
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        for task in [
            self.renewal.take(),
            self.kubernetes_service.take(),
            self.aggregator.take(),
        ]
        .into_iter()
        .flatten()
        {
            task.abort();
        }
        self.registry.stop();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Creates each of `objects` that does not exist yet (an existing one is left as it is).
async fn ensure<T: Resource>(
    registry: &registry::Registry,
    objects: Vec<T>,
) -> Result<(), ApiServerError> {
    let handler = registry
        .handler(T::INFO.plural)
        .map_err(|source| ApiServerError::Bootstrap {
            object: T::INFO.plural.to_string(),
            source,
        })?;
    for obj in objects {
        let name = obj.metadata().map(|m| m.name.clone()).unwrap_or_default();
        match handler
            .create(
                "",
                skiff_api::Encoded::proto(&obj),
                registry::WriteOptions::default(),
            )
            .await
        {
            Ok(_) => info!(kind = T::INFO.kind, %name, "created"),
            Err(ApiError::AlreadyExists { .. }) => {}
            Err(source) => {
                return Err(ApiServerError::Bootstrap {
                    object: format!("{} {name:?}", T::INFO.kind),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// The annotation with which an operator keeps a default ClusterRole as it is.
const AUTOUPDATE_ANNOTATION: &str = "rbac.authorization.kubernetes.io/autoupdate";

/// kube-apiserver's default-role reconciliation: a default ClusterRole that already exists
/// keeps what an operator added and gets the rules this server's default has and it lacks
/// (unless annotated `rbac.authorization.kubernetes.io/autoupdate: "false"`), so a cluster
/// started by an older server never leaves a component without a permission it now needs
/// (the controller manager's signers, say, which admission checks). Roles filled by
/// aggregation are the aggregation controller's.
async fn reconcile_default_roles(registry: &registry::Registry) -> Result<(), ApiServerError> {
    use prost::Message as _;
    use skiff_api::api::ClusterRole;
    let failed = |object: String, source: ApiError| ApiServerError::Bootstrap { object, source };
    let handler = registry
        .handler(ClusterRole::INFO.plural)
        .map_err(|e| failed(ClusterRole::INFO.plural.into(), e))?;
    for want in auth::policy::cluster_roles() {
        if want.aggregation_rule.is_some() {
            continue;
        }
        let name = want
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        for _ in 0..5 {
            let bytes = match handler.get("", &name).await {
                Ok(b) => b,
                Err(ApiError::NotFound { .. }) => break,
                Err(e) => return Err(failed(format!("ClusterRole {name:?}"), e)),
            };
            let mut have = ClusterRole::decode(bytes.as_slice()).map_err(|e| {
                failed(
                    format!("ClusterRole {name:?}"),
                    ApiError::Internal(e.to_string()),
                )
            })?;
            let kept = have
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.get(AUTOUPDATE_ANNOTATION))
                .is_some_and(|v| v == "false");
            let missing: Vec<_> = want
                .rules
                .iter()
                .filter(|r| !have.rules.contains(r))
                .cloned()
                .collect();
            if kept || missing.is_empty() {
                break;
            }
            have.rules.extend(missing);
            match handler
                .update(
                    "",
                    skiff_api::Encoded::proto(&have),
                    "",
                    registry::WriteOptions::default(),
                )
                .await
            {
                Ok(_) => {
                    info!(%name, "default ClusterRole given its missing rules");
                    break;
                }
                Err(ApiError::Conflict(_)) => continue,
                Err(e) => return Err(failed(format!("ClusterRole {name:?}"), e)),
            }
        }
    }
    Ok(())
}

/// Creates the bootstrap namespaces, the default RBAC policy and the local APIServices of
/// the built-in group-versions that do not exist yet.
async fn bootstrap(
    registry: &registry::Registry,
    namespaces: &[String],
) -> Result<(), ApiServerError> {
    let namespaces = namespaces
        .iter()
        .map(|name| Namespace {
            metadata: Some(ObjectMeta {
                name: name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    ensure(registry, namespaces).await?;
    ensure(registry, auth::policy::cluster_roles()).await?;
    reconcile_default_roles(registry).await?;
    ensure(registry, strategy::apiregistration::local_apiservices()).await?;
    ensure(registry, auth::policy::cluster_role_bindings()).await
}

/// Starts what authentication and authorization read from the store: the bootstrap tokens'
/// Secret mirror (on the first server of this `Security`) and the authorizer's mirrors.
async fn start_authorization(
    registry: &registry::Registry,
    security: &Security,
) -> Result<Arc<auth::authz::Authorizer>, error::ApiError> {
    if security.authenticator.bootstrap.get().is_none() {
        let tokens = auth::bootstrap::BootstrapTokens::start(registry).await?;
        let _ = security.authenticator.bootstrap.set(tokens);
    }
    auth::authz::Authorizer::start(registry).await
}

/// Bootstraps (default namespaces), starts watch caches and serves gRPC on `listener`.
pub async fn spawn(
    store: Arc<dyn Store>,
    listener: tokio::net::TcpListener,
    opts: ApiServerOptions,
) -> Result<ServerHandle, ApiServerError> {
    let addr = listener.local_addr().map_err(ApiServerError::Listener)?;
    let admission = Arc::new(admission::Chain::new(admission::Config {
        service_cluster_ip_range: Some(opts.service_cluster_ip_range),
        cluster_cidr: opts.cluster_cidr,
    }));
    let registry = Arc::new(
        registry::Registry::start(store, opts.watch_cache_capacity, admission.clone()).await?,
    );
    let missing = registry.missing_kinds();
    if !missing.is_empty() {
        registry.stop();
        return Err(ApiServerError::MissingKinds(missing));
    }
    if let Err(e) = bootstrap(&registry, &opts.bootstrap_namespaces).await {
        registry.stop();
        return Err(e);
    }
    if let Err(source) = admission.start_webhooks(&registry).await {
        registry.stop();
        return Err(ApiServerError::Bootstrap {
            object: "the admission webhook configurations".into(),
            source,
        });
    }
    if let Err(source) = definitions::start(&registry).await {
        registry.stop();
        return Err(ApiServerError::Bootstrap {
            object: "the custom kinds of the stored definitions".into(),
            source,
        });
    }
    let front_proxy = opts.security.as_ref().and_then(|s| s.front_proxy.clone());
    let aggregator =
        match aggregator::Aggregator::start(Arc::clone(&registry), front_proxy.as_ref()).await {
            Ok(a) => a,
            Err(source) => {
                registry.stop();
                return Err(ApiServerError::Bootstrap {
                    object: "the APIServices' mirrors".into(),
                    source,
                });
            }
        };
    if let Some(s) = &opts.security
        && let Err(source) = aggregator::publish_authentication(
            &registry,
            s.authenticator.client_ca_pem.as_deref(),
            front_proxy.as_ref(),
        )
        .await
    {
        registry.stop();
        return Err(ApiServerError::Bootstrap {
            object: format!(
                "the ConfigMap kube-system/{}",
                aggregator::AUTHENTICATION_CONFIGMAP
            ),
            source,
        });
    }
    // With authentication on, every request is authorized too (RBAC, the Node authorizer).
    let authorizer = match &opts.security {
        Some(s) => match start_authorization(&registry, s).await {
            Ok(a) => Some(a),
            Err(source) => {
                registry.stop();
                return Err(ApiServerError::Bootstrap {
                    object: "the authenticator's and authorizer's mirrors".into(),
                    source,
                });
            }
        },
        None => None,
    };
    if let Some(a) = &authorizer {
        admission.set_authorizer(Arc::clone(a));
    }
    let (tx, rx) = oneshot::channel::<()>();
    let service = ApiServer::new(service::ApiService::new(
        Arc::clone(&registry),
        authorizer.clone(),
    ))
    .max_decoding_message_size(limits::MAX_REQUEST_BYTES);
    // One port for both APIs: gRPC (`skiff.rpc.Api`, HTTP/2) for Skiff's own components and
    // the Kubernetes REST API (HTTP/1.1 or HTTP/2) for kubectl and client libraries.
    let sa_key = opts
        .security
        .as_ref()
        .and_then(|s| s.authenticator.sa_key.clone());
    let agent_client = opts.security.as_ref().and_then(|s| s.agent_client.clone());
    let mut app = rest::router(
        Arc::clone(&registry),
        authorizer.clone(),
        sa_key,
        agent_client,
        opts.snapshot_dir.clone(),
        Some(Arc::clone(&aggregator)),
    )
    .route_service(
        &format!(
            "/{}/{{*method}}",
            <ApiServer<service::ApiService> as tonic::server::NamedService>::NAME
        ),
        service,
    );
    let tls = opts.security.as_ref().map(|s| serve::TlsSetup {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::clone(&s.tls)),
        authn: Arc::clone(&s.authenticator),
    });
    if let Some(s) = &opts.security {
        app = pipeline::handler_chain(
            app,
            pipeline::Steps {
                authn: Arc::clone(&s.authenticator),
                authz: authorizer.clone(),
                audit: s.audit.clone(),
                throttle: Arc::default(),
                limits: opts.limits,
            },
        );
    }
    let renewal = opts
        .security
        .as_ref()
        .and_then(|s| s.renewal.clone())
        .map(|r| tokio::spawn(r.run()));
    let kubernetes_service = opts
        .kubernetes_service
        .map(|k| tokio::spawn(k.run(Arc::clone(&registry))));
    let availability = Some(aggregator.run());
    let task = tokio::spawn(serve::serve(
        listener,
        app,
        tls,
        opts.header_read_timeout,
        rx,
    ));
    info!(%addr, "API server listening");
    Ok(ServerHandle {
        addr,
        tls: opts.security.is_some(),
        renewal,
        kubernetes_service,
        aggregator: availability,
        registry,
        shutdown: Some(tx),
        task: Some(task),
        shutdown_timeout: opts.shutdown_timeout,
    })
}
