//! The certificatesigningrequest controller: kube-controller-manager's `csrapproving` and
//! `csrsigning` in one reconcile. It approves a node's client-certificate request
//! (signer `kubernetes.io/kube-apiserver-client-kubelet`) when it asks for exactly
//! `CN=system:node:<name>, O=system:nodes` with client usages only, and the requester is a
//! bootstrap token (`system:bootstrappers`) or that same node renewing; other requests wait
//! for a person (`kubectl certificate approve`). With the cluster CA (the manager's
//! `--cluster-signing-cert-file`/`--cluster-signing-key-file`) it signs every approved
//! request of the two client signers it knows, checking the request against the signer's
//! rules first (a request that breaks them gets a Failed condition).

use std::sync::Arc;
use std::time::Duration;

use skiff_api::api::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, Informer, Informers, ObjectKey, Reconciler,
};
use skiff_pki::{Ca, LeafSpec, RequestInfo, Usage};

use crate::{Context, Error};

pub use skiff_api::wellknown::{CLIENT_SIGNER, KUBELET_CLIENT_SIGNER};
const NODES_GROUP: &str = "system:nodes";
const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";
/// The usages a client certificate may ask for.
const CLIENT_USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];

#[derive(Debug)]
pub struct CsrController {
    client: Client,
    requests: Informer<CertificateSigningRequest>,
    /// Signs approved requests; `None`: approval only.
    ca: Option<Arc<Ca>>,
}

/// The request's PEM, read and its signature checked.
fn request_of(r: &CertificateSigningRequest) -> Result<RequestInfo, String> {
    let spec = r.spec.as_ref().ok_or("no spec")?;
    let pem = std::str::from_utf8(&spec.request).map_err(|_| "the request is not PEM")?;
    skiff_pki::parse_request(pem).map_err(|e| e.to_string())
}

/// Why a request breaks the kubelet client signer's rules; `None` when it keeps them.
fn kubelet_client_problem(r: &CertificateSigningRequest, req: &RequestInfo) -> Option<String> {
    let spec = r.spec.as_ref()?;
    if !req.common_name.starts_with("system:node:") || req.common_name.len() <= 12 {
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
    if !req.sans.is_empty() || req.is_ca {
        return Some("the request may not ask for subject alternative names or a CA".into());
    }
    client_usages_problem(&spec.usages)
}

fn client_usages_problem(usages: &[String]) -> Option<String> {
    if let Some(u) = usages.iter().find(|u| !CLIENT_USAGES.contains(&u.as_str())) {
        return Some(format!(
            "usage {u:?} is not allowed for a client certificate"
        ));
    }
    if !usages.iter().any(|u| u == "client auth") {
        return Some("the usages must include \"client auth\"".into());
    }
    None
}

/// Whether the controller approves this request by itself (a node's first certificate
/// through a bootstrap token, or a node renewing its own).
pub fn auto_approvable(r: &CertificateSigningRequest) -> bool {
    let Some(spec) = &r.spec else {
        return false;
    };
    if spec.signer_name != KUBELET_CLIENT_SIGNER {
        return false;
    }
    let Ok(req) = request_of(r) else {
        return false;
    };
    if kubelet_client_problem(r, &req).is_some() {
        return false;
    }
    spec.groups.iter().any(|g| g == BOOTSTRAPPERS_GROUP) || spec.username == req.common_name
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
        Controller::<CertificateSigningRequest>::new(informers)
            .named("certificatesigningrequest")
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
        _ => client_usages_problem(&spec.usages),
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
    let leaf = LeafSpec {
        common_name: req.common_name,
        organizations: req.organizations,
        sans: Vec::new(),
        usage: Usage::Client,
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
            if !auto_approvable(&r) {
                return Ok(Action::Done);
            }
            r.status
                .get_or_insert_with(CertificateSigningRequestStatus::default)
                .conditions
                .push(condition(
                    "Approved",
                    "AutoApproved",
                    "Auto approving kubelet client certificate after SubjectAccessReview.",
                ));
            tracing::info!(csr = %key.name, "approved a node client certificate request");
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
        if signer != KUBELET_CLIENT_SIGNER && signer != CLIENT_SIGNER {
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
        assert!(auto_approvable(&csr(
            "system:node:n2",
            &["system:nodes"],
            "system:bootstrap:abcdef",
            &boot
        )));
        // Renewal by the node itself.
        assert!(auto_approvable(&csr(
            "system:node:n2",
            &["system:nodes"],
            "system:node:n2",
            &["system:nodes"]
        )));
        // Another node's name, another group, another requester: not by themselves.
        assert!(!auto_approvable(&csr(
            "system:node:n3",
            &["system:nodes"],
            "system:node:n2",
            &["system:nodes"]
        )));
        assert!(!auto_approvable(&csr(
            "system:node:n2",
            &["system:masters"],
            "system:bootstrap:abcdef",
            &boot
        )));
        assert!(!auto_approvable(&csr(
            "admin",
            &["system:nodes"],
            "system:bootstrap:abcdef",
            &boot
        )));
        assert!(!auto_approvable(&csr(
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
        assert!(!auto_approvable(&server));
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
}
