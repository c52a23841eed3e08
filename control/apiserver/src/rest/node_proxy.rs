//! Pod subresources served by the pod's node agent (found as the kubelet's is: the Node's
//! `status.daemonEndpoints.kubeletEndpoint.Port`), with Kubernetes' query parameters and
//! errors. The agent API's client is `skiff_client::node_api`, the one the CLI uses; it is
//! the only reason this crate links the client. The server speaks to agents as
//! `system:kube-apiserver`, only over TLS pinned to the certificate the Node publishes.
//!
//! - `pods/<name>/log`: proxied to the agent's log stream.
//! - `pods/<name>/exec`: a WebSocket in Kubernetes' channel protocol (`v5.channel.k8s.io`,
//!   and `v4`), what kubectl 1.32 speaks first: the command runs through the agent to
//!   completion, then its stdout (channel 1) and stderr (channel 2) are sent and the result
//!   as a `Status` on channel 3 (`NonZeroExitCode` with the code as a cause, which kubectl
//!   turns into its own exit code). Not yet: stdin (`-i`), TTYs, and output streamed while
//!   the command runs.

use axum::body::Body;
use axum::extract::FromRequestParts as _;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prost::Message as _;
use serde_json::json;
use skiff_api::Resource;
use skiff_api::api::{Node, Pod};
use skiff_client::node_api::{AgentEndpoint, LogOptions, NodeApiError};

use super::call::Call;
use super::context::Rest;
use super::path::ResourcePath;
use super::query::Query;
use crate::ApiError;
use crate::status::{Format, plain_failure};
use skiff_client::node_api::ExecRequest;

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

/// The channel protocols Skiff speaks, preferred first (kubectl 1.32 offers v5 down to v1).
const EXEC_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// `GET|POST /api/v1/namespaces/<ns>/pods/<name>/exec?command=...&container=...`.
pub(crate) async fn exec(rest: &Rest, mut parts: Parts, p: ResourcePath, query: Query) -> Response {
    let namespace = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let target = match exec_target(rest, &namespace, &name, &query).await {
        Ok(t) => t,
        Err(e) => return pod_failure(&e, &name),
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(u) => u,
        Err(_) => {
            // kubectl falls back to SPDY when the WebSocket upgrade is refused.
            return plain_failure(
                400,
                "BadRequest",
                "Upgrade request required: pods/exec is served over WebSocket \
                 (v5.channel.k8s.io or v4.channel.k8s.io)",
            );
        }
    };
    upgrade
        .protocols(EXEC_PROTOCOLS)
        .on_upgrade(move |socket| run_exec(socket, target))
}

/// Where and what to run, checked before the upgrade so errors are plain `Status` answers.
struct ExecTarget {
    agent: AgentEndpoint,
    namespace: String,
    pod: String,
    container: String,
    command: Vec<String>,
}

async fn exec_target(
    rest: &Rest,
    namespace: &str,
    name: &str,
    query: &Query,
) -> Result<ExecTarget, ApiError> {
    let command: Vec<String> = query.all("command").into_iter().map(String::from).collect();
    if command.is_empty() {
        return Err(ApiError::BadRequest(
            "you must specify at least 1 command".to_string(),
        ));
    }
    for unsupported in ["stdin", "tty"] {
        if query.flag(unsupported) {
            return Err(ApiError::BadRequest(format!(
                "{unsupported}: not supported by Skiff's exec yet (run without -i/-t)"
            )));
        }
    }
    let pods = rest.registry.handler(Pod::INFO.plural)?;
    let pod = Pod::decode(pods.get(namespace, name).await?.as_slice())
        .map_err(|e| ApiError::Internal(format!("decoding pod {name}: {e}")))?;
    let container = pick_container(&pod, query.get("container"))?;
    let phase = pod.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
    if phase != "Running" {
        return Err(ApiError::BadRequest(format!(
            "unable to upgrade connection: container not found (\"{container}\"): pod {name} is \
             {phase}"
        )));
    }
    let agent = node_agent(rest, &pod)
        .await?
        .map_err(|e| agent_error(&e, &pod, &container))?;
    Ok(ExecTarget {
        agent,
        namespace: namespace.to_string(),
        pod: name.to_string(),
        container,
        command,
    })
}

/// The container a request names, or the only one; Kubernetes' errors otherwise.
fn pick_container(pod: &Pod, asked: Option<&str>) -> Result<String, ApiError> {
    let name = pod.name();
    let containers: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| c.name.as_str())
        .collect();
    match asked.filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c) => Ok(c.to_string()),
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

/// Runs the command through the agent and writes the channel messages.
async fn run_exec(mut socket: WebSocket, t: ExecTarget) {
    use base64::Engine as _;
    let frame = |channel: u8, data: &[u8]| {
        let mut m = Vec::with_capacity(data.len() + 1);
        m.push(channel);
        m.extend_from_slice(data);
        Message::Binary(m.into())
    };
    // As kube-apiserver: an empty message on the first output channel says "connected".
    if socket.send(frame(1, &[])).await.is_err() {
        return;
    }
    let req = ExecRequest {
        command: t.command.clone(),
        timeout_seconds: None,
    };
    let status = match t.agent.exec(&t.namespace, &t.pod, &t.container, &req).await {
        Ok(out) => {
            let b64 = base64::engine::general_purpose::STANDARD;
            let stdout = b64.decode(&out.stdout).unwrap_or_default();
            let stderr = b64.decode(&out.stderr).unwrap_or_default();
            for (channel, data) in [(1u8, stdout), (2u8, stderr)] {
                if !data.is_empty() && socket.send(frame(channel, &data)).await.is_err() {
                    return;
                }
            }
            exec_status(&t.command, out.exit_code)
        }
        Err(e) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("error executing command {:?}: {e}", t.command),
            "reason": "InternalError",
            "code": 500,
        }),
    };
    let _ = socket.send(frame(3, status.to_string().as_bytes())).await;
    // A normal closure (1000): kubectl reads it as the end of every stream.
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: axum::extract::ws::close_code::NORMAL,
            reason: "".into(),
        })))
        .await;
}

/// The result on the error channel, as the kubelet writes it.
fn exec_status(command: &[String], exit_code: i32) -> serde_json::Value {
    if exit_code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: error executing command [{}], exit code {exit_code}",
            command.join(" ")
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": exit_code.to_string()}]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_as_the_kubelet_reports_them() {
        assert_eq!(exec_status(&[], 0)["status"], "Success");
        let s = exec_status(&["sh".into(), "-c".into(), "exit 3".into()], 3);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert_eq!(
            s["message"],
            "command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3"
        );
    }
}
