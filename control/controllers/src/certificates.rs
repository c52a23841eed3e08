//! The certificatesigningrequest controller: kube-controller-manager's `csrapproving` and
//! `csrsigning` in one reconcile. It approves by itself:
//!
//! - a node's client-certificate request (signer
//!   `kubernetes.io/kube-apiserver-client-kubelet`) when it asks for exactly
//!   `CN=system:node:<name>, O=system:nodes` with client usages only, and the requester is a
//!   bootstrap token (`system:bootstrappers`) or that same node renewing;
//! - a node's serving-certificate request (signer `kubernetes.io/kubelet-serving`, for the
//!   agent's HTTPS API) when the node itself (`system:node:<name>` in `system:nodes`) asks
//!   for `CN=system:node:<name>, O=system:nodes`, not a CA, with server usages only, and every
//!   SAN is that Node's own: each IP address one of its `status.addresses` of type InternalIP
//!   or ExternalIP (never a loopback, unspecified or multicast one), each DNS name one of its
//!   Hostname, InternalDNS or ExternalDNS addresses. Kubernetes leaves this approval to a
//!   third-party approver; a node that got a certificate for another node's or the API
//!   server's address could impersonate it. A request whose Node or addresses are not there
//!   yet stays pending and is looked at again when that Node changes.
//!
//! Other requests wait for a person (`kubectl certificate approve`). With the cluster CA (the
//! manager's `--cluster-signing-cert-file`/`--cluster-signing-key-file`) it signs every
//! approved request of the three signers it knows (the two client signers and the node
//! serving signer, whose certificates carry exactly the requested SANs), checking the request
//! against the signer's rules first (a request that breaks them gets a Failed condition).
//!
//! Requests that are done with are deleted as kube-controller-manager's `csrcleaner` deletes
//! them ([`crate::csrcleaner`]): each reconcile looks again when that time comes.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    Node,
};
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, Informer, Informers, ObjectKey, Reconciler,
};
use skiff_pki::{Ca, LeafSpec, RequestInfo, Usage};

use crate::{Context, Error};

pub use skiff_api::wellknown::{CLIENT_SIGNER, KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER};
const NODES_GROUP: &str = "system:nodes";
const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";
const NODE_USER_PREFIX: &str = "system:node:";
/// The usages a client certificate may ask for.
const CLIENT_USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];
/// The usages a node serving certificate may ask for.
const SERVING_USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];
/// Node address types whose values a serving certificate may name as IP SANs.
const IP_ADDRESS_TYPES: [&str; 2] = ["InternalIP", "ExternalIP"];
/// Node address types whose values a serving certificate may name as DNS SANs.
const DNS_ADDRESS_TYPES: [&str; 3] = ["Hostname", "InternalDNS", "ExternalDNS"];
/// The Approved condition's messages (kube-controller-manager's).
const CLIENT_APPROVAL: &str =
    "Auto approving kubelet client certificate after SubjectAccessReview.";
const SERVING_APPROVAL: &str =
    "Auto approving kubelet serving certificate after SubjectAccessReview.";

#[derive(Debug)]
pub struct CsrController {
    client: Client,
    requests: Informer<CertificateSigningRequest>,
    /// The Nodes whose addresses serving certificates may name.
    nodes: Informer<Node>,
    /// Signs approved requests; `None`: approval only.
    ca: Option<Arc<Ca>>,
}

/// The request's PEM, read and its signature checked.
fn request_of(r: &CertificateSigningRequest) -> Result<RequestInfo, String> {
    let spec = r.spec.as_ref().ok_or("no spec")?;
    let pem = std::str::from_utf8(&spec.request).map_err(|_| "the request is not PEM")?;
    skiff_pki::parse_request(pem).map_err(|e| e.to_string())
}

/// The node a `system:node:<name>` user name (or common name) names.
fn node_name(user: &str) -> Option<&str> {
    user.strip_prefix(NODE_USER_PREFIX)
        .filter(|n| !n.is_empty())
}

/// Why a request's subject is not a node's (`CN=system:node:<name>, O=system:nodes`).
fn node_subject_problem(req: &RequestInfo) -> Option<String> {
    if node_name(&req.common_name).is_none() {
        return Some(format!(
            "subject common name {:?} does not begin with system:node:",
            req.common_name
        ));
    }
    if req.organizations != [NODES_GROUP] {
        return Some(format!(
            "subject organizations {:?} are not exactly [system:nodes]",
            req.organizations
        ));
    }
    None
}

/// Why a request breaks the kubelet client signer's rules; `None` when it keeps them.
fn kubelet_client_problem(r: &CertificateSigningRequest, req: &RequestInfo) -> Option<String> {
    let spec = r.spec.as_ref()?;
    if let Some(p) = node_subject_problem(req) {
        return Some(p);
    }
    if !req.sans.is_empty() || req.is_ca {
        return Some("the request may not ask for subject alternative names or a CA".into());
    }
    usages_problem(&spec.usages, &CLIENT_USAGES, "client")
}

/// Why a request breaks the kubelet serving signer's rules; `None` when it keeps them.
fn kubelet_serving_problem(r: &CertificateSigningRequest, req: &RequestInfo) -> Option<String> {
    let spec = r.spec.as_ref()?;
    if let Some(p) = node_subject_problem(req) {
        return Some(p);
    }
    if req.is_ca {
        return Some("the request may not ask for a CA".into());
    }
    if req.sans.is_empty() {
        return Some("the request must ask for at least one DNS name or IP address".into());
    }
    if let Some(san) = req
        .sans
        .iter()
        .find(|s| s.parse::<IpAddr>().is_err() && !is_dns_name(s))
    {
        return Some(format!(
            "subject alternative name {san:?} is neither a DNS name nor an IP address"
        ));
    }
    usages_problem(&spec.usages, &SERVING_USAGES, "server")
}

/// Whether `name` is a DNS name (RFC 1123 labels of letters, digits and inner hyphens).
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Why `usages` are not ones a `kind` certificate may have: each one of `allowed`, and
/// `"<kind> auth"` among them.
fn usages_problem(usages: &[String], allowed: &[&str], kind: &str) -> Option<String> {
    if let Some(u) = usages.iter().find(|u| !allowed.contains(&u.as_str())) {
        return Some(format!(
            "usage {u:?} is not allowed for a {kind} certificate"
        ));
    }
    let required = format!("{kind} auth");
    if !usages.contains(&required) {
        return Some(format!("the usages must include {required:?}"));
    }
    None
}

/// The first of `sans` that is not one of `node`'s addresses of the right type (IP SANs:
/// InternalIP or ExternalIP, compared as addresses; DNS SANs: Hostname, InternalDNS or
/// ExternalDNS). A loopback, unspecified or multicast address names no node and is never
/// the node's; neither is an address another of `nodes` lists too (a node writes its own
/// status, so it could list another node's address to be certified for it: the address
/// stays that other node's).
fn foreign_san<'a>(sans: &'a [String], node: &Node, nodes: &[Arc<Node>]) -> Option<&'a str> {
    let addresses = node
        .status
        .as_ref()
        .map(|s| s.addresses.as_slice())
        .unwrap_or_default();
    let lists = |n: &Node, ip: IpAddr| {
        n.status.as_ref().is_some_and(|s| {
            s.addresses.iter().any(|a| {
                IP_ADDRESS_TYPES.contains(&a.r#type.as_str())
                    && a.address.parse::<IpAddr>().is_ok_and(|own| own == ip)
            })
        })
    };
    let owns = |san: &str| match san.parse::<IpAddr>() {
        Ok(ip) => {
            !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast())
                && lists(node, ip)
                && !nodes
                    .iter()
                    .any(|other| other.name() != node.name() && lists(other, ip))
        }
        Err(_) => addresses
            .iter()
            .any(|a| DNS_ADDRESS_TYPES.contains(&a.r#type.as_str()) && a.address == san),
    };
    sans.iter().map(String::as_str).find(|s| !owns(s))
}

/// The message of the Approved condition the controller sets by itself on `r`, or why it
/// does not approve it (the request then waits for a person, or for its Node to list the
/// addresses it asks for). `nodes` are the cluster's Nodes.
fn auto_approval(
    r: &CertificateSigningRequest,
    nodes: &[Arc<Node>],
) -> Result<&'static str, String> {
    let spec = r.spec.as_ref().ok_or("no spec")?;
    let req = request_of(r)?;
    match spec.signer_name.as_str() {
        KUBELET_CLIENT_SIGNER => {
            if let Some(p) = kubelet_client_problem(r, &req) {
                return Err(p);
            }
            let requester_may = spec.groups.iter().any(|g| g == BOOTSTRAPPERS_GROUP)
                || spec.username == req.common_name;
            if !requester_may {
                return Err(format!(
                    "{:?} is neither a bootstrap token nor the node itself",
                    spec.username
                ));
            }
            Ok(CLIENT_APPROVAL)
        }
        KUBELET_SERVING_SIGNER => {
            if let Some(p) = kubelet_serving_problem(r, &req) {
                return Err(p);
            }
            // Only the node itself, never a bootstrap token or another node.
            if spec.username != req.common_name || !spec.groups.iter().any(|g| g == NODES_GROUP) {
                return Err(format!(
                    "{:?} is not the node {:?} itself",
                    spec.username, req.common_name
                ));
            }
            let name = node_name(&req.common_name).ok_or("no node name")?;
            let node = nodes
                .iter()
                .find(|n| n.name() == name)
                .ok_or_else(|| format!("node {name:?} does not exist"))?;
            if let Some(san) = foreign_san(&req.sans, node, nodes) {
                return Err(format!("{san:?} is not an address of node {name:?}"));
            }
            Ok(SERVING_APPROVAL)
        }
        other => Err(format!("signer {other:?} is approved by people only")),
    }
}

/// Whether the controller approves this request by itself: a node's first client certificate
/// through a bootstrap token, a node renewing its own, or a node's serving certificate for its
/// own addresses (`nodes`: the cluster's Nodes).
pub fn auto_approvable(r: &CertificateSigningRequest, nodes: &[Arc<Node>]) -> bool {
    auto_approval(r, nodes).is_ok()
}

/// The serving-certificate requests of `node` (asked by it) among `requests` that still wait
/// for approval: what a change of the Node may let the controller approve.
fn waiting_for(node: &Node, requests: &[Arc<CertificateSigningRequest>]) -> Vec<ObjectKey> {
    let user = format!("{NODE_USER_PREFIX}{}", node.name());
    requests
        .iter()
        .filter(|r| {
            r.spec
                .as_ref()
                .is_some_and(|s| s.signer_name == KUBELET_SERVING_SIGNER && s.username == user)
                && !["Approved", "Denied", "Failed"].iter().any(|ty| has(r, ty))
        })
        .map(|r| ObjectKey::of(&**r))
        .collect()
}

fn has(r: &CertificateSigningRequest, ty: &str) -> bool {
    r.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == ty && c.status == "True")
    })
}

fn condition(ty: &str, reason: &str, message: &str) -> CertificateSigningRequestCondition {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    CertificateSigningRequestCondition {
        r#type: ty.into(),
        status: "True".into(),
        reason: reason.into(),
        message: message.into(),
        last_update_time: now.clone(),
        last_transition_time: now,
    }
}

impl CsrController {
    pub fn new(informers: &Informers, ca: Option<Arc<Ca>>) -> Self {
        CsrController {
            client: informers.client().clone(),
            requests: informers.get::<CertificateSigningRequest>(),
            nodes: informers.get::<Node>(),
            ca,
        }
    }

    /// Runs it with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        ca: Option<Arc<Ca>>,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(CsrController::new(informers, ca));
        // A serving request waits for its Node's addresses: a change of a Node looks again at
        // the pending serving requests of that node (level-triggered, no polling).
        let requests = reconciler.requests.clone();
        Controller::<CertificateSigningRequest>::new(informers)
            .named("certificatesigningrequest")
            .watches(&reconciler.nodes, move |node: &Node| {
                waiting_for(node, &requests.list())
            })
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }
}

/// The certificate for an approved request, or why the signer refuses it.
fn sign(ca: &Ca, r: &CertificateSigningRequest) -> Result<String, String> {
    let spec = r.spec.as_ref().ok_or("no spec")?;
    let req = request_of(r)?;
    let problem = match spec.signer_name.as_str() {
        KUBELET_CLIENT_SIGNER => kubelet_client_problem(r, &req),
        KUBELET_SERVING_SIGNER => kubelet_serving_problem(r, &req),
        _ => usages_problem(&spec.usages, &CLIENT_USAGES, "client"),
    };
    if let Some(p) = problem {
        return Err(p);
    }
    let validity = spec
        .expiration_seconds
        .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
        .filter(|d| !d.is_zero())
        .map_or(skiff_pki::LEAF_VALIDITY, |d| {
            d.min(skiff_pki::LEAF_VALIDITY)
        });
    let (sans, usage) = if spec.signer_name == KUBELET_SERVING_SIGNER {
        (req.sans, Usage::Server)
    } else {
        (Vec::new(), Usage::Client)
    };
    let leaf = LeafSpec {
        common_name: req.common_name,
        organizations: req.organizations,
        sans,
        usage,
        validity,
    };
    let pem = std::str::from_utf8(&spec.request).map_err(|_| "the request is not PEM")?;
    ca.sign_request(pem, &leaf).map_err(|e| e.to_string())
}

impl Reconciler for CsrController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(current) = self.requests.get(key) else {
            return Ok(Action::Done);
        };
        let keep = crate::csrcleaner::remaining(&current, std::time::SystemTime::now());
        if keep == Some(Duration::ZERO) {
            tracing::info!(csr = %key.name, "deleting a request that is done with");
            let api = self.client.cluster::<CertificateSigningRequest>();
            return match api
                .delete(&key.name, &skiff_client::DeleteParams::default())
                .await
            {
                Ok(_) => Ok(Action::Done),
                Err(e) if e.is_not_found() => Ok(Action::Done),
                Err(e) => Err(e).during(|| format!("deleting {}", key.name)),
            };
        }
        // Looked at again when it is to be deleted, whatever else happens to it.
        Ok(match self.reconcile_request(key, current).await? {
            Action::Done => keep.map_or(Action::Done, Action::RequeueAfter),
            other => other,
        })
    }
}

impl CsrController {
    /// Approval and signing of the request `current` (named by `key`).
    async fn reconcile_request(
        &self,
        key: &ObjectKey,
        current: Arc<CertificateSigningRequest>,
    ) -> Result<Action, Error> {
        let issued = current
            .status
            .as_ref()
            .is_some_and(|s| !s.certificate.is_empty());
        if issued || has(&current, "Denied") || has(&current, "Failed") {
            return Ok(Action::Done);
        }
        let api = self.client.cluster::<CertificateSigningRequest>();
        let mut r = (*current).clone();
        if !has(&r, "Approved") {
            let message = match auto_approval(&r, &self.nodes.list()) {
                Ok(message) => message,
                Err(reason) => {
                    tracing::debug!(csr = %key.name, %reason, "not approving by itself");
                    return Ok(Action::Done);
                }
            };
            r.status
                .get_or_insert_with(CertificateSigningRequestStatus::default)
                .conditions
                .push(condition("Approved", "AutoApproved", message));
            tracing::info!(csr = %key.name, %message, "approved a node certificate request");
            return match api.update_subresource(&r, "approval").await {
                Ok(_) => Ok(Action::Done),
                Err(e) if e.is_conflict() => Ok(Action::RequeueAfter(Duration::ZERO)),
                Err(e) => Err(e).during(|| format!("approving {}", key.name)),
            };
        }
        let Some(ca) = &self.ca else {
            return Ok(Action::Done);
        };
        let signer = r
            .spec
            .as_ref()
            .map(|s| s.signer_name.clone())
            .unwrap_or_default();
        if ![KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER, CLIENT_SIGNER]
            .contains(&signer.as_str())
        {
            return Ok(Action::Done);
        }
        let status = r
            .status
            .get_or_insert_with(CertificateSigningRequestStatus::default);
        match sign(ca, &current) {
            Ok(pem) => {
                status.certificate = pem.into_bytes();
                tracing::info!(csr = %key.name, %signer, "signed");
            }
            Err(reason) => {
                tracing::info!(csr = %key.name, %signer, %reason, "refused to sign");
                status
                    .conditions
                    .push(condition("Failed", "SignerValidationFailure", &reason));
            }
        }
        match api.update_status(&r).await {
            Ok(_) => Ok(Action::Done),
            Err(e) if e.is_conflict() => Ok(Action::RequeueAfter(Duration::ZERO)),
            Err(e) => Err(e).during(|| format!("writing the certificate of {}", key.name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::CertificateSigningRequestSpec;

    fn csr(cn: &str, orgs: &[&str], requester: &str, groups: &[&str]) -> CertificateSigningRequest {
        let orgs: Vec<String> = orgs.iter().map(|s| s.to_string()).collect();
        let (_, pem) = skiff_pki::new_request(cn, &orgs).unwrap();
        CertificateSigningRequest {
            spec: Some(CertificateSigningRequestSpec {
                request: pem.into_bytes(),
                signer_name: KUBELET_CLIENT_SIGNER.into(),
                usages: vec!["digital signature".into(), "client auth".into()],
                username: requester.into(),
                groups: groups.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_node_client_requests_of_bootstrappers_or_the_node_itself_are_approved() {
        let boot = ["system:bootstrappers", "system:authenticated"];
        let approvable = |r: CertificateSigningRequest| auto_approvable(&r, &[]);
        assert!(approvable(csr(
            "system:node:n2",
            &["system:nodes"],
            "system:bootstrap:abcdef",
            &boot
        )));
        // Renewal by the node itself.
        assert!(approvable(csr(
            "system:node:n2",
            &["system:nodes"],
            "system:node:n2",
            &["system:nodes"]
        )));
        // Another node's name, another group, another requester: not by themselves.
        assert!(!approvable(csr(
            "system:node:n3",
            &["system:nodes"],
            "system:node:n2",
            &["system:nodes"]
        )));
        assert!(!approvable(csr(
            "system:node:n2",
            &["system:masters"],
            "system:bootstrap:abcdef",
            &boot
        )));
        assert!(!approvable(csr(
            "admin",
            &["system:nodes"],
            "system:bootstrap:abcdef",
            &boot
        )));
        assert!(!approvable(csr(
            "system:node:n2",
            &["system:nodes"],
            "alice",
            &["dev"]
        )));
        let mut server = csr(
            "system:node:n2",
            &["system:nodes"],
            "system:bootstrap:abcdef",
            &boot,
        );
        server
            .spec
            .as_mut()
            .unwrap()
            .usages
            .push("server auth".into());
        assert!(!approvable(server));
    }

    #[test]
    fn signing_follows_the_signer_rules() {
        let ca = Ca::generate("test-ca").unwrap();
        let good = csr(
            "system:node:n2",
            &["system:nodes"],
            "system:bootstrap:abcdef",
            &[],
        );
        let pem = sign(&ca, &good).unwrap();
        let info = skiff_pki::parse_pem(&pem, "issued").unwrap();
        assert_eq!(info.common_name, "system:node:n2");
        assert_eq!(info.organizations, ["system:nodes"]);
        let bad = csr(
            "system:node:n2",
            &["system:masters"],
            "system:bootstrap:abcdef",
            &[],
        );
        assert!(sign(&ca, &bad).unwrap_err().contains("organizations"));
    }

    const NODE_GROUPS: [&str; 2] = ["system:nodes", "system:authenticated"];

    /// A serving request of `requester` (in `groups`) for `cn` in `system:nodes` with `sans`.
    fn serving(
        cn: &str,
        sans: &[&str],
        requester: &str,
        groups: &[&str],
    ) -> CertificateSigningRequest {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let (_, pem) =
            skiff_pki::new_server_request(cn, &["system:nodes".to_string()], &sans).unwrap();
        CertificateSigningRequest {
            metadata: Some(skiff_api::api::ObjectMeta {
                name: format!("csr-{cn}"),
                ..Default::default()
            }),
            spec: Some(CertificateSigningRequestSpec {
                request: pem.into_bytes(),
                signer_name: KUBELET_SERVING_SIGNER.into(),
                usages: SERVING_USAGES.iter().map(|u| u.to_string()).collect(),
                username: requester.into(),
                groups: groups.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// n1's request for `sans`, by n1 itself.
    fn n1_asks(sans: &[&str]) -> CertificateSigningRequest {
        serving("system:node:n1", sans, "system:node:n1", &NODE_GROUPS)
    }

    fn node(name: &str, addresses: &[(&str, &str)]) -> Node {
        Node {
            metadata: Some(skiff_api::api::ObjectMeta {
                name: name.into(),
                ..Default::default()
            }),
            status: Some(skiff_api::api::NodeStatus {
                addresses: addresses
                    .iter()
                    .map(|(ty, a)| skiff_api::api::NodeAddress {
                        r#type: ty.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The cluster's Nodes: n1 (with a loopback InternalIP it should not have, and an IP
    /// written as a Hostname) and n2.
    fn nodes() -> Vec<Arc<Node>> {
        vec![
            Arc::new(node(
                "n1",
                &[
                    ("InternalIP", "192.168.100.3"),
                    ("ExternalIP", "203.0.113.7"),
                    ("InternalIP", "fd00:0:0::3"),
                    ("InternalIP", "127.0.0.1"),
                    ("Hostname", "n1"),
                    ("Hostname", "10.9.9.9"),
                    ("InternalDNS", "n1.cluster.internal"),
                ],
            )),
            Arc::new(node(
                "n2",
                &[("InternalIP", "192.168.100.4"), ("Hostname", "n2")],
            )),
        ]
    }

    /// Why the controller does not approve `r` by itself (panics if it does).
    fn refused(r: &CertificateSigningRequest) -> String {
        match auto_approval(r, &nodes()) {
            Ok(m) => panic!("approved: {m}"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_node_serving_request_is_approved_for_its_own_addresses() {
        let all = [
            "192.168.100.3",
            "203.0.113.7",
            "fd00::3",
            "n1",
            "n1.cluster.internal",
        ];
        assert_eq!(
            auto_approval(&n1_asks(&all), &nodes()),
            Ok(SERVING_APPROVAL)
        );
        assert!(auto_approvable(&n1_asks(&["192.168.100.3"]), &nodes()));
        // Without its usage "key encipherment" (Kubernetes' kubelet asks for it; an ECDSA key
        // need not).
        let mut r = n1_asks(&["192.168.100.3"]);
        r.spec.as_mut().unwrap().usages = vec!["digital signature".into(), "server auth".into()];
        assert!(auto_approvable(&r, &nodes()));
    }

    #[test]
    fn a_node_serving_request_for_an_address_not_its_own_is_not_approved() {
        // Another node's IP, asked by n1, and by n2 for n1's.
        let e = refused(&n1_asks(&["192.168.100.3", "192.168.100.4"]));
        assert!(
            e.contains("\"192.168.100.4\" is not an address of node \"n1\""),
            "{e}"
        );
        let r = serving(
            "system:node:n2",
            &["192.168.100.3"],
            "system:node:n2",
            &NODE_GROUPS,
        );
        assert!(refused(&r).contains("not an address of node \"n2\""));
        // Addresses that are no node's, loopback even when the Node lists it, an IP the Node
        // lists only as a host name.
        for san in ["10.0.0.99", "127.0.0.1", "::1", "0.0.0.0", "10.9.9.9"] {
            let e = refused(&n1_asks(&["192.168.100.3", san]));
            assert!(e.contains("is not an address of node"), "{san}: {e}");
        }
        // DNS names the Node does not list (another node's, the API server's), and a name
        // that is only an IP address of the Node's.
        for san in ["n2", "kubernetes.default.svc", "N1.cluster.internal"] {
            let e = refused(&n1_asks(&["n1", san]));
            assert!(e.contains("is not an address of node"), "{san}: {e}");
        }
        // n2 lists n1's address in its own status (a node writes its own): the address stays
        // n1's, and neither node is certified for it while both list it.
        let mut claimed = nodes();
        let mut n2 = (*claimed[1]).clone();
        n2.status
            .as_mut()
            .unwrap()
            .addresses
            .push(skiff_api::api::NodeAddress {
                r#type: "InternalIP".into(),
                address: "192.168.100.3".into(),
            });
        claimed[1] = Arc::new(n2);
        let by_n2 = serving(
            "system:node:n2",
            &["192.168.100.3"],
            "system:node:n2",
            &NODE_GROUPS,
        );
        for r in [&by_n2, &n1_asks(&["192.168.100.3"])] {
            let e = auto_approval(r, &claimed).unwrap_err();
            assert!(
                e.contains("\"192.168.100.3\" is not an address of node"),
                "{e}"
            );
        }
        // A Node that does not exist (yet).
        let r = serving(
            "system:node:n9",
            &["192.168.100.9"],
            "system:node:n9",
            &NODE_GROUPS,
        );
        assert!(refused(&r).contains("does not exist"));
    }

    #[test]
    fn only_the_node_itself_gets_a_serving_certificate_approved() {
        // A bootstrap token (for a node that may not even exist, as for a client
        // certificate).
        let r = serving(
            "system:node:n1",
            &["192.168.100.3"],
            "system:bootstrap:abcdef",
            &["system:bootstrappers", "system:authenticated"],
        );
        assert!(refused(&r).contains("is not the node"));
        // Another node, for n1.
        let r = serving(
            "system:node:n1",
            &["192.168.100.3"],
            "system:node:n2",
            &NODE_GROUPS,
        );
        assert!(refused(&r).contains("is not the node"));
        // The node's name without the nodes group.
        let r = serving(
            "system:node:n1",
            &["192.168.100.3"],
            "system:node:n1",
            &["system:authenticated"],
        );
        assert!(refused(&r).contains("is not the node"));
    }

    #[test]
    fn a_serving_request_must_keep_the_signer_rules_to_be_approved() {
        // Client usages, or client and server.
        for usages in [
            &["digital signature", "key encipherment", "client auth"][..],
            &["digital signature", "server auth", "client auth"],
            &["digital signature", "key encipherment"],
        ] {
            let mut r = n1_asks(&["192.168.100.3"]);
            r.spec.as_mut().unwrap().usages = usages.iter().map(|u| u.to_string()).collect();
            let e = refused(&r);
            assert!(e.contains("usage"), "{usages:?}: {e}");
        }
        // No SANs.
        assert!(refused(&n1_asks(&[])).contains("at least one DNS name or IP address"));
        // Not a node's subject.
        let (_, pem) = skiff_pki::new_server_request(
            "system:node:n1",
            &["system:masters".to_string()],
            &["192.168.100.3".to_string()],
        )
        .unwrap();
        let mut r = n1_asks(&["192.168.100.3"]);
        r.spec.as_mut().unwrap().request = pem.into_bytes();
        assert!(refused(&r).contains("organizations"));
        // A CA (rcgen, here, cannot write a request for one: the rule on what was read).
        let r = n1_asks(&["192.168.100.3"]);
        let mut req = request_of(&r).unwrap();
        assert_eq!(kubelet_serving_problem(&r, &req), None);
        req.is_ca = true;
        let p = kubelet_serving_problem(&r, &req).unwrap();
        assert!(p.contains("a CA"), "{p}");
        // A SAN that is neither an IP address nor a DNS name (how a URI SAN is read).
        req.is_ca = false;
        req.sans = vec!["URI(Ia5String(\"spiffe://x\"))".into()];
        let p = kubelet_serving_problem(&r, &req).unwrap();
        assert!(p.contains("neither a DNS name nor an IP address"), "{p}");
    }

    #[test]
    fn the_serving_signer_issues_a_server_certificate_with_exactly_the_requested_sans() {
        let ca = Ca::generate("test-ca").unwrap();
        let sans = ["192.168.100.3", "fd00::3", "n1"];
        let pem = sign(&ca, &n1_asks(&sans)).unwrap();
        let info = skiff_pki::parse_pem(&pem, "issued").unwrap();
        assert_eq!(info.common_name, "system:node:n1");
        assert_eq!(info.organizations, ["system:nodes"]);
        assert_eq!(info.sans, sans);
        assert!(!info.is_ca);
        let der = skiff_pki::pem_certificates(&pem, "issued")
            .unwrap()
            .remove(0);
        skiff_pki::tls::verify_chain_for(ca.cert_pem(), &der, &[], Usage::Server).unwrap();
        assert!(skiff_pki::tls::verify_chain_for(ca.cert_pem(), &der, &[], Usage::Client).is_err());
        // The signer's rules hold whoever approved: no SANs, client usages.
        assert!(
            sign(&ca, &n1_asks(&[]))
                .unwrap_err()
                .contains("at least one")
        );
        let mut r = n1_asks(&["192.168.100.3"]);
        r.spec.as_mut().unwrap().usages = vec!["digital signature".into(), "client auth".into()];
        assert!(sign(&ca, &r).unwrap_err().contains("usage"));
    }

    #[test]
    fn a_node_change_looks_again_at_its_pending_serving_requests_only() {
        let mine = n1_asks(&["192.168.100.3"]);
        let mut approved = serving(
            "system:node:x",
            &["192.168.100.3"],
            "system:node:n1",
            &NODE_GROUPS,
        );
        approved.status = Some(CertificateSigningRequestStatus {
            conditions: vec![condition("Approved", "AutoApproved", SERVING_APPROVAL)],
            ..Default::default()
        });
        let other = serving(
            "system:node:n2",
            &["192.168.100.4"],
            "system:node:n2",
            &NODE_GROUPS,
        );
        let client = csr(
            "system:node:n1",
            &["system:nodes"],
            "system:node:n1",
            &NODE_GROUPS,
        );
        let requests: Vec<_> = [mine, approved, other, client]
            .into_iter()
            .map(Arc::new)
            .collect();
        let n1 = node("n1", &[]);
        assert_eq!(
            waiting_for(&n1, &requests),
            [ObjectKey::new("", "csr-system:node:n1")]
        );
    }
}
