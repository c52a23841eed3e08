//! Denial-of-service limits, as kube-apiserver's `--max-requests-inflight` and
//! `--max-mutating-requests-inflight`: a request beyond the limit of its kind is answered at
//! once with 429 `TooManyRequests` and `Retry-After: 1` (gRPC: `RESOURCE_EXHAUSTED`), so a
//! flood of requests from one client never queues up behind the others' work. Long-running
//! requests (watches, exec, attach, port-forward, followed logs) do not count against the
//! inflight limits; watches count against a per-user limit instead
//! (`--max-watches-per-user`), held for as long as the watch's response streams.
//! `system:masters` is exempt, as kube-apiserver exempts it from its inflight limits.
//!
//! Runs after authentication (it needs the user) and before authorization.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::UserInfo;
use crate::auth::authz::MASTERS_GROUP;

/// The limits; `0` turns one off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Non-mutating requests in flight at once (kube-apiserver's default 400).
    pub max_requests_inflight: usize,
    /// Mutating requests in flight at once (kube-apiserver's default 200).
    pub max_mutating_requests_inflight: usize,
    /// Watches one user may have open at once.
    pub max_watches_per_user: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            max_watches_per_user: 500,
        }
    }
}

/// The shared state of the limits.
#[derive(Debug)]
pub(crate) struct Limiter {
    limits: Limits,
    reads: Arc<Semaphore>,
    writes: Arc<Semaphore>,
    watches: Arc<Mutex<HashMap<String, usize>>>,
}

impl Limiter {
    pub(crate) fn new(limits: Limits) -> Arc<Limiter> {
        let permits = |n: usize| {
            Arc::new(Semaphore::new(if n == 0 {
                Semaphore::MAX_PERMITS
            } else {
                n
            }))
        };
        Arc::new(Limiter {
            limits,
            reads: permits(limits.max_requests_inflight),
            writes: permits(limits.max_mutating_requests_inflight),
            watches: Arc::default(),
        })
    }

    /// A watch permit for `user`, or `None` when the user has its limit open.
    fn watch(&self, user: &str) -> Option<WatchPermit> {
        let limit = self.limits.max_watches_per_user;
        let mut open = self.watches.lock().ok()?;
        let n = open.entry(user.to_string()).or_insert(0);
        if limit != 0 && *n >= limit {
            return None;
        }
        *n += 1;
        Some(WatchPermit {
            user: user.to_string(),
            watches: Arc::clone(&self.watches),
        })
    }

    /// Watches `user` has open.
    #[cfg(test)]
    fn open_watches(&self, user: &str) -> usize {
        self.watches
            .lock()
            .map(|m| m.get(user).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// One open watch of a user; released when the watch's response ends.
#[derive(Debug)]
struct WatchPermit {
    user: String,
    watches: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        if let Ok(mut open) = self.watches.lock()
            && let Some(n) = open.get_mut(&self.user)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.user);
            }
        }
    }
}

/// What a request is, for the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Watch,
    /// exec, attach, port-forward, followed logs: bounded by other means.
    LongRunning,
    Mutating,
    ReadOnly,
}

fn classify(req: &Request) -> Class {
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    let flag = |name: &str| {
        query
            .split('&')
            .any(|kv| kv == format!("{name}=true") || kv == format!("{name}=1"))
    };
    if path == "/skiff.rpc.Api/Watch" || (req.method() == Method::GET && flag("watch")) {
        return Class::Watch;
    }
    let sub = path.rsplit('/').next().unwrap_or("");
    if matches!(sub, "exec" | "attach" | "portforward")
        || (sub == "log" && flag("follow"))
        || path.starts_with("/skiff/v1/")
    {
        return Class::LongRunning;
    }
    // gRPC calls are all POSTs: their method names say whether they write.
    if let Some(method) = path.strip_prefix("/skiff.rpc.Api/") {
        return match method {
            "Get" | "List" | "Discovery" => Class::ReadOnly,
            _ => Class::Mutating,
        };
    }
    match *req.method() {
        Method::GET | Method::HEAD | Method::OPTIONS => Class::ReadOnly,
        _ => Class::Mutating,
    }
}

/// The 429 answer (gRPC: `RESOURCE_EXHAUSTED`), with kube-apiserver's message.
fn too_many(grpc: bool) -> Response {
    const MESSAGE: &str = "Too many requests, please try again later.";
    if grpc {
        return tonic::Status::resource_exhausted(MESSAGE)
            .into_http::<Body>()
            .into_response();
    }
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": MESSAGE,
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 1},
        "code": 429,
    });
    let mut resp = crate::rest::respond_json(429, &body);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// The middleware.
pub(crate) async fn middleware(
    State(limiter): State<Arc<Limiter>>,
    req: Request,
    next: Next,
) -> Response {
    let user = req.extensions().get::<UserInfo>();
    if user.is_some_and(|u| u.groups.iter().any(|g| g == MASTERS_GROUP)) {
        return next.run(req).await;
    }
    let grpc = crate::auth::is_grpc(req.headers());
    match classify(&req) {
        Class::LongRunning => next.run(req).await,
        Class::Watch => {
            let name = user.map(|u| u.name.clone()).unwrap_or_default();
            let Some(permit) = limiter.watch(&name) else {
                return too_many(grpc);
            };
            holding(next.run(req).await, Permit::Watch(permit))
        }
        class => {
            let sem = if class == Class::Mutating {
                &limiter.writes
            } else {
                &limiter.reads
            };
            let Ok(permit) = Arc::clone(sem).try_acquire_owned() else {
                return too_many(grpc);
            };
            // Held until the response body is sent (a large list is still work).
            holding(next.run(req).await, Permit::Inflight(permit))
        }
    }
}

#[derive(Debug)]
enum Permit {
    Watch(#[allow(dead_code, reason = "held for its Drop")] WatchPermit),
    Inflight(#[allow(dead_code, reason = "held for its Drop")] OwnedSemaphorePermit),
}

/// `resp` with its body holding `permit` until the body ends (or is dropped).
fn holding(resp: Response, permit: Permit) -> Response {
    let (parts, body) = resp.into_parts();
    Response::from_parts(
        parts,
        Body::new(Guarded {
            inner: body,
            _permit: permit,
        }),
    )
}

/// A response body that holds a permit until it ends (or is dropped).
struct Guarded {
    inner: Body,
    _permit: Permit,
}

impl http_body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, uri: &str) -> Request {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .expect("request")
    }

    #[test]
    fn requests_are_classified_as_kube_apiserver_does() {
        let c = |m: Method, u: &str| classify(&req(m, u));
        assert_eq!(c(Method::GET, "/api/v1/pods?watch=true"), Class::Watch);
        assert_eq!(c(Method::GET, "/api/v1/pods?watch=1&rv=3"), Class::Watch);
        assert_eq!(c(Method::POST, "/skiff.rpc.Api/Watch"), Class::Watch);
        assert_eq!(c(Method::GET, "/api/v1/pods"), Class::ReadOnly);
        assert_eq!(c(Method::POST, "/skiff.rpc.Api/List"), Class::ReadOnly);
        assert_eq!(c(Method::POST, "/skiff.rpc.Api/Create"), Class::Mutating);
        assert_eq!(
            c(Method::PATCH, "/api/v1/namespaces/a/pods/p"),
            Class::Mutating
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/a/pods/p/exec?command=sh"),
            Class::LongRunning
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/a/pods/p/log?follow=true"),
            Class::LongRunning
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/a/pods/p/log"),
            Class::ReadOnly
        );
    }

    #[tokio::test]
    async fn requests_over_an_inflight_limit_are_answered_429_at_once() {
        use tower::ServiceExt as _;
        let limiter = Limiter::new(Limits {
            max_requests_inflight: 1,
            max_mutating_requests_inflight: 1,
            ..Limits::default()
        });
        let gate = Arc::new(tokio::sync::Notify::new());
        let g = Arc::clone(&gate);
        let app = axum::Router::new()
            .route(
                "/slow",
                axum::routing::get(move || {
                    let g = Arc::clone(&g);
                    async move {
                        g.notified().await;
                        "done"
                    }
                })
                .post(|| async { "written" }),
            )
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&limiter),
                middleware,
            ));
        let first = tokio::spawn(app.clone().oneshot(req(Method::GET, "/slow")));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let second = app
            .clone()
            .oneshot(req(Method::GET, "/slow"))
            .await
            .expect("answer");
        assert_eq!(second.status(), 429);
        assert_eq!(
            second
                .headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        // Writes have their own limit.
        let write = app
            .clone()
            .oneshot(req(Method::POST, "/slow"))
            .await
            .expect("answer");
        assert_eq!(write.status(), 200);
        gate.notify_one();
        let done = first.await.expect("task").expect("answer");
        assert_eq!(done.status(), 200);
        drop(done);
        let third = tokio::spawn(app.clone().oneshot(req(Method::GET, "/slow")));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        gate.notify_one();
        assert_eq!(third.await.expect("task").expect("answer").status(), 200);
    }

    #[test]
    fn watches_are_counted_per_user_and_released() {
        let l = Limiter::new(Limits {
            max_watches_per_user: 2,
            ..Limits::default()
        });
        let a = l.watch("alice").expect("first");
        let b = l.watch("alice").expect("second");
        assert!(l.watch("alice").is_none(), "third is over the limit");
        let _c = l.watch("bob").expect("bob has his own");
        drop(a);
        assert_eq!(l.open_watches("alice"), 1);
        let _d = l.watch("alice").expect("freed");
        drop(b);
        assert_eq!(l.open_watches("alice"), 1);
    }
}
