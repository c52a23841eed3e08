//! What the registry sees of admission: the [`Request`] a plug-in reviews (one write:
//! its operation, kind, subresource, namespace, name, old object and requester, with reads
//! of the store for what a plug-in must look up), the [`Plugin`] trait, and [`Admit`], the
//! chain as the registry runs it. The plug-ins and their order live above, in
//! [`super::Chain`]; the registry depends only on this module.

use std::any::Any;

use async_trait::async_trait;
use skiff_api::api::Namespace;
use skiff_api::{KindInfo, Resource};
use skiff_store::Store;

use crate::error::ApiError;
use crate::object::Object;
use crate::request::UserInfo;

/// The JSON of a kind's objects, for plug-ins that hand objects to servers outside the API
/// server (admission webhooks).
pub trait ObjectJson: Send + Sync {
    /// Kubernetes' JSON of `object`; `None` if it is not of this kind.
    fn to_json(&self, object: &(dyn Any + Send + Sync)) -> Option<serde_json::Value>;
    /// Replaces `object` with what `value` decodes to (as a request body of the kind,
    /// defaults applied).
    fn replace_from_json(
        &self,
        object: &mut (dyn Any + Send + Sync),
        value: serde_json::Value,
    ) -> Result<(), String>;
}

/// The [`ObjectJson`] of the kind `T` (its codec for custom kinds).
pub(crate) struct JsonOf<T: Object>(pub std::sync::Arc<T::Kind>);

impl<T: crate::strategy::Strategy> ObjectJson for JsonOf<T> {
    fn to_json(&self, object: &(dyn Any + Send + Sync)) -> Option<serde_json::Value> {
        object.downcast_ref::<T>().map(Object::to_json)
    }

    fn replace_from_json(
        &self,
        object: &mut (dyn Any + Send + Sync),
        value: serde_json::Value,
    ) -> Result<(), String> {
        let slot = object
            .downcast_mut::<T>()
            .ok_or_else(|| "the object is not of this kind".to_string())?;
        *slot = T::from_json(&self.0, value)?;
        // Decoding a request body defaults it, as kube-apiserver's decoding of a patched
        // object does: what a webhook adds (a container, a port) gets the kind's defaults.
        crate::strategy::Strategy::default(slot);
        Ok(())
    }
}

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
    /// A dry run: nothing will be written.
    pub dry_run: bool,
    /// The objects' JSON.
    pub json: &'a dyn ObjectJson,
    pub(crate) store: &'a dyn Store,
    /// The request's audit record, where plug-ins leave warnings for the client and
    /// annotations for the audit event; `None` for requests outside the REST pipeline.
    pub audit: Option<&'a crate::request::AuditSlot>,
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
        dry_run: bool,
        json: &'a dyn ObjectJson,
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
            dry_run,
            json,
            store,
            audit: None,
            namespace_object: tokio::sync::OnceCell::new(),
        }
    }

    /// The same request, noting warnings and audit annotations in `audit`.
    pub(crate) fn noted_in(mut self, audit: Option<&'a crate::request::AuditSlot>) -> Self {
        self.audit = audit;
        self
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
        crate::stored::get(self.store, namespace, name).await
    }

    /// Every object of kind `T` (in `namespace` for a namespaced kind), as the store has
    /// them now.
    pub async fn list<T: Resource>(&self, namespace: &str) -> Result<Vec<T>, ApiError> {
        let mut prefix = crate::stored::key_prefix(&T::INFO);
        if T::INFO.namespaced {
            prefix.push_str(namespace);
            prefix.push('/');
        }
        let listing = self
            .store
            .list(&prefix, None)
            .await
            .map_err(ApiError::from_store)?;
        listing.items.iter().map(crate::stored::decode_kv).collect()
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

/// The whole chain as the registry runs it: every plug-in's mutating phase, then (after the
/// kind's validation) every plug-in's validating phase; the first refusal ends the write.
#[async_trait]
pub trait Admit: Send + Sync + std::fmt::Debug {
    /// The mutating phase of every plug-in, in order.
    async fn mutate(
        &self,
        req: &Request<'_>,
        object: &mut (dyn Any + Send + Sync),
    ) -> Result<(), Refusal>;

    /// The validating phase of every plug-in, in order.
    async fn validate(
        &self,
        req: &Request<'_>,
        object: &(dyn Any + Send + Sync),
    ) -> Result<(), Refusal>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::Pod;

    #[test]
    fn what_a_webhook_adds_gets_the_kinds_defaults() {
        let json = JsonOf::<Pod>(Default::default());
        let mut pod: Box<dyn Any + Send + Sync> = Box::new(Pod::default());
        let patched = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "added", "image": "x",
                "ports": [{"containerPort": 80}],
                "readinessProbe": {"tcpSocket": {"port": 80}}}]},
        });
        json.replace_from_json(pod.as_mut(), patched).unwrap();
        let pod = pod.downcast_ref::<Pod>().unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        assert_eq!(c.ports[0].protocol, "TCP");
        assert_eq!(c.readiness_probe.as_ref().unwrap().period_seconds, 10);
        assert_eq!(spec.restart_policy, "Always");
    }
}
