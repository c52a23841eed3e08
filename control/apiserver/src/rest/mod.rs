//! The Kubernetes REST API, on the same generic registry as the gRPC API: kubectl, client-go,
//! kube-rs and the Python client talk to Skiff unchanged.
//!
//! One handler ([`dispatch`]) serves every path: [`path::parse`] reads what a request
//! addresses (as kube-apiserver's request-info factory), and each verb is implemented once
//! for every kind through the registry's object-safe handler and the kind's
//! [`skiff_api::DynKind`] (strict JSON in, Kubernetes-style JSON out). Nothing is written per
//! kind: the per-kind facts are the registry's (`KindInfo`), the discovery table
//! ([`discovery`]) and the kubectl columns ([`skiff_api::columns`]).
//!
//! - discovery: `/api`, `/apis`, `/apis/<g>`, each group-version's `APIResourceList`, and
//!   aggregated discovery (`apidiscovery.k8s.io/v2`) when the Accept header asks for it;
//! - `/version`, `/healthz`, `/livez`, `/readyz`;
//! - objects: get, list (selectors, `limit`/`continue`, `resourceVersion`), watch
//!   (`?watch=true`, newline-delimited events, bookmarks, `timeoutSeconds`, streaming lists
//!   with `sendInitialEvents`), create, update, patch (JSON patch, merge patch, strategic
//!   merge patch), delete (DeleteOptions), deletecollection, `dryRun=All`,
//!   `fieldValidation=Strict|Warn|Ignore`; list and watch options validated as
//!   kube-apiserver's `ValidateListOptions`;
//! - subresources: `status`, `scale` (as `autoscaling/v1` Scale), `pods/binding`, and
//!   `pods/ephemeralcontainers` (get, update, patch: `kubectl debug`), and `pods/log`,
//!   `pods/exec` and `pods/attach` (WebSocket, `v5.channel.k8s.io`, or SPDY/3.1 streams;
//!   [`exec`], [`attach`], [`spdy_streams`]) and `pods/portforward` (SPDY/3.1, in a
//!   WebSocket or on the connection) through the pod's node agent ([`node_proxy`]);
//! - answers as JSON, YAML (`Accept: application/yaml`), a `meta.k8s.io/v1` Table
//!   (`;as=Table`) or metadata only (`;as=PartialObjectMetadata[List]`); errors as `Status`
//!   objects with Kubernetes' codes and reasons;
//! - `/openapi/v3` and each group-version's document ([`openapi`]), generated from the types;
//! - `GET /skiff/v1/snapshot`: a consistent snapshot of the store ([`snapshot`]), for
//!   `skiff snapshot save` (or `kubectl get --raw`); a non-resource URL only
//!   `cluster-admin` holds.
//!
//! Also: `/openapi/v2` as an empty document (gnostic protobuf or JSON, all kubectl needs to
//! validate a `kind: List` item by item); field managers and server-side apply (`managed`);
//! `pods/eviction`, a delete after the PodDisruptionBudget check
//! (`crate::strategy::policy::eviction_decision`); TokenRequest and the issuer's OIDC
//! documents (`tokens`); the access reviews (`access`).
//!
//! Tested in process by `http_tests` (HTTP semantics against kube-apiserver's answers), by
//! kube-rs in `control/apiserver/tests/kube_rs_client.rs`, and on arbitrary bytes by
//! `fuzzing` (feature `fuzzing`), the cargo-fuzz target in `tests/fuzz` run by
//! `cargo xtask fuzz [--seconds N]` (the `fuzz` test tier runs it for 60 s); its seeds also
//! run as a unit test.

mod access;
mod agent_client;
mod attach;
pub(crate) mod call;
mod context;
mod discovery;
mod exec;
mod managed;
mod metrics;
mod node_proxy;
mod objects;
mod openapi;
mod patch;
mod path;
mod portforward;
mod query;
mod session;
mod snapshot;
mod spdy;
mod spdy_streams;
mod table;
mod tokens;
mod watch;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use skiff_api::KindInfo;

use crate::registry::Registry;
use crate::status::{Format, fail, negotiate, plain_failure, respond};
pub use agent_client::AgentClient;
use context::Rest;
use discovery::{KUBERNETES_MAJOR, KUBERNETES_MINOR};
use path::Target;
use query::Query;

/// Largest request body accepted (kube-apiserver's limit).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The REST API as an axum router: one fallback handler for every path.
pub(crate) fn router(
    registry: Arc<Registry>,
    authorizer: Option<Arc<crate::auth::authz::Authorizer>>,
    sa_key: Option<Arc<skiff_pki::sa_token::SigningKey>>,
    agent_client: Option<AgentClient>,
    snapshot_dir: Option<std::path::PathBuf>,
    aggregator: Option<Arc<crate::aggregator::Aggregator>>,
) -> axum::Router {
    axum::Router::new().fallback(dispatch).with_state(Rest {
        registry,
        authorizer,
        sa_key,
        agent_client,
        metrics: Arc::default(),
        snapshot_dir,
        aggregator,
    })
}

/// `kubectl version`'s server half.
fn version() -> Value {
    json!({
        "major": KUBERNETES_MAJOR,
        "minor": KUBERNETES_MINOR,
        "gitVersion": format!("v{KUBERNETES_MAJOR}.{KUBERNETES_MINOR}.0+skiff.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        }),
    })
}

/// `/healthz` and friends: `ok`, or the checks with `?verbose`.
fn health(name: &str, query: &Query) -> Response {
    let text = if query.get("verbose").is_some() {
        format!("[+]ping ok\n[+]etcd ok\n[+]watch-cache ok\n{name} check passed\n")
    } else {
        "ok".to_string()
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

/// The kinds the registry serves.
fn infos(rest: &Rest) -> Vec<&'static KindInfo> {
    rest.registry.infos()
}

/// The served kinds, typed and custom, as discovery and OpenAPI describe them.
fn served(rest: &Rest) -> Vec<discovery::Served> {
    let mut all: Vec<discovery::Served> = infos(rest)
        .into_iter()
        .map(discovery::Served::typed)
        .collect();
    all.extend(
        rest.registry
            .custom_kinds()
            .iter()
            .flat_map(|k| k.served_versions())
            .map(|k| discovery::Served {
                info: k.info(),
                singular: k.singular.clone(),
                categories: k.categories.clone(),
                scale: k.scale().is_some(),
                schema: Some(k.openapi()),
            }),
    );
    all
}

/// What discovery lists: the served kinds and the metrics API's two.
fn discovery_infos(rest: &Rest) -> Vec<discovery::Served> {
    let mut all = served(rest);
    all.extend(
        [&metrics::NODE_METRICS, &metrics::POD_METRICS]
            .into_iter()
            .map(discovery::Served::typed),
    );
    all
}

/// Whether a local kind (typed, custom or the metrics API's) serves `group`/`version`:
/// then no APIService can take it over.
fn served_locally(rest: &Rest, group: &str, version: &str) -> bool {
    discovery_infos(rest)
        .iter()
        .any(|s| s.info.group() == group && s.info.api_version.ends_with(&format!("/{version}")))
}

/// The aggregated group-versions discovery lists: service-backed APIServices whose
/// group-version no local kind serves.
fn remote_versions(rest: &Rest) -> Vec<crate::aggregator::RemoteVersion> {
    let Some(agg) = &rest.aggregator else {
        return Vec::new();
    };
    agg.remote_versions()
        .into_iter()
        .filter(|v| !served_locally(rest, &v.group, &v.version))
        .collect()
}

/// The one REST handler.
async fn dispatch(State(rest): State<Rest>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let query = Query::parse(parts.uri.query());
    let format = negotiate(&parts.headers);
    let target = path::parse(parts.uri.path());
    let get = parts.method == Method::GET;
    let user = parts.extensions.get::<crate::request::UserInfo>().cloned();
    let mut attrs = access::attributes(&parts.method, &target, &query, parts.uri.path());
    // An aggregated group-version: authorized here like any request, then proxied; it never
    // reaches the registry.
    // Authorization of what the URL names (a request with a body is checked once it is
    // read: a create's name is in it).
    let check_url = |attrs: &mut _, parts: &axum::http::request::Parts| {
        access::check(
            &rest,
            parts.extensions.get::<crate::request::AuditSlot>(),
            user.as_ref(),
            attrs,
            &parts.headers,
            &[],
        )
    };
    if let Some(agg) = &rest.aggregator
        && let Some((group, version)) = crate::aggregator::group_version_of(parts.uri.path())
        && let Some(api) = agg.route(group, version)
        && !served_locally(&rest, group, version)
    {
        if let Err(resp) = check_url(&mut attrs, &parts) {
            return *resp;
        }
        return agg.proxy(&api, parts, body, user.as_ref()).await;
    }
    // An aggregated group-version's OpenAPI document is its server's: proxied the same way
    // (kube-aggregator merges them; kubectl reads one group-version's at a time).
    if let Some(agg) = &rest.aggregator
        && get
        && let Target::OpenApiV3 { group, version } = &target
        && let Some(api) = agg.route(group, version)
        && !served_locally(&rest, group, version)
    {
        if let Err(resp) = check_url(&mut attrs, &parts) {
            return *resp;
        }
        return agg.proxy(&api, parts, body, user.as_ref()).await;
    }
    let has_body = matches!(&target, Target::Resource(p)
        if !matches!(p.subresource.as_deref(), Some("exec" | "portforward" | "attach")));
    if !has_body && let Err(resp) = check_url(&mut attrs, &parts) {
        return *resp;
    }
    let not_found = || {
        plain_failure(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    match target {
        Target::Version if get => respond(200, &version(), Format::Json, &[]),
        Target::OpenIdConfiguration if get => {
            let host = parts
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            tokens::openid_configuration(&rest, host)
        }
        Target::Jwks if get => tokens::jwks(&rest),
        Target::Snapshot if get => snapshot::serve(&rest).await,
        Target::Health(name) if get => health(name, &query),
        Target::CoreVersions if get => {
            if format == Format::AggregatedDiscovery {
                aggregated(discovery::aggregated(&discovery_infos(&rest), true))
            } else {
                let host = parts
                    .headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("");
                respond(200, &discovery::core_versions(host), Format::Json, &[])
            }
        }
        Target::Groups if get => {
            let remote = remote_versions(&rest);
            if format == Format::AggregatedDiscovery {
                let mut doc = discovery::aggregated(&discovery_infos(&rest), false);
                discovery::add_remote_aggregated(&mut doc, &remote);
                aggregated(doc)
            } else {
                let mut doc = discovery::group_list(&discovery_infos(&rest));
                discovery::add_remote_groups(&mut doc, &remote);
                respond(200, &doc, Format::Json, &[])
            }
        }
        Target::Group(g) if get => {
            match discovery::group_with_remote(&discovery_infos(&rest), &remote_versions(&rest), &g)
            {
                Some(doc) => respond(200, &doc, Format::Json, &[]),
                None => not_found(),
            }
        }
        Target::GroupVersion { group, version } if get => {
            match discovery::resource_list(&discovery_infos(&rest), &group, &version) {
                Some(doc) => respond(200, &doc, Format::Json, &[]),
                None => not_found(),
            }
        }
        Target::Resource(p)
            if p.resource == "pods"
                && p.group.is_empty()
                && p.subresource.as_deref() == Some("exec")
                && matches!(parts.method, Method::GET | Method::POST) =>
        {
            exec::serve(&rest, parts, p, query).await
        }
        Target::Resource(p)
            if p.resource == "pods"
                && p.group.is_empty()
                && p.subresource.as_deref() == Some("attach")
                && matches!(parts.method, Method::GET | Method::POST) =>
        {
            attach::serve(&rest, parts, p, query).await
        }
        Target::Resource(p)
            if p.resource == "pods"
                && p.group.is_empty()
                && p.subresource.as_deref() == Some("portforward")
                && matches!(parts.method, Method::GET | Method::POST) =>
        {
            portforward::serve(&rest, parts, p, query).await
        }
        Target::Resource(p) => {
            let body = match read_body(body).await {
                Ok(b) => b,
                Err(resp) => return *resp,
            };
            if let Err(resp) = access::check(
                &rest,
                parts.extensions.get::<crate::request::AuditSlot>(),
                user.as_ref(),
                &mut attrs,
                &parts.headers,
                &body,
            ) {
                return *resp;
            }
            if p.group == metrics::GROUP {
                return match (
                    &parts.method,
                    metrics::serve(
                        &metrics::Sources {
                            registry: &rest.registry,
                            agent_client: rest.agent_client.as_ref(),
                            metrics: &rest.metrics,
                        },
                        &p,
                        &query,
                    )
                    .await,
                ) {
                    (&Method::GET, Ok(doc)) => respond(200, &doc, Format::Json, &[]),
                    (&Method::GET, Err(e)) => fail(
                        &e,
                        &crate::status::Subject {
                            resource: &p.resource,
                            group: metrics::GROUP,
                            name: p.name.as_deref().unwrap_or(""),
                        },
                        Format::Json,
                    ),
                    _ => plain_failure(
                        405,
                        "MethodNotAllowed",
                        "the server does not allow this method on the requested resource",
                    ),
                };
            }
            if p.resource == "serviceaccounts"
                && p.group.is_empty()
                && p.subresource.as_deref() == Some("token")
            {
                return tokens::token_request(
                    &rest,
                    &p,
                    user.as_ref(),
                    &parts.method,
                    &parts.headers,
                    &body,
                )
                .await;
            }
            if access::is_review(&p) {
                return access::review(
                    &rest,
                    &p,
                    &parts.method,
                    &parts.headers,
                    user.as_ref(),
                    &body,
                );
            }
            objects::serve(
                &rest,
                user.as_ref(),
                parts.extensions.get::<crate::request::AuditSlot>().cloned(),
                parts.method,
                &parts.headers,
                p,
                query,
                format,
                body,
            )
            .await
        }
        Target::OpenApiV3Index if get => {
            let remote: Vec<(String, String)> = remote_versions(&rest)
                .into_iter()
                .filter(|v| v.fresh)
                .map(|v| (v.group, v.version))
                .collect();
            respond(
                200,
                &openapi::index(&served(&rest), &remote),
                Format::Json,
                &[],
            )
        }
        Target::OpenApiV3 { group, version } if get => {
            match openapi::document(&served(&rest), &group, &version) {
                Some(doc) => respond(200, &doc, Format::Json, &[]),
                None => not_found(),
            }
        }
        Target::OpenApiV2 if get => {
            let accept = parts
                .headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let (body, content_type) = openapi::v2_document(accept.contains("protobuf"));
            (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        Target::NotFound => not_found(),
        _ => plain_failure(
            405,
            "MethodNotAllowed",
            &format!(
                "the server does not allow this method on the requested resource ({})",
                parts.method
            ),
        ),
    }
}

fn aggregated(doc: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, discovery::AGGREGATED_CONTENT_TYPE)],
        doc.to_string(),
    )
        .into_response()
}

/// Reads the request body, refusing one over [`MAX_BODY_BYTES`] with 413.
/// How long a client may take to send a request body (kube-apiserver's default request
/// timeout): a body sent slowly would otherwise hold an inflight slot for ever.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

async fn read_body(body: Body) -> Result<Bytes, Box<Response>> {
    read_body_within(body, BODY_TIMEOUT).await
}

async fn read_body_within(body: Body, limit: std::time::Duration) -> Result<Bytes, Box<Response>> {
    match tokio::time::timeout(limit, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(Box::new(plain_failure(
            413,
            "RequestEntityTooLarge",
            &format!("Request entity too large: limit is {MAX_BODY_BYTES}"),
        ))),
        Err(_) => Err(Box::new(plain_failure(
            408,
            "Timeout",
            &format!("the request body was not sent within {} s", limit.as_secs()),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    fn accept(v: &str) -> Format {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        negotiate(&h)
    }

    #[tokio::test]
    async fn a_body_sent_too_slowly_is_refused() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        tx.send(Ok(Bytes::from_static(b"{\"kind\":")))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let resp = read_body_within(body, std::time::Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(resp.status(), 408);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        drop(tx);
    }

    #[test]
    fn content_negotiation_like_kubectl() {
        assert_eq!(
            accept(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            Format::Table
        );
        assert_eq!(
            accept(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            ),
            Format::AggregatedDiscovery
        );
        // A version Skiff does not serve falls through to plain JSON.
        assert_eq!(
            accept(
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            ),
            Format::Json
        );
        assert_eq!(accept("application/yaml"), Format::Yaml);
        // kube-rs' metadata requests, and client-go's with a JSON fallback.
        assert_eq!(
            accept("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
            Format::Metadata {
                list: false,
                v1beta1: false
            }
        );
        assert_eq!(
            accept(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1,application/json"
            ),
            Format::Metadata {
                list: true,
                v1beta1: true
            }
        );
        // A conversion Skiff does not serve is skipped; with nothing else acceptable, 406.
        assert_eq!(
            accept("application/json;as=Widget;g=meta.k8s.io;v=v1,application/json"),
            Format::Json
        );
        assert_eq!(
            accept("application/json;as=Widget;g=meta.k8s.io;v=v1"),
            Format::NotAcceptable
        );
        assert_eq!(
            accept("application/json;as=PartialObjectMetadata;g=apps;v=v1"),
            Format::NotAcceptable
        );
        assert_eq!(accept("application/vnd.kubernetes.protobuf"), Format::Json);
        assert_eq!(accept("*/*"), Format::Json);
        assert_eq!(negotiate(&HeaderMap::new()), Format::Json);
    }

    #[test]
    fn query_flags() {
        let q = Query::parse(Some(
            "watch=true&limit=500&dryRun=All&labelSelector=app%3Dweb",
        ));
        assert!(q.flag("watch"));
        assert_eq!(q.get("limit"), Some("500"));
        assert_eq!(q.get("labelSelector"), Some("app=web"));
        assert!(!q.flag("allowWatchBookmarks"));
        assert!(Query::parse(Some("watch=1")).flag("watch"));
    }
}

#[cfg(test)]
mod http_tests;

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
