//! `pods/<name>/exec`: kubectl's exec, over a WebSocket in Kubernetes' channel protocol
//! (`v5.channel.k8s.io`, and `v4`; kubectl 1.32's default) or over SPDY/3.1 streams
//! (`v4.channel.k8s.io` down to `v2`: older kubectl, kubectl with
//! `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`, client-go's SPDY executor;
//! [`super::spdy_streams`]). In the WebSocket protocol each binary
//! message starts with its channel: 0 stdin, 1 stdout, 2 stderr, 3 the session's end (a
//! `Status`), 4 a terminal resize, 255 (v5) close the channel named by the next byte; over
//! SPDY each is a stream of its own. The session runs on the pod's node agent, which this
//! module reaches with an HTTP upgrade and the same channel numbers in length-prefixed frames
//! (`skiff_client::node_api::exec`). One [`bridge`] carries every session: it reads the
//! agent's frames and writes the end, and a transport ([`ClientInput`], [`ClientOutput`]:
//! WebSocket messages here, SPDY streams in `spdy_streams`) turns them into the client's
//! protocol, in both directions as they come: output streams while the command runs, stdin
//! (`-i`) and the terminal (`-t`, resizes included) are live.
//!
//! Everything that can fail before the command runs (no such container, a pod that is not
//! running, a container that has exited, an unreachable agent; [`target`], shared with
//! attach) fails before the upgrade, as a `Status`, which kubectl prints. A request that asks
//! for neither upgrade is a 400; a SPDY request offering no protocol served is a 403, as the
//! kubelet answers it.
//! The end is written as the kubelet writes it: `Success`, or `NonZeroExitCode` with the code
//! as a cause (kubectl's own exit code). When kubectl goes away the agent connection is
//! dropped, which ends the session on the node (its processes are killed).

use axum::extract::FromRequestParts as _;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::response::Response;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, StreamExt as _};
use hyper_util::rt::TokioIo;
use prost::Message as _;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::node_api::exec as channel;
use skiff_client::node_api::{AgentEndpoint, ExecRequest, NodeApiError};

use super::context::Rest;
use super::node_proxy::{node_agent, pick_container, pod_failure};
use super::path::ResourcePath;
use super::query::Query;
use super::session::{ClientInput, ClientOutput, Session, bridge};
use super::spdy_streams::{self, Expected, REMOTE_COMMAND_PROTOCOLS};
use crate::ApiError;
use crate::status::plain_failure;

/// The channel protocols Skiff speaks over WebSocket, preferred first (kubectl 1.32 offers v5
/// down to v1).
pub(super) const EXEC_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

pub(super) type AgentConn = TokioIo<hyper::upgrade::Upgraded>;

/// `GET|POST /api/v1/namespaces/<ns>/pods/<name>/exec?command=...&container=...`.
pub(crate) async fn serve(rest: &Rest, parts: Parts, p: ResourcePath, query: Query) -> Response {
    let namespace = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let command: Vec<String> = query.all("command").into_iter().map(String::from).collect();
    let target = if command.is_empty() {
        Err(ApiError::BadRequest(
            "you must specify at least 1 command".to_string(),
        ))
    } else {
        target(rest, &namespace, &name, &query, |_, _| Ok(())).await
    };
    let target = match target {
        Ok(t) => t,
        Err(ApiError::Internal(why)) => return exec_error(&why),
        Err(e) => return pod_failure(&e, &name),
    };
    let client = match Client::of(&parts, "exec") {
        Ok(c) => c,
        Err(resp) => return *resp,
    };
    let req = ExecRequest {
        command: command.clone(),
        stdin: target.streams.stdin,
        tty: target.streams.tty,
    };
    let agent = match target
        .agent
        .exec(&namespace, &name, &target.container, &req)
        .await
    {
        Ok(conn) => conn,
        Err(e) => return agent_failure(&e, &name, &target.container),
    };
    accept(
        parts,
        client,
        target.streams,
        agent,
        Session::Exec { command },
    )
    .await
}

/// How the client talks: which upgrade it asked for, and (SPDY) the protocol chosen.
pub(super) enum Client {
    WebSocket,
    Spdy(&'static str),
}

impl Client {
    /// The client's transport, or the answer to a request that asks for none Skiff serves.
    pub(super) fn of(parts: &Parts, subresource: &str) -> Result<Client, Box<Response>> {
        if wants_websocket(parts) {
            return Ok(Client::WebSocket);
        }
        if spdy_streams::wants_spdy(parts) {
            let offered = spdy_streams::offered(parts);
            return match spdy_streams::negotiate(&offered, &REMOTE_COMMAND_PROTOCOLS) {
                Some(p) => Ok(Client::Spdy(p)),
                None => Err(Box::new(spdy_streams::no_common_protocol(
                    &offered,
                    &REMOTE_COMMAND_PROTOCOLS,
                ))),
            };
        }
        Err(Box::new(upgrade_required(subresource)))
    }
}

/// Whether the request asks for a WebSocket upgrade.
pub(super) fn wants_websocket(parts: &Parts) -> bool {
    parts
        .headers
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The answer to a request that asks for no upgrade Skiff serves.
fn upgrade_required(subresource: &str) -> Response {
    plain_failure(
        400,
        "BadRequest",
        &format!(
            "Upgrade request required: pods/{subresource} is served over WebSocket \
             (v5.channel.k8s.io or v4.channel.k8s.io) or SPDY/3.1 (v4.channel.k8s.io down to \
             v2.channel.k8s.io)"
        ),
    )
}

/// Accepts the client's upgrade, once the agent has taken the session, and bridges the two.
pub(super) async fn accept(
    mut parts: Parts,
    client: Client,
    streams: Streams,
    agent: AgentConn,
    session: Session,
) -> Response {
    let subresource = match session {
        Session::Exec { .. } => "exec",
        Session::Attach => "attach",
    };
    match client {
        Client::Spdy(protocol) => {
            let expected = Expected::of(
                protocol,
                streams.stdin,
                streams.stdout,
                streams.stderr,
                streams.tty,
            );
            spdy_streams::upgrade(&mut parts, subresource, protocol, move |conn| {
                spdy_streams::remote_command(conn, protocol, expected, agent, session)
            })
        }
        Client::WebSocket => {
            let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
                Ok(u) => u,
                Err(e) => return plain_failure(400, "BadRequest", &e.to_string()),
            };
            upgrade
                .protocols(EXEC_PROTOCOLS)
                .on_upgrade(move |socket| websocket_session(socket, agent, session))
        }
    }
}

/// The streams a request asks for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Streams {
    pub(super) stdin: bool,
    pub(super) stdout: bool,
    pub(super) stderr: bool,
    pub(super) tty: bool,
}

/// Where a session goes, checked before anything starts.
pub(super) struct Target {
    pub(super) agent: AgentEndpoint,
    pub(super) container: String,
    pub(super) streams: Streams,
}

/// The checks exec and attach share: at least one of stdin, stdout and stderr; the pod and
/// its container (`container`, or the only one); `check`, the caller's own (on the pod and
/// the container's name); the pod running, the container not known to have exited; the
/// node's agent. [`ApiError::Internal`] carries a failure the runtime's words describe.
pub(super) async fn target(
    rest: &Rest,
    namespace: &str,
    name: &str,
    query: &Query,
    check: impl FnOnce(&Pod, &str) -> Result<(), ApiError>,
) -> Result<Target, ApiError> {
    let streams = Streams {
        stdin: query.flag("stdin"),
        stdout: query.flag("stdout"),
        stderr: query.flag("stderr"),
        tty: query.flag("tty"),
    };
    if !(streams.stdin || streams.stdout || streams.stderr) {
        return Err(ApiError::BadRequest(
            "you must specify at least 1 of stdin, stdout, stderr".to_string(),
        ));
    }
    let pods = rest.registry.handler(Pod::INFO.plural)?;
    let pod = Pod::decode(pods.get(namespace, name).await?.as_slice())
        .map_err(|e| ApiError::Internal(format!("decoding pod {name}: {e}")))?;
    let container = pick_container(&pod, query.get("container"))?;
    check(&pod, &container)?;
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
        streams,
    })
}

/// A container the pod's status shows not running (waiting, or exited) is refused with why;
/// [`ApiError::Internal`] carries the reason.
fn check_running(pod: &Pod, container: &str) -> Result<(), ApiError> {
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

/// A WebSocket session: the channel byte first in every binary message.
async fn websocket_session(mut socket: WebSocket, agent: AgentConn, session: Session) {
    // As kube-apiserver: an empty message on the first output channel says "connected".
    if socket.send(message(channel::STDOUT, &[])).await.is_err() {
        return;
    }
    let (tx, rx) = socket.split();
    bridge(WsInput(rx), WsOutput(tx), agent, session).await;
}

struct WsInput(SplitStream<WebSocket>);

impl ClientInput for WsInput {
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            match self.0.next().await? {
                Ok(Message::Binary(b)) => {
                    if let Some((&ch, data)) = b.split_first() {
                        return Some((ch, data.to_vec()));
                    }
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}

struct WsOutput(SplitSink<WebSocket, Message>);

impl ClientOutput for WsOutput {
    async fn output(&mut self, ch: u8, data: Vec<u8>) -> bool {
        self.0.send(message(ch, &data)).await.is_ok()
    }

    async fn end(mut self, status: serde_json::Value) {
        let _ = self
            .0
            .send(message(channel::ERROR, status.to_string().as_bytes()))
            .await;
        // A normal closure (1000): kubectl reads it as the end of every stream.
        let _ = self
            .0
            .send(Message::Close(Some(CloseFrame {
                code: axum::extract::ws::close_code::NORMAL,
                reason: "".into(),
            })))
            .await;
    }
}
