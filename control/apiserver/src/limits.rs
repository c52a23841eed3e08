//! Denial-of-service limits, as kube-apiserver's `--max-requests-inflight` and
//! `--max-mutating-requests-inflight` with API Priority and Fairness' queues: each kind of
//! request (non-mutating, mutating) has a number of seats. A request that finds its kind's
//! seats taken waits in its user's own queue (at most [`Limits::queue_length_per_user`]
//! waiting, for at most [`Limits::queue_wait`]), and a freed seat goes to the users waiting
//! in turn, one request each, as APF's fair queuing hands seats to flows: a flood from one
//! user fills its own queue and waits there, costing no CPU, while another user's request
//! takes the next seat. A request whose user's queue is full, or that waited its time out, is
//! answered 429 `TooManyRequests` with `Retry-After: 1` (gRPC: `RESOURCE_EXHAUSTED`). Long-running
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
use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::request::MASTERS_GROUP;
use crate::request::UserInfo;

/// Largest request the server decodes (large lists go the other way and are not capped).
pub(crate) const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// The limits; `0` turns one off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Non-mutating requests in flight at once (kube-apiserver's default 400).
    pub max_requests_inflight: usize,
    /// Mutating requests in flight at once (kube-apiserver's default 200).
    pub max_mutating_requests_inflight: usize,
    /// Watches one user may have open at once.
    pub max_watches_per_user: usize,
    /// How long a request waits for a seat (kube-apiserver's APF: 15 s); zero answers 429 at
    /// once.
    pub queue_wait: Duration,
    /// Requests of one user that may wait for seats of one kind at once (APF's default
    /// queue length, 50); more are answered 429 at once.
    pub queue_length_per_user: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            max_watches_per_user: 500,
            queue_wait: Duration::from_secs(15),
            queue_length_per_user: 50,
        }
    }
}

/// The shared state of the limits.
#[derive(Debug)]
pub(crate) struct Limiter {
    limits: Limits,
    reads: Arc<FairPool>,
    writes: Arc<FairPool>,
    watches: Arc<Mutex<HashMap<String, usize>>>,
}

impl Limiter {
    pub(crate) fn new(limits: Limits) -> Arc<Limiter> {
        let permits = |seats: usize| {
            Arc::new(FairPool {
                seats,
                queue_length_per_user: limits.queue_length_per_user,
                queues: Mutex::default(),
            })
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

/// Seats handed out fairly across users (one pool per kind of request).
#[derive(Debug)]
struct FairPool {
    /// 0: no limit.
    seats: usize,
    queue_length_per_user: usize,
    queues: Mutex<Queues>,
}

#[derive(Debug, Default)]
struct Queues {
    in_use: usize,
    /// Each user's waiting requests, oldest first.
    waiting: HashMap<String, VecDeque<oneshot::Sender<()>>>,
    /// The users with waiting requests, in the order their turns come.
    turn: VecDeque<String>,
}

/// A taken seat; freed (and handed to the next user waiting) when dropped.
#[derive(Debug)]
struct Seat {
    pool: Arc<FairPool>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.pool.release();
    }
}

impl FairPool {
    /// A seat for `user`: at once when one is free and nobody waits, else after waiting in
    /// the user's queue; `None` when the queue is full or the wait ran out.
    async fn acquire(self: &Arc<Self>, user: &str, wait: Duration) -> Option<Seat> {
        let seat = || Seat {
            pool: Arc::clone(self),
        };
        let mut rx = {
            let mut q = self.queues.lock().ok()?;
            if self.seats == 0 || (q.in_use < self.seats && q.turn.is_empty()) {
                q.in_use += 1;
                return Some(seat());
            }
            if wait.is_zero() {
                return None;
            }
            let queue = q.waiting.entry(user.to_string()).or_default();
            let in_turn = !queue.is_empty();
            // Requests that stopped waiting leave their places.
            queue.retain(|tx| !tx.is_closed());
            if queue.len() >= self.queue_length_per_user {
                return None;
            }
            let (tx, rx) = oneshot::channel();
            queue.push_back(tx);
            if !in_turn {
                q.turn.push_back(user.to_string());
            }
            rx
        };
        match tokio::time::timeout(wait, &mut rx).await {
            Ok(Ok(())) => Some(seat()),
            Ok(Err(_)) => None,
            // A seat handed over as the wait ran out is still this request's.
            Err(_) => {
                rx.close();
                rx.try_recv().ok().map(|()| seat())
            }
        }
    }

    /// Frees a seat and hands free seats to the waiting users in turn, one request each.
    fn release(&self) {
        let Ok(mut q) = self.queues.lock() else {
            return;
        };
        q.in_use = q.in_use.saturating_sub(1);
        while self.seats == 0 || q.in_use < self.seats {
            let Some(user) = q.turn.pop_front() else {
                break;
            };
            let Some(queue) = q.waiting.get_mut(&user) else {
                continue;
            };
            let next = queue.pop_front();
            if queue.is_empty() {
                q.waiting.remove(&user);
            } else {
                q.turn.push_back(user);
            }
            if let Some(tx) = next
                && tx.send(()).is_ok()
            {
                q.in_use += 1;
            }
        }
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
    let mut resp = crate::status::respond_json(429, &body);
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
    let grpc = crate::request::is_grpc(req.headers());
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
            let pool = if class == Class::Mutating {
                &limiter.writes
            } else {
                &limiter.reads
            };
            let name = user.map(|u| u.name.as_str()).unwrap_or_default();
            let Some(permit) = pool.acquire(name, limiter.limits.queue_wait).await else {
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
    Inflight(#[allow(dead_code, reason = "held for its Drop")] Seat),
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

    fn pool(seats: usize, queue_length_per_user: usize) -> Arc<FairPool> {
        Arc::new(FairPool {
            seats,
            queue_length_per_user,
            queues: Mutex::default(),
        })
    }

    /// Waits until `n` requests wait in `pool`.
    async fn waiting(pool: &FairPool, n: usize) {
        for _ in 0..200 {
            let now = {
                let q = pool.queues.lock().expect("lock");
                q.waiting
                    .values()
                    .flatten()
                    .filter(|tx| !tx.is_closed())
                    .count()
            };
            if now == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{n} requests never waited");
    }

    /// A flooding user's requests wait in its own queue; a freed seat goes to the users in
    /// turn, so another user's one request is served after one of the flood's, not after
    /// all of them.
    #[tokio::test]
    async fn users_take_turns_for_freed_seats() {
        let p = pool(1, 50);
        let wait = Duration::from_secs(10);
        let held = p.acquire("flood", wait).await.expect("a free seat");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let spawn = |user: &'static str, tasks: &mut Vec<_>| {
            let (p, order) = (Arc::clone(&p), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let seat = p.acquire(user, wait).await.expect("a seat in time");
                order.lock().expect("lock").push(user);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(seat);
            }));
        };
        for i in 0..4 {
            spawn("flood", &mut tasks);
            waiting(&p, i + 1).await;
        }
        spawn("alice", &mut tasks);
        waiting(&p, 5).await;
        drop(held);
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(
            *order.lock().expect("lock"),
            ["flood", "alice", "flood", "flood", "flood"]
        );
        assert_eq!(p.queues.lock().expect("lock").in_use, 0);
    }

    /// A user's queue holds `queue_length_per_user` requests; the next is refused at once,
    /// another user's still waits. A request that waited its time out is refused and leaves
    /// no seat taken.
    #[tokio::test]
    async fn full_queues_and_timeouts_refuse_without_leaking_seats() {
        let p = pool(1, 2);
        let held = p
            .acquire("flood", Duration::ZERO)
            .await
            .expect("a free seat");
        assert!(
            p.acquire("flood", Duration::ZERO).await.is_none(),
            "no wait: 429"
        );
        let q1 = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire("flood", Duration::from_secs(10)).await.is_some() }
        });
        let q2 = tokio::spawn({
            let p = Arc::clone(&p);
            async move {
                p.acquire("flood", Duration::from_millis(100))
                    .await
                    .is_some()
            }
        });
        waiting(&p, 2).await;
        let started = std::time::Instant::now();
        assert!(
            p.acquire("flood", Duration::from_secs(10)).await.is_none(),
            "the third waiting request of one user is over its queue"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refused at once"
        );
        assert!(!q2.await.expect("task"), "waited 100 ms: refused");
        let alice = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire("alice", Duration::from_secs(10)).await.is_some() }
        });
        waiting(&p, 2).await;
        drop(held);
        assert!(q1.await.expect("task"));
        assert!(alice.await.expect("task"));
        assert_eq!(p.queues.lock().expect("lock").in_use, 0, "no seat leaked");
        assert!(p.acquire("bob", Duration::ZERO).await.is_some());
    }

    #[tokio::test]
    async fn requests_over_an_inflight_limit_without_a_queue_are_answered_429_at_once() {
        use tower::ServiceExt as _;
        let limiter = Limiter::new(Limits {
            max_requests_inflight: 1,
            max_mutating_requests_inflight: 1,
            queue_wait: Duration::ZERO,
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
