//! The request pipeline: every request on the API server's port, REST and gRPC alike, passes
//! the same steps in kube-apiserver's handler-chain order, composed once by
//! [`handler_chain`]:
//!
//! 1. **authentication** ([`crate::auth::Authenticator`]: client certificates, tokens,
//!    bootstrap and ServiceAccount tokens; a failure is a 401, throttled per address);
//! 2. **audit**: the request's [`AuditRecord`](crate::request::AuditRecord) is opened here and
//!    written when the response is done, with the final decision (authorization's, or the
//!    admission plug-in's refusal);
//! 3. **impersonation** (`Impersonate-*` headers, each checked with the authorizer);
//! 4. **limits** ([`crate::limits`]: inflight requests and watches per user, 429);
//! 5. **request info**: each front end reads what the request asks ([`Attributes`]) from
//!    what it has (REST from the URL, `rest::access`; gRPC from the message, `service`);
//! 6. **authorization** ([`authorize`], the one function both front ends call: fails closed
//!    without a user, records the decision in the audit record);
//!
//! then the registry: admission ([`crate::admission::Chain`], one ordered list of plug-ins),
//! the kind's strategy, storage. Every answer is written by [`crate::status`].

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::debug;

use crate::auth::authz::Authorizer;
use crate::auth::throttle::FailureThrottle;
use crate::auth::{AuthError, Authenticator, PeerIdentity, impersonate};
use crate::limits::{Limiter, Limits};
use crate::request::{Attributes, AuditSlot, UserInfo, is_grpc, note_authorization};

/// The handler chain around the front ends (`app`: the REST router and the gRPC service):
/// authentication, audit and impersonation outermost, then the limits. Authorization is the
/// front ends' first step ([`authorize`]), once they know what the request asks.
pub(crate) fn handler_chain(app: Router, steps: Steps) -> Router {
    let limiter = Limiter::new(steps.limits);
    // axum runs the layer added last first.
    app.layer(axum::middleware::from_fn_with_state(
        limiter,
        crate::limits::middleware,
    ))
    .layer(axum::middleware::from_fn_with_state(
        Arc::new(steps),
        authenticate,
    ))
}

/// Why a request is refused at authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No authenticated user reached authorization (fail closed): 401.
    Unauthenticated,
    /// The authorizer's refusal, with kube-apiserver's message: 403.
    Forbidden(String),
}

/// Authorization, the one step both front ends call with the request's [`Attributes`]:
/// `authz` `None` is an in-process server without authentication (everything allowed); a
/// server that authorizes never serves a request without a user. The decision goes into the
/// request's audit record.
pub(crate) fn authorize(
    authz: Option<&Authorizer>,
    user: Option<&UserInfo>,
    audit: Option<&AuditSlot>,
    attrs: &Attributes,
) -> Result<(), Denied> {
    let Some(authz) = authz else {
        return Ok(());
    };
    let Some(user) = user else {
        return Err(Denied::Unauthenticated);
    };
    let result = authz.authorize(user, attrs);
    note_authorization(audit, attrs, &result);
    result.map_err(|message| {
        debug!(user = %user.name, verb = %attrs.verb, resource = %attrs.resource, "forbidden");
        Denied::Forbidden(message)
    })
}

/// kube-apiserver's answer to a request it cannot authenticate: a `Status` with code 401
/// for REST, `UNAUTHENTICATED` for gRPC.
pub(crate) fn unauthorized(grpc: bool) -> Response {
    refused(grpc, 401, "Unauthorized")
}

/// What the pipeline needs: the authenticators, the authorizer (impersonation, revoked
/// tokens), the audit log and the request limits.
#[derive(Debug, Clone)]
pub(crate) struct Steps {
    pub authn: Arc<Authenticator>,
    pub authz: Option<Arc<Authorizer>>,
    /// Every request's event goes here when set.
    pub audit: Option<crate::audit::AuditLog>,
    /// Slows down failed authentications per source address.
    pub throttle: Arc<FailureThrottle>,
    pub limits: Limits,
}

/// Authentication, audit and impersonation: authenticates the request, opens its audit
/// record, applies impersonation and hands the request on with its [`UserInfo`] and
/// [`AuditSlot`] in the extensions, or answers 401 (403 for a refused impersonation); writes
/// the audit event when the response is done.
async fn authenticate(State(state): State<Arc<Steps>>, mut req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let received = chrono::Utc::now();
    let grpc = is_grpc(req.headers());
    let slot = AuditSlot::default();
    req.extensions_mut().insert(std::sync::Arc::clone(&slot));
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let remote = req
        .extensions()
        .get::<PeerIdentity>()
        .and_then(|p| p.remote);
    let agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let result = state
        .authn
        .authenticate(
            req.extensions().get::<PeerIdentity>(),
            req.headers(),
            req.uri().path(),
        )
        .and_then(|u| match &state.authz {
            Some(a) if !a.token_subject_alive(&u) => Err(AuthError::Revoked),
            _ => Ok(u),
        });
    let mut impersonator = None;
    let (user, resp) = match result {
        Err(e) => {
            debug!(path = %req.uri().path(), reason = %e, "authentication failed");
            let delay = state
                .throttle
                .failed(remote.map(|r| r.ip()), std::time::Instant::now());
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            (None, unauthorized(grpc))
        }
        Ok(authenticated) => {
            match impersonate(state.authz.as_deref(), authenticated.clone(), req.headers()) {
                Ok(user) => {
                    if user != authenticated {
                        impersonator = Some(authenticated);
                    }
                    req.extensions_mut().insert(user.clone());
                    (Some(user), next.run(req).await)
                }
                Err(e) => (Some(authenticated), refused(grpc, e.code, &e.message)),
            }
        }
    };
    if let Some(audit) = &state.audit {
        // gRPC answers errors in a trailers-only response: its code is the grpc-status.
        let code = match resp
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
        {
            Some("16") => 401,
            Some("7") => 403,
            _ => resp.status().as_u16(),
        };
        let record = slot
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        audit.record(
            &method,
            &uri,
            user.as_ref(),
            impersonator.as_ref(),
            remote,
            &agent,
            &record,
            code,
            received,
            started.elapsed(),
        );
    }
    resp
}

/// A refusal as kube-apiserver answers it: a `Status` for REST (the REST API's one Status
/// builder), the matching gRPC code.
fn refused(grpc: bool, code: u16, message: &str) -> Response {
    let (reason, status) = match code {
        400 => ("BadRequest", tonic::Status::invalid_argument(message)),
        401 => ("Unauthorized", tonic::Status::unauthenticated(message)),
        _ => ("Forbidden", tonic::Status::permission_denied(message)),
    };
    if grpc {
        return status.into_http::<Body>().into_response();
    }
    let (code, body) = crate::status::plain(code, reason, message);
    crate::status::respond_json(code, &body)
}
