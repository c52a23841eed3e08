//! The Service load balancer's reconciler on the shared controller runtime: one Service key
//! at a time, writing only the difference between the desired frontends and the programmed
//! ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_api::api::{Endpoints, Service};
use skiff_client::controller::{Action, Informer, ObjectKey, Reconciler};
use skiff_datapath::BpfError;
use skiff_datapath::lb::Frontend;
use tracing::{debug, warn};

use super::desired::{DesiredPort, desired_on, to_local};
use super::{Owner, Proxy, ProxyState};

/// How often a Service whose frontend another Service holds is looked at again.
const CONFLICT_RETRY: Duration = Duration::from_secs(30);
/// The reconciler: one Service key at a time.
pub(super) struct ServiceReconciler {
    pub(super) proxy: Arc<Proxy>,
    pub(super) services: Informer<Service>,
    pub(super) endpoints: Informer<Endpoints>,
}

impl ServiceReconciler {
    fn desired_of(&self, key: &ObjectKey) -> Vec<DesiredPort> {
        let (node, node_ips, local) = {
            let inner = self.proxy.lock();
            (
                inner.node_name.clone(),
                inner.node_ips.clone(),
                inner.local.get(key).copied(),
            )
        };
        let mut ports = desired_on(
            self.services.get(key).as_deref(),
            self.endpoints.get(key).as_deref(),
            &node,
            &node_ips,
        );
        if let Some(local) = local {
            to_local(&mut ports, local);
        }
        ports
    }
}

impl Reconciler for ServiceReconciler {
    type Error = BpfError;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, BpfError> {
        // When the change was seen: our subscription's mark, or now if the controller's own
        // subscription queued the key first (then the mark follows within microseconds, and
        // its reconcile finds nothing left to write).
        let now = Instant::now();
        let seen = self
            .proxy
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
            .map_or(now, |t| t.min(now));
        let want = self.desired_of(key);
        let mut inner = self.proxy.lock();
        let mut writes = 0;
        let mut action = Action::Done;
        let result = (|| {
            let ProxyState { lb, owners, .. } = &mut *inner;
            let stale: Vec<Frontend> = owners
                .iter()
                .filter(|(f, o)| o.key == *key && !want.iter().any(|d| d.frontend == **f))
                .map(|(f, _)| *f)
                .collect();
            for f in stale {
                writes += lb.remove_service(&f)?;
                owners.remove(&f);
            }
            for d in &want {
                if let Some(other) = owners.get(&d.frontend)
                    && other.key != *key
                    && self
                        .desired_of(&other.key)
                        .iter()
                        .any(|o| o.frontend == d.frontend)
                {
                    warn!(service = %key, frontend = %d.frontend, holder = %other.key,
                        "frontend already programmed for another Service; not taking it");
                    action = Action::RequeueAfter(CONFLICT_RETRY);
                    continue;
                }
                writes += lb.sync_service(d.frontend, d.params, &d.backends)?;
                owners.insert(
                    d.frontend,
                    Owner {
                        key: key.clone(),
                        port_name: d.port_name.clone(),
                    },
                );
            }
            Ok::<(), BpfError>(())
        })();
        inner.writes += writes as u64;
        if writes > 0 {
            let latency = seen.elapsed();
            inner.latency.observe(latency);
            debug!(service = %key, writes, ?latency, "service load balancer programmed");
        }
        result.map(|()| action)
    }
}
