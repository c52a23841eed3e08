//! API aggregation, as kube-aggregator does it inside kube-apiserver: an
//! `apiregistration.k8s.io/v1` APIService with a `service` hands its group-version to an
//! extension API server behind that Service.
//!
//! - **Proxy** ([`Aggregator::proxy`]): a request under `/apis/<group>/<version>` that no local
//!   kind serves, after the whole pipeline (authentication, audit, impersonation, limits and
//!   authorization by the request's attributes, as for any request), goes to a ready endpoint
//!   of the Service (`crate::outbound`'s endpoint routing: the control machine runs no data
//!   plane) over TLS checked against the APIService's `caBundle` only, for the name
//!   `<service>.<namespace>.svc`, presenting the front-proxy client certificate. The caller's
//!   credentials never travel: `Authorization`, every `Impersonate-*` and every client-sent
//!   `X-Remote-*` header are dropped, then `X-Remote-User`, one `X-Remote-Group` per group
//!   and `X-Remote-Extra-<key>` are set from the authenticated (post-impersonation) user.
//!   The answer streams back unchanged (status, headers but hop-by-hop ones, body: watches
//!   and big lists are neither buffered nor capped); only connecting and the answer's headers
//!   have a deadline. A redirect is not forwarded (502). Connection upgrades are refused
//!   (400) before anything is dialled: no upgraded connection ever carries the API server's
//!   client certificate for a caller (the CVE-2018-1002105 class). An APIService that is not
//!   Available answers 503 `service unavailable`, as kube-aggregator does. The OpenAPI v3
//!   index lists each aggregated group-version whose discovery check passed, and its document
//!   (`/openapi/v3/apis/<group>/<version>`) is the server's, proxied the same way, so
//!   `kubectl explain` reads its kinds.
//! - **Availability** ([`Aggregator::run`]): one loop, woken by changes of APIServices,
//!   Services and Endpoints (mirrors of the registry) and every [`PROBE_EVERY`], writes each
//!   APIService's `Available` condition with kube-aggregator's reasons and messages (`Local`,
//!   `ServiceNotFound`, `ServicePortError`, `EndpointsNotFound`, `MissingEndpoints`,
//!   `FailedDiscoveryCheck`, `Passed`). Its discovery check GETs `/apis/<group>/<version>` as
//!   `system:kube-aggregator` in `system:masters` (kube-aggregator's identity) and keeps the
//!   `APIResourceList` it answered for discovery ([`Aggregator::remote_versions`]); a failed
//!   check keeps the last list, marked stale. A condition is written when its status or
//!   reason changes, or its message (one that differs only in the endpoint a failure names, at
//!   most every 30 s); rounds are at least half a second apart, so the loop's own writes
//!   cannot spin it.
//!   The same loop reads the front-proxy certificate again when its file changed (renewed).
//! - **Authentication for extension servers** ([`publish_authentication`]): the ConfigMap
//!   `kube-system/extension-apiserver-authentication` says which CA signs the front proxy's
//!   client certificate, which names it may have and which headers carry the user, as
//!   kube-apiserver publishes it, and the Role `extension-apiserver-authentication-reader`
//!   lets extension servers read it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prost::Message as _;
use serde_json::Value;
use skiff_api::Resource;
use skiff_api::api::{
    ApiService, ApiServiceCondition, ApiServiceStatus, ConfigMap, Endpoints, ObjectMeta,
    PolicyRule, Role, Service,
};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::auth::mirror::Mirror;
use crate::error::ApiError;
use crate::outbound::{ProxyClient, Trust};
use crate::registry::{Registry, WriteOptions};
use crate::request::UserInfo;

/// How often every APIService's server is checked when nothing changed (kube-aggregator
/// resyncs every 30 s; a few seconds here so a server that went away is noticed soon).
pub const PROBE_EVERY: Duration = Duration::from_secs(5);
/// The least time between two rounds of checks.
const MIN_ROUND_GAP: Duration = Duration::from_millis(500);
/// A condition whose status and reason stay is rewritten for a new message (another
/// endpoint's address in a failure, say) at most this often.
const MESSAGE_REFRESH: Duration = Duration::from_secs(30);
/// The discovery check's deadline (kube-aggregator's 5 s).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connecting and the answer's headers, for a proxied request (its body has none).
const PROXY_HEADERS_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest `APIResourceList` kept from a discovery check.
const MAX_DISCOVERY_BYTES: usize = 3 << 20;
/// The user of discovery checks (kube-aggregator's).
pub const AGGREGATOR_USER: &str = "system:kube-aggregator";

/// The headers that carry the user to an extension server (kube-apiserver's
/// `--requestheader-*-headers` defaults).
pub const USER_HEADER: &str = "X-Remote-User";
pub const GROUP_HEADER: &str = "X-Remote-Group";
pub const EXTRA_HEADER_PREFIX: &str = "X-Remote-Extra-";

/// The ConfigMap extension API servers read to trust the front proxy.
pub const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";

/// The front proxy's identity towards extension API servers (kube-apiserver's
/// `--proxy-client-*-file` and `--requestheader-*` flags).
#[derive(Clone)]
pub struct FrontProxy {
    /// The client certificate and key presented to extension servers.
    pub client: skiff_pki::Identity,
    /// The CA that signed it (`--requestheader-client-ca-file`).
    pub client_ca_pem: String,
    /// The names extension servers accept (`--requestheader-allowed-names`).
    pub allowed_names: Vec<String>,
    /// The files `client` was read from (certificate, key): read again when the certificate
    /// file changes (renewed), as kube-apiserver reloads them.
    pub files: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontProxy")
            .field("allowed_names", &self.allowed_names)
            .finish_non_exhaustive()
    }
}

/// What discovery lists of one aggregated group-version.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteVersion {
    pub group: String,
    pub version: String,
    pub group_priority_minimum: i32,
    pub version_priority: i32,
    /// The `resources` of the server's last `APIResourceList`; `None` before any answered.
    pub resources: Option<Vec<Value>>,
    /// Whether the last discovery check succeeded (aggregated discovery's `freshness`).
    pub fresh: bool,
}

/// What the last discovery check of an APIService found.
#[derive(Debug, Clone, Default)]
struct Discovered {
    resources: Option<Vec<Value>>,
    fresh: bool,
}

/// The aggregation layer (see the module docs).
pub struct Aggregator {
    registry: Arc<Registry>,
    apiservices: Arc<Mirror<ApiService>>,
    services: Arc<Mirror<Service>>,
    endpoints: Arc<Mirror<Endpoints>>,
    client: ProxyClient,
    discovered: RwLock<HashMap<String, Discovered>>,
    /// APIServices whose `insecureSkipTLSVerify` was logged (once each).
    warned_insecure: Mutex<HashSet<String>>,
    /// The front-proxy certificate's files and the certificate file's last modification seen.
    client_files: Option<(std::path::PathBuf, std::path::PathBuf)>,
    client_modified: Mutex<Option<std::time::SystemTime>>,
    /// When each APIService's condition was last written.
    written: Mutex<HashMap<String, std::time::Instant>>,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

/// Why a group-version cannot be proxied now: kube-aggregator's 503.
fn unavailable() -> Response {
    go_error(StatusCode::SERVICE_UNAVAILABLE, "service unavailable")
}

/// Go's `http.Error`: a plain-text line, as kube-aggregator answers its proxy errors.
fn go_error(code: StatusCode, message: &str) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{message}\n"),
    )
        .into_response()
}

impl Aggregator {
    /// Mirrors APIServices, Services and Endpoints; `front_proxy` is the client certificate
    /// presented to extension servers (without one they see an anonymous TLS client and most
    /// will refuse: said once in the log).
    pub async fn start(
        registry: Arc<Registry>,
        front_proxy: Option<&FrontProxy>,
    ) -> Result<Arc<Aggregator>, ApiError> {
        if front_proxy.is_none() {
            warn!(
                "no front-proxy client certificate (--proxy-client-cert-file): aggregated APIs \
                 are proxied without one, and extension servers that require it will refuse"
            );
        }
        Ok(Arc::new(Aggregator {
            apiservices: Mirror::start(&registry).await?,
            services: Mirror::start(&registry).await?,
            endpoints: Mirror::start(&registry).await?,
            registry,
            client: ProxyClient::new(front_proxy.map(|f| f.client.clone())),
            discovered: RwLock::default(),
            warned_insecure: Mutex::default(),
            client_modified: Mutex::new(
                front_proxy
                    .and_then(|f| f.files.as_ref())
                    .and_then(|(cert, _)| modified(cert)),
            ),
            client_files: front_proxy.and_then(|f| f.files.clone()),
            written: Mutex::default(),
        }))
    }

    /// Reads the front-proxy certificate again if its file changed since it was last read.
    fn reload_client_certificate(&self) {
        let Some((cert, key)) = &self.client_files else {
            return;
        };
        let now = modified(cert);
        let Ok(mut seen) = self.client_modified.lock() else {
            return;
        };
        if now.is_none() || now == *seen {
            return;
        }
        match (std::fs::read_to_string(cert), std::fs::read_to_string(key)) {
            (Ok(cert_pem), Ok(key_pem)) => {
                self.client
                    .set_identity(skiff_pki::Identity { cert_pem, key_pem });
                *seen = now;
                info!(path = %cert.display(), "front-proxy client certificate reloaded");
            }
            (Err(e), _) | (_, Err(e)) => {
                warn!(error = %e, "cannot read the renewed front-proxy client certificate")
            }
        }
    }

    /// The APIService with a `service` for `group`/`version`, if any (the caller has checked
    /// that no local kind serves it).
    pub fn route(&self, group: &str, version: &str) -> Option<Arc<ApiService>> {
        self.apiservices
            .get("", &format!("{version}.{group}"))
            .filter(|a| a.spec.as_ref().is_some_and(|s| s.service.is_some()))
    }

    /// The groups of service-backed APIServices, for `/apis/<group>`.
    pub fn has_group(&self, group: &str) -> bool {
        self.remote_versions().iter().any(|v| v.group == group)
    }

    /// Every service-backed group-version with what its server's discovery said.
    pub fn remote_versions(&self) -> Vec<RemoteVersion> {
        let discovered = self
            .discovered
            .read()
            .map(|d| d.clone())
            .unwrap_or_default();
        let mut out: Vec<RemoteVersion> = self
            .apiservices
            .filter(|a| a.spec.as_ref().is_some_and(|s| s.service.is_some()))
            .into_iter()
            .map(|a| {
                let spec = a.spec.clone().unwrap_or_default();
                let d = discovered.get(a.name()).cloned().unwrap_or_default();
                RemoteVersion {
                    group: spec.group,
                    version: spec.version,
                    group_priority_minimum: spec.group_priority_minimum,
                    version_priority: spec.version_priority,
                    resources: d.resources,
                    fresh: d.fresh,
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.group, &a.version).cmp(&(&b.group, &b.version)));
        out
    }

    /// Sends the request to the APIService's server and streams its answer back (see the
    /// module docs). `user` is the authenticated, impersonated user (`None` only on
    /// in-process servers without authentication).
    pub async fn proxy(
        &self,
        api: &ApiService,
        parts: axum::http::request::Parts,
        body: Body,
        user: Option<&UserInfo>,
    ) -> Response {
        if is_upgrade(&parts.headers) {
            let (code, body) = crate::status::plain(
                400,
                "BadRequest",
                "connection upgrades are not proxied to aggregated APIs",
            );
            return crate::status::respond_json(code, &body);
        }
        if !is_available(api) {
            return unavailable();
        }
        let spec = api.spec.clone().unwrap_or_default();
        let Some(svc_ref) = spec.service.as_ref() else {
            return unavailable();
        };
        let port = svc_ref
            .port
            .unwrap_or(crate::strategy::apiregistration::DEFAULT_PORT);
        let Some(svc) = self.services.get(&svc_ref.namespace, &svc_ref.name) else {
            return unavailable();
        };
        let endpoints = self.endpoints.get(&svc_ref.namespace, &svc_ref.name);
        let addr = match crate::outbound::pick_endpoint(&svc, endpoints.as_deref(), port) {
            Ok(a) => a,
            Err(e) => {
                debug!(apiservice = api.name(), error = %e, "cannot resolve the service");
                return unavailable();
            }
        };
        let tls = match self.tls(api) {
            Ok(t) => t,
            Err(e) => return go_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let mut req = match hyper::Request::builder()
            .method(parts.method.clone())
            .uri(path_and_query)
            .body(body)
        {
            Ok(r) => r,
            Err(e) => return go_error(StatusCode::BAD_REQUEST, &e.to_string()),
        };
        *req.headers_mut() = forwarded_headers(&parts.headers, user);
        if let Ok(host) = HeaderValue::from_str(&addr.to_string()) {
            req.headers_mut().insert(header::HOST, host);
        }
        let server_name = format!("{}.{}.svc", svc_ref.name, svc_ref.namespace);
        let resp = match self
            .client
            .send(addr, &server_name, tls, req, PROXY_HEADERS_TIMEOUT)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                debug!(apiservice = api.name(), error = %e, "proxying failed");
                return go_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("error trying to reach service: {e}"),
                );
            }
        };
        if resp.status().is_redirection() {
            return go_error(
                StatusCode::BAD_GATEWAY,
                "the backend attempted to redirect this request, which is not permitted",
            );
        }
        let (rparts, incoming) = resp.into_parts();
        let mut out = Response::new(Body::new(incoming));
        *out.status_mut() = rparts.status;
        *out.headers_mut() = strip_hop_by_hop(&rparts.headers);
        out
    }

    /// The TLS configuration of an APIService (warning once about `insecureSkipTLSVerify`).
    fn tls(
        &self,
        api: &ApiService,
    ) -> Result<Arc<rustls::ClientConfig>, crate::outbound::CallError> {
        let spec = api.spec.as_ref();
        let insecure = spec.is_some_and(|s| s.insecure_skip_tls_verify);
        if insecure {
            let first = self
                .warned_insecure
                .lock()
                .map(|mut w| w.insert(api.name().to_string()))
                .unwrap_or(false);
            if first {
                warn!(
                    apiservice = api.name(),
                    "insecureSkipTLSVerify: the extension server's certificate is not verified"
                );
            }
            return self.client.tls_for(Trust::Insecure);
        }
        self.client.tls_for(Trust::Bundle(
            spec.map_or(&[][..], |s| s.ca_bundle.as_slice()),
        ))
    }

    /// The availability loop until the aggregator is dropped (see the module docs).
    pub fn run(self: &Arc<Self>) -> JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let mut changes = [
            self.apiservices.changes(),
            self.services.changes(),
            self.endpoints.changes(),
        ];
        tokio::spawn(async move {
            loop {
                let Some(me) = weak.upgrade() else { return };
                me.reload_client_certificate();
                me.check_all().await;
                drop(me);
                let [a, s, e] = &mut changes;
                tokio::select! {
                    _ = a.changed() => {}
                    _ = s.changed() => {}
                    _ = e.changed() => {}
                    _ = tokio::time::sleep(PROBE_EVERY) => {}
                }
                // Let a burst of changes land before checking again (and at most two rounds
                // a second: the loop's own status writes wake it too).
                tokio::time::sleep(MIN_ROUND_GAP).await;
                for c in &mut changes {
                    c.mark_unchanged();
                }
                if weak.strong_count() == 0 {
                    return;
                }
            }
        })
    }

    /// Checks every APIService and writes the conditions that changed.
    async fn check_all(self: &Arc<Self>) {
        let all = self.apiservices.filter(|_| true);
        let names: HashSet<String> = all.iter().map(|a| a.name().to_string()).collect();
        if let Ok(mut d) = self.discovered.write() {
            d.retain(|k, _| names.contains(k));
        }
        if let Ok(mut w) = self.written.lock() {
            w.retain(|k, _| names.contains(k));
        }
        let checks = all.into_iter().map(|api| {
            let me = Arc::clone(self);
            async move {
                let cond = me.check(&api).await;
                if cond.status != "True" {
                    // What discovery keeps of the server is stale now.
                    me.note_discovery(api.name(), None);
                }
                me.write_condition(&api, cond).await;
            }
        });
        futures::future::join_all(checks).await;
    }

    /// kube-aggregator's availability check of one APIService.
    async fn check(&self, api: &ApiService) -> ApiServiceCondition {
        let spec = api.spec.clone().unwrap_or_default();
        let Some(r) = &spec.service else {
            return condition("True", "Local", "Local APIServices are always available");
        };
        let (ns, name) = (&r.namespace, &r.name);
        let port = r
            .port
            .unwrap_or(crate::strategy::apiregistration::DEFAULT_PORT);
        let Some(svc) = self.services.get(ns, name) else {
            return condition(
                "False",
                "ServiceNotFound",
                &format!("service/{name} in {ns:?} is not present"),
            );
        };
        let svc_spec = svc.spec.clone().unwrap_or_default();
        if matches!(svc_spec.r#type.as_str(), "" | "ClusterIP") {
            let Some(sp) = svc_spec.ports.iter().find(|p| p.port == port) else {
                return condition(
                    "False",
                    "ServicePortError",
                    &format!("service/{name} in {ns:?} is not listening on port {port}"),
                );
            };
            let Some(eps) = self.endpoints.get(ns, name) else {
                return condition(
                    "False",
                    "EndpointsNotFound",
                    &format!("cannot find endpoints for service/{name} in {ns:?}"),
                );
            };
            let ready = eps.subsets.iter().any(|s| {
                !s.addresses.is_empty()
                    && s.ports
                        .iter()
                        .any(|p| p.name == sp.name || (sp.name.is_empty() && s.ports.len() == 1))
            });
            if !ready {
                return condition(
                    "False",
                    "MissingEndpoints",
                    &format!(
                        "endpoints for service/{name} in {ns:?} have no addresses with port name {:?}",
                        sp.name
                    ),
                );
            }
        }
        match self.discover(api, &svc, port).await {
            Ok(resources) => {
                self.note_discovery(api.name(), Some(resources));
                condition("True", "Passed", "all checks passed")
            }
            Err(message) => condition("False", "FailedDiscoveryCheck", &message),
        }
    }

    fn note_discovery(&self, name: &str, resources: Option<Vec<Value>>) {
        if let Ok(mut d) = self.discovered.write() {
            let entry = d.entry(name.to_string()).or_default();
            entry.fresh = resources.is_some();
            if resources.is_some() {
                entry.resources = resources;
            }
        }
    }

    /// The discovery check: GET `/apis/<group>/<version>` of a ready endpoint as
    /// `system:kube-aggregator`; the `resources` of the `APIResourceList` it answers, or
    /// kube-aggregator's message.
    async fn discover(
        &self,
        api: &ApiService,
        svc: &Service,
        port: i32,
    ) -> Result<Vec<Value>, String> {
        let spec = api.spec.clone().unwrap_or_default();
        let path = format!("/apis/{}/{}", spec.group, spec.version);
        let endpoints = spec
            .service
            .as_ref()
            .and_then(|r| self.endpoints.get(&r.namespace, &r.name));
        let addr =
            crate::outbound::pick_endpoint(svc, endpoints.as_deref(), port).map_err(|e| {
                let reason = match e {
                    crate::outbound::CallError::Resolve(m)
                    | crate::outbound::CallError::Client(m) => m,
                    other => other.to_string(),
                };
                format!(
                    "failing or missing response for service/{}: {reason}",
                    svc.name()
                )
            })?;
        let url = format!("https://{addr}{path}");
        let failing =
            |e: String| format!("failing or missing response from {url}: Get {url:?}: {e}");
        let tls = self.tls(api).map_err(|e| failing(e.to_string()))?;
        let r = svc_name(api);
        let mut req = hyper::Request::get(path.as_str())
            .header(header::HOST, addr.to_string())
            .header(header::ACCEPT, "application/json")
            .header(USER_HEADER, AGGREGATOR_USER)
            .header(GROUP_HEADER, skiff_pki::bootstrap::MASTERS_GROUP)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| failing(e.to_string()))?;
        req.headers_mut().insert(
            header::USER_AGENT,
            HeaderValue::from_static("skiff-apiserver"),
        );
        let exchange = async {
            let resp = self
                .client
                .send(addr, &r, tls, req, PROBE_TIMEOUT)
                .await
                .map_err(failing)?;
            let status = resp.status();
            if !status.is_success() {
                return Err(format!("bad status from {url}: {}", status.as_u16()));
            }
            use http_body_util::BodyExt as _;
            let body = http_body_util::Limited::new(resp.into_body(), MAX_DISCOVERY_BYTES)
                .collect()
                .await
                .map_err(|e| failing(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok(body)
        };
        let body = tokio::time::timeout(PROBE_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| Err(format!("timed out waiting for {url}")))?;
        let list: Value = serde_json::from_slice(&body)
            .map_err(|e| failing(format!("the answer is not an APIResourceList: {e}")))?;
        Ok(list["resources"].as_array().cloned().unwrap_or_default())
    }

    /// Writes `cond` as the APIService's `Available` condition when it differs (the
    /// transition time kept unless the status changed).
    async fn write_condition(&self, api: &ApiService, mut cond: ApiServiceCondition) {
        let old = api
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Available"));
        if let Some(old) = old {
            let same = old.status == cond.status && old.reason == cond.reason;
            let recently = self
                .written
                .lock()
                .ok()
                .and_then(|w| w.get(api.name()).map(|t| t.elapsed() < MESSAGE_REFRESH))
                .unwrap_or(false);
            let moved = without_addresses(&old.message) == without_addresses(&cond.message);
            if same && (old.message == cond.message || (moved && recently)) {
                return;
            }
            if old.status == cond.status {
                cond.last_transition_time = old.last_transition_time.clone();
            }
        }
        if let Ok(mut w) = self.written.lock() {
            w.insert(api.name().to_string(), std::time::Instant::now());
        }
        info!(
            apiservice = api.name(),
            status = %cond.status,
            reason = %cond.reason,
            message = %cond.message,
            "changing APIService availability"
        );
        let mut next = api.clone();
        let status = next.status.get_or_insert_with(ApiServiceStatus::default);
        status.conditions.retain(|c| c.r#type != "Available");
        status.conditions.push(cond);
        let result = match self.registry.handler(ApiService::INFO.plural) {
            Ok(h) => {
                h.update(
                    "",
                    skiff_api::Encoded::proto(&next),
                    "status",
                    WriteOptions::default(),
                )
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            // A conflict or a deleted object: the mirror's next event brings the news.
            debug!(apiservice = api.name(), error = %e, "cannot write the APIService's status");
        }
    }
}

/// A message with every `IPv4:port` replaced by `*`: the same failure at another endpoint
/// reads the same.
fn without_addresses(message: &str) -> String {
    let mut out = String::new();
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        // A sentence's `:` or `.` may follow the address.
        let core = token.trim_end_matches([':', '.']);
        if core.parse::<std::net::SocketAddr>().is_ok() {
            out.push('*');
            out.push_str(&token[core.len()..]);
        } else {
            out.push_str(token);
        }
        token.clear();
    };
    for c in message.chars() {
        if c.is_ascii_digit() || c == '.' || c == ':' {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out
}

/// A file's last modification time.
fn modified(path: &std::path::Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The server name an APIService's certificate must carry.
fn svc_name(api: &ApiService) -> String {
    api.spec
        .as_ref()
        .and_then(|s| s.service.as_ref())
        .map(|r| format!("{}.{}.svc", r.name, r.namespace))
        .unwrap_or_default()
}

fn condition(status: &str, reason: &str, message: &str) -> ApiServiceCondition {
    ApiServiceCondition {
        r#type: "Available".into(),
        status: status.into(),
        last_transition_time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        reason: reason.into(),
        message: message.into(),
    }
}

/// Whether the APIService's `Available` condition is True.
pub fn is_available(api: &ApiService) -> bool {
    api.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == "Available" && c.status == "True")
    })
}

/// Whether a request asks to upgrade its connection (WebSocket, SPDY: exec-style streams).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        || headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Headers that concern one connection only (RFC 9110 §7.6.1), and those a `Connection`
/// header names.
fn hop_by_hop(headers: &HeaderMap) -> HashSet<HeaderName> {
    let mut out: HashSet<HeaderName> = [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
        header::TRAILER,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ]
    .into_iter()
    .collect();
    for v in headers.get_all(header::CONNECTION) {
        for t in v.to_str().unwrap_or("").split(',') {
            if let Ok(n) = HeaderName::from_bytes(t.trim().as_bytes()) {
                out.insert(n);
            }
        }
    }
    out
}

fn strip_hop_by_hop(headers: &HeaderMap) -> HeaderMap {
    let drop = hop_by_hop(headers);
    let mut out = HeaderMap::new();
    for (k, v) in headers {
        if !drop.contains(k) {
            out.append(k.clone(), v.clone());
        }
    }
    out
}

/// Whether a client-sent header could speak for a user: credentials, impersonation and the
/// front proxy's own user headers (case-insensitive; header names are lower case here).
fn carries_identity(name: &HeaderName) -> bool {
    let n = name.as_str();
    name == header::AUTHORIZATION || n.starts_with("impersonate-") || n.starts_with("x-remote-")
}

/// The headers sent to an extension server: the client's, without hop-by-hop ones, `Host`
/// and anything that carries an identity; then the user's `X-Remote-*` headers
/// (client-go's `SetAuthProxyHeaders`).
pub fn forwarded_headers(client: &HeaderMap, user: Option<&UserInfo>) -> HeaderMap {
    let mut out = strip_hop_by_hop(client);
    out.remove(header::HOST);
    let names: Vec<HeaderName> = out
        .keys()
        .filter(|k| carries_identity(k))
        .cloned()
        .collect();
    for n in names {
        out.remove(n);
    }
    let Some(user) = user else { return out };
    let mut set = |name: String, value: &str| {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            out.append(n, v);
        }
    };
    set(USER_HEADER.to_string(), &user.name);
    for g in &user.groups {
        set(GROUP_HEADER.to_string(), g);
    }
    for (key, values) in &user.extra {
        for v in values {
            set(format!("{EXTRA_HEADER_PREFIX}{}", escape_extra_key(key)), v);
        }
    }
    out
}

/// client-go's `headerKeyEscape`: an extra key percent-encoded so it is a header name (and
/// `%` itself encoded), which extension servers decode.
fn escape_extra_key(key: &str) -> String {
    let legal = |b: u8| b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b);
    let mut out = String::new();
    for b in key.bytes() {
        if legal(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `/apis/<group>/<version>` or below: the group-version a path addresses.
pub fn group_version_of(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/apis/")?;
    let mut it = rest.splitn(3, '/');
    let group = it.next().filter(|g| !g.is_empty())?;
    let version = it.next().filter(|v| !v.is_empty())?;
    Some((group, version))
}

/// Publishes what extension API servers need to trust the front proxy, as kube-apiserver
/// does: the ConfigMap `kube-system/extension-apiserver-authentication` (the client CA, and
/// with a front proxy its CA, allowed names and headers), kept current at every start, and
/// the Role that lets them read it.
pub async fn publish_authentication(
    registry: &Registry,
    client_ca_pem: Option<&str>,
    front_proxy: Option<&FrontProxy>,
) -> Result<(), ApiError> {
    let mut data = BTreeMap::new();
    if let Some(ca) = client_ca_pem {
        data.insert("client-ca-file".to_string(), ca.to_string());
    }
    if let Some(fp) = front_proxy {
        let list = |v: &[&str]| serde_json::to_string(v).unwrap_or_default();
        let names: Vec<&str> = fp.allowed_names.iter().map(String::as_str).collect();
        data.insert(
            "requestheader-client-ca-file".into(),
            fp.client_ca_pem.clone(),
        );
        data.insert("requestheader-allowed-names".into(), list(&names));
        data.insert(
            "requestheader-username-headers".into(),
            list(&[USER_HEADER]),
        );
        data.insert("requestheader-group-headers".into(), list(&[GROUP_HEADER]));
        data.insert(
            "requestheader-extra-headers-prefix".into(),
            list(&[EXTRA_HEADER_PREFIX]),
        );
    }
    let meta = |name: &str| ObjectMeta {
        name: name.into(),
        namespace: "kube-system".into(),
        ..Default::default()
    };
    let cm = ConfigMap {
        metadata: Some(meta(AUTHENTICATION_CONFIGMAP)),
        data: data.clone(),
        ..Default::default()
    };
    let handler = registry.handler(ConfigMap::INFO.plural)?;
    match handler.get("kube-system", AUTHENTICATION_CONFIGMAP).await {
        Ok(bytes) => {
            let mut have = ConfigMap::decode(bytes.as_slice())
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            if have.data != data {
                have.data = data;
                handler
                    .update(
                        "kube-system",
                        skiff_api::Encoded::proto(&have),
                        "",
                        WriteOptions::default(),
                    )
                    .await?;
            }
        }
        Err(ApiError::NotFound { .. }) => {
            handler
                .create(
                    "kube-system",
                    skiff_api::Encoded::proto(&cm),
                    WriteOptions::default(),
                )
                .await?;
        }
        Err(e) => return Err(e),
    }
    let role = Role {
        metadata: Some(meta("extension-apiserver-authentication-reader")),
        rules: vec![PolicyRule {
            api_groups: vec![String::new()],
            resources: vec!["configmaps".into()],
            resource_names: vec![AUTHENTICATION_CONFIGMAP.into()],
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    match registry
        .handler(Role::INFO.plural)?
        .create(
            "kube-system",
            skiff_api::Encoded::proto(&role),
            WriteOptions::default(),
        )
        .await
    {
        Ok(_) | Err(ApiError::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn all<'a>(h: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn a_hostile_client_cannot_speak_for_anyone() {
        let client = headers(&[
            ("Authorization", "Bearer secret-token"),
            ("X-Remote-User", "system:admin"),
            ("x-remote-group", "system:masters"),
            ("X-Remote-Extra-Scopes", "all"),
            ("Impersonate-User", "system:admin"),
            ("Impersonate-Group", "system:masters"),
            ("Impersonate-Extra-Scopes", "all"),
            ("Proxy-Authorization", "Basic x"),
            ("Connection", "close, X-Secret-Hop"),
            ("X-Secret-Hop", "1"),
            ("Host", "apiserver"),
            ("Accept", "application/json"),
            ("User-Agent", "kubectl"),
        ]);
        let mut extra = BTreeMap::new();
        extra.insert(
            "scopes.example.com/a b".to_string(),
            vec!["x".to_string(), "y".to_string()],
        );
        let user = UserInfo {
            name: "alice".into(),
            uid: "u-1".into(),
            groups: vec!["dev".into(), "system:authenticated".into()],
            extra,
        };
        let out = forwarded_headers(&client, Some(&user));
        assert_eq!(all(&out, "x-remote-user"), ["alice"]);
        assert_eq!(all(&out, "x-remote-group"), ["dev", "system:authenticated"]);
        assert_eq!(
            all(&out, "x-remote-extra-scopes.example.com%2Fa%20b"),
            ["x", "y"]
        );
        for gone in [
            "authorization",
            "x-remote-extra-scopes",
            "impersonate-user",
            "impersonate-group",
            "impersonate-extra-scopes",
            "proxy-authorization",
            "connection",
            "x-secret-hop",
            "host",
        ] {
            assert!(!out.contains_key(gone), "{gone} forwarded: {out:?}");
        }
        assert_eq!(all(&out, "accept"), ["application/json"]);
        assert_eq!(all(&out, "user-agent"), ["kubectl"]);
        // Without a user nothing speaks for one.
        let anonymous = forwarded_headers(&client, None);
        assert!(!anonymous.keys().any(carries_identity), "{anonymous:?}");
    }

    #[test]
    fn upgrades_are_recognised() {
        assert!(is_upgrade(&headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket")
        ])));
        assert!(is_upgrade(&headers(&[(
            "Connection",
            "keep-alive, upgrade"
        )])));
        assert!(is_upgrade(&headers(&[("Upgrade", "SPDY/3.1")])));
        assert!(!is_upgrade(&headers(&[("Connection", "keep-alive")])));
    }

    #[test]
    fn paths_name_their_group_version() {
        assert_eq!(
            group_version_of("/apis/wardle.example.com/v1alpha1"),
            Some(("wardle.example.com", "v1alpha1"))
        );
        assert_eq!(
            group_version_of("/apis/wardle.example.com/v1alpha1/namespaces/a/flunders/b"),
            Some(("wardle.example.com", "v1alpha1"))
        );
        assert_eq!(group_version_of("/apis/wardle.example.com"), None);
        assert_eq!(group_version_of("/apis/wardle.example.com/"), None);
        assert_eq!(group_version_of("/api/v1/pods"), None);
    }

    #[test]
    fn the_same_failure_at_another_endpoint_reads_the_same() {
        let at = |a: &str| {
            format!(
                "failing or missing response from https://{a}/apis/x/v1: Get \"https://{a}/apis/x/v1\": dial tcp {a}: refused"
            )
        };
        assert_eq!(
            without_addresses(&at("10.244.0.2:8443")),
            without_addresses(&at("10.244.1.7:8443"))
        );
        assert_ne!(
            without_addresses(&at("10.244.0.2:8443")),
            without_addresses(
                "failing or missing response from https://10.244.0.2:8443/apis/x/v1: tls: invalid peer certificate"
            )
        );
        assert_eq!(without_addresses("all checks passed"), "all checks passed");
    }

    #[test]
    fn availability_reads_the_condition() {
        let mut api = ApiService::default();
        assert!(!is_available(&api));
        api.status = Some(ApiServiceStatus {
            conditions: vec![condition("False", "MissingEndpoints", "x")],
        });
        assert!(!is_available(&api));
        api.status = Some(ApiServiceStatus {
            conditions: vec![condition("True", "Passed", "all checks passed")],
        });
        assert!(is_available(&api));
    }
}
