//! Failover between several API servers over one store: a tower `Service` over one lazily
//! connecting tonic [`Channel`] per server, shared by the gRPC calls and the REST calls.
//!
//! Requests go to the current server. A request that fails because the server could not be
//! reached (connection refused or reset, TLS handshake failure, connect timeout, a connection
//! that broke under the request) marks that server unhealthy for a back-off (1 s doubling to
//! 30 s) and moves the next requests to the next usable server, round-robin from there; when
//! every server is in back-off, to the one whose back-off ends first. A server is healthy again
//! once a request to it succeeds. The failed request itself returns its error (its body is a
//! stream and cannot be replayed); callers retry. Error statuses from a live server are
//! answers, not failures of the server.
//!
//! Why not [`Channel::balance_list`]: tower's power-of-two-choices balancer over tonic's lazy
//! connections keeps choosing a dead server. tonic's `Reconnect` reports a connection whose
//! connect failed as ready (it keeps the error for the next call) and every connection's load
//! is 0, so after the first failure the balancer still sends a good share of the requests to
//! the dead server (15 of 40 in a trial with one dead and one live server), each paying a new
//! connect attempt (up to the connect timeout for a host that does not answer). Here a dead server gets no request until its back-off ends, and one
//! server at a time is used, on one connection.
//!
//! With one server this is a pass-through: same errors, no health tracking, no logs.

use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use http_body_util::BodyExt;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::transport::Channel;
use tower::ServiceExt;

type BoxError = Box<dyn StdError + Send + Sync>;

/// The first back-off of a server that failed.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest back-off.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The API servers and which one is in use. Cheap to clone; clones share the state.
#[derive(Clone)]
pub(crate) struct Failover {
    shared: Arc<ServerSet>,
}

struct ServerSet {
    servers: Vec<Server>,
    rotation: Mutex<Rotation>,
}

struct Server {
    url: Arc<str>,
    channel: Channel,
}

impl fmt::Debug for Failover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<&str> = self.shared.servers.iter().map(|s| &*s.url).collect();
        f.debug_struct("Failover")
            .field("servers", &urls)
            .field("current", &self.current())
            .finish()
    }
}

impl Failover {
    /// One server: a pass-through to its channel.
    pub(crate) fn single(url: &str, channel: Channel) -> Failover {
        Failover::new(vec![(url.to_string(), channel)])
    }

    /// `servers` (URL and channel; at least one), the first current.
    pub(crate) fn new(servers: Vec<(String, Channel)>) -> Failover {
        let n = servers.len();
        Failover {
            shared: Arc::new(ServerSet {
                servers: servers
                    .into_iter()
                    .map(|(url, channel)| Server {
                        url: url.into(),
                        channel,
                    })
                    .collect(),
                rotation: Mutex::new(Rotation::new(n)),
            }),
        }
    }

    fn rotation(&self) -> std::sync::MutexGuard<'_, Rotation> {
        self.shared
            .rotation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn is_single(&self) -> bool {
        self.shared.servers.len() == 1
    }

    /// The URL of server `i`.
    pub(crate) fn url(&self, i: usize) -> &str {
        &self.shared.servers[i].url
    }

    /// The URL of the server the next request goes to.
    pub(crate) fn current(&self) -> &str {
        let i = self.rotation().pick(Instant::now());
        self.url(i)
    }

    /// Every server, in the order a request that can be repeated tries them: the one
    /// requests go to now, the other usable ones round-robin, then those in back-off by the
    /// end of their back-off.
    pub(crate) fn order(&self) -> Vec<usize> {
        self.rotation().order(Instant::now())
    }

    /// Server `i` could not be reached (`error` says why): it is not used again before its
    /// back-off ends.
    pub(crate) fn failed(&self, i: usize, error: &dyn fmt::Display) {
        if self.is_single() {
            return;
        }
        let marked = self.rotation().failed(i, Instant::now());
        match marked {
            Some(ServerBackoff { delay, first: true }) => tracing::warn!(
                server = self.url(i), error = %error, retry_in = ?delay,
                "API server unreachable; failing over to the next one"
            ),
            Some(ServerBackoff {
                delay,
                first: false,
            }) => tracing::debug!(
                server = self.url(i), error = %error, retry_in = ?delay,
                "API server still unreachable"
            ),
            None => {}
        }
    }

    /// Server `i` answered.
    pub(crate) fn succeeded(&self, i: usize) {
        if self.is_single() {
            return;
        }
        if self.rotation().succeeded(i) {
            tracing::info!(server = self.url(i), "API server reachable again; using it");
        }
    }

    /// A response body error of server `i`: marks the server when the connection broke, and
    /// names the server in the error.
    fn body_error(&self, i: usize, status: tonic::Status) -> BoxError {
        if !is_server_failure(&status) {
            return Box::new(status);
        }
        self.failed(i, &crate::error::transport_reason(&status));
        Box::new(ServerError {
            url: self.shared.servers[i].url.clone(),
            source: Box::new(status),
        })
    }
}

impl Service<http::Request<Body>> for Failover {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call waits for its own server's channel (`oneshot` below): which server that
        // is is known only when the call is made.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let i = self.rotation().pick(Instant::now());
        let channel = self.shared.servers[i].channel.clone();
        if self.is_single() {
            return Box::pin(async move { channel.oneshot(req).await.map_err(Into::into) });
        }
        let this = self.clone();
        Box::pin(async move {
            match channel.oneshot(req).await {
                Ok(resp) => {
                    this.succeeded(i);
                    let watcher = this.clone();
                    Ok(resp.map(move |body| {
                        Body::new(body.map_err(move |status| watcher.body_error(i, status)))
                    }))
                }
                Err(e) => {
                    if is_server_failure(&e) {
                        this.failed(i, &crate::error::transport_reason(&e));
                    }
                    Err(Box::new(ServerError {
                        url: this.shared.servers[i].url.clone(),
                        source: e.into(),
                    }) as BoxError)
                }
            }
        })
    }
}

/// Whether `err` (of a request or of a response body) says the server itself failed: the
/// connection could not be made (tonic's `ConnectError`: refused, TLS handshake, connect
/// timeout), or broke (an I/O error, a connection closed under the request or going away, a
/// keep-alive timeout). A request's own deadline, a reset of one stream by a live server or
/// an error of the request body are not.
pub(crate) fn is_server_failure(err: &(dyn StdError + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<tonic::ConnectError>() || e.is::<std::io::Error>() {
            return true;
        }
        if e.is::<tonic::TimeoutExpired>() {
            return false;
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_user() {
                return false;
            }
            if h.is_closed() || h.is_canceled() || h.is_incomplete_message() || h.is_timeout() {
                return true;
            }
        }
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_io() || h2.is_go_away();
        }
        cur = e.source();
    }
    false
}

/// A transport error of a request to one of several servers, naming that server (see
/// [`server_of`]); otherwise transparent: it displays as its source.
#[derive(Debug)]
pub(crate) struct ServerError {
    url: Arc<str>,
    source: BoxError,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl StdError for ServerError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// The server a failed request went to, when there were several to choose from.
pub(crate) fn server_of<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a str> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(s) = e.downcast_ref::<ServerError>() {
            return Some(&s.url);
        }
        cur = e.source();
    }
    None
}

/// A server's health: consecutive failures and the end of its back-off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Health {
    /// 0: healthy.
    failures: u32,
    /// Not used before this.
    until: Option<Instant>,
}

/// A back-off a failure started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ServerBackoff {
    delay: Duration,
    /// The server was healthy before.
    first: bool,
}

/// Which server is current and which are in back-off (time passed in: pure).
#[derive(Debug)]
struct Rotation {
    current: usize,
    health: Vec<Health>,
}

impl Rotation {
    fn new(n: usize) -> Rotation {
        Rotation {
            current: 0,
            health: vec![Health::default(); n],
        }
    }

    fn usable(&self, i: usize, now: Instant) -> bool {
        self.health[i].until.is_none_or(|t| t <= now)
    }

    /// The server for the next request, which becomes the current one: the current one if
    /// usable, else the next usable one after it, else the one whose back-off ends first.
    fn pick(&mut self, now: Instant) -> usize {
        let n = self.health.len();
        let next = (0..n)
            .map(|k| (self.current + k) % n)
            .find(|&i| self.usable(i, now))
            .or_else(|| (0..n).min_by_key(|&i| self.health[i].until))
            .unwrap_or(self.current);
        self.current = next;
        next
    }

    /// [`Rotation::pick`]'s server, then the other usable ones round-robin, then the others
    /// by the end of their back-off.
    fn order(&mut self, now: Instant) -> Vec<usize> {
        let first = self.pick(now);
        let n = self.health.len();
        let rest: Vec<usize> = (1..n).map(|k| (first + k) % n).collect();
        let (usable, mut waiting): (Vec<usize>, Vec<usize>) =
            rest.into_iter().partition(|&i| self.usable(i, now));
        waiting.sort_by_key(|&i| self.health[i].until);
        std::iter::once(first)
            .chain(usable)
            .chain(waiting)
            .collect()
    }

    /// Server `i` failed: the back-off it starts, or `None` when it is in one already (other
    /// requests that failed in the same outage).
    fn failed(&mut self, i: usize, now: Instant) -> Option<ServerBackoff> {
        if !self.usable(i, now) {
            return None;
        }
        let h = &mut self.health[i];
        h.failures = h.failures.saturating_add(1);
        // 2^5 s is past the cap already.
        let delay = (FIRST_BACKOFF * (1 << (h.failures - 1).min(5))).min(MAX_BACKOFF);
        h.until = Some(now + delay);
        Some(ServerBackoff {
            delay,
            first: h.failures == 1,
        })
    }

    /// Server `i` answered: whether it had failed before.
    fn succeeded(&mut self, i: usize) -> bool {
        let h = &mut self.health[i];
        let was_failed = h.failures > 0;
        *h = Health::default();
        was_failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn fails_over_round_robin_and_backs_off() {
        let t0 = Instant::now();
        let mut r = Rotation::new(3);
        assert_eq!(r.pick(t0), 0);
        assert_eq!(r.pick(t0), 0, "the current server stays while healthy");
        assert_eq!(
            r.failed(0, t0),
            Some(ServerBackoff {
                delay: S,
                first: true
            })
        );
        // Other requests of the same outage do not extend the back-off.
        assert_eq!(r.failed(0, t0), None);
        assert_eq!(r.pick(t0), 1);
        assert_eq!(r.order(t0), [1, 2, 0]);
        // Its back-off over, 0 is usable again, but 1 stays current while it works.
        assert_eq!(r.pick(t0 + 2 * S), 1);
        assert_eq!(r.failed(1, t0 + 2 * S).map(|b| b.delay), Some(S));
        assert_eq!(r.pick(t0 + 2 * S), 2, "round-robin from the failed one");
        // Failing again doubles the back-off, up to 30 s.
        assert_eq!(r.failed(0, t0 + 2 * S).map(|b| b.delay), Some(2 * S));
        let mut t = t0 + 2 * S;
        let mut delays = vec![];
        for _ in 0..8 {
            t += MAX_BACKOFF;
            delays.push(r.failed(0, t).map(|b| (b.delay.as_secs(), b.first)));
        }
        assert_eq!(
            delays,
            [4, 8, 16, 30, 30, 30, 30, 30].map(|d| Some((d, false)))
        );
        assert!(r.succeeded(0));
        assert!(!r.succeeded(0));
        assert_eq!(r.failed(0, t).map(|b| b.delay), Some(S));
    }

    #[test]
    fn all_in_back_off_picks_the_one_that_ends_first() {
        let t0 = Instant::now();
        let mut r = Rotation::new(3);
        r.failed(0, t0);
        r.failed(1, t0 - S / 2);
        r.failed(2, t0 + S / 4);
        assert_eq!(r.pick(t0), 1);
        assert_eq!(r.order(t0), [1, 0, 2]);
        // A failure of the chosen one while in back-off changes nothing.
        assert_eq!(r.failed(1, t0), None);
        assert_eq!(r.pick(t0), 1);
        assert!(r.succeeded(1));
        assert_eq!(r.order(t0), [1, 0, 2]);
    }

    #[test]
    fn order_puts_usable_servers_before_those_in_back_off() {
        let t0 = Instant::now();
        let mut r = Rotation::new(4);
        r.failed(2, t0);
        r.failed(1, t0 + S);
        assert_eq!(r.order(t0), [0, 3, 2, 1]);
        r.failed(0, t0);
        assert_eq!(r.order(t0), [3, 0, 2, 1]);
    }

    #[test]
    fn connection_errors_are_failures_of_the_server() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(is_server_failure(&tonic::ConnectError(Box::new(refused))));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let status = tonic::Status::from_error(Box::new(reset));
        assert!(is_server_failure(&status));
        let go_away = h2::Error::from(h2::Reason::NO_ERROR);
        assert!(!is_server_failure(&go_away), "a reset of one stream");
        // Statuses a server sends, and a request's own deadline, are not.
        assert!(!is_server_failure(&tonic::Status::unavailable(
            "the API server is shutting down"
        )));
        assert!(!is_server_failure(&tonic::TimeoutExpired(())));
        let wrapped = ServerError {
            url: "http://a:1".into(),
            source: Box::new(tonic::ConnectError(Box::new(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))),
        };
        assert!(is_server_failure(&wrapped));
        assert_eq!(server_of(&wrapped), Some("http://a:1"));
        // Transparent: it displays as what it wraps.
        assert_eq!(wrapped.to_string(), wrapped.source.to_string());
    }
}
