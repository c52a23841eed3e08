//! Pods of a workload controller, one code path for every controller that owns pods directly
//! (ReplicaSet, DaemonSet), as Kubernetes' `controller_utils`: claiming pods (adopting
//! matching orphans, releasing owned pods that no longer match), creating and deleting them
//! with events, and the expectations that keep a lagging pod informer from causing
//! duplicate creates or deletes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{LabelSelector, Pod};
use skiff_api::selector::Selector;
use skiff_client::controller::{EventRecorder, EventType, Informer, ObjectKey, controller_of};
use skiff_client::{Client, DeleteParams};
use tokio::time::Instant;

use crate::util::{self, controller_ref, is_pod_active, is_terminating, labels, workload_selector};
use crate::{Context, Error};

/// After this long, in-flight creates/deletes that were never observed are given up on.
const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct KeyExpectations {
    /// Pods created, by name, with the resourceVersion the create returned.
    creates: HashMap<String, u64>,
    /// Pods deleted, by name.
    deletes: HashSet<String>,
    since: Instant,
}

/// The creates and deletes each owner (ReplicaSet, DaemonSet) is waiting to see in the pod informer.
#[derive(Debug, Default)]
pub struct Expectations {
    pending: Mutex<HashMap<ObjectKey, KeyExpectations>>,
}

impl Expectations {
    fn with<R>(&self, key: &ObjectKey, f: impl FnOnce(&mut KeyExpectations) -> R) -> R {
        let mut map = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let p = map.entry(key.clone()).or_insert_with(|| KeyExpectations {
            creates: HashMap::new(),
            deletes: HashSet::new(),
            since: Instant::now(),
        });
        p.since = Instant::now();
        f(p)
    }

    pub fn created(&self, key: &ObjectKey, pod: &Pod) {
        let rv = pod.resource_version().parse().unwrap_or(u64::MAX);
        self.with(key, |p| p.creates.insert(pod.name().to_string(), rv));
    }

    pub fn deleted(&self, key: &ObjectKey, pod: &str) {
        self.with(key, |p| p.deletes.insert(pod.to_string()));
    }

    pub fn forget(&self, key: &ObjectKey) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// `None` when everything this owner did has been observed by `pods` (or given up
    /// on); else how long until it is given up on.
    pub fn pending(&self, key: &ObjectKey, pods: &Informer<Pod>) -> Option<Duration> {
        let mut map = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let p = map.get_mut(key)?;
        let revision = pods.revision();
        p.creates.retain(|name, rv| {
            revision < *rv && pods.get(&ObjectKey::new(&key.namespace, name)).is_none()
        });
        p.deletes.retain(|name| {
            pods.get(&ObjectKey::new(&key.namespace, name))
                .is_some_and(|pod| is_pod_active(&pod))
        });
        if p.creates.is_empty() && p.deletes.is_empty() {
            map.remove(key);
            return None;
        }
        let waited = p.since.elapsed();
        if waited >= EXPECTATIONS_TIMEOUT {
            tracing::warn!(owner = %key, creates = p.creates.len(), deletes = p.deletes.len(),
                "pod changes never observed, managing replicas again");
            map.remove(key);
            return None;
        }
        Some(EXPECTATIONS_TIMEOUT - waited)
    }
}

/// Who may adopt `pod`: the keys of the `owners` in its namespace whose selector
/// (`selector_of`) matches it, when it has no controller and is not being deleted. What a
/// controller of pods watches pods with, besides the pods it owns.
pub fn adopters<T: Resource>(
    owners: &Informer<T>,
    pod: &Pod,
    selector_of: impl Fn(&T) -> Option<std::borrow::Cow<'_, LabelSelector>>,
) -> Vec<ObjectKey> {
    if controller_of(pod).is_some() || is_terminating(pod) {
        return Vec::new();
    }
    owners
        .by_namespace(pod.namespace())
        .iter()
        .filter(|o| {
            workload_selector(selector_of(o).as_deref()).is_ok_and(|sel| sel.matches(labels(pod)))
        })
        .map(|o| ObjectKey::of(&**o))
        .collect()
}

/// Creates, deletes, adopts and releases pods for their controllers.
pub struct PodControl {
    pub client: Client,
    pub recorder: EventRecorder,
    pub pods: Informer<Pod>,
    pub expectations: Expectations,
}

impl std::fmt::Debug for PodControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodControl").finish_non_exhaustive()
    }
}

impl PodControl {
    pub fn new(client: Client, recorder: EventRecorder, pods: Informer<Pod>) -> Self {
        PodControl {
            client,
            recorder,
            pods,
            expectations: Expectations::default(),
        }
    }

    /// The pods `owner` owns after adopting matching orphans and releasing owned pods that no
    /// longer match (every phase).
    pub async fn claim_pods<T: Resource>(
        &self,
        owner: &T,
        selector: &Selector,
    ) -> Result<Vec<Arc<Pod>>, Error> {
        let ns = owner.namespace();
        let owner_uid = util::uid(owner);
        let mut owned = Vec::new();
        for pod in self.pods.by_owner(owner_uid) {
            if pod.namespace() != ns {
                continue;
            }
            if selector.matches(labels(&*pod)) {
                owned.push(pod);
            } else if !is_terminating(owner) {
                self.release(owner, &pod).await?;
            }
        }
        if is_terminating(owner) {
            return Ok(owned);
        }
        for pod in self.pods.select(Some(ns), selector) {
            if controller_of(&*pod).is_some() || is_terminating(&*pod) {
                continue;
            }
            let mut adopted = (*pod).clone();
            adopted
                .metadata_mut()
                .owner_references
                .push(controller_ref(owner));
            match self.client.namespaced::<Pod>(ns).update(&adopted).await {
                Ok(p) => {
                    tracing::info!(
                        kind = T::INFO.kind,
                        owner = owner.name(),
                        pod = p.name(),
                        "adopted pod"
                    );
                    owned.push(Arc::new(p));
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    return Err(e).during(|| format!("adopting pod {}/{}", ns, pod.name()));
                }
            }
        }
        Ok(owned)
    }

    async fn release<T: Resource>(&self, owner: &T, pod: &Pod) -> Result<(), Error> {
        let mut released = pod.clone();
        let owner_uid = util::uid(owner);
        released
            .metadata_mut()
            .owner_references
            .retain(|o| o.uid != owner_uid);
        match self
            .client
            .namespaced::<Pod>(pod.namespace())
            .update(&released)
            .await
        {
            Ok(_) => {
                tracing::info!(
                    kind = T::INFO.kind,
                    owner = owner.name(),
                    pod = pod.name(),
                    "released pod"
                );
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e).during(|| format!("releasing pod {}", pod.name())),
        }
    }

    pub async fn create_pod<T: Resource>(
        &self,
        key: &ObjectKey,
        owner: &T,
        pod: &Pod,
    ) -> Result<(), Error> {
        let created = self
            .client
            .namespaced::<Pod>(owner.namespace())
            .create(pod)
            .await;
        match created {
            Ok(p) => {
                self.expectations.created(key, &p);
                self.recorder
                    .publish(
                        owner,
                        EventType::Normal,
                        "SuccessfulCreate",
                        &format!("Created pod: {}", p.name()),
                    )
                    .await;
                Ok(())
            }
            Err(e) => {
                self.recorder
                    .publish(
                        owner,
                        EventType::Warning,
                        "FailedCreate",
                        &format!("Error creating: {e}"),
                    )
                    .await;
                Err(e).during(|| format!("creating a pod for {} {key}", T::INFO.kind))
            }
        }
    }

    /// The pods `owner` owns, claimed by its `selector`; `None` (after an InvalidSelector
    /// Warning event) when the selector cannot be used.
    pub async fn claim<T: Resource>(
        &self,
        owner: &T,
        selector: Option<&LabelSelector>,
    ) -> Result<Option<Vec<Arc<Pod>>>, Error> {
        match workload_selector(selector) {
            Ok(sel) => self.claim_pods(owner, &sel).await.map(Some),
            Err(e) => {
                self.recorder
                    .publish(owner, EventType::Warning, "InvalidSelector", &e)
                    .await;
                Ok(None)
            }
        }
    }

    /// Deletes the pods named in `delete` and creates `create`, all at once, for `owner`
    /// (its key `key`); the first error, after every call was made.
    pub async fn apply<T: Resource>(
        &self,
        key: &ObjectKey,
        owner: &T,
        delete: &[String],
        create: &[Pod],
    ) -> Result<(), Error> {
        let deletes = futures::future::join_all(delete.iter().map(|name| {
            let pod = Pod {
                metadata: Some(skiff_api::api::ObjectMeta {
                    name: name.clone(),
                    namespace: owner.namespace().to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            async move { self.delete_pod(key, owner, &pod).await }
        }))
        .await;
        let creates =
            futures::future::join_all(create.iter().map(|p| self.create_pod(key, owner, p))).await;
        deletes
            .into_iter()
            .chain(creates)
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    pub async fn delete_pod<T: Resource>(
        &self,
        key: &ObjectKey,
        owner: &T,
        pod: &Pod,
    ) -> Result<(), Error> {
        let result = self
            .client
            .namespaced::<Pod>(owner.namespace())
            .delete(pod.name(), &DeleteParams::default())
            .await;
        match result {
            Ok(_) => {
                self.expectations.deleted(key, pod.name());
                self.recorder
                    .publish(
                        owner,
                        EventType::Normal,
                        "SuccessfulDelete",
                        &format!("Deleted pod: {}", pod.name()),
                    )
                    .await;
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => {
                self.recorder
                    .publish(
                        owner,
                        EventType::Warning,
                        "FailedDelete",
                        &format!("Error deleting: {e}"),
                    )
                    .await;
                Err(e).during(|| format!("deleting pod {} of {key}", pod.name()))
            }
        }
    }
}
