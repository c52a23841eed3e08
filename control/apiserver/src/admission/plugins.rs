//! The plug-ins of [`super::Chain`], each a few lines over the kind logic it calls.

use std::any::Any;
use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use skiff_api::api::{CertificateSigningRequest, Node, PersistentVolumeClaim, Pod, Service};
use skiff_cidr::Ipv4Cidr;

use super::{Operation, Plugin, Request};
use crate::auth::authz::Authorizer;
use crate::error::{ApiError, FieldError, FieldErrorKind};
use crate::request::{Attributes, Decision};
use crate::strategy::pod_security;

/// Nothing new in a namespace that does not exist or is being deleted.
pub(super) struct NamespaceLifecycle;

#[async_trait]
impl Plugin for NamespaceLifecycle {
    fn name(&self) -> &'static str {
        "NamespaceLifecycle"
    }

    async fn mutate(
        &self,
        req: &Request<'_>,
        _object: &mut (dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        if req.operation != Operation::Create || !req.info.namespaced || !req.subresource.is_empty()
        {
            return Ok(());
        }
        let ns = req
            .namespace_object()
            .await?
            .ok_or_else(|| ApiError::NamespaceNotFound(req.namespace.to_string()))?;
        let terminating = ns
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty())
            || ns.status.as_ref().is_some_and(|s| s.phase == "Terminating");
        if terminating {
            return Err(ApiError::NamespaceTerminating(req.namespace.to_string()));
        }
        Ok(())
    }
}

/// A new pod's ServiceAccount and its token volume.
pub(super) struct ServiceAccount;

#[async_trait]
impl Plugin for ServiceAccount {
    fn name(&self) -> &'static str {
        "ServiceAccount"
    }

    async fn mutate(
        &self,
        req: &Request<'_>,
        object: &mut (dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        match object.downcast_mut::<Pod>() {
            Some(pod) if req.operation == Operation::Create => {
                crate::strategy::pod::service_account_admission(pod, async |namespace, name| {
                    req.get::<skiff_api::api::ServiceAccount>(&namespace, &name)
                        .await
                })
                .await
            }
            _ => Ok(()),
        }
    }
}

/// A new claim without a class gets the default StorageClass.
pub(super) struct DefaultStorageClass;

#[async_trait]
impl Plugin for DefaultStorageClass {
    fn name(&self) -> &'static str {
        "DefaultStorageClass"
    }

    async fn mutate(
        &self,
        req: &Request<'_>,
        object: &mut (dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        match object.downcast_mut::<PersistentVolumeClaim>() {
            Some(claim) if req.operation == Operation::Create => {
                crate::strategy::storage::default_storage_class(claim, async || {
                    req.list::<skiff_api::api::StorageClass>("").await
                })
                .await
            }
            _ => Ok(()),
        }
    }
}

/// The namespace's enforced Pod Security level, on a pod's create and on every update that
/// changes what a check looks at (an image), as kube-apiserver's plug-in, and on every write
/// of `ephemeralcontainers` (a container added to a running pod is checked as any other);
/// the other subresources (status, binding) are not evaluated.
pub(super) struct PodSecurity;

#[async_trait]
impl Plugin for PodSecurity {
    fn name(&self) -> &'static str {
        "PodSecurity"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let Some(pod) = object.downcast_ref::<Pod>() else {
            return Ok(());
        };
        if !req.subresource.is_empty()
            && req.subresource != crate::strategy::pod::EPHEMERAL_CONTAINERS
        {
            return Ok(());
        }
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        match req.operation {
            Operation::Create => {}
            Operation::Update => {
                let old = req.old_as::<Pod>().and_then(|p| p.spec.as_ref());
                if old.is_some_and(|old| !pod_security::significant_update(spec, old)) {
                    return Ok(());
                }
            }
            Operation::Delete => return Ok(()),
        }
        let labels = req
            .namespace_object()
            .await?
            .and_then(|ns| ns.metadata.as_ref())
            .map(|m| m.labels.clone())
            .unwrap_or_default();
        let level = pod_security::level(&labels, pod_security::ENFORCE_LABEL);
        match pod_security::verdict(level, spec) {
            None => Ok(()),
            Some(v) => Err(ApiError::Forbidden(format!(
                "pods {:?} is forbidden: {v}",
                req.name
            ))),
        }
    }
}

/// A Service's clusterIPs come from the service CIDR: kube-apiserver's allocator refuses
/// any other address (one namespace could otherwise claim another's pod IP, a node's address
/// or an outside one and take every pod's connections to it).
pub(super) struct ServiceIpRange {
    pub range: Option<Ipv4Cidr>,
}

#[async_trait]
impl Plugin for ServiceIpRange {
    fn name(&self) -> &'static str {
        "ServiceIPRange"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let (Some(range), Some(svc)) = (self.range, object.downcast_ref::<Service>()) else {
            return Ok(());
        };
        if req.operation == Operation::Delete || !req.subresource.is_empty() {
            return Ok(());
        }
        let Some(spec) = &svc.spec else {
            return Ok(());
        };
        let mut ips: Vec<&str> = spec.cluster_ips.iter().map(String::as_str).collect();
        if ips.is_empty() && !spec.cluster_ip.is_empty() {
            ips.push(&spec.cluster_ip);
        }
        let unchanged = req
            .old_as::<Service>()
            .and_then(|o| o.spec.as_ref())
            .is_some_and(|o| o.cluster_ip == spec.cluster_ip && o.cluster_ips == spec.cluster_ips);
        if unchanged {
            return Ok(());
        }
        match outside(range, &ips) {
            None => Ok(()),
            Some(ip) => Err(ApiError::Invalid {
                kind: "Service".into(),
                name: req.name.to_string(),
                errors: vec![FieldError {
                    path: "spec.clusterIPs".into(),
                    kind: FieldErrorKind::Invalid,
                    value: Some(go_strings(&ips)),
                    detail: format!(
                        "failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid \
                         range. The range of valid IPs is {range}"
                    ),
                }],
            }),
        }
    }
}

/// The first of `ips` (skipping `None`, a headless Service) outside `range`. An address
/// that does not parse is validation's to report.
fn outside<'a>(range: Ipv4Cidr, ips: &[&'a str]) -> Option<&'a str> {
    ips.iter()
        .copied()
        .find(|ip| *ip != "None" && ip.parse::<Ipv4Addr>().is_ok_and(|a| !range.contains(a)))
}

/// `[]string{"a", "b"}`, as Go prints the value of a string list in field errors.
fn go_strings(v: &[&str]) -> String {
    let quoted: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// No new `externalIPs`: kube-apiserver's DenyServiceExternalIPs plug-in (CVE-2020-8554:
/// an externalIP lets a namespace intercept the cluster's traffic to any address). Existing
/// ones may stay or be removed.
pub(super) struct DenyServiceExternalIps;

#[async_trait]
impl Plugin for DenyServiceExternalIps {
    fn name(&self) -> &'static str {
        "DenyServiceExternalIPs"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let Some(svc) = object.downcast_ref::<Service>() else {
            return Ok(());
        };
        if req.operation == Operation::Delete {
            return Ok(());
        }
        let new = svc
            .spec
            .as_ref()
            .map(|s| &s.external_ips[..])
            .unwrap_or(&[]);
        let old = req
            .old_as::<Service>()
            .and_then(|o| o.spec.as_ref())
            .map(|s| &s.external_ips[..])
            .unwrap_or(&[]);
        if new.iter().all(|ip| old.contains(ip)) {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!(
            "services {:?} is forbidden: Use of external IPs is denied by admission control",
            req.name
        )))
    }
}

/// RBAC's escalation prevention on every write of a Role, ClusterRole or binding, with the
/// object's own namespace ([`crate::auth::escalation::check`]).
pub(super) struct RbacEscalation {
    pub authorizer: Arc<OnceLock<Arc<Authorizer>>>,
}

#[async_trait]
impl Plugin for RbacEscalation {
    fn name(&self) -> &'static str {
        "RBACEscalation"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        if req.operation == Operation::Delete
            || req.info.group() != crate::strategy::rbac::RBAC_GROUP
        {
            return Ok(());
        }
        // Without authentication (in-process servers) there is no one to check.
        let (Some(authz), Some(user)) = (self.authorizer.get(), req.user) else {
            return Ok(());
        };
        crate::auth::escalation::check(authz, user, object, req.namespace)
            .map_err(ApiError::Forbidden)
    }
}

/// Whether `user` may `verb` (`approve`, `sign`) requests of `signer`: on `signers` of
/// `certificates.k8s.io` named the signer, or `<domain>/*` (kube-apiserver's
/// `IsAuthorizedForSignerName`).
fn may_use_signer(
    authz: &Authorizer,
    user: &crate::request::UserInfo,
    verb: &str,
    signer: &str,
) -> bool {
    let allowed = |name: &str| {
        authz.decide(
            user,
            &Attributes::resource(verb, CERTIFICATES_GROUP, "signers", "", "", name),
        ) == Decision::Allow
    };
    allowed(signer)
        || signer
            .split_once('/')
            .is_some_and(|(domain, _)| allowed(&format!("{domain}/*")))
}

const CERTIFICATES_GROUP: &str = "certificates.k8s.io";

/// The signer of a request, and its name for messages.
fn signer_of(csr: &CertificateSigningRequest) -> &str {
    csr.spec
        .as_ref()
        .map(|s| s.signer_name.as_str())
        .unwrap_or("")
}

/// A write through a CertificateSigningRequest subresource takes a verb on the request's
/// signer: approving or denying (`approval`) takes `approve`, writing the certificate
/// (`status`, when it changes) takes `sign` — kube-apiserver's CertificateApproval and
/// CertificateSigning plug-ins. Without them, anyone allowed to update the subresource could
/// approve, or issue, a certificate for any identity.
pub(super) struct SignerPermission {
    pub name: &'static str,
    pub subresource: &'static str,
    pub verb: &'static str,
    pub authorizer: Arc<OnceLock<Arc<Authorizer>>>,
}

#[async_trait]
impl Plugin for SignerPermission {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let Some(csr) = object.downcast_ref::<CertificateSigningRequest>() else {
            return Ok(());
        };
        if req.subresource != self.subresource {
            return Ok(());
        }
        if self.subresource == "status" {
            let certificate = |c: &CertificateSigningRequest| {
                c.status
                    .as_ref()
                    .map(|s| s.certificate.clone())
                    .unwrap_or_default()
            };
            let old = req.old_as::<CertificateSigningRequest>().map(certificate);
            if old.is_some_and(|o| o == certificate(csr)) {
                return Ok(());
            }
        }
        let (Some(authz), Some(user)) = (self.authorizer.get(), req.user) else {
            return Ok(());
        };
        let signer = signer_of(csr);
        if may_use_signer(authz, user, self.verb, signer) {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!(
            "certificatesigningrequests.{CERTIFICATES_GROUP} {:?} is forbidden: user not \
             permitted to {} requests with signerName {signer:?}",
            req.name, self.verb
        )))
    }
}

/// No request of the API server's client signer for the `system:masters` group, whoever
/// approves it: kube-apiserver's CertificateSubjectRestriction plug-in.
pub(super) struct CertificateSubjectRestriction;

#[async_trait]
impl Plugin for CertificateSubjectRestriction {
    fn name(&self) -> &'static str {
        "CertificateSubjectRestriction"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let Some(csr) = object.downcast_ref::<CertificateSigningRequest>() else {
            return Ok(());
        };
        if req.operation != Operation::Create
            || signer_of(csr) != skiff_api::wellknown::CLIENT_SIGNER
        {
            return Ok(());
        }
        let Some(info) = csr
            .spec
            .as_ref()
            .and_then(|s| std::str::from_utf8(&s.request).ok())
            .and_then(|pem| skiff_pki::parse_request(pem).ok())
        else {
            return Ok(());
        };
        if info
            .organizations
            .iter()
            .any(|o| o == crate::request::MASTERS_GROUP)
        {
            return Err(ApiError::Forbidden(format!(
                "certificatesigningrequests.{CERTIFICATES_GROUP} {:?} is forbidden: use of \
                 {} signer with system:masters group is not allowed",
                req.name,
                skiff_api::wellknown::CLIENT_SIGNER
            )));
        }
        Ok(())
    }
}

/// kube-apiserver's NodeRestriction for writes by a node (`system:node:<name>`), beyond the
/// Node authorizer (which already limits a node to its own Node and the pods bound to it):
/// a node never creates pods or changes one's spec or metadata (only status, and deletes),
/// never changes its own taints, and sets only the kubelet's labels in the `kubernetes.io`
/// and `k8s.io` domains (others, `node-restriction.kubernetes.io/` above all, steer
/// workloads). A CertificateSigningRequest from a bootstrap token for an existing node is
/// refused: a token may join a new node, not take an existing node's identity.
pub(super) struct NodeRestriction;

/// Labels a node may set on its own Node in Kubernetes' domains (kubelet's `KubeletLabels`).
const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// Whether a node may set label `key` on itself (kube-apiserver's `getForbiddenLabels`).
fn node_may_set_label(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return true;
    };
    if prefix == "node-restriction.kubernetes.io"
        || prefix.ends_with(".node-restriction.kubernetes.io")
    {
        return false;
    }
    let kubernetes = |d: &str| prefix == d || prefix.ends_with(&format!(".{d}"));
    if !kubernetes("kubernetes.io") && !kubernetes("k8s.io") {
        return true;
    }
    KUBELET_LABELS.contains(&key)
        || kubernetes("kubelet.kubernetes.io")
        || kubernetes("node.kubernetes.io")
}

/// The labels `new` sets or changes compared to `old`, and those it removes.
fn changed_labels<'a>(
    new: &'a std::collections::BTreeMap<String, String>,
    old: Option<&'a std::collections::BTreeMap<String, String>>,
) -> Vec<&'a str> {
    let mut out: Vec<&str> = new
        .iter()
        .filter(|(k, v)| old.and_then(|o| o.get(*k)) != Some(*v))
        .map(|(k, _)| k.as_str())
        .collect();
    if let Some(old) = old {
        out.extend(
            old.keys()
                .filter(|k| !new.contains_key(*k))
                .map(String::as_str),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[async_trait]
impl Plugin for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let Some(user) = req.user else {
            return Ok(());
        };
        if let Some(csr) = object.downcast_ref::<CertificateSigningRequest>() {
            return bootstrap_may_request(req, user, csr).await;
        }
        let Some(node) = crate::request::node_of(user) else {
            return Ok(());
        };
        let forbidden = |message: String| {
            ApiError::Forbidden(format!(
                "{} {:?} is forbidden: {message}",
                req.info.qualified(),
                req.name
            ))
        };
        if object.is::<Pod>() {
            let bound = |p: &Pod| p.spec.as_ref().is_some_and(|s| s.node_name == node);
            return match (req.operation, req.subresource) {
                (Operation::Update, "status") | (Operation::Delete, "") => {
                    if req.old_as::<Pod>().is_some_and(bound) {
                        Ok(())
                    } else {
                        Err(forbidden(format!(
                            "node {node:?} can only update pod status for pods with \
                             spec.nodeName set to itself"
                        )))
                    }
                }
                (op, _) => Err(forbidden(format!(
                    "unexpected operation {:?}, node {node:?} can only delete pods and update \
                     their status",
                    format!("{op:?}").to_uppercase()
                ))),
            };
        }
        let Some(new) = object.downcast_ref::<Node>() else {
            return Ok(());
        };
        if req.operation == Operation::Delete || req.subresource == "status" {
            return Ok(());
        }
        let old = req.old_as::<Node>();
        let labels_of = |n: &'_ Node| {
            n.metadata
                .as_ref()
                .map(|m| m.labels.clone())
                .unwrap_or_default()
        };
        let new_labels = labels_of(new);
        let old_labels = old.map(labels_of);
        let bad: Vec<&str> = changed_labels(&new_labels, old_labels.as_ref())
            .into_iter()
            .filter(|k| !node_may_set_label(k))
            .collect();
        if !bad.is_empty() {
            let verb = if old.is_some() {
                "is not allowed to modify labels"
            } else {
                "is not allowed to set the following labels"
            };
            return Err(forbidden(format!("{verb}: {}", bad.join(", "))));
        }
        // A Node owned by another object is deleted with it by the garbage collector: a node
        // must not set owners on itself (CVE-2025-5187).
        let owners = |n: &Node| {
            n.metadata
                .as_ref()
                .map(|m| m.owner_references.clone())
                .unwrap_or_default()
        };
        if owners(new) != old.map(owners).unwrap_or_default() {
            return Err(forbidden(format!(
                "node {node:?} is not allowed to set or change its own ownerReferences"
            )));
        }
        if let Some(old) = old {
            let taints = |n: &Node| {
                n.spec
                    .as_ref()
                    .map(|s| s.taints.clone())
                    .unwrap_or_default()
            };
            if taints(new) != taints(old) {
                return Err(forbidden(format!(
                    "node {node:?} is not allowed to modify taints"
                )));
            }
        }
        Ok(())
    }
}

/// A bootstrap token (`system:bootstrappers`) may ask for a node client certificate only
/// for a node that does not exist yet.
async fn bootstrap_may_request(
    req: &Request<'_>,
    user: &crate::request::UserInfo,
    csr: &CertificateSigningRequest,
) -> Result<(), ApiError> {
    let bootstrapper = user
        .groups
        .iter()
        .any(|g| g == crate::request::BOOTSTRAP_GROUP);
    if req.operation != Operation::Create || !bootstrapper {
        return Ok(());
    }
    let Some(info) = csr
        .spec
        .as_ref()
        .and_then(|s| std::str::from_utf8(&s.request).ok())
        .and_then(|pem| skiff_pki::parse_request(pem).ok())
    else {
        return Ok(());
    };
    let Some(name) = info
        .common_name
        .strip_prefix(crate::request::NODE_USER_PREFIX)
    else {
        return Ok(());
    };
    if req.get::<Node>("", name).await?.is_some() {
        return Err(ApiError::Forbidden(format!(
            "certificatesigningrequests.{CERTIFICATES_GROUP} {:?} is forbidden: node {name:?} \
             is already registered: a bootstrap token may only join a new node",
            req.name
        )));
    }
    Ok(())
}

/// No two Nodes' pod CIDRs overlap: a node that registered another's range would take the
/// pod traffic routed to it (every node routes a Node's podCIDR to that node).
pub(super) struct NodePodCidrs;

#[async_trait]
impl Plugin for NodePodCidrs {
    fn name(&self) -> &'static str {
        "NodePodCIDRs"
    }

    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        let Some(node) = object.downcast_ref::<Node>() else {
            return Ok(());
        };
        if req.operation == Operation::Delete || req.subresource == "status" {
            return Ok(());
        }
        let cidrs = |n: &Node| -> Vec<String> {
            let Some(s) = &n.spec else { return Vec::new() };
            let mut v = s.pod_cidrs.clone();
            if v.is_empty() && !s.pod_cidr.is_empty() {
                v.push(s.pod_cidr.clone());
            }
            v
        };
        let mine = cidrs(node);
        if mine.is_empty() || req.old_as::<Node>().is_some_and(|o| cidrs(o) == mine) {
            return Ok(());
        }
        let parse = |s: &str| skiff_cidr::Cidr::parse_lenient(s).ok();
        for other in req.list::<Node>("").await? {
            if other.metadata.as_ref().is_some_and(|m| m.name == req.name) {
                continue;
            }
            for a in &mine {
                for b in cidrs(&other) {
                    let (Some(x), Some(y)) = (parse(a), parse(&b)) else {
                        continue;
                    };
                    if x.contains(y.network()) || y.contains(x.network()) {
                        return Err(ApiError::Invalid {
                            kind: "Node".into(),
                            name: req.name.to_string(),
                            errors: vec![FieldError::invalid(
                                "spec.podCIDRs",
                                a,
                                format!(
                                    "overlaps the pod CIDR {b} of node {:?}",
                                    other
                                        .metadata
                                        .as_ref()
                                        .map(|m| m.name.as_str())
                                        .unwrap_or("")
                                ),
                            )],
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ips_outside_the_range_are_named() {
        let range: Ipv4Cidr = "10.96.0.0/16".parse().expect("cidr");
        assert_eq!(outside(range, &["10.96.3.4"]), None);
        assert_eq!(outside(range, &["None"]), None);
        assert_eq!(
            outside(range, &["10.96.0.1", "10.244.1.7"]),
            Some("10.244.1.7")
        );
        assert_eq!(outside(range, &["192.168.100.1"]), Some("192.168.100.1"));
        assert_eq!(go_strings(&["a", "b"]), "[]string{\"a\", \"b\"}");
    }

    #[test]
    fn nodes_set_only_the_kubelets_labels_in_kubernetes_domains() {
        for ok in [
            "zone",
            "example.com/rack",
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
            "kubelet.kubernetes.io/x",
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "skiff.io/agent",
        ] {
            assert!(node_may_set_label(ok), "{ok}");
        }
        for bad in [
            "node-restriction.kubernetes.io/secure",
            "node-role.kubernetes.io/control-plane",
            "kubernetes.io/role",
            "foo.k8s.io/bar",
        ] {
            assert!(!node_may_set_label(bad), "{bad}");
        }
        let old: std::collections::BTreeMap<String, String> =
            [("a".into(), "1".into()), ("b".into(), "2".into())].into();
        let new: std::collections::BTreeMap<String, String> =
            [("a".into(), "1".into()), ("c".into(), "3".into())].into();
        assert_eq!(changed_labels(&new, Some(&old)), vec!["b", "c"]);
        assert_eq!(changed_labels(&new, None), vec!["a", "c"]);
    }
}
