//! The reflector: list, then watch from the list's revision, re-watch from the last seen
//! revision when a watch ends or fails, and list again only when the server says the revision
//! is too old. It never gives up: errors are retried with capped exponential back-off. A
//! watch that failed resumes from its revision, so a client failing over to another API
//! server (same store, same revisions) goes on without a relist.
//!
//! Every controller, the scheduler and the node agent observe the cluster through this one
//! code path ("watch, don't poll"), optionally keeping a [`Store`] of the current objects.
//! It reflects anything that lists and watches ([`ListWatch`]): a typed [`Api`], or a
//! [`DynamicApi`] for a kind known only at run time (a custom resource).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use skiff_api::Resource;

use crate::{Api, ClientError, DynamicApi, ListParams, ObjectList, WatchEvent, WatchStream};

/// A source of objects a reflector can follow: a list with its revision, and a watch from a
/// revision.
pub trait ListWatch: Send + 'static {
    type Object: Send + 'static;
    /// The resource's name, for logs.
    fn resource(&self) -> &str;
    fn list<'a>(
        &'a self,
        lp: &'a ListParams,
    ) -> BoxFuture<'a, Result<ObjectList<Self::Object>, ClientError>>;
    fn watch(&self, lp: &ListParams, resource_version: &str) -> WatchStream<Self::Object>;
    /// The object's resourceVersion (empty when it has none).
    fn revision_of(obj: &Self::Object) -> &str;
}

impl<T: Resource> ListWatch for Api<T> {
    type Object = T;
    fn resource(&self) -> &str {
        T::INFO.plural
    }
    fn list<'a>(&'a self, lp: &'a ListParams) -> BoxFuture<'a, Result<ObjectList<T>, ClientError>> {
        Api::list(self, lp).boxed()
    }
    fn watch(&self, lp: &ListParams, resource_version: &str) -> WatchStream<T> {
        Api::watch(self, lp, resource_version)
    }
    fn revision_of(obj: &T) -> &str {
        obj.resource_version()
    }
}

impl ListWatch for DynamicApi {
    type Object = serde_json::Value;
    fn resource(&self) -> &str {
        self.kind().info().plural
    }
    fn list<'a>(
        &'a self,
        lp: &'a ListParams,
    ) -> BoxFuture<'a, Result<ObjectList<serde_json::Value>, ClientError>> {
        DynamicApi::list(self, lp).boxed()
    }
    fn watch(&self, lp: &ListParams, resource_version: &str) -> WatchStream<serde_json::Value> {
        DynamicApi::watch(self, lp, resource_version)
    }
    fn revision_of(obj: &serde_json::Value) -> &str {
        obj["metadata"]["resourceVersion"].as_str().unwrap_or("")
    }
}

/// What a reflector reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<T> {
    /// A fresh list: this is now the complete set of objects (after a start or a relist).
    Restarted(Vec<T>),
    /// An object was added or modified.
    Applied(T),
    /// An object was deleted; this is its last state.
    Deleted(T),
}

/// Back-off between failed attempts: 100 ms doubling to 30 s.
#[derive(Debug, Clone)]
struct RetryBackoff {
    next: Duration,
}

impl RetryBackoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(30);

    fn new() -> Self {
        RetryBackoff { next: Self::FIRST }
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    fn step(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        now
    }
}

enum Phase<T> {
    List,
    Watch(String),
    Watching(crate::WatchStream<T>, String),
    /// Wait, then list (`None`) or watch from the revision.
    Wait(Duration, Option<String>),
}

impl<T> fmt::Debug for Phase<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::List => f.write_str("List"),
            Phase::Watch(rv) => f.debug_tuple("Watch").field(rv).finish(),
            Phase::Watching(_, rv) => f.debug_tuple("Watching").field(rv).finish(),
            Phase::Wait(d, rv) => f.debug_tuple("Wait").field(d).field(rv).finish(),
        }
    }
}

/// What follows a watch from `rv` that ended: `None` when the server ended it (e.g. its
/// timeout), else the error. Only an expired revision lists again; after any other error the
/// watch resumes from `rv` once the back-off has passed (the list it would take instead
/// would emit [`Event::Restarted`] for nothing).
fn after_watch<T>(end: Option<&ClientError>, rv: String, backoff: &mut RetryBackoff) -> Phase<T> {
    match end {
        None => Phase::Watch(rv),
        Some(ClientError::Expired { .. }) => Phase::List,
        Some(_) => Phase::Wait(backoff.step(), Some(rv)),
    }
}

struct ReflectorState<S: ListWatch> {
    api: S,
    lp: ListParams,
    phase: Phase<S::Object>,
    backoff: RetryBackoff,
}

/// Observes the objects `api` and `lp` select, forever.
pub fn reflector<S: ListWatch>(api: S, lp: ListParams) -> impl Stream<Item = Event<S::Object>> {
    let state = ReflectorState {
        api,
        lp,
        phase: Phase::List,
        backoff: RetryBackoff::new(),
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            match std::mem::replace(&mut s.phase, Phase::List) {
                Phase::Wait(d, next) => {
                    tokio::time::sleep(d).await;
                    s.phase = match next {
                        Some(rv) => Phase::Watch(rv),
                        None => Phase::List,
                    };
                }
                Phase::List => match s.api.list(&s.lp).await {
                    Ok(list) => {
                        s.backoff.reset();
                        s.phase = Phase::Watch(list.resource_version);
                        return Some((Event::Restarted(list.items), s));
                    }
                    Err(e) => {
                        let d = s.backoff.step();
                        tracing::warn!(resource = s.api.resource(), error = %e, retry_in = ?d, "list failed");
                        s.phase = Phase::Wait(d, None);
                    }
                },
                Phase::Watch(rv) => {
                    let stream = s.api.watch(&s.lp, &rv);
                    s.phase = Phase::Watching(stream, rv);
                }
                Phase::Watching(mut stream, mut rv) => match stream.next().await {
                    Some(Ok(ev)) => {
                        s.backoff.reset();
                        let seen = S::revision_of(ev.object());
                        if !seen.is_empty() {
                            rv = seen.to_string();
                        }
                        s.phase = Phase::Watching(stream, rv);
                        return Some((
                            match ev {
                                WatchEvent::Added(o) | WatchEvent::Modified(o) => Event::Applied(o),
                                WatchEvent::Deleted(o) => Event::Deleted(o),
                            },
                            s,
                        ));
                    }
                    end => {
                        let err = end.and_then(Result::err);
                        let next = after_watch(err.as_ref(), rv, &mut s.backoff);
                        match (&err, &next) {
                            (Some(e), Phase::Wait(d, Some(rv))) => tracing::warn!(
                                resource = s.api.resource(), error = %e, retry_in = ?d,
                                resource_version = %rv, "watch failed; resuming"
                            ),
                            (Some(_), _) => tracing::info!(
                                resource = s.api.resource(),
                                "watch too old, relisting"
                            ),
                            (None, _) => {}
                        }
                        s.phase = next;
                    }
                },
            }
        }
    })
}

/// `namespace/name` (or `name` for cluster-scoped objects).
pub fn object_key<T: Resource>(obj: &T) -> String {
    if obj.namespace().is_empty() {
        obj.name().to_string()
    } else {
        format!("{}/{}", obj.namespace(), obj.name())
    }
}

/// The current objects a reflector has seen, keyed by `namespace/name`. Cheap to clone.
#[derive(Debug)]
pub struct Store<T> {
    objects: Arc<RwLock<BTreeMap<String, Arc<T>>>>,
}

impl<T> Clone for Store<T> {
    fn clone(&self) -> Self {
        Store {
            objects: self.objects.clone(),
        }
    }
}

impl<T: Resource> Default for Store<T> {
    fn default() -> Self {
        Store {
            objects: Arc::default(),
        }
    }
}

impl<T: Resource> Store<T> {
    /// Applies one reflector event.
    pub fn apply(&self, event: &Event<T>) {
        let mut map = self.objects.write().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Restarted(items) => {
                *map = items
                    .iter()
                    .map(|o| (object_key(o), Arc::new(o.clone())))
                    .collect();
            }
            Event::Applied(o) => {
                map.insert(object_key(o), Arc::new(o.clone()));
            }
            Event::Deleted(o) => {
                map.remove(&object_key(o));
            }
        }
    }

    /// The object with key `namespace/name`.
    pub fn get(&self, key: &str) -> Option<Arc<T>> {
        self.objects
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    /// Every object, in key order.
    pub fn list(&self) -> Vec<Arc<T>> {
        self.objects
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A reflector that keeps `store` current; the events pass through after being applied.
pub fn reflect<T: Resource>(
    store: Store<T>,
    stream: impl Stream<Item = Event<T>>,
) -> impl Stream<Item = Event<T>> {
    stream.map(move |ev| {
        store.apply(&ev);
        ev
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, Pod};

    fn pod(ns: &str, name: &str) -> Pod {
        Pod {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: ns.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let mut b = RetryBackoff::new();
        let steps: Vec<_> = (0..12).map(|_| b.step()).collect();
        assert_eq!(steps[0], Duration::from_millis(100));
        assert_eq!(steps[1], Duration::from_millis(200));
        assert_eq!(*steps.last().unwrap(), Duration::from_secs(30));
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(100));
    }

    /// The phases a reflector goes through, as names with their revision.
    fn trace<T>(phase: &Phase<T>) -> String {
        format!("{phase:?}")
    }

    #[test]
    fn a_failed_watch_resumes_from_its_revision_without_relisting() {
        let mut b = RetryBackoff::new();
        let unreachable = ClientError::Unreachable {
            endpoint: "http://a:1".into(),
            reason: "connection refused".into(),
        };
        // Listed at 5, watched up to 7, then the watch fails once: wait, watch from 7.
        let mut phases = vec![Phase::<Pod>::Watch("5".into())];
        phases.push(after_watch(Some(&unreachable), "7".into(), &mut b));
        let Some(Phase::Wait(d, Some(rv))) = phases.last() else {
            panic!("{phases:?}");
        };
        assert_eq!(*d, Duration::from_millis(100));
        phases.push(Phase::Watch(rv.clone()));
        // The next watch is served: events, then the server ends it (e.g. its timeout).
        b.reset();
        phases.push(after_watch(None, "9".into(), &mut b));
        assert_eq!(
            phases.iter().map(trace).collect::<Vec<_>>(),
            [
                "Watch(\"5\")",
                "Wait(100ms, Some(\"7\"))",
                "Watch(\"7\")",
                "Watch(\"9\")"
            ]
        );
        // A server's own error (shutting down) resumes too, after a longer wait each time.
        let shutting_down = ClientError::Other {
            code: tonic::Code::Unavailable,
            message: "the API server is shutting down".into(),
        };
        let mut b = RetryBackoff::new();
        b.step();
        assert_eq!(
            trace(&after_watch::<Pod>(
                Some(&shutting_down),
                "9".into(),
                &mut b
            )),
            "Wait(200ms, Some(\"9\"))"
        );
    }

    #[test]
    fn only_an_expired_watch_relists() {
        let mut b = RetryBackoff::new();
        let expired = ClientError::Expired {
            message: "too old resource version: 3 (10)".into(),
        };
        assert!(matches!(
            after_watch::<Pod>(Some(&expired), "3".into(), &mut b),
            Phase::List
        ));
        assert_eq!(b.step(), Duration::from_millis(100), "no back-off used");
    }

    #[test]
    fn store_applies_events() {
        let store = Store::<Pod>::default();
        store.apply(&Event::Restarted(vec![pod("a", "x"), pod("a", "y")]));
        assert_eq!(store.len(), 2);
        store.apply(&Event::Applied(pod("b", "z")));
        store.apply(&Event::Deleted(pod("a", "x")));
        let keys: Vec<String> = store.list().iter().map(|p| object_key(&**p)).collect();
        assert_eq!(keys, ["a/y", "b/z"]);
        assert!(store.get("a/y").is_some());
        store.apply(&Event::Restarted(vec![]));
        assert!(store.is_empty());
    }
}
