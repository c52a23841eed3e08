//! Pod subresources served by the pod's node agent (found as the kubelet's is: the Node's
//! `status.daemonEndpoints.kubeletEndpoint.Port`), with Kubernetes' query parameters and
//! errors. The agent API's client is `skiff_client::node_api`, the one the CLI uses; it is
//! the only reason this crate links the client. The server speaks to agents as
//! `system:kube-apiserver`, only over TLS pinned to the certificate the Node publishes.
//!
//! - `pods/<name>/log`: proxied to the agent's log stream.
//! - `pods/<name>/exec`: in [`super::exec`], through the helpers here.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prost::Message as _;
use skiff_api::Resource;
use skiff_api::api::{Node, Pod};
use skiff_client::node_api::{AgentEndpoint, LogOptions, NodeApiError};

use super::call::Call;
use super::context::Rest;
use crate::ApiError;
use crate::status::Format;

/// `GET /api/v1/namespaces/<ns>/pods/<name>/log`.
pub(crate) async fn log(rest: &Rest, call: &Call<'_>) -> Result<Response, ApiError> {
    let pod = Pod::decode(
        call.handler
            .get(&call.namespace, &call.name)
            .await?
            .as_slice(),
    )
    .map_err(|e| ApiError::Internal(format!("decoding pod {}: {e}", call.name)))?;
    let opts = log_options(call)?;
    let container = pick_container(&pod, call.query.get("container"))?;
    let agent = node_agent(rest, &pod)
        .await?
        .map_err(|e| agent_error(&e, &pod, &container))?;
    let stream = agent
        .logs(&call.namespace, &call.name, &container, &opts)
        .await
        .map_err(|e| agent_error(&e, &pod, &container))?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Kubernetes' log query (`PodLogOptions`) as the agent's options; what the agent cannot do
/// is refused by name rather than ignored.
fn log_options(call: &Call<'_>) -> Result<LogOptions, ApiError> {
    let q = call.query;
    let flag = |k: &str| q.flag(k);
    let tail = match q.get("tailLines") {
        None | Some("") => None,
        Some(v) => {
            let n: i64 = v.parse().map_err(|_| {
                ApiError::BadRequest(format!("tailLines: Invalid value: {v:?}: must be a number"))
            })?;
            // Negative: everything, as kubectl's --tail=-1.
            u64::try_from(n).ok()
        }
    };
    for unsupported in ["insecureSkipTLSVerifyBackend"] {
        if flag(unsupported) {
            return Err(ApiError::BadRequest(format!(
                "{unsupported}: not supported by Skiff's node agent yet"
            )));
        }
    }
    for unsupported in ["sinceSeconds", "sinceTime", "limitBytes"] {
        if q.get(unsupported).is_some_and(|v| !v.is_empty()) {
            return Err(ApiError::BadRequest(format!(
                "{unsupported}: not supported by Skiff's node agent yet"
            )));
        }
    }
    Ok(LogOptions {
        tail,
        follow: flag("follow"),
        timestamps: flag("timestamps"),
        previous: flag("previous"),
    })
}

/// The agent's failure as the API's: a container that has no log yet is Kubernetes' 400
/// "waiting to start"; an unreachable agent is an internal error naming it.
/// A failure of a request about pod `name` (before a WebSocket upgrade), as a `Status`.
pub(crate) fn pod_failure(e: &ApiError, name: &str) -> Response {
    super::fail(
        e,
        &crate::status::Subject {
            resource: "pods",
            group: "",
            name,
        },
        Format::Json,
    )
}

/// The agent of the node `pod` is bound to (a 400 when it has none yet; the inner error when
/// the node publishes no agent endpoint).
pub(crate) async fn node_agent(
    rest: &Rest,
    pod: &Pod,
) -> Result<Result<AgentEndpoint, NodeApiError>, ApiError> {
    let node_name = pod
        .spec
        .as_ref()
        .map(|s| s.node_name.clone())
        .unwrap_or_default();
    if node_name.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "pod {} does not have a host assigned",
            pod.name()
        )));
    }
    let nodes = rest.registry.handler(Node::INFO.plural)?;
    let node = Node::decode(nodes.get("", &node_name).await?.as_slice())
        .map_err(|e| ApiError::Internal(format!("decoding node {node_name}: {e}")))?;
    let access = rest
        .agent_client
        .as_ref()
        .map(super::agent_client::AgentClient::access)
        .unwrap_or_default();
    Ok(AgentEndpoint::of_node_as(&node, &access))
}

fn agent_error(e: &NodeApiError, pod: &Pod, container: &str) -> ApiError {
    let name = pod.name();
    match e {
        NodeApiError::Status { status: 404, .. } => ApiError::BadRequest(format!(
            "container {container:?} in pod {name:?} is waiting to start: no log yet"
        )),
        NodeApiError::Status {
            status: 400,
            message,
            ..
        } => ApiError::BadRequest(message.clone()),
        other => ApiError::Internal(other.to_string()),
    }
}

/// The container a request names, or the only one; Kubernetes' errors otherwise.
pub(crate) fn pick_container(pod: &Pod, asked: Option<&str>) -> Result<String, ApiError> {
    let name = pod.name();
    let containers: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| c.name.as_str())
        .collect();
    let ephemeral = |c: &str| {
        pod.spec
            .iter()
            .flat_map(|s| &s.ephemeral_containers)
            .any(|e| e.name == c)
    };
    match asked.filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c) || ephemeral(c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::BadRequest(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].to_string()),
        None => Err(ApiError::BadRequest(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}
