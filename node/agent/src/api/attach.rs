//! `POST /attach/{namespace}/{pod}/{container}` with `Upgrade: skiff-exec`: attaches to the
//! container's main process through the runtime (`skiff_runtime::attach`: its shim serves
//! every attached client) and carries the session with exec's code and frames
//! ([`super::exec`]): stdin (when the [`AttachRequest`] asks and the container has
//! `stdin: true`), resizes of the container's terminal, its output as it writes it, then the
//! end when the container exits. Errors come before the upgrade, as exec's do. A lost
//! connection only detaches: the container keeps running.

use axum::extract::{Path as UrlPath, State};
use axum::response::Response;
use skiff_client::node_api::AttachRequest;
use skiff_runtime::exec::ExecOptions;
use tracing::debug;

use super::exec::{running_sandbox, session_error, session_request, upgrade};
use super::routes::ApiState;

pub(super) async fn attach(
    State(st): State<ApiState>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    mut req: axum::extract::Request,
) -> Response {
    let (on_upgrade, attach): (_, AttachRequest) = match session_request(&mut req, "attach").await {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let sandbox = match running_sandbox(&st, &namespace, &pod, &container) {
        Ok(s) => s,
        Err(resp) => return *resp,
    };
    debug!(pod = %format!("{namespace}/{pod}"), %container, stdin = attach.stdin, "attach");
    let opts = ExecOptions {
        stdin: attach.stdin,
        tty: false,
    };
    match st.ctx.runtime.attach(&sandbox, &container, opts).await {
        Ok(session) => upgrade(on_upgrade, session),
        Err(e) => session_error(e, &container),
    }
}
