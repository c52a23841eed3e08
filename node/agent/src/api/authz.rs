//! Caller authorization: who called (the verified client certificate) and whether they
//! may. The API server and `system:masters` pass; anyone else needs the API server's
//! SubjectAccessReview ([`crate::access`]) to allow them on `nodes/<subresource>`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio_rustls::rustls::pki_types as rustls_types;
use tracing::{debug, warn};

use super::routes::ApiState;
use crate::access;

/// The API server's user when it calls agents (logs, exec, port-forward).
pub const API_SERVER_USER: &str = "system:kube-apiserver";
const MASTERS_GROUP: &str = "system:masters";

/// Who called, from the connection's client certificate: `(user, groups)`, or why not.
#[derive(Debug, Clone)]
pub(super) struct Caller(pub(super) Result<(String, Vec<String>), String>);

pub(super) fn identify(
    ca_pem: &str,
    chain: Option<&[rustls_types::CertificateDer<'_>]>,
) -> Result<(String, Vec<String>), String> {
    let chain = chain
        .filter(|c| !c.is_empty())
        .ok_or("no client certificate")?;
    let (leaf, rest) = chain.split_first().ok_or("no client certificate")?;
    skiff_pki::tls::verify_chain_for(ca_pem, leaf, rest, skiff_pki::Usage::Client)?;
    let info = skiff_pki::parse(leaf, "the client certificate").map_err(|e| e.to_string())?;
    Ok((info.common_name, info.organizations))
}

/// 401 without a verified client certificate. The API server and `system:masters` pass;
/// anyone else passes when the API server's SubjectAccessReview allows `<verb>` on
/// `nodes/<subresource>` of this node ([`crate::access`]), else gets the kubelet's 403. A
/// review that fails is the kubelet's 500. Plain-HTTP agents (no CA configured) have no
/// caller: allowed.
pub(super) async fn authorize(
    State(st): State<ApiState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(Caller(caller)) = req.extensions().get::<Caller>().cloned() else {
        return next.run(req).await;
    };
    let (user, groups) = match caller {
        Err(reason) => {
            debug!(%reason, "agent API: authentication failed");
            return (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
        }
        Ok(who) => who,
    };
    if user == API_SERVER_USER || groups.iter().any(|g| g == MASTERS_GROUP) {
        return next.run(req).await;
    }
    let asked = access::Request {
        user,
        groups,
        verb: access::verb_of(req.method()),
        subresource: access::subresource_of(req.uri().path()),
    };
    // (The kubelet's wording of the request, made only for a refusal.)
    let attrs = || {
        format!(
            "user={}, verb={}, resource=nodes, subresource={}",
            asked.user, asked.verb, asked.subresource
        )
    };
    match st.access.allowed(&st.ctx.client, &st.node, &asked).await {
        Ok(true) => next.run(req).await,
        Ok(false) => (StatusCode::FORBIDDEN, format!("Forbidden ({})\n", attrs())).into_response(),
        Err(reason) => {
            warn!(%reason, user = %asked.user, "agent API: the access review failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Authorization error ({})\n", attrs()),
            )
                .into_response()
        }
    }
}
