//! The Services a container's environment names, as the kubelet writes them
//! (`pkg/kubelet/envvars`): for each Service with a cluster IP, `<NAME>_SERVICE_HOST`,
//! `<NAME>_SERVICE_PORT` (its first port), `<NAME>_SERVICE_PORT_<PORT NAME>` per named port,
//! and the Docker link variables (`<NAME>_PORT=tcp://ip:port`, `<NAME>_PORT_<port>_TCP`,
//! `_PROTO`, `_PORT`, `_ADDR`). The Services are the pod's namespace's when
//! `enableServiceLinks` is true (the default), and always `default/kubernetes`
//! (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, how in-cluster clients find the
//! API server) unless the pod's namespace has its own `kubernetes` Service and links are on.
//! Pure; these come first, so the container's `envFrom` and `env` override them.
//!
//! Built from the agent's Service informer; a container waits up to 30 s for its first list,
//! then fails with the kubelet's message.

use std::collections::BTreeMap;

use skiff_api::api::Service;
use skiff_api::wellknown::{KUBERNETES_SERVICE_NAME, KUBERNETES_SERVICE_NAMESPACE};

/// A Service's name as a variable prefix: upper case, `-` as `_`.
fn var_name(name: &str) -> String {
    name.to_uppercase().replace('-', "_")
}

/// The variables of the Services a pod of `namespace` sees, among `services` (all of the
/// cluster's, or at least its namespace's and `default`'s).
pub fn service_env<'a>(
    namespace: &str,
    enable_service_links: bool,
    services: impl IntoIterator<Item = &'a Service>,
) -> Vec<(String, String)> {
    let mut chosen: BTreeMap<String, &Service> = BTreeMap::new();
    for svc in services {
        let Some(meta) = svc.metadata.as_ref() else {
            continue;
        };
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        if spec.cluster_ip.is_empty() || spec.cluster_ip == "None" {
            continue;
        }
        if meta.namespace == KUBERNETES_SERVICE_NAMESPACE && meta.name == KUBERNETES_SERVICE_NAME {
            chosen.entry(meta.name.clone()).or_insert(svc);
        } else if meta.namespace == namespace && enable_service_links {
            chosen.insert(meta.name.clone(), svc);
        }
    }
    let mut out = Vec::new();
    for (name, svc) in chosen {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        let prefix = var_name(&name);
        let ip = &spec.cluster_ip;
        out.push((format!("{prefix}_SERVICE_HOST"), ip.clone()));
        if let Some(first) = spec.ports.first() {
            out.push((format!("{prefix}_SERVICE_PORT"), first.port.to_string()));
        }
        for p in spec.ports.iter().filter(|p| !p.name.is_empty()) {
            out.push((
                format!("{prefix}_SERVICE_PORT_{}", var_name(&p.name)),
                p.port.to_string(),
            ));
        }
        let host = |port: i32| match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => format!("[{ip}]:{port}"),
            _ => format!("{ip}:{port}"),
        };
        for (i, p) in spec.ports.iter().enumerate() {
            let protocol = if p.protocol.is_empty() {
                "TCP"
            } else {
                p.protocol.as_str()
            };
            let lower = protocol.to_lowercase();
            let url = format!("{lower}://{}", host(p.port));
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
            out.push((port_prefix.clone(), url));
            out.push((format!("{port_prefix}_PROTO"), lower));
            out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
            out.push((format!("{port_prefix}_ADDR"), ip.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, ServicePort, ServiceSpec};

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: ns.into(),
                ..Default::default()
            }),
            spec: Some(ServiceSpec {
                cluster_ip: ip.into(),
                ports: ports
                    .iter()
                    .map(|(n, p, proto)| ServicePort {
                        name: n.to_string(),
                        port: *p,
                        protocol: proto.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_kubelets_variables() {
        let all = [
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                &[("https", 443, "TCP")],
            ),
            svc(
                "shop",
                "redis-main",
                "10.96.0.9",
                &[("", 6379, "TCP"), ("metrics", 9121, "TCP")],
            ),
            svc("shop", "headless", "None", &[("", 80, "TCP")]),
            svc("other", "web", "10.96.0.7", &[("", 80, "TCP")]),
        ];
        let env = service_env("shop", true, &all);
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get(&env, "KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get(&env, "KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get(&env, "KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(
            get(&env, "KUBERNETES_PORT_443_TCP"),
            Some("tcp://10.96.0.1:443")
        );
        assert_eq!(get(&env, "KUBERNETES_PORT_443_TCP_PROTO"), Some("tcp"));
        assert_eq!(get(&env, "KUBERNETES_PORT_443_TCP_PORT"), Some("443"));
        assert_eq!(get(&env, "KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(get(&env, "REDIS_MAIN_SERVICE_HOST"), Some("10.96.0.9"));
        assert_eq!(get(&env, "REDIS_MAIN_SERVICE_PORT"), Some("6379"));
        assert_eq!(get(&env, "REDIS_MAIN_SERVICE_PORT_METRICS"), Some("9121"));
        assert_eq!(get(&env, "REDIS_MAIN_PORT"), Some("tcp://10.96.0.9:6379"));
        assert_eq!(
            get(&env, "REDIS_MAIN_PORT_9121_TCP"),
            Some("tcp://10.96.0.9:9121")
        );
        assert!(
            get(&env, "HEADLESS_SERVICE_HOST").is_none(),
            "no cluster IP"
        );
        assert!(get(&env, "WEB_SERVICE_HOST").is_none(), "another namespace");
    }

    #[test]
    fn without_links_only_the_api_server() {
        let all = [
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                &[("https", 443, "TCP")],
            ),
            svc("shop", "web", "10.96.0.7", &[("", 80, "TCP")]),
        ];
        let env = service_env("shop", false, &all);
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert!(get(&env, "WEB_SERVICE_HOST").is_none());
        // A namespace's own `kubernetes` Service wins when links are on.
        let own = [
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                &[("https", 443, "TCP")],
            ),
            svc("shop", "kubernetes", "10.96.0.50", &[("", 80, "TCP")]),
        ];
        assert_eq!(
            get(&service_env("shop", true, &own), "KUBERNETES_SERVICE_HOST"),
            Some("10.96.0.50")
        );
        assert_eq!(
            get(&service_env("shop", false, &own), "KUBERNETES_SERVICE_HOST"),
            Some("10.96.0.1")
        );
        // In `default` itself there is one.
        let env = service_env("default", true, &own);
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
    }
}
