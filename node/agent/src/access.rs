//! Who may use the agent's API beyond the API server and `system:masters`: the API server
//! decides, through a SubjectAccessReview for `<verb>` on `nodes/<subresource>` of this node,
//! as the kubelet's webhook authorizer asks (so a Prometheus identity bound to a role with
//! `get` on `nodes/metrics` scrapes `/metrics`, and `view`-like users do not read logs).
//! Answers are kept as the kubelet keeps them: allowed for 5 minutes, denied for 30 seconds;
//! a failed review is not kept.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use skiff_client::{Client, ResourceAttributes};

/// How long an allowed answer is kept (the kubelet's `--authorization-webhook-cache-authorized-ttl`).
const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied answer is kept (`--authorization-webhook-cache-unauthorized-ttl`).
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Most answers kept; past it the expired ones go, then all.
const MAX_ENTRIES: usize = 4096;

/// One request's attributes, as the kubelet names them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Request {
    pub user: String,
    pub groups: Vec<String>,
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// The API server's answers, kept for a while.
#[derive(Debug, Default)]
pub(crate) struct AccessCache {
    answers: Mutex<HashMap<Request, (bool, Instant)>>,
}

impl AccessCache {
    /// Whether `req` is allowed on node `node`: a kept answer, else the API server's through
    /// `client`. `Err`: the review failed (the reason, for the log).
    pub async fn allowed(
        &self,
        client: &Client,
        node: &str,
        req: &Request,
    ) -> Result<bool, String> {
        let now = Instant::now();
        if let Some(allowed) = self.kept(req, now) {
            return Ok(allowed);
        }
        let attrs = ResourceAttributes {
            verb: req.verb,
            resource: "nodes",
            subresource: req.subresource,
            name: node,
            ..ResourceAttributes::default()
        };
        let (allowed, _reason) = client
            .subject_access_review(&req.user, &req.groups, &attrs)
            .await
            .map_err(|e| e.to_string())?;
        self.keep(req.clone(), allowed, now);
        Ok(allowed)
    }

    fn kept(&self, req: &Request, now: Instant) -> Option<bool> {
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        answers
            .get(req)
            .filter(|(_, until)| *until > now)
            .map(|(allowed, _)| *allowed)
    }

    fn keep(&self, req: Request, allowed: bool, now: Instant) {
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        if answers.len() >= MAX_ENTRIES {
            answers.retain(|_, (_, until)| *until > now);
            if answers.len() >= MAX_ENTRIES {
                answers.clear();
            }
        }
        answers.insert(req, (allowed, now + ttl));
    }
}

/// The kubelet's verb for an HTTP method.
pub(crate) fn verb_of(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "create",
    }
}

/// The kubelet's name for what a path reads: `nodes/<subresource>`.
pub(crate) fn subresource_of(path: &str) -> &'static str {
    match path.split('/').nth(1).unwrap_or("") {
        "logs" => "log",
        "stats" => "stats",
        "metrics" => "metrics",
        _ => "proxy",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(user: &str) -> Request {
        Request {
            user: user.into(),
            groups: vec![],
            verb: "get",
            subresource: "metrics",
        }
    }

    #[test]
    fn answers_are_kept_for_their_ttl_allowed_longer_than_denied() {
        let cache = AccessCache::default();
        let t0 = Instant::now();
        cache.keep(req("yes"), true, t0);
        cache.keep(req("no"), false, t0);
        assert_eq!(cache.kept(&req("yes"), t0), Some(true));
        assert_eq!(cache.kept(&req("no"), t0), Some(false));
        assert_eq!(cache.kept(&req("other"), t0), None);
        let later = t0 + DENIED_TTL + Duration::from_secs(1);
        assert_eq!(cache.kept(&req("no"), later), None, "denied expires first");
        assert_eq!(cache.kept(&req("yes"), later), Some(true));
        assert_eq!(cache.kept(&req("yes"), t0 + ALLOWED_TTL), None);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let cache = AccessCache::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES + 10 {
            cache.keep(req(&format!("u{i}")), true, t0);
        }
        assert!(cache.answers.lock().unwrap().len() <= MAX_ENTRIES);
    }

    #[test]
    fn paths_and_methods_are_named_as_the_kubelet_names_them() {
        assert_eq!(subresource_of("/logs/ns/p/c"), "log");
        assert_eq!(subresource_of("/stats/summary"), "stats");
        assert_eq!(subresource_of("/metrics"), "metrics");
        assert_eq!(subresource_of("/exec/ns/p/c"), "proxy");
        assert_eq!(subresource_of("/bpf/services"), "proxy");
        assert_eq!(verb_of(&axum::http::Method::GET), "get");
        assert_eq!(verb_of(&axum::http::Method::POST), "create");
        assert_eq!(verb_of(&axum::http::Method::DELETE), "delete");
    }
}
