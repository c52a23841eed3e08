//! Node heartbeats as Leases: every node agent (and every hollow node) renews
//! `kube-node-lease/<node>`, and the node lifecycle controller reads them, as in Kubernetes.

use std::time::{Duration, SystemTime};

use skiff_api::api::{Lease, LeaseSpec, ObjectMeta};

use crate::controller::time;
use crate::{Client, ClientError};

/// Where node Leases live (one per node, named after it).
pub const NAMESPACE: &str = "kube-node-lease";

/// Renews (creating it if needed) node `node`'s Lease: holder the node, `renewTime` now,
/// `leaseDurationSeconds` `duration`. Conflicts with a concurrent writer are retried a few
/// times; after that the renewal is left to the next call.
pub async fn renew(client: &Client, node: &str, duration: Duration) -> Result<(), ClientError> {
    let api = client.namespaced::<Lease>(NAMESPACE);
    let now = time::format(SystemTime::now(), true);
    let seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX);
    for _ in 0..5 {
        let result = match api.get_opt(node).await? {
            None => {
                let lease = Lease {
                    metadata: Some(ObjectMeta {
                        name: node.into(),
                        namespace: NAMESPACE.into(),
                        ..Default::default()
                    }),
                    spec: Some(LeaseSpec {
                        holder_identity: Some(node.into()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: now.clone(),
                        renew_time: now.clone(),
                        lease_transitions: Some(0),
                    }),
                    ..Default::default()
                };
                api.create(&lease).await
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.holder_identity = Some(node.into());
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = now.clone();
                api.update(&lease).await
            }
        };
        match result {
            Ok(_) => return Ok(()),
            Err(ClientError::Conflict { .. } | ClientError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    tracing::warn!(node, "node lease renewal kept conflicting");
    Ok(())
}
