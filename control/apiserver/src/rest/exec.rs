//! `pods/<name>/exec`: kubectl 1.32's exec, a WebSocket in Kubernetes' channel protocol
//! (`v5.channel.k8s.io`, and `v4`). Each binary message starts with its channel: 0 stdin,
//! 1 stdout, 2 stderr, 3 the session's end (a `Status`), 4 a terminal resize, 255 (v5) close
//! the channel named by the next byte. The session runs on the pod's node agent, which this
//! module reaches with an HTTP upgrade and the same channel numbers in length-prefixed frames
//! (`skiff_client::node_api::exec`), so messages are translated one for one, in both
//! directions as they come: output streams while the command runs, stdin (`-i`) and the
//! terminal (`-t`, resizes included) are live.
//!
//! Everything that can fail before the command runs (no such container, a pod that is not
//! running, a container that has exited, an unreachable agent) fails before the WebSocket
//! upgrade, as a `Status`: kubectl then tries SPDY, which gets the same answer, and prints
//! it. The end is written as the kubelet writes it: `Success`, or `NonZeroExitCode` with the
//! code as a cause (kubectl's own exit code). When kubectl goes away the agent connection is
//! dropped, which ends the session on the node (its processes are killed).

use axum::extract::FromRequestParts as _;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::response::Response;
use futures::{SinkExt as _, StreamExt as _};
use hyper_util::rt::TokioIo;
use prost::Message as _;
use serde_json::json;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::node_api::exec::{self as channel, ExecEnd, read_frame, write_frame};
use skiff_client::node_api::{ExecRequest, NodeApiError};

use super::context::Rest;
use super::node_proxy::{node_agent, pick_container, pod_failure};
use super::path::ResourcePath;
use super::query::Query;
use crate::ApiError;
use crate::status::plain_failure;

/// The channel protocols Skiff speaks, preferred first (kubectl 1.32 offers v5 down to v1).
pub(super) const EXEC_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

pub(super) type AgentConn = TokioIo<hyper::upgrade::Upgraded>;

/// `GET|POST /api/v1/namespaces/<ns>/pods/<name>/exec?command=...&container=...`.
pub(crate) async fn serve(rest: &Rest, parts: Parts, p: ResourcePath, query: Query) -> Response {
    let namespace = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let is_websocket = wants_websocket(&parts);
    let target = match request(rest, &namespace, &name, &query).await {
        Ok(t) => t,
        Err(ApiError::Internal(why)) => return exec_error(&why),
        Err(e) => return pod_failure(&e, &name),
    };
    if !is_websocket {
        return websocket_required("exec");
    }
    let session = Session::Exec {
        command: target.req.command.clone(),
    };
    let agent = match target
        .agent
        .exec(&namespace, &name, &target.container, &target.req)
        .await
    {
        Ok(conn) => conn,
        Err(e) => return agent_failure(&e, &name, &target.container),
    };
    accept(parts, agent, session).await
}

/// Whether the request asks for a WebSocket upgrade.
pub(super) fn wants_websocket(parts: &Parts) -> bool {
    parts
        .headers
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The answer to a request that is not a WebSocket upgrade (kubectl falls back to SPDY when
/// the WebSocket upgrade is refused, and prints this).
pub(super) fn websocket_required(subresource: &str) -> Response {
    plain_failure(
        400,
        "BadRequest",
        &format!(
            "Upgrade request required: pods/{subresource} is served over WebSocket \
             (v5.channel.k8s.io or v4.channel.k8s.io)"
        ),
    )
}

/// Accepts kubectl's WebSocket, once the agent has taken the session, and bridges the two.
pub(super) async fn accept(mut parts: Parts, agent: AgentConn, session: Session) -> Response {
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(u) => u,
        Err(e) => return plain_failure(400, "BadRequest", &e.to_string()),
    };
    upgrade
        .protocols(EXEC_PROTOCOLS)
        .on_upgrade(move |socket| bridge(socket, agent, session))
}

/// Where and what to run, checked before anything starts.
struct Target {
    agent: skiff_client::node_api::AgentEndpoint,
    container: String,
    req: ExecRequest,
}

async fn request(
    rest: &Rest,
    namespace: &str,
    name: &str,
    query: &Query,
) -> Result<Target, ApiError> {
    let command: Vec<String> = query.all("command").into_iter().map(String::from).collect();
    if command.is_empty() {
        return Err(ApiError::BadRequest(
            "you must specify at least 1 command".to_string(),
        ));
    }
    let (stdin, stdout, stderr, tty) = (
        query.flag("stdin"),
        query.flag("stdout"),
        query.flag("stderr"),
        query.flag("tty"),
    );
    if !(stdin || stdout || stderr) {
        return Err(ApiError::BadRequest(
            "you must specify at least 1 of stdin, stdout, stderr".to_string(),
        ));
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
    // A container the pod's status shows exited is refused here, before anything starts
    // (the agent checks again: the status may lag).
    check_running(&pod, &container)?;
    let agent = node_agent(rest, &pod)
        .await?
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Target {
        agent,
        container,
        req: ExecRequest {
            command,
            stdin,
            tty,
        },
    })
}

/// A container the pod's status shows not running (waiting, or exited) is refused with why;
/// [`ApiError::Internal`] carries the reason.
pub(super) fn check_running(pod: &Pod, container: &str) -> Result<(), ApiError> {
    let state = pod
        .status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .chain(&s.ephemeral_container_statuses)
        })
        .find(|c| c.name == container)
        .and_then(|c| c.state.as_ref());
    if let Some(state) = state
        && state.running.is_none()
    {
        let why = match &state.waiting {
            Some(w) if !w.reason.is_empty() => format!("it is waiting to start: {}", w.reason),
            Some(_) => "it is waiting to start".to_string(),
            None => "it has exited".to_string(),
        };
        return Err(ApiError::Internal(format!(
            "container {container:?} is not running: {why}"
        )));
    }
    Ok(())
}

/// The agent's refusal as Kubernetes words it (the runtime's reason after kube-apiserver's
/// "error executing command in container").
pub(super) fn agent_failure(e: &NodeApiError, name: &str, container: &str) -> Response {
    match e {
        NodeApiError::Status {
            status: 400,
            message,
            ..
        } => pod_failure(&ApiError::BadRequest(message.clone()), name),
        NodeApiError::Status {
            status: 404,
            message,
            ..
        } => plain_failure(
            404,
            "NotFound",
            &format!(
                "unable to upgrade connection: container not found (\"{container}\"): {message}"
            ),
        ),
        NodeApiError::Status { message, .. } => exec_error(message),
        other => exec_error(&other.to_string()),
    }
}

/// kube-apiserver's answer when the runtime could not run the command.
pub(super) fn exec_error(why: &str) -> Response {
    plain_failure(
        500,
        "InternalError",
        &format!("Internal error occurred: error executing command in container: {why}"),
    )
}

fn message(channel: u8, data: &[u8]) -> Message {
    let mut m = Vec::with_capacity(data.len() + 1);
    m.push(channel);
    m.extend_from_slice(data);
    Message::Binary(m.into())
}

/// What a bridged session is, for the Status written at its end.
pub(super) enum Session {
    Exec { command: Vec<String> },
    Attach,
}

impl Session {
    /// The session ended: the command exited with `code` (attach: the container exited, or
    /// the client detached, which the kubelet reports as success).
    fn ended(&self, code: i32) -> serde_json::Value {
        match self {
            Session::Exec { command } => exec_status(command, code),
            Session::Attach => json!({"metadata": {}, "status": "Success"}),
        }
    }

    fn failed(&self, why: &str) -> serde_json::Value {
        match self {
            Session::Exec { command } => failure(command, why),
            Session::Attach => json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("error attaching to container: {why}"),
                "reason": "InternalError",
                "code": 500,
            }),
        }
    }
}

/// Translates between kubectl's WebSocket and the agent's frames until the session ends
/// (its end written, then a normal close) or either side goes away.
pub(super) async fn bridge(mut socket: WebSocket, agent: AgentConn, session: Session) {
    // As kube-apiserver: an empty message on the first output channel says "connected".
    if socket.send(message(channel::STDOUT, &[])).await.is_err() {
        return;
    }
    let (mut ws_tx, mut ws_rx) = socket.split();
    let (mut rd, mut wr) = tokio::io::split(agent);
    let to_agent = async move {
        while let Some(Ok(msg)) = ws_rx.next().await {
            match msg {
                Message::Binary(b) => {
                    let Some((&ch, data)) = b.split_first() else {
                        continue;
                    };
                    if matches!(ch, channel::STDIN | channel::RESIZE | channel::CLOSE)
                        && write_frame(&mut wr, ch, data).await.is_err()
                    {
                        return;
                    }
                }
                Message::Close(_) => return,
                _ => {}
            }
        }
    };
    let from_agent = async move {
        let status = loop {
            match read_frame(&mut rd).await {
                Ok(Some((ch @ (channel::STDOUT | channel::STDERR), data))) => {
                    if ws_tx.send(message(ch, &data)).await.is_err() {
                        return;
                    }
                }
                Ok(Some((channel::ERROR, data))) => {
                    break match serde_json::from_slice::<ExecEnd>(&data) {
                        Ok(ExecEnd {
                            exit_code: Some(code),
                            ..
                        }) => session.ended(code),
                        Ok(ExecEnd { error, .. }) => session.failed(
                            error
                                .as_deref()
                                .unwrap_or("the session ended without an exit code"),
                        ),
                        Err(e) => session.failed(&format!("unreadable end of session: {e}")),
                    };
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    break session.failed("the node agent's connection was lost");
                }
            }
        };
        let _ = ws_tx
            .send(message(channel::ERROR, status.to_string().as_bytes()))
            .await;
        // A normal closure (1000): kubectl reads it as the end of every stream.
        let _ = ws_tx
            .send(Message::Close(Some(CloseFrame {
                code: axum::extract::ws::close_code::NORMAL,
                reason: "".into(),
            })))
            .await;
    };
    tokio::select! {
        () = to_agent => {}
        () = from_agent => {}
    }
}

fn failure(command: &[String], why: &str) -> serde_json::Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("error executing command {command:?}: {why}"),
        "reason": "InternalError",
        "code": 500,
    })
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
