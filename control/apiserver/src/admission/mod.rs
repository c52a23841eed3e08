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
//! | `LoadBalancerIPPools` | pools overlap no other pool, the service CIDR or the cluster CIDR; a LoadBalancer Service asks only for addresses of a pool that serves it |
//! | `RBACEscalation` | Roles and bindings: no one grants permissions they do not hold ([`crate::auth::escalation`]) |
//! | `CertificateApproval` | approving a CertificateSigningRequest takes `approve` on `signers/<signerName>` |
//! | `CertificateSigning` | writing its certificate takes `sign` on `signers/<signerName>` |
//! | `CertificateSubjectRestriction` | no `system:masters` request of the API server's client signer |
//! | `MutatingAdmissionWebhook` | the MutatingWebhookConfigurations' webhooks, in turn, may patch the object ([`webhooks`]) |
//! | `ValidatingAdmissionPolicy` | the bound ValidatingAdmissionPolicies' CEL validations deny, warn or audit ([`policies`]) |
//! | `ValidatingAdmissionWebhook` | the ValidatingWebhookConfigurations' webhooks, in parallel, may refuse |
//!
//! A plug-in sees the typed object as `dyn Any` and acts on the kinds it knows, as
//! kube-apiserver's plug-ins switch on the object's type.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use skiff_cidr::Ipv4Cidr;

use crate::auth::authz::Authorizer;

pub mod interface;
mod lb_pools;
mod plugins;
pub mod policies;
pub mod webhooks;

pub use interface::{Admit, Operation, Plugin, Refusal, Request};

/// What the chain needs from the server's configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The Services' clusterIP range; `None` accepts any address (in-process servers of
    /// tests that do not configure one).
    pub service_cluster_ip_range: Option<Ipv4Cidr>,
    /// The pods' addresses (`--cluster-cidr`), which no LoadBalancerIPPool may overlap;
    /// `None`: not checked.
    pub cluster_cidr: Option<Ipv4Cidr>,
}

/// The ordered plug-ins.
pub struct Chain {
    plugins: Vec<Box<dyn Plugin>>,
    /// RBAC's escalation check needs the authorizer, which starts after the registry (it
    /// mirrors RBAC objects through it): set once by the server when it has one.
    authorizer: Arc<OnceLock<Arc<Authorizer>>>,
    /// The webhook plug-ins read their configurations through the registry, which starts
    /// after the chain: [`Chain::start_webhooks`].
    webhooks: Arc<webhooks::Webhooks>,
    /// Likewise the ValidatingAdmissionPolicies and their bindings.
    policies: Arc<policies::Policies>,
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
        let hooks: Arc<webhooks::Webhooks> = Arc::default();
        let policies: Arc<policies::Policies> = Arc::default();
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
            Box::new(lb_pools::LoadBalancerIpPools {
                service_cluster_ip_range: config.service_cluster_ip_range,
                cluster_cidr: config.cluster_cidr,
            }),
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
            Box::new(webhooks::MutatingAdmissionWebhook(Arc::clone(&hooks))),
            Box::new(policies::ValidatingAdmissionPolicyPlugin(Arc::clone(
                &policies,
            ))),
            Box::new(webhooks::ValidatingAdmissionWebhook(Arc::clone(&hooks))),
        ];
        Chain {
            plugins,
            authorizer,
            webhooks: hooks,
            policies,
        }
    }

    /// The plug-ins' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.plugins.iter().map(|p| p.name()).collect()
    }

    /// Starts reading the webhook configurations and the admission policies through the
    /// registry.
    pub(crate) async fn start_webhooks(
        &self,
        registry: &crate::registry::Registry,
    ) -> Result<(), crate::error::ApiError> {
        self.webhooks.start(registry).await?;
        self.policies.start(registry).await
    }

    /// Gives the chain the server's authorizer (once; later calls are ignored).
    pub(crate) fn set_authorizer(&self, authorizer: Arc<Authorizer>) {
        let _ = self.authorizer.set(authorizer);
    }
}

#[async_trait]
impl Admit for Chain {
    /// The mutating phase of every plug-in, in order.
    async fn mutate(
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
    async fn validate(
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
