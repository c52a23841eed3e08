//! The ServiceAccount controller (kube-controller-manager's `serviceaccount` controller):
//! every namespace that is not terminating has a ServiceAccount `default`; one deleted is
//! made again. Keyed by Namespace; a ServiceAccount's change wakes its namespace.

use std::sync::Arc;

use skiff_api::Resource;
use skiff_api::api::{Namespace, ObjectMeta, ServiceAccount};
use skiff_client::Client;
use skiff_client::controller::{
    Action, CancelToken, Controller, Informer, Informers, ObjectKey, Reconciler,
};

use crate::util::is_terminating;
use crate::{Context, Error};

/// The ServiceAccount every namespace gets.
pub const DEFAULT: &str = "default";

#[derive(Debug)]
pub struct ServiceAccountController {
    client: Client,
    namespaces: Informer<Namespace>,
    accounts: Informer<ServiceAccount>,
}

impl ServiceAccountController {
    pub fn new(informers: &Informers) -> Self {
        ServiceAccountController {
            client: informers.client().clone(),
            namespaces: informers.get::<Namespace>(),
            accounts: informers.get::<ServiceAccount>(),
        }
    }

    /// Namespaces, woken by their ServiceAccounts.
    pub fn controller(informers: &Informers) -> Controller<Namespace> {
        let accounts = informers.get::<ServiceAccount>();
        Controller::<Namespace>::new(informers)
            .named("serviceaccount")
            .watches(&accounts, |sa: &ServiceAccount| {
                vec![ObjectKey::cluster(sa.namespace())]
            })
    }

    /// Runs it with `workers` workers until `stop` is cancelled.
    pub async fn run(informers: &Informers, workers: usize, stop: CancelToken) {
        let reconciler = Arc::new(ServiceAccountController::new(informers));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }
}

impl Reconciler for ServiceAccountController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(ns) = self.namespaces.get(key) else {
            return Ok(Action::Done);
        };
        let terminating =
            is_terminating(&*ns) || ns.status.as_ref().is_some_and(|s| s.phase == "Terminating");
        if terminating
            || self
                .accounts
                .get(&ObjectKey::new(&key.name, DEFAULT))
                .is_some()
        {
            return Ok(Action::Done);
        }
        let sa = ServiceAccount {
            metadata: Some(ObjectMeta {
                name: DEFAULT.into(),
                namespace: key.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        };
        match self
            .client
            .namespaced::<ServiceAccount>(&key.name)
            .create(&sa)
            .await
        {
            Ok(_) => {
                tracing::debug!(namespace = %key.name, "created the default ServiceAccount");
                Ok(Action::Done)
            }
            // Already there (our cache lagged), or the namespace is going away.
            Err(e) if e.is_already_exists() => Ok(Action::Done),
            Err(e) => Err(e).during(|| format!("creating {}/{DEFAULT}", key.name)),
        }
    }
}
