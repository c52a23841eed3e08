//! Watching a rollout at every revision: [`Sampler`] follows an app's pods and ReplicaSets
//! through the client's reflector and records, after every change, how many pods are active
//! and how many of those are ready, the ReplicaSets' summed replicas, and every pod created
//! per owning ReplicaSet. Every watch event is one revision, so every state the cluster went
//! through is checked, not a periodic sample of it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::{Pod, ReplicaSet};
use skiff_client::reflector::{Event as ReflectorEvent, reflector};
use skiff_client::{Client, ListParams};

/// Whether an object is being deleted.
pub fn terminating<T: Resource>(o: &T) -> bool {
    o.metadata()
        .is_some_and(|m| !m.deletion_timestamp.is_empty())
}

/// A pod that counts: not terminating, not finished.
pub fn active(p: &Pod) -> bool {
    let phase = p.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
    !terminating(p) && !matches!(phase, "Succeeded" | "Failed")
}

/// What a continuous watch of a Deployment's pods saw, at every revision.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    /// Most active (not terminating, not finished) pods at once.
    pub max_active: usize,
    /// Fewest ready, active pods at once.
    pub min_ready: usize,
    /// Number of pod states evaluated.
    pub samples: usize,
    /// The ReplicaSets' summed spec.replicas, at most.
    pub max_rs_replicas: i32,
    /// Every pod uid seen, per owning ReplicaSet (its name).
    pub created: BTreeMap<String, BTreeSet<String>>,
}

/// Follows the pods and ReplicaSets of `app` (label `app=<app>`) in `default`.
#[derive(Debug)]
pub struct Sampler {
    samples: Arc<Mutex<Samples>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn uid_of(p: &Pod) -> String {
    p.metadata().map(|m| m.uid.clone()).unwrap_or_default()
}

fn owner_of(p: &Pod) -> String {
    p.metadata()
        .and_then(|m| m.owner_references.iter().find(|o| o.kind == "ReplicaSet"))
        .map(|o| o.name.clone())
        .unwrap_or_default()
}

impl Sampler {
    pub async fn start(client: &Client, app: &str) -> Sampler {
        let samples = Arc::new(Mutex::new(Samples {
            min_ready: usize::MAX,
            ..Default::default()
        }));
        let lp = ListParams::default().labels(&format!("app={app}"));
        let pods_task = {
            let (samples, api, lp) = (
                samples.clone(),
                client.namespaced::<Pod>("default"),
                lp.clone(),
            );
            tokio::spawn(async move {
                let mut state: HashMap<String, Pod> = HashMap::new();
                let events = reflector(api, lp);
                tokio::pin!(events);
                while let Some(ev) = events.next().await {
                    let mut seen = Vec::new();
                    match ev {
                        ReflectorEvent::Restarted(all) => {
                            seen.extend(all.iter().map(|p| (owner_of(p), uid_of(p))));
                            state = all.into_iter().map(|p| (p.name().to_string(), p)).collect()
                        }
                        ReflectorEvent::Applied(p) => {
                            seen.push((owner_of(&p), uid_of(&p)));
                            state.insert(p.name().to_string(), p);
                        }
                        ReflectorEvent::Deleted(p) => {
                            state.remove(p.name());
                        }
                    }
                    let active: Vec<&Pod> = state.values().filter(|p| active(p)).collect();
                    let ready = active.iter().filter(|p| p.is_ready()).count();
                    let mut s = samples.lock().unwrap_or_else(|e| e.into_inner());
                    s.max_active = s.max_active.max(active.len());
                    s.min_ready = s.min_ready.min(ready);
                    s.samples += 1;
                    for (owner, uid) in seen {
                        s.created.entry(owner).or_default().insert(uid);
                    }
                }
            })
        };
        let rs_task = {
            let (samples, api) = (samples.clone(), client.namespaced::<ReplicaSet>("default"));
            tokio::spawn(async move {
                let mut state: HashMap<String, i32> = HashMap::new();
                let events = reflector(api, lp);
                tokio::pin!(events);
                while let Some(ev) = events.next().await {
                    let replicas =
                        |rs: &ReplicaSet| rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
                    match ev {
                        ReflectorEvent::Restarted(all) => {
                            state = all
                                .iter()
                                .map(|rs| (rs.name().to_string(), replicas(rs)))
                                .collect()
                        }
                        ReflectorEvent::Applied(rs) => {
                            state.insert(rs.name().to_string(), replicas(&rs));
                        }
                        ReflectorEvent::Deleted(rs) => {
                            state.remove(rs.name());
                        }
                    }
                    let sum: i32 = state.values().sum();
                    let mut s = samples.lock().unwrap_or_else(|e| e.into_inner());
                    s.max_rs_replicas = s.max_rs_replicas.max(sum);
                }
            })
        };
        let sampler = Sampler {
            samples,
            tasks: vec![pods_task, rs_task],
        };
        // Wait for the initial lists, so nothing before the start is missed.
        let deadline = Instant::now() + Duration::from_secs(10);
        while sampler.get().samples == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sampler
    }

    pub fn get(&self) -> Samples {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
