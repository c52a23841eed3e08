//! The namespace controller: empties a terminating namespace, then deletes it.
//!
//! A delete of a namespace that still holds objects only marks it (`deletionTimestamp`, phase
//! Terminating: the API server refuses creates in it). For such a namespace this controller
//! lists every namespaced kind ([`skiff_api::kinds`] and the custom kinds discovery lists,
//! through the dynamic API: one code path for all kinds) and deletes what is not already being deleted (Background propagation),
//! re-checking every [`RECHECK`] while anything remains (pods on nodes take their grace
//! period, objects with finalizers wait for them). Once every list is empty it deletes the
//! namespace again, and the API server removes it. Progress is reported as Kubernetes does,
//! in the conditions `NamespaceDeletionContentFailure`, `NamespaceContentRemaining` and
//! `NamespaceFinalizersRemaining`; a failed delete is also a Warning event naming the kind.
//!
//! Namespaces that are not terminating are never touched: the namespace is read from the API
//! server before anything is deleted, so a cached terminating namespace that has since been
//! replaced by a new one of the same name is left alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use skiff_api::Resource;
use skiff_api::api::{Condition, Namespace, ObjectMeta};
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler,
};
use skiff_client::{Client, DeleteParams, ListParams, Preconditions, PropagationPolicy};

use crate::util::{self, format_time};
use crate::{Context, Error};

/// How long to wait before looking again at a namespace whose content is not all gone.
pub const RECHECK: Duration = Duration::from_secs(1);

pub const CONTENT_FAILURE: &str = "NamespaceDeletionContentFailure";
pub const CONTENT_REMAINING: &str = "NamespaceContentRemaining";
pub const FINALIZERS_REMAINING: &str = "NamespaceFinalizersRemaining";

/// What one pass over a terminating namespace's content found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ContentReport {
    /// Objects found, by resource (plural), before this pass deleted them.
    pub found: BTreeMap<&'static str, usize>,
    /// Objects held by each finalizer.
    pub finalizers: BTreeMap<String, usize>,
    /// Resources that could not be listed or deleted, with the error.
    pub failures: Vec<(&'static str, String)>,
}

impl ContentReport {
    pub fn is_empty(&self) -> bool {
        self.found.values().all(|n| *n == 0) && self.failures.is_empty()
    }

    /// The three conditions Kubernetes reports on a terminating namespace.
    pub fn conditions(&self, now: &str) -> Vec<Condition> {
        let cond = |ty: &str, status: bool, reason: &str, message: String| Condition {
            r#type: ty.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message,
            last_transition_time: now.into(),
            ..Default::default()
        };
        let failure = if self.failures.is_empty() {
            cond(
                CONTENT_FAILURE,
                false,
                "ContentDeleted",
                "All content successfully deleted, may be waiting on finalization".into(),
            )
        } else {
            let list: Vec<String> = self
                .failures
                .iter()
                .map(|(r, e)| format!("{r}: {e}"))
                .collect();
            cond(
                CONTENT_FAILURE,
                true,
                "ContentDeletionFailed",
                format!(
                    "Failed to delete all resource types, {} remaining: {}",
                    self.failures.len(),
                    list.join(", ")
                ),
            )
        };
        let found: Vec<String> = self
            .found
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| format!("{r} has {n} resource instances"))
            .collect();
        let remaining = if found.is_empty() {
            cond(
                CONTENT_REMAINING,
                false,
                "ContentRemoved",
                "All content successfully removed".into(),
            )
        } else {
            cond(
                CONTENT_REMAINING,
                true,
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", found.join(", ")),
            )
        };
        let held: Vec<String> = self
            .finalizers
            .iter()
            .map(|(f, n)| format!("{f} in {n} resource instances"))
            .collect();
        let finalizers = if held.is_empty() {
            cond(
                FINALIZERS_REMAINING,
                false,
                "ContentHasNoFinalizers",
                "All content-preserving finalizers finished".into(),
            )
        } else {
            cond(
                FINALIZERS_REMAINING,
                true,
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    held.join(", ")
                ),
            )
        };
        vec![failure, remaining, finalizers]
    }
}

/// The metadata of an object in the dynamic API's JSON form.
fn metadata_of(obj: &serde_json::Value) -> Result<ObjectMeta, String> {
    let meta = obj.get("metadata").cloned().unwrap_or_default();
    serde_json::from_value(meta).map_err(|e| format!("cannot read metadata: {e}"))
}

/// The reconciler of namespaces.
pub struct NamespaceController {
    client: Client,
    recorder: EventRecorder,
    namespaces: Informer<Namespace>,
}

impl std::fmt::Debug for NamespaceController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceController")
            .finish_non_exhaustive()
    }
}

impl NamespaceController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        NamespaceController {
            client: informers.client().clone(),
            recorder,
            namespaces: informers.get::<Namespace>(),
        }
    }

    pub fn controller(informers: &Informers) -> Controller<Namespace> {
        Controller::<Namespace>::new(informers).named("namespace")
    }

    /// Runs the namespace controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(NamespaceController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    /// Deletes every object in `namespace` that is not already being deleted, every
    /// namespaced kind through the same dynamic path. Kinds go in the reverse of
    /// [`skiff_api::kinds`]' order, which puts workloads before what they create
    /// (Deployments, ReplicaSets, then Pods), so their controllers do not keep trying to
    /// replace what was just deleted (the API server would refuse it anyway).
    pub async fn delete_content(&self, namespace: &str) -> ContentReport {
        let mut report = ContentReport::default();
        // Custom kinds first (their objects may own typed ones), as discovery lists them.
        let custom: Vec<&'static dyn skiff_api::DynKind> = match self.client.custom_kinds().await {
            Ok(kinds) => kinds.into_iter().filter(|k| k.info().namespaced).collect(),
            Err(e) => {
                report.failures.push((
                    "discovery",
                    format!("listing the custom kinds: {}", crate::error_chain(&e)),
                ));
                Vec::new()
            }
        };
        let typed = skiff_api::kinds()
            .iter()
            .rev()
            .copied()
            .filter(|k| k.info().namespaced);
        for kind in custom.into_iter().chain(typed) {
            let resource = kind.info().plural;
            let api = self.client.dynamic(kind, Some(namespace));
            let items = match api.list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(e) => {
                    report
                        .failures
                        .push((resource, format!("listing: {}", crate::error_chain(&e))));
                    continue;
                }
            };
            *report.found.entry(resource).or_default() += items.len();
            for obj in items {
                let meta = match metadata_of(&obj) {
                    Ok(m) => m,
                    Err(e) => {
                        report.failures.push((resource, e));
                        continue;
                    }
                };
                for f in &meta.finalizers {
                    *report.finalizers.entry(f.clone()).or_default() += 1;
                }
                if !meta.deletion_timestamp.is_empty() {
                    continue;
                }
                let params = DeleteParams {
                    grace_period_seconds: None,
                    propagation_policy: Some(PropagationPolicy::Background),
                    preconditions: Some(Preconditions {
                        uid: Some(meta.uid.clone()),
                        resource_version: None,
                    }),
                };
                match api.delete(&meta.name, &params).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => report.failures.push((
                        resource,
                        format!("deleting {}: {}", meta.name, crate::error_chain(&e)),
                    )),
                }
            }
        }
        report
    }

    /// Writes the report's conditions into the namespace's status when they changed.
    async fn report(&self, ns: &Namespace, report: &ContentReport) -> Result<(), Error> {
        let now = format_time(Utc::now());
        let mut status = ns.status.clone().unwrap_or_default();
        let mut changed = false;
        for c in report.conditions(&now) {
            changed |= util::set_condition(&mut status.conditions, c);
        }
        if !changed {
            return Ok(());
        }
        let mut updated = ns.clone();
        updated.status = Some(status);
        match self
            .client
            .cluster::<Namespace>()
            .update_status(&updated)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e).during(|| format!("updating the status of namespace {}", ns.name())),
        }
    }
}

impl Reconciler for NamespaceController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(cached) = self.namespaces.get(key) else {
            return Ok(Action::Done);
        };
        if !util::is_terminating(&*cached) {
            return Ok(Action::Done);
        }
        // Act only on the namespace as it is now: the cached one may be gone and replaced.
        let api = self.client.cluster::<Namespace>();
        let ns = match api
            .get_opt(&key.name)
            .await
            .during(|| format!("reading namespace {}", key.name))?
        {
            Some(ns) if util::is_terminating(&ns) => ns,
            _ => return Ok(Action::Done),
        };
        let report = self.delete_content(&key.name).await;
        for (resource, error) in &report.failures {
            self.recorder
                .publish(
                    &ns,
                    EventType::Warning,
                    CONTENT_FAILURE,
                    &format!("Failed to delete {resource}: {error}"),
                )
                .await;
        }
        self.report(&ns, &report).await?;
        if !report.is_empty() {
            tracing::debug!(namespace = %key, found = ?report.found,
                failures = report.failures.len(), "content remaining");
            return Ok(Action::RequeueAfter(RECHECK));
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(util::uid(&ns).to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&key.name, &params).await {
            Ok(_) => {
                tracing::info!(namespace = %key, "namespace empty, deleted");
            }
            Err(e) if e.is_not_found() => return Ok(Action::Done),
            Err(e) => return Err(e).during(|| format!("deleting namespace {}", key.name)),
        }
        // If something is still in it the API server kept it: look again.
        Ok(Action::RequeueAfter(RECHECK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_say_what_remains() {
        let mut r = ContentReport::default();
        r.found.insert("pods", 0);
        assert!(r.is_empty());
        let c = r.conditions("t");
        assert_eq!(c.len(), 3);
        assert!(c.iter().all(|c| c.status == "False"), "{c:?}");
        r.found.insert("pods", 3);
        r.finalizers.insert("foregroundDeletion".into(), 1);
        r.failures.push(("leases", "boom".into()));
        assert!(!r.is_empty());
        let c = r.conditions("t");
        assert!(c.iter().all(|c| c.status == "True"), "{c:?}");
        assert_eq!(
            c[0].message,
            "Failed to delete all resource types, 1 remaining: leases: boom"
        );
        assert_eq!(
            c[1].message,
            "Some resources are remaining: pods has 3 resource instances"
        );
        assert_eq!(
            c[2].message,
            "Some content in the namespace has finalizers remaining: foregroundDeletion in 1 \
             resource instances"
        );
    }

    #[test]
    fn metadata_from_dynamic_json() {
        let obj = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "finalizers": ["orphan"], "deletionTimestamp": "2024-01-01T00:00:00Z"},
        });
        let m = metadata_of(&obj).unwrap();
        assert_eq!((m.name.as_str(), m.uid.as_str()), ("p", "u1"));
        assert_eq!(m.finalizers, ["orphan"]);
        assert!(!m.deletion_timestamp.is_empty());
        assert!(metadata_of(&serde_json::json!({"metadata": {"bogus": 1}})).is_err());
    }
}
