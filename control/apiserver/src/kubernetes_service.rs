//! The `kubernetes` Service in `default` and its Endpoints: how pods find the API server
//! (kube-apiserver's `kubernetesservice` controller and endpoint reconciler). The Service
//! has the first address of the service range as its clusterIP and port 443 named `https`;
//! its Endpoints list this server's advertised address and secure port. Level-triggered:
//! checked at start and every [`RECONCILE_EVERY`] after, so a deleted or edited object
//! comes back, as in Kubernetes.
//!
//! Written through the registry like any client's write (defaulting, validation), by the
//! server itself. The node agents route the Service to the API server; KUBERNETES_SERVICE_HOST
//! and _PORT come from it.
//!
//! With several API servers each adds its own address and keeps the others'; removing the
//! address of a server that is gone needs kube-apiserver's lease reconciler, which Skiff
//! does not have.
//!
//! The Service's clusterIP is also a SAN of the serving certificate; the Endpoints' address is
//! `--advertise-address` (default the listen address). The same pass creates
//! `kube-system/kube-dns` (the range's tenth address, port 53 UDP and TCP, no selector) when
//! it is missing, for the node agents' cluster DNS.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectMeta, Service, ServicePort,
    ServiceSpec,
};
use tracing::{info, warn};

use crate::error::ApiError;
use crate::registry::{Registry, WriteOptions};

/// How often the objects are checked (kube-apiserver's `--endpoint-reconciler` interval).
pub const RECONCILE_EVERY: Duration = Duration::from_secs(10);
use skiff_api::wellknown::{
    KUBERNETES_SERVICE_NAME as NAME, KUBERNETES_SERVICE_NAMESPACE as NAMESPACE,
};
/// The Service's port and its name.
pub const SERVICE_PORT: i32 = 443;
const PORT_NAME: &str = "https";

/// What the objects say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubernetesService {
    /// The Service's clusterIP: the first address of the service range.
    pub cluster_ip: Ipv4Addr,
    /// Where clients reach this server: the Endpoints address and port.
    pub advertise: IpAddr,
    pub port: u16,
}

impl KubernetesService {
    fn meta(&self) -> ObjectMeta {
        ObjectMeta {
            name: NAME.into(),
            namespace: NAMESPACE.into(),
            labels: [("component", "apiserver"), ("provider", "kubernetes")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn ports(&self) -> Vec<ServicePort> {
        vec![ServicePort {
            name: PORT_NAME.into(),
            protocol: "TCP".into(),
            port: SERVICE_PORT,
            target_port: self.port.to_string(),
            ..Default::default()
        }]
    }

    /// The Service as it is created.
    pub fn service(&self) -> Service {
        Service {
            metadata: Some(self.meta()),
            spec: Some(ServiceSpec {
                ports: self.ports(),
                cluster_ip: self.cluster_ip.to_string(),
                cluster_ips: vec![self.cluster_ip.to_string()],
                r#type: "ClusterIP".into(),
                session_affinity: "None".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The Service `current` should become, if it differs: its ports put back (the
    /// clusterIP cannot change; type and affinity are set back too).
    pub fn service_fix(&self, current: &Service) -> Option<Service> {
        let spec = current.spec.clone().unwrap_or_default();
        let same = spec.ports == self.ports()
            && spec.r#type == "ClusterIP"
            && spec.session_affinity == "None";
        if same {
            return None;
        }
        let mut fixed = current.clone();
        let s = fixed.spec.get_or_insert_with(ServiceSpec::default);
        s.ports = self.ports();
        s.r#type = "ClusterIP".into();
        s.session_affinity = "None".into();
        Some(fixed)
    }

    /// The Endpoints `current` (absent: `None`) should become, if it differs: one subset
    /// with port `https`, the addresses other servers put there (on the same port) plus
    /// this server's.
    pub fn endpoints_fix(&self, current: Option<&Endpoints>) -> Option<Endpoints> {
        let port = EndpointPort {
            name: PORT_NAME.into(),
            port: i32::from(self.port),
            protocol: "TCP".into(),
            ..Default::default()
        };
        let ours = self.advertise.to_string();
        let mut addresses: Vec<EndpointAddress> = current
            .map(|e| e.subsets.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|s| s.ports == [port.clone()])
            .flat_map(|s| s.addresses.iter().cloned())
            .collect();
        if !addresses.iter().any(|a| a.ip == ours) {
            addresses.push(EndpointAddress {
                ip: ours,
                ..Default::default()
            });
        }
        addresses.sort_by(|a, b| a.ip.cmp(&b.ip));
        addresses.dedup_by(|a, b| a.ip == b.ip);
        let subsets = vec![EndpointSubset {
            addresses,
            ports: vec![port],
            ..Default::default()
        }];
        match current {
            Some(e) if e.subsets == subsets => None,
            Some(e) => Some(Endpoints {
                subsets,
                ..e.clone()
            }),
            None => Some(Endpoints {
                metadata: Some(self.meta()),
                subsets,
                ..Default::default()
            }),
        }
    }

    /// The `kube-system/kube-dns` Service the node agents' cluster DNS answers behind
    /// (clusterIP the tenth address of the range, ports 53 UDP and TCP; no selector: each
    /// agent serves it itself). Created when missing, never changed.
    pub fn kube_dns(&self) -> Option<Service> {
        let ip = Ipv4Addr::from(u32::from(self.cluster_ip).checked_add(9)?);
        let port = |name: &str, protocol: &str| ServicePort {
            name: name.into(),
            protocol: protocol.into(),
            port: 53,
            target_port: "53".into(),
            ..Default::default()
        };
        Some(Service {
            metadata: Some(ObjectMeta {
                name: "kube-dns".into(),
                namespace: "kube-system".into(),
                labels: [
                    ("k8s-app", "kube-dns"),
                    ("kubernetes.io/cluster-service", "true"),
                    ("kubernetes.io/name", "SkiffDNS"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                ports: vec![port("dns", "UDP"), port("dns-tcp", "TCP")],
                cluster_ip: ip.to_string(),
                cluster_ips: vec![ip.to_string()],
                r#type: "ClusterIP".into(),
                session_affinity: "None".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// One pass: creates the kube-dns Service if missing, creates or fixes the kubernetes
    /// Service, then its Endpoints.
    pub async fn reconcile(&self, registry: &Registry) -> Result<(), ApiError> {
        if let Some(dns) = self.kube_dns()
            && get_named::<Service>(registry, "kube-system", "kube-dns")
                .await?
                .is_none()
        {
            create_in(registry, "kube-system", &dns).await?;
        }
        match get::<Service>(registry).await? {
            None => create(registry, &self.service()).await?,
            Some(current) => {
                if let Some(fixed) = self.service_fix(&current) {
                    update(registry, &fixed).await?;
                }
            }
        }
        let current = get::<Endpoints>(registry).await?;
        match (self.endpoints_fix(current.as_ref()), current.is_some()) {
            (Some(e), false) => create(registry, &e).await,
            (Some(e), true) => update(registry, &e).await,
            (None, _) => Ok(()),
        }
    }

    /// Reconciles until the registry stops (a failed pass is logged and tried again at the
    /// next tick).
    pub async fn run(self, registry: std::sync::Arc<Registry>) {
        let mut logged_ok = false;
        loop {
            match self.reconcile(&registry).await {
                Ok(()) if !logged_ok => {
                    info!(cluster_ip = %self.cluster_ip, endpoint = %std::net::SocketAddr::new(self.advertise, self.port),
                        "the kubernetes Service is in place");
                    logged_ok = true;
                }
                Ok(()) => {}
                Err(e) => warn!(error = %e, "reconciling the kubernetes Service"),
            }
            tokio::time::sleep(RECONCILE_EVERY).await;
        }
    }
}

async fn get<T: Resource>(registry: &Registry) -> Result<Option<T>, ApiError> {
    get_named(registry, NAMESPACE, NAME).await
}

async fn get_named<T: Resource>(
    registry: &Registry,
    namespace: &str,
    name: &str,
) -> Result<Option<T>, ApiError> {
    match registry.handler(T::INFO.plural)?.get(namespace, name).await {
        Ok(bytes) => T::decode(bytes.as_slice())
            .map(Some)
            .map_err(|e| ApiError::Internal(format!("decoding {}: {e}", T::INFO.kind))),
        Err(ApiError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

async fn create<T: Resource>(registry: &Registry, obj: &T) -> Result<(), ApiError> {
    create_in(registry, NAMESPACE, obj).await
}

async fn create_in<T: Resource>(
    registry: &Registry,
    namespace: &str,
    obj: &T,
) -> Result<(), ApiError> {
    match registry
        .handler(T::INFO.plural)?
        .create(
            namespace,
            skiff_api::Encoded::proto(obj),
            WriteOptions::default(),
        )
        .await
    {
        Ok(_) => {
            info!(kind = T::INFO.kind, name = obj.name(), namespace, "created");
            Ok(())
        }
        // Another server (or a client) was first: the next pass compares.
        Err(ApiError::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn update<T: Resource>(registry: &Registry, obj: &T) -> Result<(), ApiError> {
    match registry
        .handler(T::INFO.plural)?
        .update(
            NAMESPACE,
            skiff_api::Encoded::proto(obj),
            "",
            WriteOptions::default(),
        )
        .await
    {
        Ok(_) => {
            info!(kind = T::INFO.kind, name = NAME, "updated");
            Ok(())
        }
        // Changed meanwhile: the next pass sees the new version.
        Err(ApiError::Conflict(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ks() -> KubernetesService {
        KubernetesService {
            cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
            advertise: IpAddr::V4(Ipv4Addr::new(192, 168, 1, 5)),
            port: 6443,
        }
    }

    #[test]
    fn the_service_is_kubernetes_own() {
        let s = ks().service();
        let spec = s.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip, "10.96.0.1");
        assert_eq!(spec.ports[0].port, 443);
        assert_eq!(spec.ports[0].name, "https");
        assert_eq!(spec.ports[0].target_port, "6443");
        assert!(
            spec.selector.is_empty(),
            "no selector: the Endpoints are ours"
        );
        assert_eq!(ks().service_fix(&s), None);
        let mut edited = s.clone();
        edited.spec.as_mut().unwrap().ports[0].port = 8443;
        let fixed = ks().service_fix(&edited).unwrap();
        assert_eq!(fixed.spec.unwrap().ports, ks().ports());
    }

    #[test]
    fn kube_dns_is_the_tenth_address() {
        let dns = ks().kube_dns().unwrap();
        let spec = dns.spec.unwrap();
        assert_eq!(spec.cluster_ip, "10.96.0.10");
        let ports: Vec<(&str, &str, i32)> = spec
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.protocol.as_str(), p.port))
            .collect();
        assert_eq!(ports, [("dns", "UDP", 53), ("dns-tcp", "TCP", 53)]);
        assert!(spec.selector.is_empty());
    }

    #[test]
    fn endpoints_keep_other_servers_and_add_this_one() {
        let created = ks().endpoints_fix(None).unwrap();
        assert_eq!(created.subsets[0].addresses[0].ip, "192.168.1.5");
        assert_eq!(created.subsets[0].ports[0].port, 6443);
        assert_eq!(ks().endpoints_fix(Some(&created)), None);
        let mut other = ks();
        other.advertise = IpAddr::V4(Ipv4Addr::new(192, 168, 1, 6));
        let both = other.endpoints_fix(Some(&created)).unwrap();
        let ips: Vec<&str> = both.subsets[0]
            .addresses
            .iter()
            .map(|a| a.ip.as_str())
            .collect();
        assert_eq!(ips, ["192.168.1.5", "192.168.1.6"]);
        // An address on another port (a user's edit) is replaced.
        let mut wrong = created.clone();
        wrong.subsets[0].ports[0].port = 1;
        let fixed = other.endpoints_fix(Some(&wrong)).unwrap();
        assert_eq!(fixed.subsets[0].addresses.len(), 1);
        assert_eq!(fixed.subsets[0].addresses[0].ip, "192.168.1.6");
    }
}
