//! Resource amounts: a node's allocatable, what its pods request, what one pod requests.

use std::collections::BTreeMap;
use std::fmt;

use skiff_api::api::{Container, PodSpec};

use crate::quantity::{QuantityError, parse_milli, parse_value};

pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const PODS: &str = "pods";

/// CPU assumed for a container without a CPU request when scoring (Kubernetes' 100m).
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// Memory assumed for a container without a memory request when scoring (200Mi).
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// Amounts of resources: CPU in millicores, memory in bytes, a pod count, and any other
/// resource (`ephemeral-storage`, `example.com/gpu`) in whole units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub pods: i64,
    pub scalar: BTreeMap<String, i64>,
}

/// A quantity that could not be read, with the resource it was given for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{resource}: {source}")]
pub struct ResourceError {
    pub resource: String,
    #[source]
    pub source: QuantityError,
}

fn parse_resource(name: &str, text: &str) -> Result<i64, ResourceError> {
    let r = if name == CPU {
        parse_milli(text)
    } else {
        parse_value(text)
    };
    r.map_err(|source| ResourceError {
        resource: name.to_string(),
        source,
    })
}

impl Resources {
    /// Reads a resource list (`{cpu: "4", memory: "16Gi", pods: "110"}`). Entries that do not
    /// parse count as zero and are returned as errors.
    pub fn from_list(list: &BTreeMap<String, String>) -> (Resources, Vec<ResourceError>) {
        let mut out = Resources::default();
        let mut errors = Vec::new();
        for (name, text) in list {
            match parse_resource(name, text) {
                Ok(v) => out.set(name, v),
                Err(e) => errors.push(e),
            }
        }
        (out, errors)
    }

    pub fn get(&self, name: &str) -> i64 {
        match name {
            CPU => self.milli_cpu,
            MEMORY => self.memory,
            PODS => self.pods,
            other => self.scalar.get(other).copied().unwrap_or(0),
        }
    }

    pub fn set(&mut self, name: &str, value: i64) {
        match name {
            CPU => self.milli_cpu = value,
            MEMORY => self.memory = value,
            PODS => self.pods = value,
            other => {
                self.scalar.insert(other.to_string(), value);
            }
        }
    }

    /// Adds `other` (saturating).
    pub fn add(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.saturating_add(other.milli_cpu);
        self.memory = self.memory.saturating_add(other.memory);
        self.pods = self.pods.saturating_add(other.pods);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(*v);
        }
    }

    /// Subtracts `other` (saturating; entries that reach zero are dropped).
    pub fn sub(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.saturating_sub(other.milli_cpu);
        self.memory = self.memory.saturating_sub(other.memory);
        self.pods = self.pods.saturating_sub(other.pods);
        for (k, v) in &other.scalar {
            if let Some(e) = self.scalar.get_mut(k) {
                *e = e.saturating_sub(*v);
                if *e == 0 {
                    self.scalar.remove(k);
                }
            }
        }
    }

    /// Each entry the larger of the two.
    pub fn max_with(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.pods = self.pods.max(other.pods);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpu={}m memory={} pods={}",
            self.milli_cpu, self.memory, self.pods
        )?;
        for (k, v) in &self.scalar {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

/// What a pod asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRequests {
    /// The requests the node must fit (`pods` is 0: the caller counts the pod).
    pub requests: Resources,
    /// CPU and memory with Kubernetes' defaults for containers that request none, used for
    /// scoring so that request-less pods still spread.
    pub non_zero_milli_cpu: i64,
    pub non_zero_memory: i64,
}

/// A container's request for `name`: its request, else its limit (Kubernetes defaults a
/// missing request to the limit).
fn container_request<'a>(c: &'a Container, name: &str) -> Option<&'a String> {
    let r = c.resources.as_ref()?;
    r.requests.get(name).or_else(|| r.limits.get(name))
}

fn container_requests(c: &Container) -> Result<(Resources, i64, i64), ResourceError> {
    let mut out = Resources::default();
    if let Some(r) = &c.resources {
        let names: std::collections::BTreeSet<&String> =
            r.requests.keys().chain(r.limits.keys()).collect();
        for name in names {
            if let Some(text) = container_request(c, name) {
                out.set(name, parse_resource(name, text)?);
            }
        }
    }
    let cpu = if container_request(c, CPU).is_some() {
        out.milli_cpu
    } else {
        DEFAULT_MILLI_CPU_REQUEST
    };
    let mem = if container_request(c, MEMORY).is_some() {
        out.memory
    } else {
        DEFAULT_MEMORY_REQUEST
    };
    Ok((out, cpu, mem))
}

/// The pod's effective requests: the sum over its containers, or the largest init container
/// if that is more (init containers run one at a time, before the others).
pub fn pod_requests(spec: &PodSpec) -> Result<PodRequests, ResourceError> {
    let mut sum = Resources::default();
    let (mut cpu, mut mem) = (0i64, 0i64);
    for c in &spec.containers {
        let (r, c_cpu, c_mem) = container_requests(c)?;
        sum.add(&r);
        cpu = cpu.saturating_add(c_cpu);
        mem = mem.saturating_add(c_mem);
    }
    for c in &spec.init_containers {
        let (r, c_cpu, c_mem) = container_requests(c)?;
        sum.max_with(&r);
        cpu = cpu.max(c_cpu);
        mem = mem.max(c_mem);
    }
    sum.pods = 0;
    Ok(PodRequests {
        requests: sum,
        non_zero_milli_cpu: cpu,
        non_zero_memory: mem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::ResourceRequirements;

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let map = |l: &[(&str, &str)]| {
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Container {
            name: "c".into(),
            image: "host".into(),
            resources: Some(ResourceRequirements {
                requests: map(requests),
                limits: map(limits),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn allocatable_list() {
        let list = [
            ("cpu", "4"),
            ("memory", "16Gi"),
            ("pods", "110"),
            ("x/gpu", "2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (r, errs) = Resources::from_list(&list);
        assert!(errs.is_empty());
        assert_eq!(r.milli_cpu, 4000);
        assert_eq!(r.memory, 16 << 30);
        assert_eq!(r.pods, 110);
        assert_eq!(r.get("x/gpu"), 2);
        let bad = [("cpu", "lots")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (r, errs) = Resources::from_list(&bad);
        assert_eq!(r.milli_cpu, 0);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].to_string().starts_with("cpu: invalid quantity"));
    }

    #[test]
    fn pod_sums_containers_and_maxes_init() {
        let spec = PodSpec {
            containers: vec![
                container(&[("cpu", "250m"), ("memory", "64Mi")], &[]),
                container(&[], &[("cpu", "500m")]),
            ],
            init_containers: vec![container(&[("cpu", "2")], &[])],
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert_eq!(r.requests.milli_cpu, 2000, "init container dominates cpu");
        assert_eq!(r.requests.memory, 64 << 20);
        assert_eq!(r.non_zero_milli_cpu, 2000);
        // Second container requests no memory: default 200Mi is added for scoring only.
        assert_eq!(r.non_zero_memory, (64 << 20) + DEFAULT_MEMORY_REQUEST);
    }

    #[test]
    fn pod_without_requests() {
        let spec = PodSpec {
            containers: vec![Container::default()],
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert_eq!(r.requests, Resources::default());
        assert_eq!(r.non_zero_milli_cpu, DEFAULT_MILLI_CPU_REQUEST);
        assert_eq!(r.non_zero_memory, DEFAULT_MEMORY_REQUEST);
    }

    #[test]
    fn bad_request_is_an_error() {
        let spec = PodSpec {
            containers: vec![container(&[("memory", "12 apples")], &[])],
            ..Default::default()
        };
        assert_eq!(pod_requests(&spec).unwrap_err().resource, "memory");
    }

    #[test]
    fn arithmetic() {
        let mut a = Resources {
            milli_cpu: 100,
            memory: 10,
            pods: 1,
            scalar: [("g".to_string(), 1)].into(),
        };
        let b = a.clone();
        a.add(&b);
        assert_eq!(a.milli_cpu, 200);
        assert_eq!(a.get("g"), 2);
        a.sub(&b);
        a.sub(&b);
        assert_eq!(a, Resources::default());
    }
}
