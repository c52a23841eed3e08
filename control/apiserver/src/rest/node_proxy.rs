//! Pod subresources served by the pod's node agent: `pods/<name>/log` is proxied to the
//! agent's log endpoint (found as the kubelet's is: the Node's
//! `status.daemonEndpoints.kubeletEndpoint.Port`), with Kubernetes' query parameters and
//! errors. The agent API's client is `skiff_client::node_api`, the one the CLI uses.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prost::Message;
use skiff_api::Resource;
use skiff_api::api::{Node, Pod};
use skiff_client::node_api::{AgentEndpoint, LogOptions, NodeApiError};

use super::Rest;
use super::objects::Call;
use crate::ApiError;

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
    let containers: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| c.name.clone())
        .collect();
    let container = match call.query.get("container").filter(|c| !c.is_empty()) {
        Some(c) if containers.iter().any(|n| n == c) => c.to_string(),
        Some(c) => {
            return Err(ApiError::BadRequest(format!(
                "container {c} is not valid for pod {}",
                call.name
            )));
        }
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            return Err(ApiError::BadRequest(format!(
                "a container name must be specified for pod {}, choose one of: [{}]",
                call.name,
                containers.join(" ")
            )));
        }
    };
    let node_name = pod
        .spec
        .as_ref()
        .map(|s| s.node_name.clone())
        .unwrap_or_default();
    if node_name.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "pod {} does not have a host assigned",
            call.name
        )));
    }
    let nodes = rest.registry.handler(Node::INFO.plural)?;
    let node = Node::decode(nodes.get("", &node_name).await?.as_slice())
        .map_err(|e| ApiError::Internal(format!("decoding node {node_name}: {e}")))?;
    let agent = AgentEndpoint::of_node(&node).map_err(|e| agent_error(&e, &pod, &container))?;
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
    for unsupported in ["previous", "insecureSkipTLSVerifyBackend"] {
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
    })
}

/// The agent's failure as the API's: a container that has no log yet is Kubernetes' 400
/// "waiting to start"; an unreachable agent is an internal error naming it.
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
