//! The connection to the API server, the typed [`Api`] and the [`DynamicApi`].

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryFutureExt, TryStreamExt};
use prost::Message;
use skiff_api::api::{Binding, ObjectMeta, ObjectReference, Pod};
use skiff_api::rpc::{self, api_client::ApiClient};
use skiff_api::{DynKind, Resource};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::config::ClientConfig;
use crate::error::ClientError;
use crate::failover::Failover;

/// Adds the configured bearer token to every call (nothing without one).
#[derive(Clone, Default)]
pub struct Credentials {
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.authorization.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.authorization {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Rpc = ApiClient<InterceptedService<Failover, Credentials>>;

/// Largest message the client accepts (big lists).
const MAX_MESSAGE: usize = 256 * 1024 * 1024;
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the API server (or to several, failing over between them: see
/// [`ClientConfig`]). Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Client {
    rpc: Rpc,
    servers: Failover,
    /// How it connects (CA, client certificate or token): also used for the REST calls
    /// gRPC does not carry (TokenRequest) and, its certificate, toward node agents.
    config: Arc<ClientConfig>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.endpoint())
            .finish()
    }
}

/// `server` with a scheme: none means `http://`.
pub(crate) fn url_of(server: &str) -> String {
    if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    }
}

/// The URL and tonic endpoint of `server` as `config` says to connect (TLS trusting its CA,
/// its client certificate; SNI and verification for the URL's host unless
/// `tls_server_name` is set).
fn endpoint_of(config: &ClientConfig, server: &str) -> Result<(String, Endpoint), ClientError> {
    let url = url_of(server);
    let invalid = |reason: String| ClientError::InvalidEndpoint {
        endpoint: server.to_string(),
        reason,
    };
    let mut ep = Endpoint::from_shared(url.clone())
        .map_err(|e| invalid(crate::error::transport_reason(&e)))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if url.starts_with("https://") {
        let ca = config.ca_pem.as_deref().ok_or_else(|| {
            invalid(
                "no CA to verify the server with: give a kubeconfig with \
                 certificate-authority(-data) (--kubeconfig or $SKIFF_CONFIG)"
                    .into(),
            )
        })?;
        let mut tls =
            ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca));
        if let Some(id) = &config.identity {
            tls = tls.identity(tonic::transport::Identity::from_pem(
                &id.cert_pem,
                &id.key_pem,
            ));
        }
        if let Some(name) = &config.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        ep = ep
            .tls_config(tls)
            .map_err(|e| invalid(crate::error::transport_reason(&e)))?;
    }
    Ok((url, ep))
}

/// The bearer token header of `config`, if it has a token.
fn credentials_of(config: &ClientConfig) -> Result<Credentials, ClientError> {
    let authorization = match &config.token {
        Some(t) => {
            Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| ClientError::InvalidEndpoint {
                        endpoint: config.server.clone(),
                        reason: "the token is not a valid header value".into(),
                    })?,
            )
        }
        None => None,
    };
    Ok(Credentials { authorization })
}

/// Every server of `config` with its tonic endpoint, checked.
fn endpoints_of(config: &ClientConfig) -> Result<Vec<(String, Endpoint)>, ClientError> {
    let servers = config.endpoints();
    if servers.len() > 1 {
        crate::config::check_servers(&servers)?;
    }
    servers.iter().map(|s| endpoint_of(config, s)).collect()
}

/// What a SubjectAccessReview asks about (its `spec.resourceAttributes`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ResourceAttributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Client {
    /// Connects to the API server at `endpoint` without credentials (`http://127.0.0.1:7443`;
    /// a missing scheme means `http://`): for in-process plain-HTTP servers. Fails with
    /// [`ClientError::Unreachable`] if nothing answers. A comma-separated list of URLs fails
    /// over between them as [`Client::connect_with`] does.
    pub async fn connect(endpoint: &str) -> Result<Client, ClientError> {
        Client::connect_with(&ClientConfig::plain(endpoint)).await
    }

    /// Connects as `config` says: TLS trusting its CA, its client certificate or token.
    ///
    /// With several servers ([`ClientConfig::endpoints`]) it connects to the first that
    /// answers (an error only if none does) and fails over: when a request finds its server
    /// unreachable, that request fails and the next ones go to the next server (see the
    /// `failover` module). Watches through [`crate::reflector`] resume on the next server.
    pub async fn connect_with(config: &ClientConfig) -> Result<Client, ClientError> {
        let endpoints = endpoints_of(config)?;
        let creds = credentials_of(config)?;
        if let [(url, ep)] = endpoints.as_slice() {
            let channel = ep
                .connect()
                .await
                .map_err(|e| ClientError::unreachable(url, &e))?;
            tracing::debug!(endpoint = %url, "connected to the API server");
            return Ok(Client::new(Failover::single(url, channel), creds, config));
        }
        // The first server that answers is current; the others connect on first use.
        let mut servers = Vec::with_capacity(endpoints.len());
        let mut unreachable = Vec::new();
        let mut connected = None;
        for (i, (url, ep)) in endpoints.into_iter().enumerate() {
            let channel = if connected.is_some() {
                ep.connect_lazy()
            } else {
                match ep.connect().await {
                    Ok(channel) => {
                        tracing::debug!(endpoint = %url, "connected to the API server");
                        connected = Some(i);
                        channel
                    }
                    Err(e) => {
                        unreachable.push((i, url.clone(), crate::error::transport_reason(&e)));
                        ep.connect_lazy()
                    }
                }
            };
            servers.push((url, channel));
        }
        if connected.is_none() {
            let failures: Vec<(String, String)> =
                unreachable.into_iter().map(|(_, u, r)| (u, r)).collect();
            return Err(ClientError::unreachable_all(&failures));
        }
        let servers = Failover::new(servers);
        for (i, _, reason) in &unreachable {
            servers.failed(*i, reason);
        }
        Ok(Client::new(servers, creds, config))
    }

    /// Like [`Client::connect`] but connects on first use (and reconnects as needed): for
    /// components that may start before the API server.
    pub fn connect_lazy(endpoint: &str) -> Result<Client, ClientError> {
        Client::connect_lazy_with(&ClientConfig::plain(endpoint))
    }

    /// Like [`Client::connect_with`] but connects on first use.
    pub fn connect_lazy_with(config: &ClientConfig) -> Result<Client, ClientError> {
        let servers = endpoints_of(config)?
            .into_iter()
            .map(|(url, ep)| {
                let channel = ep.connect_lazy();
                (url, channel)
            })
            .collect();
        let creds = credentials_of(config)?;
        Ok(Client::new(Failover::new(servers), creds, config))
    }

    fn new(servers: Failover, creds: Credentials, config: &ClientConfig) -> Client {
        let rpc = ApiClient::with_interceptor(servers.clone(), creds)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Client {
            rpc,
            servers,
            config: Arc::new(config.clone()),
        }
    }

    /// The client certificate this client connects with, if any (what it presents to node
    /// agents too).
    pub fn identity(&self) -> Option<&skiff_pki::Identity> {
        self.config.identity.as_ref()
    }

    /// The CA(s) this client verifies API servers against (PEM), if any: the cluster CA,
    /// which also signs node agents' serving certificates.
    pub fn ca_pem(&self) -> Option<&str> {
        self.config.ca_pem.as_deref()
    }

    /// `GET path` of the Kubernetes REST API as JSON (what the gRPC API does not carry: the
    /// metrics API).
    pub async fn get_json(&self, path: &str) -> Result<serde_json::Value, ClientError> {
        crate::rest::get_json(&self.config, &self.servers, path).await
    }

    /// A consistent snapshot of the store, taken by the API server while it runs
    /// (`GET /skiff/v1/snapshot`, `cluster-admin` only), streamed into the new file `dest`:
    /// its format (`skiff-embedded` or `etcd`) and revision, when the server names it.
    pub async fn snapshot(
        &self,
        dest: &std::path::Path,
    ) -> Result<(String, Option<i64>), ClientError> {
        let headers =
            crate::rest::download(&self.config, &self.servers, "/skiff/v1/snapshot", dest).await?;
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        Ok((
            header("skiff-snapshot-format").unwrap_or_default(),
            header("skiff-snapshot-revision").and_then(|r| r.parse().ok()),
        ))
    }

    /// A token of ServiceAccount `service_account` in `namespace` from the TokenRequest
    /// subresource (the REST API's `POST .../serviceaccounts/<name>/token`, which gRPC does
    /// not carry), bound to `bound_pod` (`(name, uid)`) when given: the token and its expiry
    /// (Unix seconds).
    pub async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[String],
        expiration_seconds: Option<i64>,
        bound_pod: Option<(&str, &str)>,
    ) -> Result<(String, i64), ClientError> {
        let mut spec = serde_json::json!({"audiences": audiences});
        if let Some(e) = expiration_seconds {
            spec["expirationSeconds"] = e.into();
        }
        if let Some((name, uid)) = bound_pod {
            spec["boundObjectRef"] =
                serde_json::json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid});
        }
        let body = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec,
        });
        let path =
            format!("/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token");
        let answer = crate::rest::post_json(&self.config, &self.servers, &path, &body).await?;
        let token = answer
            .pointer("/status/token")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| ClientError::Other {
                code: tonic::Code::Internal,
                message: "the TokenRequest answer has no status.token".into(),
            })?
            .to_string();
        let expires = answer
            .pointer("/status/expirationTimestamp")
            .and_then(serde_json::Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp())
            .unwrap_or(0);
        Ok((token, expires))
    }

    /// Asks the API server whether `user` in `groups` may do `verb` on `resource` (with
    /// `subresource`, object `name`, in `namespace`; `group` is the API group) with a
    /// SubjectAccessReview (the REST API's `POST .../subjectaccessreviews`, which gRPC does
    /// not carry): whether it is allowed and the authorizer's reason. What a node agent does
    /// for callers of its own API, as the kubelet does.
    pub async fn subject_access_review(
        &self,
        user: &str,
        groups: &[String],
        attributes: &ResourceAttributes<'_>,
    ) -> Result<(bool, String), ClientError> {
        let body = serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {
                "user": user, "groups": groups,
                "resourceAttributes": {
                    "verb": attributes.verb, "group": attributes.group,
                    "resource": attributes.resource, "subresource": attributes.subresource,
                    "namespace": attributes.namespace, "name": attributes.name,
                },
            },
        });
        let answer = crate::rest::post_json(
            &self.config,
            &self.servers,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            &body,
        )
        .await?;
        let allowed = answer
            .pointer("/status/allowed")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        let reason = answer
            .pointer("/status/reason")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_string();
        Ok((allowed, reason))
    }

    /// Wraps an existing channel to the server at `endpoint` (no credentials).
    pub fn from_channel(channel: Channel, endpoint: &str) -> Client {
        Client::new(
            Failover::single(endpoint, channel),
            Credentials::default(),
            &ClientConfig::plain(endpoint),
        )
    }

    /// The URL of the API server requests go to now (with several, the one failed over to).
    pub fn endpoint(&self) -> &str {
        self.servers.current()
    }

    /// A typed API for `T` in `namespace` (`None`: every namespace, or a cluster-scoped
    /// type). The namespace is ignored for cluster-scoped types.
    pub fn api<T: Resource>(&self, namespace: Option<&str>) -> Api<T> {
        Api {
            raw: Raw::new(self, T::INFO.plural, T::INFO.namespaced, namespace),
            _t: PhantomData,
        }
    }

    /// A typed API for `T` in one namespace.
    pub fn namespaced<T: Resource>(&self, namespace: &str) -> Api<T> {
        self.api(Some(namespace))
    }

    /// A typed API for `T` across every namespace (list and watch; create and update use the
    /// object's own namespace).
    pub fn all<T: Resource>(&self) -> Api<T> {
        self.api(None)
    }

    /// A typed API for a cluster-scoped `T` (Namespace, Node).
    pub fn cluster<T: Resource>(&self) -> Api<T> {
        self.api(None)
    }

    /// An API for a resource type known only at run time.
    /// A custom kind ([`skiff_api::json_kind`]) is addressed as `<plural>.<group>`.
    pub fn dynamic(&self, kind: &'static dyn DynKind, namespace: Option<&str>) -> DynamicApi {
        let info = kind.info();
        let resource: std::borrow::Cow<'static, str> = if skiff_api::is_typed(info) {
            info.plural.into()
        } else {
            format!("{}.{}", info.plural, info.group()).into()
        };
        DynamicApi {
            raw: Raw::new(self, resource, info.namespaced, namespace),
            kind,
        }
    }

    /// The custom kinds the server serves (what discovery lists beyond Skiff's typed kinds),
    /// each with its JSON codec for [`Client::dynamic`].
    pub async fn custom_kinds(&self) -> Result<Vec<&'static dyn DynKind>, ClientError> {
        Ok(self
            .discovery()
            .await?
            .iter()
            .map(|r| {
                skiff_api::intern_kind(
                    &r.api_version,
                    &r.kind,
                    &r.plural,
                    &r.short_names,
                    r.namespaced,
                    r.has_status,
                )
            })
            .filter(|info| !skiff_api::is_typed(info))
            .map(skiff_api::json_kind)
            .collect())
    }

    /// The resource types the server serves.
    pub async fn discovery(&self) -> Result<Vec<rpc::ResourceInfo>, ClientError> {
        let resp = self
            .rpc
            .clone()
            .discovery(rpc::DiscoveryRequest {})
            .await
            .map_err(|s| self.status(s))?;
        Ok(resp.into_inner().resources)
    }

    fn status(&self, s: tonic::Status) -> ClientError {
        ClientError::from_status(s, self.endpoint())
    }
}

/// Selectors for list and watch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListParams {
    /// Kubernetes label selector syntax (`app=web,tier!=db`); empty selects everything.
    pub label_selector: String,
    /// Field selector (`spec.nodeName=n1`, `status.phase!=Running`); empty selects
    /// everything.
    pub field_selector: String,
}

impl ListParams {
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = selector.to_string();
        self
    }

    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = selector.to_string();
        self
    }
}

/// What happens to the dependents of a deleted object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropagationPolicy {
    /// Delete the object now; the garbage collector deletes dependents afterwards.
    Background,
    /// Delete dependents first, then the object.
    Foreground,
    /// Leave the dependents.
    Orphan,
}

impl PropagationPolicy {
    pub fn as_str(&self) -> &'static str {
        match self {
            PropagationPolicy::Background => "Background",
            PropagationPolicy::Foreground => "Foreground",
            PropagationPolicy::Orphan => "Orphan",
        }
    }
}

impl FromStr for PropagationPolicy {
    type Err = String;

    /// Case-insensitive `background`, `foreground` or `orphan`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "background" => Ok(PropagationPolicy::Background),
            "foreground" => Ok(PropagationPolicy::Foreground),
            "orphan" => Ok(PropagationPolicy::Orphan),
            _ => Err(format!(
                "invalid propagation policy {s:?}: expected background, foreground or orphan"
            )),
        }
    }
}

/// Conditions the object must still meet for the delete to happen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// Options of a delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteParams {
    /// Seconds the object gets to shut down; `None` uses the object's default, 0 deletes
    /// immediately.
    pub grace_period_seconds: Option<i64>,
    /// `None` uses the server's default (Background).
    pub propagation_policy: Option<PropagationPolicy>,
    pub preconditions: Option<Preconditions>,
}

/// The result of a list: the objects and the revision they reflect (watch from it to miss
/// nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectList<T> {
    pub items: Vec<T>,
    pub resource_version: String,
}

impl<T> IntoIterator for ObjectList<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

/// One change seen by a watch. `Deleted` carries the object's last state.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent<T> {
    Added(T),
    Modified(T),
    Deleted(T),
}

impl<T> WatchEvent<T> {
    pub fn object(&self) -> &T {
        match self {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
        }
    }

    pub fn into_object(self) -> T {
        match self {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
        }
    }

    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub fn type_name(&self) -> &'static str {
        match self {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> WatchEvent<U> {
        match self {
            WatchEvent::Added(o) => WatchEvent::Added(f(o)),
            WatchEvent::Modified(o) => WatchEvent::Modified(f(o)),
            WatchEvent::Deleted(o) => WatchEvent::Deleted(f(o)),
        }
    }

    fn from_type(ty: &str, object: T) -> Option<WatchEvent<T>> {
        match ty {
            "ADDED" => Some(WatchEvent::Added(object)),
            "MODIFIED" => Some(WatchEvent::Modified(object)),
            "DELETED" => Some(WatchEvent::Deleted(object)),
            _ => None,
        }
    }
}

/// A stream of watch events. The watch call is made when the stream is first polled; if it
/// fails, the error is the stream's first item. The stream ends when the server ends the
/// watch; an error item ([`ClientError::Expired`] in particular: list again) ends it too.
pub type WatchStream<T> = BoxStream<'static, Result<WatchEvent<T>, ClientError>>;

/// The resource-independent calls, on protobuf bytes.
#[derive(Clone)]
struct Raw {
    client: Client,
    /// A typed kind's plural, or a custom kind's `<plural>.<group>`.
    resource: std::borrow::Cow<'static, str>,
    namespaced: bool,
    /// Empty: all namespaces (or cluster-scoped).
    namespace: String,
}

impl Raw {
    fn new(
        client: &Client,
        resource: impl Into<std::borrow::Cow<'static, str>>,
        namespaced: bool,
        namespace: Option<&str>,
    ) -> Raw {
        let resource = resource.into();
        Raw {
            client: client.clone(),
            resource,
            namespaced,
            namespace: if namespaced {
                namespace.unwrap_or("").to_string()
            } else {
                String::new()
            },
        }
    }

    /// The namespace to send for an object whose own namespace is `object_ns`.
    fn namespace_for(&self, object_ns: &str) -> String {
        if !self.namespaced {
            String::new()
        } else if self.namespace.is_empty() {
            object_ns.to_string()
        } else {
            self.namespace.clone()
        }
    }

    fn rpc(&self) -> Rpc {
        self.client.rpc.clone()
    }

    fn err(&self, s: tonic::Status) -> ClientError {
        self.client.status(s)
    }

    async fn create(&self, namespace: String, object: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        tracing::debug!(resource = %self.resource, %namespace, "create");
        let resp = self
            .rpc()
            .create(rpc::CreateRequest {
                resource: self.resource.to_string(),
                namespace,
                object,
            })
            .await
            .map_err(|s| self.err(s))?;
        Ok(resp.into_inner().object)
    }

    async fn get(&self, name: &str) -> Result<Vec<u8>, ClientError> {
        tracing::debug!(resource = %self.resource, namespace = %self.namespace, name, "get");
        let resp = self
            .rpc()
            .get(rpc::GetRequest {
                resource: self.resource.to_string(),
                namespace: self.namespace.clone(),
                name: name.to_string(),
            })
            .await
            .map_err(|s| self.err(s))?;
        Ok(resp.into_inner().object)
    }

    async fn list(&self, lp: &ListParams) -> Result<ObjectList<Vec<u8>>, ClientError> {
        tracing::debug!(resource = %self.resource, namespace = %self.namespace, ?lp, "list");
        let resp = self
            .rpc()
            .list(rpc::ListRequest {
                resource: self.resource.to_string(),
                namespace: self.namespace.clone(),
                label_selector: lp.label_selector.clone(),
                field_selector: lp.field_selector.clone(),
            })
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        Ok(ObjectList {
            items: resp.items,
            resource_version: resp.resource_version,
        })
    }

    async fn update(
        &self,
        namespace: String,
        object: Vec<u8>,
        subresource: &str,
    ) -> Result<Vec<u8>, ClientError> {
        tracing::debug!(resource = %self.resource, %namespace, subresource, "update");
        let resp = self
            .rpc()
            .update(rpc::UpdateRequest {
                resource: self.resource.to_string(),
                namespace,
                object,
                subresource: subresource.to_string(),
            })
            .await
            .map_err(|s| self.err(s))?;
        Ok(resp.into_inner().object)
    }

    async fn delete(&self, name: &str, dp: &DeleteParams) -> Result<Vec<u8>, ClientError> {
        tracing::debug!(resource = %self.resource, namespace = %self.namespace, name, "delete");
        let pre = dp.preconditions.clone().unwrap_or_default();
        let resp = self
            .rpc()
            .delete(rpc::DeleteRequest {
                resource: self.resource.to_string(),
                namespace: self.namespace.clone(),
                name: name.to_string(),
                grace_period_seconds: dp.grace_period_seconds,
                propagation_policy: dp
                    .propagation_policy
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_default(),
                precondition_uid: pre.uid.unwrap_or_default(),
                precondition_resource_version: pre.resource_version.unwrap_or_default(),
            })
            .await
            .map_err(|s| self.err(s))?;
        Ok(resp.into_inner().object)
    }

    fn watch(
        &self,
        lp: &ListParams,
        resource_version: &str,
    ) -> BoxStream<'static, Result<rpc::WatchEvent, ClientError>> {
        tracing::debug!(resource = %self.resource, namespace = %self.namespace, ?lp,
            resource_version, "watch");
        let mut rpc = self.rpc();
        let client = self.client.clone();
        let req = rpc::WatchRequest {
            resource: self.resource.to_string(),
            namespace: self.namespace.clone(),
            label_selector: lp.label_selector.clone(),
            field_selector: lp.field_selector.clone(),
            resource_version: resource_version.to_string(),
        };
        async move {
            let stream = rpc
                .watch(req)
                .await
                .map_err(|s| client.status(s))?
                .into_inner();
            Ok(stream.map_err(move |s| client.status(s)))
        }
        .try_flatten_stream()
        .boxed()
    }
}

fn decode<T: Resource>(bytes: &[u8]) -> Result<T, ClientError> {
    let mut obj = T::decode(bytes).map_err(|e| ClientError::decode(T::INFO.kind, e))?;
    obj.set_type_meta();
    Ok(obj)
}

/// Typed access to one resource type, in one namespace or all.
pub struct Api<T> {
    raw: Raw,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Api<T> {
    fn clone(&self) -> Self {
        Api {
            raw: self.raw.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Api<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api")
            .field("resource", &self.raw.resource)
            .field("namespace", &self.raw.namespace)
            .finish()
    }
}

impl<T: Resource> Api<T> {
    /// The namespace this API works in; `None` for all namespaces or a cluster-scoped type.
    pub fn namespace(&self) -> Option<&str> {
        Some(self.raw.namespace.as_str()).filter(|n| !n.is_empty())
    }

    /// The client this API uses.
    pub fn client(&self) -> &Client {
        &self.raw.client
    }

    /// Creates `obj`. It goes to this API's namespace, or the object's own with [`Client::all`].
    pub async fn create(&self, obj: &T) -> Result<T, ClientError> {
        let ns = self.raw.namespace_for(obj.namespace());
        decode(&self.raw.create(ns, obj.encode_to_vec()).await?)
    }

    pub async fn get(&self, name: &str) -> Result<T, ClientError> {
        decode(&self.raw.get(name).await?)
    }

    /// Like [`Api::get`] but `None` when the object does not exist.
    pub async fn get_opt(&self, name: &str) -> Result<Option<T>, ClientError> {
        match self.get(name).await {
            Ok(o) => Ok(Some(o)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn list(&self, lp: &ListParams) -> Result<ObjectList<T>, ClientError> {
        let list = self.raw.list(lp).await?;
        Ok(ObjectList {
            items: list
                .items
                .iter()
                .map(|b| decode(b))
                .collect::<Result<_, _>>()?,
            resource_version: list.resource_version,
        })
    }

    /// Replaces the object's metadata and spec. `metadata.resourceVersion` must be set; a
    /// stale one fails with [`ClientError::Conflict`].
    pub async fn update(&self, obj: &T) -> Result<T, ClientError> {
        let ns = self.raw.namespace_for(obj.namespace());
        decode(&self.raw.update(ns, obj.encode_to_vec(), "").await?)
    }

    /// Replaces only the object's status (the status subresource).
    pub async fn update_status(&self, obj: &T) -> Result<T, ClientError> {
        self.update_subresource(obj, "status").await
    }

    /// Replaces what the subresource `subresource` covers (`status`, a
    /// CertificateSigningRequest's `approval`).
    pub async fn update_subresource(&self, obj: &T, subresource: &str) -> Result<T, ClientError> {
        let ns = self.raw.namespace_for(obj.namespace());
        decode(
            &self
                .raw
                .update(ns, obj.encode_to_vec(), subresource)
                .await?,
        )
    }

    /// Deletes (or starts a graceful delete of) the object; returns its last state.
    pub async fn delete(&self, name: &str, dp: &DeleteParams) -> Result<T, ClientError> {
        decode(&self.raw.delete(name, dp).await?)
    }

    /// Watches for changes after `resource_version` (`""`: ADDED events for every current
    /// object first). Unknown event types are skipped.
    pub fn watch(&self, lp: &ListParams, resource_version: &str) -> WatchStream<T> {
        self.raw
            .watch(lp, resource_version)
            .try_filter_map(|ev| async move {
                let obj = decode::<T>(&ev.object)?;
                let out = WatchEvent::from_type(&ev.r#type, obj);
                if out.is_none() {
                    tracing::debug!(r#type = %ev.r#type, "skipping unknown watch event type");
                }
                Ok(out)
            })
            .boxed()
    }
}

/// Just the type meta of an object, to tell what the server sent back.
#[derive(Clone, PartialEq, prost::Message)]
struct TypeMeta {
    #[prost(string, tag = "1")]
    api_version: String,
    #[prost(string, tag = "2")]
    kind: String,
}

impl Api<Pod> {
    /// Binds pod `pod` (in this API's namespace) to node `node` (the pods/binding
    /// subresource) and returns the bound pod.
    pub async fn bind(&self, pod: &str, node: &str) -> Result<Pod, ClientError> {
        let binding = Binding {
            api_version: "v1".into(),
            kind: "Binding".into(),
            metadata: Some(ObjectMeta {
                name: pod.to_string(),
                namespace: self.raw.namespace.clone(),
                ..Default::default()
            }),
            target: Some(ObjectReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                ..Default::default()
            }),
        };
        tracing::debug!(namespace = %self.raw.namespace, pod, node, "bind");
        let resp = self
            .raw
            .rpc()
            .bind(rpc::BindRequest {
                namespace: self.raw.namespace.clone(),
                binding: binding.encode_to_vec(),
            })
            .await
            .map_err(|s| self.raw.err(s))?
            .into_inner()
            .object;
        // The server answers with the pod; tolerate one that answers with the binding.
        let kind = TypeMeta::decode(resp.as_slice())
            .map(|t| t.kind)
            .unwrap_or_default();
        if (kind == "Pod" || (kind.is_empty() && !resp.is_empty()))
            && let Ok(p) = decode::<Pod>(&resp)
        {
            return Ok(p);
        }
        self.get(pod).await
    }
}

/// Access to a resource type known only at run time, with objects as Kubernetes-style JSON
/// (or protobuf bytes, with the `*_proto` methods).
#[derive(Clone)]
pub struct DynamicApi {
    raw: Raw,
    kind: &'static dyn DynKind,
}

impl fmt::Debug for DynamicApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamicApi")
            .field("resource", &self.raw.resource)
            .field("namespace", &self.raw.namespace)
            .finish()
    }
}

fn json_namespace(obj: &serde_json::Value) -> &str {
    obj.pointer("/metadata/namespace")
        .and_then(|v| v.as_str())
        .unwrap_or("")
}

impl DynamicApi {
    pub fn kind(&self) -> &'static dyn DynKind {
        self.kind
    }

    pub fn namespace(&self) -> Option<&str> {
        Some(self.raw.namespace.as_str()).filter(|n| !n.is_empty())
    }

    fn to_json(&self, bytes: &[u8]) -> Result<serde_json::Value, ClientError> {
        self.kind
            .proto_to_json(bytes)
            .map_err(|e| ClientError::decode(self.kind.info().kind, e))
    }

    fn to_proto(&self, obj: &serde_json::Value) -> Result<Vec<u8>, ClientError> {
        Ok(self.kind.json_to_proto(obj.clone())?)
    }

    /// Creates an object given as protobuf bytes; `namespace` is used when this API has none.
    pub async fn create_proto(
        &self,
        namespace: &str,
        object: Vec<u8>,
    ) -> Result<Vec<u8>, ClientError> {
        self.raw
            .create(self.raw.namespace_for(namespace), object)
            .await
    }

    /// Updates an object given as protobuf bytes (`subresource` `""` or `"status"`).
    pub async fn update_proto(
        &self,
        namespace: &str,
        object: Vec<u8>,
        subresource: &str,
    ) -> Result<Vec<u8>, ClientError> {
        self.raw
            .update(self.raw.namespace_for(namespace), object, subresource)
            .await
    }

    pub async fn get_proto(&self, name: &str) -> Result<Vec<u8>, ClientError> {
        self.raw.get(name).await
    }

    pub async fn list_proto(&self, lp: &ListParams) -> Result<ObjectList<Vec<u8>>, ClientError> {
        self.raw.list(lp).await
    }

    pub async fn create(&self, obj: &serde_json::Value) -> Result<serde_json::Value, ClientError> {
        let bytes = self.to_proto(obj)?;
        self.to_json(&self.create_proto(json_namespace(obj), bytes).await?)
    }

    pub async fn get(&self, name: &str) -> Result<serde_json::Value, ClientError> {
        self.to_json(&self.raw.get(name).await?)
    }

    pub async fn get_opt(&self, name: &str) -> Result<Option<serde_json::Value>, ClientError> {
        match self.get(name).await {
            Ok(o) => Ok(Some(o)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn list(
        &self,
        lp: &ListParams,
    ) -> Result<ObjectList<serde_json::Value>, ClientError> {
        let list = self.raw.list(lp).await?;
        Ok(ObjectList {
            items: list
                .items
                .iter()
                .map(|b| self.to_json(b))
                .collect::<Result<_, _>>()?,
            resource_version: list.resource_version,
        })
    }

    pub async fn update(&self, obj: &serde_json::Value) -> Result<serde_json::Value, ClientError> {
        let bytes = self.to_proto(obj)?;
        self.to_json(&self.update_proto(json_namespace(obj), bytes, "").await?)
    }

    pub async fn update_status(
        &self,
        obj: &serde_json::Value,
    ) -> Result<serde_json::Value, ClientError> {
        let bytes = self.to_proto(obj)?;
        self.to_json(
            &self
                .update_proto(json_namespace(obj), bytes, "status")
                .await?,
        )
    }

    pub async fn delete(
        &self,
        name: &str,
        dp: &DeleteParams,
    ) -> Result<serde_json::Value, ClientError> {
        self.to_json(&self.raw.delete(name, dp).await?)
    }

    pub fn watch(&self, lp: &ListParams, resource_version: &str) -> WatchStream<serde_json::Value> {
        let kind = self.kind;
        self.raw
            .watch(lp, resource_version)
            .try_filter_map(move |ev| async move {
                let obj = kind
                    .proto_to_json(&ev.object)
                    .map_err(|e| ClientError::decode(kind.info().kind, e))?;
                Ok(WatchEvent::from_type(&ev.r#type, obj))
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{Deployment, Namespace};

    #[test]
    fn endpoint_gets_a_scheme() {
        let url = |e: &str| endpoint_of(&ClientConfig::plain(e), e).map(|(u, _)| u);
        assert_eq!(url("127.0.0.1:7443").unwrap(), "http://127.0.0.1:7443");
        assert_eq!(url("http://localhost:1").unwrap(), "http://localhost:1");
        assert!(matches!(
            url("http://bad host:1"),
            Err(ClientError::InvalidEndpoint { .. })
        ));
    }

    #[test]
    fn https_needs_a_ca_and_tokens_become_a_bearer_header() {
        let e = endpoint_of(
            &ClientConfig::plain("https://127.0.0.1:1"),
            "https://127.0.0.1:1",
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert!(e.contains("no CA to verify the server"), "{e}");
        let mut cfg = ClientConfig::plain("http://127.0.0.1:1");
        cfg.token = Some("t0ken".into());
        let mut creds = credentials_of(&cfg).unwrap();
        let req = creds.call(tonic::Request::new(())).unwrap();
        assert_eq!(req.metadata().get("authorization").unwrap(), "Bearer t0ken");
        assert!(!format!("{creds:?}").contains("t0ken"));
    }

    #[tokio::test]
    async fn namespace_handling() {
        let c = Client::connect_lazy("127.0.0.1:1").unwrap();
        let a = c.api::<Deployment>(Some("shop"));
        assert_eq!(a.namespace(), Some("shop"));
        assert_eq!(a.raw.namespace_for("other"), "shop");
        let a = c.all::<Deployment>();
        assert_eq!(a.namespace(), None);
        assert_eq!(a.raw.namespace_for("other"), "other");
        // Cluster-scoped types never send a namespace.
        let n = c.api::<Namespace>(Some("shop"));
        assert_eq!(n.namespace(), None);
        assert_eq!(n.raw.namespace_for("x"), "");
    }

    #[tokio::test]
    async fn unreachable_server_is_reported() {
        // Port 1 on loopback: nothing listens there.
        let err = Client::connect("http://127.0.0.1:1").await.unwrap_err();
        assert!(err.is_unreachable(), "{err:?}");
        assert_eq!(
            err.to_string(),
            "cannot reach the Skiff API server at http://127.0.0.1:1: connection refused \
             (is it running? start one with `cargo xtask up`)"
        );
        // A lazy client reports it on the first call.
        let c = Client::connect_lazy("http://127.0.0.1:1").unwrap();
        let err = c
            .namespaced::<Deployment>("default")
            .get("x")
            .await
            .unwrap_err();
        assert!(err.is_unreachable(), "{err:?}");
        assert!(err.to_string().contains("connection refused"), "{err}");
        let mut w = c.all::<Deployment>().watch(&ListParams::default(), "");
        let first = w.next().await.unwrap().unwrap_err();
        assert!(first.is_unreachable(), "{first:?}");
    }

    #[test]
    fn propagation_policy_parses() {
        assert_eq!(
            "foreground".parse::<PropagationPolicy>().unwrap(),
            PropagationPolicy::Foreground
        );
        assert_eq!(PropagationPolicy::Orphan.as_str(), "Orphan");
        assert!("bogus".parse::<PropagationPolicy>().is_err());
    }
}
