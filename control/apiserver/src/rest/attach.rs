//! `pods/<name>/attach`: kubectl's attach (and `kubectl debug -it`'s), the streams of a
//! container's main process over the same transports as exec (a WebSocket,
//! `v5.channel.k8s.io` or `v4`, or SPDY/3.1 streams, `v4.channel.k8s.io` down to `v2`),
//! bridged to the pod's node agent by exec's code ([`super::exec::bridge`]) with the agent's
//! `POST /attach/...` as the other end.
//!
//! Query: `container` (the pod's only container by default; ephemeral containers count),
//! `stdin`, `stdout`, `stderr`, `tty` (the terminal is the container's own: kubectl asks
//! for it when the container has `tty: true`). Everything that can fail before the stream
//! fails before the upgrade, as a `Status` (exec's checks, [`super::exec::target`], and
//! here: stdin asked of a container without `stdin: true`). The session ends with `Success`
//! when the container exits (or the agent detaches the client after its stdin closed); a
//! lost kubectl only detaches: the container keeps running.

use axum::http::request::Parts;
use axum::response::Response;
use skiff_api::api::Pod;
use skiff_client::node_api::AttachRequest;

use super::context::Rest;
use super::exec::{Client, accept, agent_failure, target};
use super::node_proxy::pod_failure;
use super::path::ResourcePath;
use super::query::Query;
use super::session::Session;
use crate::ApiError;
use crate::status::plain_failure;

/// `GET|POST /api/v1/namespaces/<ns>/pods/<name>/attach?container=...&stdin=...`.
pub(crate) async fn serve(rest: &Rest, parts: Parts, p: ResourcePath, query: Query) -> Response {
    let namespace = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let asks_stdin = query.flag("stdin");
    let check = |pod: &Pod, container: &str| stdin_allowed(pod, &name, container, asks_stdin);
    let target = match target(rest, &namespace, &name, &query, check).await {
        Ok(t) => t,
        Err(ApiError::Internal(why)) => return attach_error(&why),
        Err(e) => return pod_failure(&e, &name),
    };
    let client = match Client::of(&parts, "attach") {
        Ok(c) => c,
        Err(resp) => return *resp,
    };
    let req = AttachRequest {
        stdin: target.streams.stdin,
    };
    let conn = match target
        .agent
        .attach(&namespace, &name, &target.container, &req)
        .await
    {
        Ok(conn) => conn,
        Err(e) => return agent_failure(&e, &name, &target.container),
    };
    accept(parts, client, target.streams, conn, Session::Attach).await
}

/// Stdin may be attached only to a container started with `stdin: true`.
fn stdin_allowed(pod: &Pod, name: &str, container: &str, asks_stdin: bool) -> Result<(), ApiError> {
    let has_stdin = pod.spec.iter().any(|s| {
        s.containers.iter().any(|c| c.name == container && c.stdin)
            || s.ephemeral_containers
                .iter()
                .any(|c| c.name == container && c.stdin)
    });
    if asks_stdin && !has_stdin {
        return Err(ApiError::BadRequest(format!(
            "container {container} in pod {name} was not started with stdin: true: its input \
             cannot be attached to (attach without -i to see its output)"
        )));
    }
    Ok(())
}

/// kube-apiserver's answer when the runtime could not attach.
fn attach_error(why: &str) -> Response {
    plain_failure(
        500,
        "InternalError",
        &format!("Internal error occurred: error attaching to container: {why}"),
    )
}
