//! The root CA publisher (kube-controller-manager's `root-ca-cert-publisher`): every namespace
//! that is not terminating has a ConfigMap `kube-root-ca.crt` whose `ca.crt` is the cluster
//! CA (`--root-ca-file`, else the CA of the manager's kubeconfig), so pods can verify the API
//! server (the ServiceAccount token volume projects it). A changed or deleted one is put back.
//! Keyed by Namespace; a change of such a ConfigMap wakes its namespace.

use std::collections::BTreeMap;
use std::sync::Arc;

use skiff_api::Resource;
use skiff_api::api::{ConfigMap, Namespace, ObjectMeta};
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, Informer, Informers, ObjectKey, Reconciler,
};

use crate::util::is_terminating;
use crate::{Context, Error};

/// The ConfigMap every namespace gets.
pub const NAME: &str = "kube-root-ca.crt";
/// Its key.
pub const KEY: &str = "ca.crt";

#[derive(Debug)]
pub struct RootCaPublisher {
    client: Client,
    namespaces: Informer<Namespace>,
    config_maps: Informer<ConfigMap>,
    ca_pem: Arc<str>,
}

impl RootCaPublisher {
    /// Runs it with `workers` workers until `stop` is cancelled, publishing `ca_pem`.
    pub async fn run(informers: &Informers, ca_pem: Arc<str>, workers: usize, stop: CancelToken) {
        let reconciler = Arc::new(RootCaPublisher {
            client: informers.client().clone(),
            namespaces: informers.get::<Namespace>(),
            config_maps: informers.get::<ConfigMap>(),
            ca_pem,
        });
        let config_maps = informers.get::<ConfigMap>();
        Controller::<Namespace>::new(informers)
            .named("root-ca-cert-publisher")
            .watches(&config_maps, |cm: &ConfigMap| {
                if cm.name() == NAME {
                    vec![ObjectKey::cluster(cm.namespace())]
                } else {
                    Vec::new()
                }
            })
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    fn wanted(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(KEY.to_string(), self.ca_pem.to_string())])
    }
}

impl Reconciler for RootCaPublisher {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(ns) = self.namespaces.get(key) else {
            return Ok(Action::Done);
        };
        let terminating =
            is_terminating(&*ns) || ns.status.as_ref().is_some_and(|s| s.phase == "Terminating");
        if terminating {
            return Ok(Action::Done);
        }
        let api = self.client.namespaced::<ConfigMap>(&key.name);
        match self.config_maps.get(&ObjectKey::new(&key.name, NAME)) {
            Some(cm) if cm.data == self.wanted() && cm.binary_data.is_empty() => Ok(Action::Done),
            Some(cm) => {
                let mut cm = (*cm).clone();
                cm.data = self.wanted();
                cm.binary_data.clear();
                match api.update(&cm).await {
                    Ok(_) => Ok(Action::Done),
                    Err(e) if e.is_conflict() || e.is_not_found() => {
                        Ok(Action::RequeueAfter(std::time::Duration::ZERO))
                    }
                    Err(e) => Err(e).during(|| format!("updating {}/{NAME}", key.name)),
                }
            }
            None => {
                let cm = ConfigMap {
                    metadata: Some(ObjectMeta {
                        name: NAME.into(),
                        namespace: key.name.clone(),
                        ..Default::default()
                    }),
                    data: self.wanted(),
                    ..Default::default()
                };
                match api.create(&cm).await {
                    Ok(_) => Ok(Action::Done),
                    Err(e) if e.is_already_exists() => Ok(Action::Done),
                    Err(e) => Err(e).during(|| format!("creating {}/{NAME}", key.name)),
                }
            }
        }
    }
}
