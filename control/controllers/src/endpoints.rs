//! The Endpoints controller: keeps, for every Service with a selector, an Endpoints object of
//! the same namespace and name listing the pods the selector matches (Kubernetes'
//! endpoint-controller).
//!
//! - A selected pod is listed once it has a `status.podIP` (a valid IP), unless it has finished
//!   (Succeeded, Failed) or is being deleted (kept while terminating when the Service
//!   publishes not-ready addresses, as Kubernetes does). Ready pods go to `addresses`, the
//!   others to `notReadyAddresses`; with `publishNotReadyAddresses` all are ready.
//! - Each ServicePort's `targetPort` is resolved per pod: a number as is, a name through the
//!   pod's container ports of that name and protocol. A pod lacking a named port is left out
//!   for that port only. Pods are grouped into subsets by the ports they resolve to.
//! - Subsets, addresses and ports are sorted, so the object is written only when its content
//!   changes. It carries the Service's labels and a controller ownerReference to the Service,
//!   which marks it as managed: when the Service goes away, a managed Endpoints is deleted.
//! - Services without a selector are left alone: their Endpoints belong to the user.
//!
//! Pods map to the Services in their namespace whose selector matches their old or new labels
//! (so a pod that stops matching leaves), Endpoints to the Service of the same name (so an
//! edit of a managed one is reverted).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectMeta, ObjectReference, Pod,
    Service, ServicePort,
};
use skiff_api::selector::{Requirement, Selector};
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler, controller_of,
};
use skiff_client::{Client, ClientError, DeleteParams, Preconditions};

use crate::util::{controller_ref, is_terminating, labels, uid};
use crate::{Context, Error};

/// The label Kubernetes puts on the Endpoints of headless Services.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// How long a reconcile waits for the informer to show its own write (so the next reconcile
/// compares against it rather than a stale copy).
const OBSERVE_WRITE: Duration = Duration::from_secs(5);

/// The reconciler of Endpoints.
pub struct EndpointsController {
    client: Client,
    recorder: EventRecorder,
    services: Informer<Service>,
    pods: Informer<Pod>,
    endpoints: Informer<Endpoints>,
}

impl std::fmt::Debug for EndpointsController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointsController")
            .finish_non_exhaustive()
    }
}

/// The selector of a Service; `None` when it has none (its Endpoints are not managed).
fn service_selector(svc: &Service) -> Option<Selector> {
    let sel = &svc.spec.as_ref()?.selector;
    (!sel.is_empty()).then(|| Selector {
        requirements: sel
            .iter()
            .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
            .collect(),
    })
}

/// Whether `ep` is managed by the controller: it has a controller reference to a Service of
/// its name.
fn is_managed(ep: &Endpoints) -> bool {
    controller_of(ep).is_some_and(|r| r.kind == "Service" && r.name == ep.name())
}

/// The port a pod serves `port` on: a numeric targetPort as is, a named one from the pod's
/// container ports of that name and protocol.
pub fn resolve_target_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let target = port.target_port.trim();
    if target.is_empty() {
        return Some(port.port);
    }
    if let Ok(n) = target.parse::<i32>() {
        return Some(n);
    }
    let protocol = |p: &str| if p.is_empty() { "TCP" } else { p }.to_string();
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| &c.ports)
        .find(|cp| cp.name == target && protocol(&cp.protocol) == protocol(&port.protocol))
        .map(|cp| cp.container_port)
}

/// The sort and grouping key of an EndpointPort.
type PortKey = (String, i32, String, String);

fn port_key(p: &EndpointPort) -> PortKey {
    (
        p.name.clone(),
        p.port,
        p.protocol.clone(),
        p.app_protocol.clone(),
    )
}

fn address_key(a: &EndpointAddress) -> (Option<IpAddr>, String, String, String) {
    let r = a.target_ref.as_ref();
    (
        a.ip.parse().ok(),
        a.ip.clone(),
        r.map(|r| r.name.clone()).unwrap_or_default(),
        r.map(|r| r.uid.clone()).unwrap_or_default(),
    )
}

/// Whether a selected pod is listed at all.
fn should_list(pod: &Pod, tolerate_unready: bool) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if matches!(status.phase.as_str(), "Succeeded" | "Failed") {
        return false;
    }
    // No address yet; one that is not an IP would make the whole Endpoints invalid.
    if status.pod_ip.parse::<IpAddr>().is_err() {
        if !status.pod_ip.is_empty() {
            tracing::warn!(pod = pod.name(), namespace = pod.namespace(), ip = %status.pod_ip,
                "pod IP is not an IP address, leaving the pod out of endpoints");
        }
        return false;
    }
    tolerate_unready || !is_terminating(pod)
}

/// The subsets of `svc`'s Endpoints given the pods its selector matches: one subset per
/// distinct list of resolved ports, everything sorted.
pub fn desired_subsets<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Vec<EndpointSubset> {
    let spec = svc.spec.clone().unwrap_or_default();
    let tolerate = spec.publish_not_ready_addresses;
    let headless = spec.cluster_ip == "None";
    let mut groups: BTreeMap<Vec<PortKey>, (Vec<EndpointAddress>, Vec<EndpointAddress>)> =
        BTreeMap::new();
    for pod in pods {
        if !should_list(pod, tolerate) {
            continue;
        }
        let mut ports: Vec<PortKey> = spec
            .ports
            .iter()
            .filter_map(|sp| {
                resolve_target_port(pod, sp).map(|port| {
                    port_key(&EndpointPort {
                        name: sp.name.clone(),
                        port,
                        protocol: sp.protocol.clone(),
                        app_protocol: sp.app_protocol.clone(),
                    })
                })
            })
            .collect();
        // A Service with ports that none resolve to: the pod serves none of them. A headless
        // one without ports lists its pods without ports.
        if ports.is_empty() && !(spec.ports.is_empty() && headless) {
            continue;
        }
        ports.sort();
        ports.dedup();
        let pod_spec = pod.spec.clone().unwrap_or_default();
        let address = EndpointAddress {
            ip: pod
                .status
                .as_ref()
                .map(|s| s.pod_ip.clone())
                .unwrap_or_default(),
            hostname: if !pod_spec.hostname.is_empty() && pod_spec.subdomain == svc.name() {
                pod_spec.hostname.clone()
            } else {
                String::new()
            },
            node_name: Some(pod_spec.node_name.clone()).filter(|n| !n.is_empty()),
            target_ref: Some(ObjectReference {
                kind: "Pod".into(),
                namespace: pod.namespace().to_string(),
                name: pod.name().to_string(),
                uid: uid(pod).to_string(),
                ..Default::default()
            }),
        };
        let group = groups.entry(ports).or_default();
        if tolerate || pod.is_ready() {
            group.0.push(address);
        } else {
            group.1.push(address);
        }
    }
    groups
        .into_iter()
        .map(|(ports, (mut ready, mut not_ready))| {
            ready.sort_by_cached_key(address_key);
            not_ready.sort_by_cached_key(address_key);
            EndpointSubset {
                addresses: ready,
                not_ready_addresses: not_ready,
                ports: ports
                    .into_iter()
                    .map(|(name, port, protocol, app_protocol)| EndpointPort {
                        name,
                        port,
                        protocol,
                        app_protocol,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The Endpoints `svc` needs, given the pods its selector matches and `current` (the stored
/// object, if any): `None` when `current` already is that, so nothing is to be written.
/// Everything else of `current` (annotations, other ownerReferences, resourceVersion) is
/// kept.
pub fn endpoints_update<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
    current: Option<&Endpoints>,
) -> Option<Endpoints> {
    let mut ep = current.cloned().unwrap_or_else(|| Endpoints {
        metadata: Some(ObjectMeta {
            name: svc.name().to_string(),
            namespace: svc.namespace().to_string(),
            ..Default::default()
        }),
        ..Default::default()
    });
    ep.subsets = desired_subsets(svc, pods);
    let m = ep.metadata_mut();
    m.labels = endpoints_labels(svc);
    m.owner_references.retain(|r| r.controller != Some(true));
    m.owner_references.push(controller_ref(svc));
    (current != Some(&ep)).then_some(ep)
}

/// The labels of `svc`'s Endpoints: the Service's, plus the headless marker for a headless
/// Service.
fn endpoints_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut out = labels(svc).clone();
    if svc.spec.as_ref().is_some_and(|s| s.cluster_ip == "None") {
        out.insert(HEADLESS_LABEL.into(), String::new());
    } else {
        out.remove(HEADLESS_LABEL);
    }
    out
}

impl EndpointsController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        EndpointsController {
            client: informers.client().clone(),
            recorder,
            services: informers.get::<Service>(),
            pods: informers.get::<Pod>(),
            endpoints: informers.get::<Endpoints>(),
        }
    }

    /// The controller: Services, the pods their selectors match, their Endpoints.
    pub fn controller(informers: &Informers) -> Controller<Service> {
        let services = informers.get::<Service>();
        let pods = informers.get::<Pod>();
        let endpoints = informers.get::<Endpoints>();
        Controller::<Service>::new(informers)
            .named("endpoints")
            .watches(&pods, move |pod: &Pod| {
                services
                    .by_namespace(pod.namespace())
                    .iter()
                    .filter(|svc| service_selector(svc).is_some_and(|s| s.matches(labels(pod))))
                    .map(|svc| ObjectKey::of(&**svc))
                    .collect()
            })
            .watches(&endpoints, |ep: &Endpoints| vec![ObjectKey::of(ep)])
    }

    /// Runs the Endpoints controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(EndpointsController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    /// Deletes the managed Endpoints of a Service that is gone.
    async fn delete_orphan(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(ep) = self.endpoints.get(key).filter(|ep| is_managed(ep)) else {
            return Ok(Action::Done);
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid(&*ep).to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self
            .client
            .namespaced::<Endpoints>(&key.namespace)
            .delete(&key.name, &params)
            .await
        {
            Ok(_) => {
                tracing::debug!(endpoints = %key, "deleted the endpoints of a deleted service");
                Ok(Action::Done)
            }
            Err(e) if e.is_not_found() => Ok(Action::Done),
            Err(e) => Err(e).during(|| format!("deleting endpoints {key}")),
        }
    }

    /// Waits (bounded) until the Endpoints informer reflects a write of ours.
    async fn observe(&self, written: &Endpoints) {
        let rv = written.resource_version().parse().unwrap_or(0);
        let _ = tokio::time::timeout(OBSERVE_WRITE, self.endpoints.wait_for_revision(rv)).await;
    }

    async fn write_failed(&self, ep: &Endpoints, reason: &str, e: &ClientError) {
        // A conflict only means our copy was stale: the retry sorts it out.
        if !e.is_conflict() && !e.is_already_exists() {
            let message = format!(
                "Failed to write endpoints {}/{}: {e}",
                ep.namespace(),
                ep.name()
            );
            self.recorder
                .publish(ep, EventType::Warning, reason, &message)
                .await;
        }
    }
}

impl Reconciler for EndpointsController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(svc) = self.services.get(key) else {
            return self.delete_orphan(key).await;
        };
        let Some(selector) = service_selector(&svc) else {
            return Ok(Action::Done);
        };
        if is_terminating(&*svc) {
            return Ok(Action::Done);
        }
        let pods = self.pods.select(Some(&key.namespace), &selector);
        let current = self.endpoints.get(key);
        let Some(ep) = endpoints_update(&svc, pods.iter().map(|p| &**p), current.as_deref()) else {
            return Ok(Action::Done);
        };
        let api = self.client.namespaced::<Endpoints>(&key.namespace);
        let (result, reason) = match current {
            Some(_) => (api.update(&ep).await, "FailedToUpdateEndpoint"),
            None => (api.create(&ep).await, "FailedToCreateEndpoint"),
        };
        let written = match result {
            Ok(w) => w,
            Err(e) => {
                self.write_failed(&ep, reason, &e).await;
                return Err(e).during(|| format!("writing endpoints {key}"));
            }
        };
        tracing::debug!(endpoints = %key, "endpoints written");
        self.observe(&written).await;
        Ok(Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{Condition, Container, ContainerPort, PodSpec, PodStatus, ServiceSpec};

    fn pod(name: &str, ip: &str, ready: bool, http_port: Option<i32>) -> Pod {
        Pod {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: "ns".into(),
                uid: format!("uid-{name}"),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                node_name: "node-1".into(),
                containers: vec![Container {
                    name: "c".into(),
                    ports: http_port
                        .map(|p| ContainerPort {
                            name: "http".into(),
                            container_port: p,
                            protocol: "TCP".into(),
                            ..Default::default()
                        })
                        .into_iter()
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: "Running".into(),
                pod_ip: ip.into(),
                conditions: vec![Condition {
                    r#type: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn service(ports: Vec<ServicePort>, publish: bool) -> Service {
        Service {
            metadata: Some(ObjectMeta {
                name: "web".into(),
                namespace: "ns".into(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                ports,
                selector: [("app".to_string(), "web".to_string())].into(),
                publish_not_ready_addresses: publish,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sport(name: &str, port: i32, target: &str) -> ServicePort {
        ServicePort {
            name: name.into(),
            port,
            target_port: target.into(),
            protocol: "TCP".into(),
            ..Default::default()
        }
    }

    fn ips(addrs: &[EndpointAddress]) -> Vec<&str> {
        addrs.iter().map(|a| a.ip.as_str()).collect()
    }

    #[test]
    fn resolves_ports_and_groups_pods() {
        let svc = service(
            vec![sport("metrics", 9090, "9100"), sport("http", 80, "http")],
            false,
        );
        let pods = [
            pod("b", "10.0.0.2", true, Some(8080)),
            pod("a", "10.0.0.10", false, Some(8080)),
            pod("c", "10.0.0.3", true, Some(8081)),
            // No named port: listed for the numeric port only.
            pod("d", "10.0.0.4", true, None),
            // No IP yet.
            pod("e", "", true, Some(8080)),
        ];
        let subsets = desired_subsets(&svc, &pods);
        let summary: Vec<(Vec<i32>, Vec<&str>, Vec<&str>)> = subsets
            .iter()
            .map(|s| {
                (
                    s.ports.iter().map(|p| p.port).collect(),
                    ips(&s.addresses),
                    ips(&s.not_ready_addresses),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (vec![8080, 9100], vec!["10.0.0.2"], vec!["10.0.0.10"]),
                (vec![8081, 9100], vec!["10.0.0.3"], vec![]),
                (vec![9100], vec!["10.0.0.4"], vec![]),
            ]
        );
        let a = &subsets[0].addresses[0];
        assert_eq!(a.node_name.as_deref(), Some("node-1"));
        let r = a.target_ref.as_ref().expect("targetRef");
        assert_eq!(
            (
                r.kind.as_str(),
                r.namespace.as_str(),
                r.name.as_str(),
                r.uid.as_str()
            ),
            ("Pod", "ns", "b", "uid-b")
        );
        assert_eq!(subsets[0].ports[0].name, "http");
        // Deterministic: the same pods in another order give the same subsets.
        let mut reversed = pods.clone();
        reversed.reverse();
        assert_eq!(desired_subsets(&svc, &reversed), subsets);
    }

    #[test]
    fn readiness_termination_and_phase() {
        let mut terminating = pod("t", "10.0.0.5", true, Some(80));
        terminating.metadata_mut().deletion_timestamp = "2024-01-01T00:00:00Z".into();
        let mut done = pod("s", "10.0.0.6", false, Some(80));
        if let Some(s) = done.status.as_mut() {
            s.phase = "Succeeded".into();
        }
        let pods = [pod("n", "10.0.0.7", false, Some(80)), terminating, done];
        let strict = desired_subsets(&service(vec![sport("", 80, "80")], false), &pods);
        assert_eq!(strict.len(), 1);
        assert!(strict[0].addresses.is_empty());
        assert_eq!(ips(&strict[0].not_ready_addresses), ["10.0.0.7"]);
        // publishNotReadyAddresses: every listed pod is ready, terminating ones included.
        let tolerant = desired_subsets(&service(vec![sport("", 80, "80")], true), &pods);
        assert_eq!(ips(&tolerant[0].addresses), ["10.0.0.5", "10.0.0.7"]);
        assert!(tolerant[0].not_ready_addresses.is_empty());
    }

    #[test]
    fn writes_only_what_changed() {
        let svc = service(vec![sport("", 80, "http")], false);
        let pods = [pod("a", "10.0.0.1", true, Some(8080))];
        let created = endpoints_update(&svc, &pods, None).expect("a new object");
        assert_eq!(created.name(), "web");
        assert_eq!(created.subsets.len(), 1);
        assert!(is_managed(&created));
        assert_eq!(endpoints_update(&svc, &pods, Some(&created)), None);
        // A user's annotation is kept, a changed subset is put back.
        let mut edited = created.clone();
        edited
            .metadata_mut()
            .annotations
            .insert("note".into(), "x".into());
        edited.subsets.clear();
        let fixed = endpoints_update(&svc, &pods, Some(&edited)).expect("an update");
        assert_eq!(fixed.subsets, created.subsets);
        assert_eq!(
            fixed.metadata.as_ref().map(|m| m.annotations.len()),
            Some(1)
        );
    }

    #[test]
    fn named_ports_match_protocol() {
        let p = pod("a", "10.0.0.1", true, Some(8080));
        let mut udp = sport("dns", 53, "http");
        udp.protocol = "UDP".into();
        assert_eq!(resolve_target_port(&p, &sport("", 80, "http")), Some(8080));
        assert_eq!(resolve_target_port(&p, &udp), None);
        assert_eq!(resolve_target_port(&p, &sport("", 80, "")), Some(80));
        assert_eq!(resolve_target_port(&p, &sport("", 80, "grpc")), None);
    }
}
