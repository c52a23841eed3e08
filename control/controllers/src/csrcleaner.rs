//! Which CertificateSigningRequests are done with, as kube-controller-manager's `csrcleaner`
//! decides: a request is deleted one hour after it was issued (its Approved condition's last
//! update), denied or failed; 24 hours after its creation while still pending; and at once
//! when the certificate it was issued has expired. Without this every join, renewal and
//! serving certificate leaves a request behind forever (each carries a public key and the
//! requester's identity, and every list of them grows).
//!
//! [`remaining`] is the pure rule; the certificatesigningrequest controller
//! (`crate::certificates`) applies it on every reconcile and asks to look again when the
//! time comes (level-triggered: a requeue, not a periodic sweep).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use skiff_api::api::CertificateSigningRequest;

/// How long a pending request is kept.
pub const PENDING: Duration = Duration::from_secs(24 * 3600);
/// How long an issued, denied or failed request is kept.
pub const FINISHED: Duration = Duration::from_secs(3600);

/// How long until `r` should be deleted (zero: now); `None` when its times cannot be read
/// (it is then kept: a request is never deleted on a guess).
pub fn remaining(r: &CertificateSigningRequest, now: SystemTime) -> Option<Duration> {
    let now = secs(now);
    let status = r.status.as_ref();
    let condition_time = |ty: &str| {
        status?
            .conditions
            .iter()
            .find(|c| c.r#type == ty && c.status == "True")
            .and_then(|c| rfc3339(&c.last_update_time))
    };
    let left = |since: i64, keep: Duration| {
        let until = since.saturating_add(i64::try_from(keep.as_secs()).unwrap_or(i64::MAX));
        Duration::from_secs(u64::try_from(until.saturating_sub(now)).unwrap_or(0))
    };
    let certificate = status.map(|s| s.certificate.as_slice()).unwrap_or_default();
    if !certificate.is_empty() {
        let expired = std::str::from_utf8(certificate)
            .ok()
            .and_then(|pem| skiff_pki::parse_pem(pem, "issued certificate").ok())
            .is_some_and(|info| info.not_after <= now);
        if expired {
            return Some(Duration::ZERO);
        }
        return condition_time("Approved").map(|t| left(t, FINISHED));
    }
    for finished in ["Denied", "Failed"] {
        if let Some(t) = condition_time(finished) {
            return Some(left(t, FINISHED));
        }
    }
    let created = rfc3339(r.metadata.as_ref()?.creation_timestamp.as_str())?;
    Some(left(created, PENDING))
}

fn secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn rfc3339(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus, ObjectMeta,
    };

    const T0: i64 = 1_800_000_000;

    fn at(secs: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap())
    }

    fn time(secs: i64) -> String {
        chrono::DateTime::from_timestamp(secs, 0)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    fn request(conditions: &[(&str, i64)], certificate: Vec<u8>) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: Some(ObjectMeta {
                name: "r".into(),
                creation_timestamp: time(T0),
                ..Default::default()
            }),
            status: Some(CertificateSigningRequestStatus {
                conditions: conditions
                    .iter()
                    .map(|(ty, t)| CertificateSigningRequestCondition {
                        r#type: ty.to_string(),
                        status: "True".into(),
                        last_update_time: time(*t),
                        ..Default::default()
                    })
                    .collect(),
                certificate,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pending_requests_are_kept_a_day_finished_ones_an_hour() {
        let pending = request(&[], Vec::new());
        assert_eq!(remaining(&pending, at(T0)), Some(PENDING));
        assert_eq!(
            remaining(&pending, at(T0 + 3600)),
            Some(PENDING - Duration::from_secs(3600))
        );
        assert_eq!(
            remaining(&pending, at(T0 + 25 * 3600)),
            Some(Duration::ZERO)
        );
        for finished in ["Denied", "Failed"] {
            let r = request(&[(finished, T0 + 60)], Vec::new());
            assert_eq!(
                remaining(&r, at(T0 + 60 + 600)),
                Some(Duration::from_secs(3000))
            );
            assert_eq!(remaining(&r, at(T0 + 2 * 3600)), Some(Duration::ZERO));
        }
        // Approved but not issued yet: still pending (the signer has not acted).
        let approved = request(&[("Approved", T0)], Vec::new());
        assert_eq!(
            remaining(&approved, at(T0 + 2 * 3600)),
            Some(PENDING - Duration::from_secs(2 * 3600))
        );
    }

    #[test]
    fn issued_requests_go_an_hour_after_approval_or_when_the_certificate_expires() {
        let ca = skiff_pki::Ca::generate("test-ca").unwrap();
        let (_, csr) = skiff_pki::new_request("system:node:n", &["system:nodes".into()]).unwrap();
        let leaf = skiff_pki::LeafSpec {
            common_name: "system:node:n".into(),
            organizations: vec!["system:nodes".into()],
            sans: Vec::new(),
            usage: skiff_pki::Usage::Client,
            validity: Duration::from_secs(3600 * 24),
        };
        let pem = ca.sign_request(&csr, &leaf).unwrap();
        let info = skiff_pki::parse_pem(&pem, "t").unwrap();
        let issued = request(&[("Approved", info.not_before)], pem.into_bytes());
        assert_eq!(
            remaining(&issued, at(info.not_before + 600)),
            Some(Duration::from_secs(3000))
        );
        assert_eq!(remaining(&issued, at(info.not_after)), Some(Duration::ZERO));
        // Unreadable times: kept.
        let mut odd = request(&[("Denied", T0)], Vec::new());
        odd.status.as_mut().unwrap().conditions[0].last_update_time = "yesterday".into();
        odd.metadata.as_mut().unwrap().creation_timestamp = "".into();
        assert_eq!(remaining(&odd, at(T0 + 99_999)), None);
    }
}
