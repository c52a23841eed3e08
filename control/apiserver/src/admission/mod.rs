//! Admission: the one ordered list of plug-ins every write passes, whichever front end it
//! came through (REST create, update, patch, server-side apply, a subresource; gRPC).
//!
//! The registry ([`crate::registry::Handler`]) runs the [`Chain`] on every create, update
//! (the object and every subresource: `status`, `approval`, `binding`) and delete, in
//! kube-apiserver's order: defaulting, then the mutating phase of every plug-in in order,
//! then the kind's validation, then the validating phase of every plug-in in order, then
//! the write. The first refusal ends the request and nothing is written.
//!
//! The plug-ins, in the order they run ([`Chain::new`] builds the list):
//!
//! | plug-in | what it does |
//! |---|---|
//! | `NamespaceLifecycle` | nothing is created in a namespace that does not exist or is terminating |
//! | `ServiceAccount` | pods: `serviceAccountName` defaults to `default`, the token volume is mounted |
//! | `DefaultStorageClass` | claims without a class get the default StorageClass |
//! | `NodeRestriction` | nodes change only their pods' status, never their own taints or labels outside the kubelet's; a bootstrap token joins only a new node |
//! | `NodePodCIDRs` | no two Nodes' pod CIDRs overlap |
//! | `PodSecurity` | pods: the namespace's enforced Pod Security level, on create and on every update that changes an image |
//! | `ServiceIPRange` | Services: clusterIPs only from the service CIDR (kube-apiserver's allocator check) |
//! | `DenyServiceExternalIPs` | Services: no new `externalIPs` (kube-apiserver's plug-in of that name) |
//! | `RBACEscalation` | Roles and bindings: no one grants permissions they do not hold ([`crate::auth::escalation`]) |
//! | `CertificateApproval` | approving a CertificateSigningRequest takes `approve` on `signers/<signerName>` |
//! | `CertificateSigning` | writing its certificate takes `sign` on `signers/<signerName>` |
//! | `CertificateSubjectRestriction` | no `system:masters` request of the API server's client signer |
//!
//! A plug-in sees the typed object as `dyn Any` and acts on the kinds it knows, as
//! kube-apiserver's plug-ins switch on the object's type.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use skiff_api::api::Namespace;
use skiff_api::{KindInfo, Resource};
use skiff_cidr::Ipv4Cidr;
use skiff_store::Store;

use crate::auth::UserInfo;
use crate::auth::authz::Authorizer;
use crate::error::ApiError;

mod plugins;

/// What a write does to its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// One write, as the plug-ins see it.
pub struct Request<'a> {
    pub operation: Operation,
    pub info: &'static KindInfo,
    /// "" for the object itself; `status`, `approval`, `binding`, ...
    pub subresource: &'a str,
    /// The object's namespace (never the URL's: they agree or the request was refused).
    pub namespace: &'a str,
    pub name: &'a str,
    /// The stored object an update or delete replaces.
    pub old: Option<&'a (dyn Any + Send + Sync)>,
    /// Who asks; `None` only on in-process servers without authentication.
    pub user: Option<&'a UserInfo>,
    store: &'a dyn Store,
    namespace_object: tokio::sync::OnceCell<Option<Namespace>>,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("operation", &self.operation)
            .field("resource", &self.info.plural)
            .field("subresource", &self.subresource)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<'a> Request<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        operation: Operation,
        info: &'static KindInfo,
        subresource: &'a str,
        namespace: &'a str,
        name: &'a str,
        old: Option<&'a (dyn Any + Send + Sync)>,
        user: Option<&'a UserInfo>,
        store: &'a dyn Store,
    ) -> Self {
        Request {
            operation,
            info,
            subresource,
            namespace,
            name,
            old,
            user,
            store,
            namespace_object: tokio::sync::OnceCell::new(),
        }
    }

    /// The old object as `T` (an update's or delete's stored object).
    pub fn old_as<T: 'static>(&self) -> Option<&T> {
        self.old.and_then(|o| o.downcast_ref::<T>())
    }

    /// The request's Namespace object (read once per request; `None` when it does not exist
    /// or the kind is cluster-scoped).
    pub async fn namespace_object(&self) -> Result<Option<&Namespace>, ApiError> {
        if !self.info.namespaced {
            return Ok(None);
        }
        let ns = self
            .namespace_object
            .get_or_try_init(|| self.get::<Namespace>("", self.namespace))
            .await?;
        Ok(ns.as_ref())
    }

    /// The object `name` of kind `T` in `namespace`, as the store has it now.
    pub async fn get<T: Resource>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<T>, ApiError> {
        let key = if T::INFO.namespaced {
            format!(
                "{}{namespace}/{name}",
                crate::registry::key_prefix(&T::INFO)
            )
        } else {
            format!("{}{name}", crate::registry::key_prefix(&T::INFO))
        };
        match self.store.get(&key).await.map_err(ApiError::from_store)? {
            Some(kv) => crate::registry::decode(&kv.value, kv.mod_revision).map(Some),
            None => Ok(None),
        }
    }

    /// Every object of kind `T` (in `namespace` for a namespaced kind), as the store has
    /// them now.
    pub async fn list<T: Resource>(&self, namespace: &str) -> Result<Vec<T>, ApiError> {
        let mut prefix = crate::registry::key_prefix(&T::INFO);
        if T::INFO.namespaced {
            prefix.push_str(namespace);
            prefix.push('/');
        }
        let listing = self
            .store
            .list(&prefix, None)
            .await
            .map_err(ApiError::from_store)?;
        listing
            .items
            .iter()
            .map(|kv| crate::registry::decode(&kv.value, kv.mod_revision))
            .collect()
    }
}

/// An admission plug-in. Both phases default to "no opinion".
#[async_trait]
pub trait Plugin: Send + Sync {
    /// kube-apiserver's name for it (`PodSecurity`), for audit records and logs.
    fn name(&self) -> &'static str;

    /// The mutating phase: may change the object before the kind validates it.
    async fn mutate(
        &self,
        _req: &Request<'_>,
        _object: &mut (dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        Ok(())
    }

    /// The validating phase: refuses or lets the (validated) object through.
    async fn validate(
        &self,
        _req: &Request<'_>,
        _object: &(dyn Any + Send + Sync),
    ) -> Result<(), ApiError> {
        Ok(())
    }
}

/// A refusal, and the plug-in that refused (for the audit record).
#[derive(Debug)]
pub struct Refusal {
    pub plugin: &'static str,
    pub error: ApiError,
}

/// What the chain needs from the server's configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The Services' clusterIP range; `None` accepts any address (in-process servers of
    /// tests that do not configure one).
    pub service_cluster_ip_range: Option<Ipv4Cidr>,
}

/// The ordered plug-ins.
pub struct Chain {
    plugins: Vec<Box<dyn Plugin>>,
    /// RBAC's escalation check needs the authorizer, which starts after the registry (it
    /// mirrors RBAC objects through it): set once by the server when it has one.
    authorizer: Arc<OnceLock<Arc<Authorizer>>>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.plugins.iter().map(|p| p.name()))
            .finish()
    }
}

impl Chain {
    /// The list every server runs, in order.
    pub fn new(config: Config) -> Chain {
        let authorizer: Arc<OnceLock<Arc<Authorizer>>> = Arc::default();
        let plugins: Vec<Box<dyn Plugin>> = vec![
            Box::new(plugins::NamespaceLifecycle),
            Box::new(plugins::ServiceAccount),
            Box::new(plugins::DefaultStorageClass),
            Box::new(plugins::NodeRestriction),
            Box::new(plugins::NodePodCidrs),
            Box::new(plugins::PodSecurity),
            Box::new(plugins::ServiceIpRange {
                range: config.service_cluster_ip_range,
            }),
            Box::new(plugins::DenyServiceExternalIps),
            Box::new(plugins::RbacEscalation {
                authorizer: Arc::clone(&authorizer),
            }),
            Box::new(plugins::SignerPermission {
                name: "CertificateApproval",
                subresource: "approval",
                verb: "approve",
                authorizer: Arc::clone(&authorizer),
            }),
            Box::new(plugins::SignerPermission {
                name: "CertificateSigning",
                subresource: "status",
                verb: "sign",
                authorizer: Arc::clone(&authorizer),
            }),
            Box::new(plugins::CertificateSubjectRestriction),
        ];
        Chain {
            plugins,
            authorizer,
        }
    }

    /// The plug-ins' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.plugins.iter().map(|p| p.name()).collect()
    }

    /// Gives the chain the server's authorizer (once; later calls are ignored).
    pub(crate) fn set_authorizer(&self, authorizer: Arc<Authorizer>) {
        let _ = self.authorizer.set(authorizer);
    }

    /// The mutating phase of every plug-in, in order.
    pub(crate) async fn mutate(
        &self,
        req: &Request<'_>,
        object: &mut (dyn Any + Send + Sync),
    ) -> Result<(), Refusal> {
        for p in &self.plugins {
            p.mutate(req, object).await.map_err(|error| Refusal {
                plugin: p.name(),
                error,
            })?;
        }
        Ok(())
    }

    /// The validating phase of every plug-in, in order.
    pub(crate) async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), Refusal> {
        for p in &self.plugins {
            p.validate(req, object).await.map_err(|error| Refusal {
                plugin: p.name(),
                error,
            })?;
        }
        Ok(())
    }
}

impl Default for Chain {
    fn default() -> Self {
        Chain::new(Config::default())
    }
}
