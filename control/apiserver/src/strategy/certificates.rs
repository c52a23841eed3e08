//! CertificateSigningRequests (`certificates.k8s.io/v1`), as kube-apiserver's strategy: the
//! requester (username, uid, groups) is the API server's to fill in, never the client's; the
//! spec is immutable; conditions change only through the `approval` subresource (Approved,
//! Denied) and the `status` subresource (Failed, the certificate); an Approved or Denied
//! condition is never taken back.
//!
//! The registry passes the authenticated requester in `WriteOptions::requester` and
//! `Strategy::stamp_requester` writes it into `spec.username`, `uid` and `groups` on create,
//! whatever the client sent; the generic update path takes the `approval` subresource through
//! `Strategy::copy_subresource_from` (only the conditions change). Approved and Denied never
//! coexist; a certificate is written only after approval.

use skiff_api::api::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};

use super::Strategy;
use crate::error::FieldError;
use crate::request::UserInfo;

/// Kubernetes' key usages (certificates.k8s.io/v1 KeyUsage).
const USAGES: [&str; 21] = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
];
const CONDITION_TYPES: [&str; 3] = ["Approved", "Denied", "Failed"];
const CONDITION_STATUSES: [&str; 3] = ["True", "False", "Unknown"];

fn has_condition(status: Option<&CertificateSigningRequestStatus>, ty: &str) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == ty && c.status == "True")
    })
}

/// Whether the request was approved (and not denied).
pub fn approved(r: &CertificateSigningRequest) -> bool {
    has_condition(r.status.as_ref(), "Approved") && !has_condition(r.status.as_ref(), "Denied")
}

/// Whether the request was denied or failed (nothing will be issued).
pub fn finished_without_certificate(r: &CertificateSigningRequest) -> bool {
    has_condition(r.status.as_ref(), "Denied") || has_condition(r.status.as_ref(), "Failed")
}

fn check_conditions(out: &mut Vec<FieldError>, conditions: &[CertificateSigningRequestCondition]) {
    let mut seen = std::collections::BTreeSet::new();
    for (i, c) in conditions.iter().enumerate() {
        let path = format!("status.conditions[{i}]");
        if c.r#type.is_empty() {
            out.push(FieldError::required(format!("{path}.type"), ""));
        } else if !CONDITION_TYPES.contains(&c.r#type.as_str()) {
            out.push(FieldError::not_supported(
                format!("{path}.type"),
                &c.r#type,
                &CONDITION_TYPES,
            ));
        } else if !seen.insert(c.r#type.as_str()) {
            out.push(FieldError::duplicate(format!("{path}.type"), &c.r#type));
        }
        if !CONDITION_STATUSES.contains(&c.status.as_str()) {
            out.push(FieldError::not_supported(
                format!("{path}.status"),
                &c.status,
                &CONDITION_STATUSES,
            ));
        }
    }
    let is_true = |ty: &str| {
        conditions
            .iter()
            .any(|c| c.r#type == ty && c.status == "True")
    };
    if is_true("Approved") && is_true("Denied") {
        out.push(FieldError::invalid(
            "status.conditions",
            "Approved, Denied",
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
}

impl Strategy for CertificateSigningRequest {
    fn prepare_create(&mut self) {
        self.status = None;
    }

    fn stamp_requester(&mut self, user: &UserInfo) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.username = user.name.clone();
        spec.uid = user.uid.clone();
        spec.groups = user.groups.clone();
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        if spec.request.is_empty() {
            out.push(FieldError::required("spec.request", ""));
        } else {
            match std::str::from_utf8(&spec.request)
                .map_err(|_| "not a PEM CERTIFICATE REQUEST".to_string())
                .and_then(|pem| skiff_pki::parse_request(pem).map_err(|e| e.to_string()))
            {
                Ok(_) => {}
                Err(e) => out.push(FieldError::invalid("spec.request", "<request>", e)),
            }
        }
        if spec.signer_name.is_empty() {
            out.push(FieldError::required("spec.signerName", ""));
        } else {
            // Kubernetes: a fully qualified domain name, a "/", then a path.
            match spec.signer_name.split_once('/') {
                Some((domain, path)) if !domain.is_empty() && !path.is_empty() => {
                    crate::validation::check_dns_subdomain(&mut out, "spec.signerName", domain)
                }
                _ => out.push(FieldError::invalid(
                    "spec.signerName",
                    &spec.signer_name,
                    "must be a fully qualified domain and path of the form 'example.com/signer-name'",
                )),
            }
        }
        if let Some(s) = spec.expiration_seconds
            && s < 600
        {
            out.push(FieldError::invalid(
                "spec.expirationSeconds",
                s.to_string(),
                "may not specify a duration less than 600 seconds (10 minutes)",
            ));
        }
        if spec.usages.is_empty() {
            out.push(FieldError::required("spec.usages", ""));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, u) in spec.usages.iter().enumerate() {
            let path = format!("spec.usages[{i}]");
            if !USAGES.contains(&u.as_str()) {
                out.push(FieldError::not_supported(path, u, &USAGES));
            } else if !seen.insert(u.as_str()) {
                out.push(FieldError::duplicate(path, u));
            }
        }
        if let Some(status) = &self.status {
            check_conditions(&mut out, &status.conditions);
            if !status.certificate.is_empty() {
                let ok = std::str::from_utf8(&status.certificate)
                    .ok()
                    .and_then(|pem| skiff_pki::parse_pem(pem, "the certificate").ok())
                    .is_some();
                if !ok {
                    out.push(FieldError::invalid(
                        "status.certificate",
                        "<certificate data>",
                        "must contain at least one CERTIFICATE PEM block",
                    ));
                }
            }
        }
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        if self.spec != old.spec {
            out.push(FieldError::forbidden(
                "spec",
                "updates to certificatesigningrequest spec are forbidden",
            ));
        }
        for ty in ["Approved", "Denied"] {
            if has_condition(old.status.as_ref(), ty) && !has_condition(self.status.as_ref(), ty) {
                out.push(FieldError::forbidden(
                    "status.conditions",
                    format!("updates may not remove a condition of type {ty:?}"),
                ));
            }
        }
        let (old_cert, new_cert) = (
            old.status.as_ref().map(|s| &s.certificate),
            self.status.as_ref().map(|s| &s.certificate),
        );
        if let Some(c) = old_cert.filter(|c| !c.is_empty())
            && new_cert != Some(c)
        {
            out.push(FieldError::forbidden(
                "status.certificate",
                "updates may not modify existing certificate content",
            ));
        }
        if new_cert.is_some_and(|c| !c.is_empty())
            && old_cert.is_none_or(|c| c.is_empty())
            && !approved(old)
        {
            out.push(FieldError::invalid(
                "status.certificate",
                "<certificate data>",
                "certificate may only be set if the request is approved",
            ));
        }
        out
    }

    fn copy_subresource_from(&mut self, new: &Self, subresource: &str) -> bool {
        if subresource != "approval" {
            return false;
        }
        // The approval subresource changes the conditions, nothing else.
        let conditions = new
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        self.status.get_or_insert_with(Default::default).conditions = conditions;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::CertificateSigningRequestSpec;
    use skiff_api::wellknown::KUBELET_CLIENT_SIGNER;

    fn csr() -> CertificateSigningRequest {
        let (_, pem) =
            skiff_pki::new_request("system:node:n2", &["system:nodes".to_string()]).unwrap();
        CertificateSigningRequest {
            spec: Some(CertificateSigningRequestSpec {
                request: pem.into_bytes(),
                signer_name: KUBELET_CLIENT_SIGNER.into(),
                usages: vec!["digital signature".into(), "client auth".into()],
                username: "mallory".into(),
                groups: vec!["system:masters".into()],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn condition(ty: &str) -> CertificateSigningRequestCondition {
        CertificateSigningRequestCondition {
            r#type: ty.into(),
            status: "True".into(),
            ..Default::default()
        }
    }

    fn paths(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(|e| e.path.clone()).collect()
    }

    #[test]
    fn the_requester_is_the_servers_to_say() {
        let mut r = csr();
        r.stamp_requester(&UserInfo {
            name: "system:bootstrap:abcdef".into(),
            uid: String::new(),
            groups: vec!["system:bootstrappers".into(), "system:authenticated".into()],
            extra: Default::default(),
        });
        let spec = r.spec.as_ref().unwrap();
        assert_eq!(spec.username, "system:bootstrap:abcdef");
        assert_eq!(
            spec.groups,
            ["system:bootstrappers", "system:authenticated"]
        );
        assert!(r.validate().is_empty(), "{:?}", r.validate());
    }

    #[test]
    fn bad_requests_name_the_field() {
        let mut r = csr();
        let spec = r.spec.as_mut().unwrap();
        spec.request =
            b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
                .to_vec();
        spec.signer_name = "nodomain".into();
        spec.usages = vec!["client auth".into(), "flying".into()];
        spec.expiration_seconds = Some(60);
        assert_eq!(
            paths(&r.validate()),
            [
                "spec.request",
                "spec.signerName",
                "spec.expirationSeconds",
                "spec.usages[1]"
            ]
        );
    }

    #[test]
    fn approval_touches_only_conditions_and_is_never_taken_back() {
        let old = csr();
        let mut new = csr();
        new.spec.as_mut().unwrap().usages = vec!["server auth".into()];
        new.status = Some(CertificateSigningRequestStatus {
            conditions: vec![condition("Approved")],
            certificate: Vec::new(),
        });
        let mut merged = old.clone();
        assert!(merged.copy_subresource_from(&new, "approval"));
        assert_eq!(merged.spec, old.spec);
        assert!(approved(&merged));
        assert!(merged.validate_update(&old).is_empty());
        // Removing the approval is refused; so is a certificate before approval.
        let mut unapproved = merged.clone();
        unapproved.status.as_mut().unwrap().conditions.clear();
        assert_eq!(
            paths(&unapproved.validate_update(&merged)),
            ["status.conditions"]
        );
        let mut early = old.clone();
        early.status = Some(CertificateSigningRequestStatus {
            conditions: Vec::new(),
            certificate: b"x".to_vec(),
        });
        assert_eq!(paths(&early.validate_update(&old)), ["status.certificate"]);
        // Approved and Denied together are refused.
        let mut both = merged.clone();
        both.status
            .as_mut()
            .unwrap()
            .conditions
            .push(condition("Denied"));
        assert_eq!(paths(&both.validate()), ["status.conditions"]);
        assert!(!old.clone().copy_subresource_from(&new, "scale"));
    }
}
