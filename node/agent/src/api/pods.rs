//! The pod directory: what the API can address, the pods this agent runs as their workers
//! publish them (names, sandbox, containers, images, cgroup ids).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use skiff_runtime::Sandbox;

/// What the API knows about one pod the agent runs, published by its worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub sandbox: Option<Sandbox>,
    /// Container names, in spec order.
    pub containers: Vec<String>,
    /// The images its containers name (garbage collection keeps them).
    pub images: Vec<String>,
    /// Every leaf cgroup id the pod's containers have run in (traffic is counted per id).
    pub cgroup_ids: BTreeSet<u64>,
}

/// The pods of this node, by uid, as their workers last saw them.
#[derive(Debug, Clone, Default)]
pub struct PodRegistry(Arc<RwLock<HashMap<String, PodInfo>>>);

impl PodRegistry {
    /// Records `info`, keeping the cgroup ids seen before.
    pub fn publish(&self, mut info: PodInfo) {
        let mut pods = self.0.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = pods.get(&info.uid) {
            if *old == info {
                return;
            }
            info.cgroup_ids.extend(old.cgroup_ids.iter().copied());
        }
        pods.insert(info.uid.clone(), info);
    }

    /// Every image a pod of this node names.
    pub fn images(&self) -> std::collections::HashSet<String> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .flat_map(|p| p.images.iter().cloned())
            .collect()
    }

    pub fn remove(&self, uid: &str) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(uid)
    }

    /// The pod `namespace/name` (if two share the name, one being replaced, the newest).
    pub fn find(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|p| p.namespace == namespace && p.name == name)
            .max_by_key(|p| p.sandbox.as_ref().map(|s| s.created_at))
            .cloned()
    }

    /// Every pod, sorted by namespace and name.
    pub fn snapshot(&self) -> Vec<PodInfo> {
        let mut pods: Vec<PodInfo> = self
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_keeps_cgroup_ids_and_finds_by_name() {
        let r = PodRegistry::default();
        let info = |ids: &[u64]| PodInfo {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "web".into(),
            containers: vec!["c".into()],
            cgroup_ids: ids.iter().copied().collect(),
            ..Default::default()
        };
        r.publish(info(&[1]));
        r.publish(info(&[2]));
        let found = r.find("default", "web").unwrap();
        assert_eq!(found.cgroup_ids, [1, 2].into());
        assert!(r.find("other", "web").is_none());
        assert!(r.contains("u1"));
        r.remove("u1");
        assert!(r.snapshot().is_empty());
    }
}
