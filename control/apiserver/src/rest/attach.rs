//! `pods/<name>/attach`: kubectl 1.32's attach (and `kubectl debug -it`'s), the streams of a
//! container's main process over the same WebSocket channel protocol as exec
//! (`v5.channel.k8s.io`, `v4`), bridged to the pod's node agent by exec's code
//! ([`super::exec::bridge`]) with the agent's `POST /attach/...` as the other end.
//!
//! Query: `container` (the pod's only container by default; ephemeral containers count),
//! `stdin`, `stdout`, `stderr`, `tty` (the terminal is the container's own: kubectl asks
//! for it when the container has `tty: true`). Everything that can fail before the stream
//! fails before the upgrade, as a `Status`: no such container, a pod or container that is
//! not running, stdin asked of a container without `stdin: true`, an unreachable agent. The
//! session ends with `Success` when the container exits (or the agent detaches the client
//! after its stdin closed); a lost kubectl only detaches: the container keeps running.

use axum::http::request::Parts;
use axum::response::Response;
use prost::Message as _;
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::node_api::AttachRequest;

use super::context::Rest;
use super::exec::{
    Session, accept, agent_failure, check_running, wants_websocket, websocket_required,
};
use super::node_proxy::{node_agent, pick_container, pod_failure};
use super::path::ResourcePath;
use super::query::Query;
use crate::ApiError;
use crate::status::plain_failure;

/// `GET|POST /api/v1/namespaces/<ns>/pods/<name>/attach?container=...&stdin=...`.
pub(crate) async fn serve(rest: &Rest, parts: Parts, p: ResourcePath, query: Query) -> Response {
    let namespace = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let is_websocket = wants_websocket(&parts);
    let (agent, container, stdin) = match request(rest, &namespace, &name, &query).await {
        Ok(t) => t,
        Err(ApiError::Internal(why)) => return attach_error(&why),
        Err(e) => return pod_failure(&e, &name),
    };
    if !is_websocket {
        return websocket_required("attach");
    }
    let conn = match agent
        .attach(&namespace, &name, &container, &AttachRequest { stdin })
        .await
    {
        Ok(conn) => conn,
        Err(e) => return agent_failure(&e, &name, &container),
    };
    accept(parts, conn, Session::Attach).await
}

/// The agent, the container and whether the client writes its stdin; checked before
/// anything starts.
async fn request(
    rest: &Rest,
    namespace: &str,
    name: &str,
    query: &Query,
) -> Result<(skiff_client::node_api::AgentEndpoint, String, bool), ApiError> {
    let (stdin, stdout, stderr) = (
        query.flag("stdin"),
        query.flag("stdout"),
        query.flag("stderr"),
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
    let has_stdin = pod.spec.iter().any(|s| {
        s.containers.iter().any(|c| c.name == container && c.stdin)
            || s.ephemeral_containers
                .iter()
                .any(|c| c.name == container && c.stdin)
    });
    if stdin && !has_stdin {
        return Err(ApiError::BadRequest(format!(
            "container {container} in pod {name} was not started with stdin: true: its input \
             cannot be attached to (attach without -i to see its output)"
        )));
    }
    let phase = pod.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
    if phase != "Running" {
        return Err(ApiError::BadRequest(format!(
            "unable to upgrade connection: container not found (\"{container}\"): pod {name} is \
             {phase}"
        )));
    }
    check_running(&pod, &container)?;
    let agent = node_agent(rest, &pod)
        .await?
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok((agent, container, stdin))
}

/// kube-apiserver's answer when the runtime could not attach.
fn attach_error(why: &str) -> Response {
    plain_failure(
        500,
        "InternalError",
        &format!("Internal error occurred: error attaching to container: {why}"),
    )
}
