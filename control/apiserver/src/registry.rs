//! The registry: one generic [`Handler`] per resource type, behind the object-safe
//! [`ResourceHandler`] trait, keyed by plural name.
//!
//! Every operation (create, get, list, update, delete, watch, bind) is implemented once in
//! `Handler<T>`; per-kind behaviour comes from the kind's [`Strategy`]: create
//! (generateName, uid, timestamps, generation), get, list with selectors, update with
//! optimistic concurrency (a compare-and-swap on the store revision), the status
//! subresource, graceful delete and finalizers, `pods/binding`, and watch (from the watch
//! cache). Every write runs the admission chain between defaulting and the store.
//!
//! Storage layout: `/registry/<plural>/<namespace>/<name>` for namespaced kinds and
//! `/registry/<plural>/<name>` for cluster-scoped ones; values are the protobuf encoding of
//! the object with `apiVersion`/`kind` set and `metadata.resourceVersion` cleared — the
//! resourceVersion of an object read back is always the key's mod_revision.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use prost::Message;
use skiff_api::api::{
    ApiService, Binding, CertificateSigningRequest, ClusterRole, ClusterRoleBinding, ConfigMap,
    CronJob, CustomResourceDefinition, DaemonSet, Deployment, Endpoints, Event,
    HorizontalPodAutoscaler, Job, Lease, LoadBalancerIpPool, MutatingWebhookConfiguration,
    Namespace, NetworkPolicy, Node, PersistentVolume, PersistentVolumeClaim, Pod,
    PodDisruptionBudget, ReplicaSet, ReplicationController, Role, RoleBinding, Secret, Service,
    ServiceAccount, StatefulSet, StorageClass, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use skiff_api::rpc::{DeleteRequest, ListRequest, ListResponse, WatchRequest};
use skiff_api::selector::{FieldSelector, Selector};
use skiff_api::{DynKind, Encoded, KindInfo};
use skiff_store::{KeyValue, Store, StoreError};
use tracing::debug;

use crate::admission::interface::{self as admission, Admit, Operation};
use crate::cache::{CachedObject, Filter, WatchCache, WatchReceiver, WatchStart};
use crate::custom::{CustomKind, Unstructured};
use crate::error::{ApiError, FieldError};
use crate::object::Object;
use crate::stored::{decode, encode_for_store, key_prefix, object_key, with_revision};
use crate::strategy::{
    CustomPrefixes, DeleteContext, DeleteDecision, Strategy, now_rfc3339, random_suffix, rfc3339_in,
};
use crate::validation::check_object_meta;

/// How often an operation that read-modify-writes an object retries on a conflict it caused
/// itself (delete, bind).
const RETRIES: usize = 5;
/// How many random suffixes `generateName` tries.
const GENERATE_ATTEMPTS: usize = 8;

pub use skiff_api::{FOREGROUND_FINALIZER, ORPHAN_FINALIZER};

fn decode_request<T: Message + Default>(bytes: &[u8], kind: &str) -> Result<T, ApiError> {
    T::decode(bytes)
        .map_err(|e| ApiError::BadRequest(format!("cannot decode the {kind} object: {e}")))
}

fn decode_object<T: Object>(kind: &T::Kind, object: Encoded) -> Result<T, ApiError> {
    T::decode_encoded(kind, object).map_err(|e| {
        ApiError::BadRequest(format!(
            "cannot decode the {} object: {e}",
            kind.info().kind
        ))
    })
}

fn parse_revision(rv: &str) -> Option<i64> {
    rv.parse::<i64>().ok().filter(|r| *r >= 0)
}

/// Parses the selectors of a list or watch, rejecting field paths the type has no value for.
fn parse_filter<T: Object>(
    kind: &T::Kind,
    namespace: &str,
    label_selector: &str,
    field_selector: &str,
) -> Result<Filter, ApiError> {
    let labels =
        Selector::parse(label_selector).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let fields =
        FieldSelector::parse(field_selector).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let info = kind.info();
    if let Some(bad) = fields.paths().find(|p| !T::selectable(kind, p)) {
        return Err(ApiError::BadRequest(format!(
            "field label not supported for {}: {bad}",
            info.qualified()
        )));
    }
    Ok(Filter {
        namespace: if info.namespaced {
            namespace.to_string()
        } else {
            String::new()
        },
        labels,
        fields,
    })
}

/// How a write is made.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// Run everything (defaulting, validation, admission of the namespace, preconditions)
    /// but write nothing; return what would have been stored (`dryRun=All`).
    pub dry_run: bool,
    /// Who asks (set when the request was authenticated): kinds that record their requester
    /// take it from here ([`Strategy::stamp_requester`]).
    pub requester: Option<crate::request::UserInfo>,
    /// The request's audit record: an admission refusal is noted in it.
    pub audit: Option<crate::request::AuditSlot>,
}

impl WriteOptions {
    /// Notes an admission refusal in the audit record and returns its error.
    fn refused(&self, r: admission::Refusal) -> ApiError {
        crate::request::note_admission(self.audit.as_ref(), r.plugin, &r.error.to_string());
        r.error
    }
}

/// The object-safe face of a resource type's handler. Objects travel encoded.
#[async_trait]
pub trait ResourceHandler: Send + Sync {
    fn info(&self) -> &'static KindInfo;
    /// The kind's JSON codec (the REST layer's view of the bytes this handler takes and
    /// returns).
    fn codec(&self) -> Arc<dyn DynKind>;
    async fn create(
        &self,
        namespace: &str,
        object: Encoded,
        opts: WriteOptions,
    ) -> Result<Vec<u8>, ApiError>;
    async fn get(&self, namespace: &str, name: &str) -> Result<Vec<u8>, ApiError>;
    /// A list at the current revision, or at `at` (a past revision still in the store's
    /// history; `Expired` when compacted).
    async fn list(&self, req: &ListRequest, at: Option<i64>) -> Result<ListResponse, ApiError>;
    async fn update(
        &self,
        namespace: &str,
        object: Encoded,
        subresource: &str,
        opts: WriteOptions,
    ) -> Result<Vec<u8>, ApiError>;
    async fn delete(&self, req: &DeleteRequest, opts: WriteOptions) -> Result<Vec<u8>, ApiError>;
    async fn watch(&self, req: &WatchRequest) -> Result<WatchReceiver, ApiError>;
    /// The binding subresource (pods only).
    async fn bind(
        &self,
        namespace: &str,
        binding: &[u8],
        opts: WriteOptions,
    ) -> Result<Vec<u8>, ApiError>;
    /// Store watches opened by this type's watch cache.
    fn store_watches(&self) -> u64;
    /// Stops the watch cache, ending every watcher.
    fn stop(&self);
}

/// A write's result: stored, as the watch cache will hold it (encoded once for the answer
/// and every watcher), or not stored (a dry run, an update that changes nothing, a delete).
pub(crate) enum Written<T> {
    Stored(Arc<CachedObject<T>>),
    Object(T),
}

impl<T: Object> Written<T> {
    fn encode(self) -> Vec<u8> {
        match self {
            Written::Stored(c) => c.bytes.clone(),
            Written::Object(o) => o.encode(),
        }
    }
}

/// Every operation of one resource type, implemented once for all types.
pub struct Handler<T: Strategy> {
    kind: Arc<T::Kind>,
    store: Arc<dyn Store>,
    custom_prefixes: CustomPrefixes,
    cache: Arc<WatchCache<T>>,
    admission: Arc<dyn Admit>,
    /// The objects' JSON, for admission webhooks.
    json: admission::JsonOf<T>,
}

impl<T: Strategy> std::fmt::Debug for Handler<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("kind", &self.info().kind)
            .finish_non_exhaustive()
    }
}

impl<T: Strategy> Handler<T> {
    /// Starts the kind's watch cache (listing its objects) and returns the handler.
    pub(crate) async fn start(
        kind: Arc<T::Kind>,
        store: Arc<dyn Store>,
        cache_capacity: usize,
        admission: Arc<dyn Admit>,
        custom_prefixes: CustomPrefixes,
    ) -> Result<Self, StoreError> {
        let cache =
            WatchCache::start(Arc::clone(&kind), Arc::clone(&store), cache_capacity).await?;
        Ok(Handler {
            json: admission::JsonOf(Arc::clone(&kind)),
            kind,
            store,
            custom_prefixes,
            cache,
            admission,
        })
    }

    /// An admission request for this kind.
    #[allow(clippy::too_many_arguments)]
    fn admission_request<'a>(
        &'a self,
        operation: Operation,
        subresource: &'a str,
        namespace: &'a str,
        name: &'a str,
        old: Option<&'a T>,
        opts: &'a WriteOptions,
    ) -> admission::Request<'a> {
        admission::Request::new(
            operation,
            self.info(),
            subresource,
            namespace,
            name,
            old.map(|o| o as &(dyn std::any::Any + Send + Sync)),
            opts.requester.as_ref(),
            opts.dry_run,
            &self.json,
            self.store.as_ref(),
        )
        .noted_in(opts.audit.as_ref())
    }

    fn info(&self) -> &'static KindInfo {
        self.kind.info()
    }

    fn invalid(&self, name: &str, errors: Vec<FieldError>) -> ApiError {
        ApiError::invalid(self.info(), name, errors)
    }

    /// apiVersion and kind must be empty or this type's.
    fn check_type_meta(&self, obj: &T, errors: &mut Vec<FieldError>) {
        let info = self.info();
        if !obj.api_version().is_empty() && obj.api_version() != info.api_version {
            errors.push(FieldError::invalid(
                "apiVersion",
                obj.api_version(),
                format!("must be {:?} for {}", info.api_version, info.qualified()),
            ));
        }
        if !obj.kind().is_empty() && obj.kind() != info.kind {
            errors.push(FieldError::invalid(
                "kind",
                obj.kind(),
                format!("must be {:?} for {}", info.kind, info.qualified()),
            ));
        }
    }

    /// The namespace of a write: the request's and the object's must agree; namespaced kinds
    /// need one, cluster-scoped kinds must not have one in the object (a request namespace is
    /// ignored for them, as kubectl does).
    fn write_namespace(&self, req_ns: &str, obj: &T) -> Result<String, ApiError> {
        let obj_ns = obj.namespace();
        if !self.info().namespaced {
            if !obj_ns.is_empty() {
                return Err(self.invalid(
                    obj.name(),
                    vec![FieldError::forbidden(
                        "metadata.namespace",
                        format!(
                            "not allowed on this type ({} are cluster-scoped)",
                            self.info().plural
                        ),
                    )],
                ));
            }
            return Ok(String::new());
        }
        match (req_ns, obj_ns) {
            ("", "") => Err(self.invalid(
                obj.name(),
                vec![FieldError::required("metadata.namespace", "")],
            )),
            (r, "") => Ok(r.to_string()),
            ("", o) => Ok(o.to_string()),
            (r, o) if r == o => Ok(r.to_string()),
            (r, o) => Err(ApiError::BadRequest(format!(
                "the namespace of the provided object ({o:?}) does not match the namespace \
                 sent on the request ({r:?})"
            ))),
        }
    }

    /// The namespace of a read or delete by name.
    fn read_namespace<'a>(&self, req_ns: &'a str) -> Result<&'a str, ApiError> {
        if !self.info().namespaced {
            Ok("")
        } else if req_ns.is_empty() {
            Err(ApiError::BadRequest(format!(
                "a namespace is required for {}",
                self.info().plural
            )))
        } else {
            Ok(req_ns)
        }
    }

    fn key(&self, namespace: &str, name: &str) -> String {
        object_key(self.info(), namespace, name)
    }

    async fn read(&self, key: &str, name: &str) -> Result<(KeyValue, T), ApiError> {
        let kv = self
            .store
            .get(key)
            .await
            .map_err(ApiError::from_store)?
            .ok_or_else(|| ApiError::not_found(self.info(), name))?;
        let obj = decode(self.kind.as_ref(), &kv.value, kv.mod_revision)?;
        Ok((kv, obj))
    }

    /// Create: type meta, namespace, generated name, uid/creationTimestamp/generation,
    /// defaulting, validation, then an atomic create in the store. The status is kept (nodes
    /// are created by their agents with a status).
    pub(crate) async fn create_object(
        &self,
        req_ns: &str,
        mut obj: T,
        opts: WriteOptions,
    ) -> Result<Written<T>, ApiError> {
        let info = self.info();
        let mut errors = Vec::new();
        self.check_type_meta(&obj, &mut errors);
        let namespace = self.write_namespace(req_ns, &obj)?;
        {
            let m = obj.metadata_mut();
            m.namespace = namespace.clone();
            m.uid = uuid::Uuid::new_v4().to_string();
            m.creation_timestamp = now_rfc3339();
            m.generation = 1;
            m.resource_version.clear();
            m.deletion_timestamp.clear();
            m.deletion_grace_period_seconds = None;
        }
        let generated = obj.name().is_empty() && !obj.metadata_mut().generate_name.is_empty();
        if generated {
            let m = obj.metadata_mut();
            m.name = format!("{}{}", m.generate_name, random_suffix());
        }
        let shown_name = if generated {
            obj.metadata_mut().generate_name.clone()
        } else {
            obj.name().to_string()
        };
        obj.set_type_meta();
        // What a client sends as status is not stored (kube-apiserver's strategies reset
        // it), except for kinds whose creator reports it (a Node registering itself).
        if info.has_status && T::RESET_STATUS_ON_CREATE {
            obj.clear_status();
        }
        obj.prepare_create();
        if let Some(user) = &opts.requester {
            obj.stamp_requester(user);
        }
        Strategy::default(&mut obj);
        let name = obj.name().to_string();
        let req = self.admission_request(Operation::Create, "", &namespace, &name, None, &opts);
        self.admission
            .mutate(&req, &mut obj)
            .await
            .map_err(|r| opts.refused(r))?;
        if let Some(m) = obj.metadata() {
            check_object_meta(&mut errors, m, T::NAME_RULE, generated);
        }
        errors.extend(obj.validate());
        if !errors.is_empty() {
            return Err(self.invalid(&shown_name, errors));
        }
        self.admission
            .validate(&req, &obj)
            .await
            .map_err(|r| opts.refused(r))?;
        if opts.dry_run {
            let key = self.key(&namespace, obj.name());
            if self
                .store
                .get(&key)
                .await
                .map_err(ApiError::from_store)?
                .is_some()
            {
                return Err(ApiError::already_exists(info, obj.name()));
            }
            return Ok(Written::Object(obj));
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let key = self.key(&namespace, obj.name());
            match self
                .put(&key, obj, |bytes| self.store.create(&key, bytes))
                .await
            {
                Ok(stored) => {
                    debug!(resource = info.plural, namespace, key, "created");
                    return Ok(Written::Stored(stored));
                }
                Err((mut back, StoreError::AlreadyExists { .. }))
                    if generated && attempt < GENERATE_ATTEMPTS =>
                {
                    let m = back.metadata_mut();
                    m.name = format!("{}{}", m.generate_name, random_suffix());
                    obj = back;
                }
                Err((back, StoreError::AlreadyExists { .. })) => {
                    return Err(ApiError::already_exists(info, back.name()));
                }
                Err((_, e)) => return Err(ApiError::from_store(e)),
            }
        }
    }

    /// Stores `obj` at `key` through `write` (a create or an update of the encoded bytes),
    /// announced to the watch cache so the write's event is not decoded again
    /// ([`WatchCache::writing`]); on failure the object comes back with the store's error.
    async fn put<F, Fut>(
        &self,
        key: &str,
        mut obj: T,
        write: F,
    ) -> Result<Arc<CachedObject<T>>, (T, StoreError)>
    where
        F: FnOnce(Vec<u8>) -> Fut,
        Fut: std::future::Future<Output = Result<KeyValue, StoreError>>,
    {
        let bytes = encode_for_store(&mut obj);
        let pending = self.cache.writing(key, &bytes, obj);
        match write(bytes).await {
            Ok(kv) => match pending.resolve(kv.mod_revision) {
                Some(stored) => Ok(stored),
                None => unreachable!("only the writer takes a pending write back"),
            },
            Err(e) => Err((self.cache.abandon(key, pending), e)),
        }
    }

    pub async fn get_object(&self, req_ns: &str, name: &str) -> Result<T, ApiError> {
        let namespace = self.read_namespace(req_ns)?;
        Ok(self.read(&self.key(namespace, name), name).await?.1)
    }

    /// A consistent list from the store, filtered; returns the items and the listing
    /// revision.
    pub async fn list_objects(
        &self,
        req: &ListRequest,
        at: Option<i64>,
    ) -> Result<(Vec<T>, i64), ApiError> {
        let filter = parse_filter::<T>(
            self.kind.as_ref(),
            &req.namespace,
            &req.label_selector,
            &req.field_selector,
        )?;
        let prefix = if filter.namespace.is_empty() {
            key_prefix(self.info())
        } else {
            format!("{}{}/", key_prefix(self.info()), filter.namespace)
        };
        let listing = self
            .store
            .list(&prefix, at)
            .await
            .map_err(ApiError::from_store)?;
        let mut items = Vec::new();
        for kv in &listing.items {
            let obj: T = decode(self.kind.as_ref(), &kv.value, kv.mod_revision)?;
            if filter.matches(&obj) {
                items.push(obj);
            }
        }
        Ok((items, listing.revision))
    }

    /// Update of the object (`subresource` "") or of its status ("status"), compare-and-swap
    /// on `metadata.resourceVersion`.
    ///
    /// The main update keeps the stored status, uid, creationTimestamp and deletion fields,
    /// and bumps generation iff the spec changed; the status update takes only the status.
    /// When an object being deleted (with grace 0) loses its last finalizer, it is deleted
    /// (unless the kind's delete hook still keeps it, e.g. a namespace that is not empty).
    /// An update that changes nothing is not written (the stored object is returned).
    pub(crate) async fn update_object(
        &self,
        req_ns: &str,
        new: T,
        subresource: &str,
        opts: WriteOptions,
    ) -> Result<Written<T>, ApiError> {
        let info = self.info();
        // "": the object; "status" or another subresource of the kind: only what that
        // subresource covers, copied into the stored object below.
        let status_only = match subresource {
            "" => false,
            "status" if info.has_status => true,
            other if new.clone().copy_subresource_from(&new, other) => true,
            other => {
                return Err(ApiError::BadRequest(format!(
                    "{} has no subresource {other:?}",
                    info.qualified()
                )));
            }
        };
        let mut errors = Vec::new();
        self.check_type_meta(&new, &mut errors);
        let namespace = self.write_namespace(req_ns, &new)?;
        let name = new.name().to_string();
        if name.is_empty() {
            errors.push(FieldError::required("metadata.name", ""));
        }
        let rv = new.resource_version();
        let expected = if rv.is_empty() {
            errors.push(FieldError::message(
                "metadata.resourceVersion",
                "must be specified for an update",
            ));
            None
        } else {
            let parsed = parse_revision(rv);
            if parsed.is_none() {
                errors.push(FieldError::invalid(
                    "metadata.resourceVersion",
                    rv,
                    "must be a decimal revision",
                ));
            }
            parsed
        };
        let Some(expected) = expected.filter(|_| errors.is_empty()) else {
            return Err(self.invalid(&name, errors));
        };
        let key = self.key(&namespace, &name);
        let (kv, old) = self.read(&key, &name).await?;
        if kv.mod_revision != expected {
            return Err(ApiError::modified(info, &name));
        }
        let old_meta = old.metadata().cloned().unwrap_or_default();
        let new_uid = new.metadata().map(|m| m.uid.clone()).unwrap_or_default();
        if !new_uid.is_empty() && new_uid != old_meta.uid {
            return Err(ApiError::Conflict(format!(
                "Precondition failed: UID in precondition: {new_uid}, UID in object meta: {}",
                old_meta.uid
            )));
        }
        let mut obj = if status_only {
            let mut o = old.clone();
            if subresource == "status" {
                o.copy_status_from(&new);
                o.prepare_status_update(&old);
            } else {
                o.copy_subresource_from(&new, subresource);
            }
            o
        } else {
            let mut o = new;
            o.copy_status_from(&old);
            let m = o.metadata_mut();
            m.namespace = namespace.clone();
            m.uid = old_meta.uid.clone();
            m.creation_timestamp = old_meta.creation_timestamp.clone();
            m.deletion_timestamp = old_meta.deletion_timestamp.clone();
            m.deletion_grace_period_seconds = old_meta.deletion_grace_period_seconds;
            m.generation = old_meta.generation;
            // A write that does not name managedFields keeps them, as in Kubernetes.
            if m.managed_fields.is_empty() {
                m.managed_fields = old_meta.managed_fields.clone();
            }
            o.prepare_update(&old);
            o
        };
        obj.set_type_meta();
        obj.metadata_mut().resource_version = old.resource_version().to_string();
        Strategy::default(&mut obj);
        if !status_only && !obj.spec_eq(&old) {
            obj.metadata_mut().generation = old_meta.generation + 1;
        }
        let req = self.admission_request(
            Operation::Update,
            subresource,
            &namespace,
            &name,
            Some(&old),
            &opts,
        );
        self.admission
            .mutate(&req, &mut obj)
            .await
            .map_err(|r| opts.refused(r))?;
        if let Some(m) = obj.metadata() {
            check_object_meta(&mut errors, m, T::NAME_RULE, false);
            if !old_meta.deletion_timestamp.is_empty()
                && m.finalizers
                    .iter()
                    .any(|f| !old_meta.finalizers.contains(f))
            {
                errors.push(FieldError::forbidden(
                    "metadata.finalizers",
                    "no new finalizers can be added if the object is being deleted",
                ));
            }
        }
        errors.extend(obj.validate());
        errors.extend(obj.validate_update(&old));
        if !errors.is_empty() {
            return Err(self.invalid(&name, errors));
        }
        if obj == old {
            return Ok(Written::Object(old));
        }
        self.admission
            .validate(&req, &obj)
            .await
            .map_err(|r| opts.refused(r))?;
        if opts.dry_run {
            return Ok(Written::Object(obj));
        }
        let finalized = obj.metadata().is_some_and(|m| {
            !m.deletion_timestamp.is_empty()
                && m.finalizers.is_empty()
                && m.deletion_grace_period_seconds.unwrap_or(0) == 0
        }) && !old_meta.finalizers.is_empty();
        // The kind may still hold it back (a namespace that is not empty yet).
        let finalized = finalized && {
            let ctx = DeleteContext {
                store: self.store.as_ref(),
                custom_prefixes: &self.custom_prefixes,
                grace_period_seconds: Some(0),
            };
            obj.clone().delete_decision(&ctx).await? == DeleteDecision::Now
        };
        if finalized {
            return match self.store.delete(&key, Some(expected)).await {
                Ok((_, revision)) => {
                    debug!(
                        resource = info.plural,
                        namespace, name, "finalized and deleted"
                    );
                    Ok(Written::Object(with_revision(obj, revision)))
                }
                Err(StoreError::Conflict { .. }) => Err(ApiError::modified(info, &name)),
                Err(StoreError::NotFound { .. }) => Err(ApiError::not_found(info, &name)),
                Err(e) => Err(ApiError::from_store(e)),
            };
        }
        match self
            .put(&key, obj, |bytes| self.store.update(&key, bytes, expected))
            .await
        {
            Ok(stored) => Ok(Written::Stored(stored)),
            Err((_, StoreError::Conflict { .. })) => Err(ApiError::modified(info, &name)),
            Err((_, StoreError::NotFound { .. })) => Err(ApiError::not_found(info, &name)),
            Err((_, e)) => Err(ApiError::from_store(e)),
        }
    }

    /// Delete with preconditions, finalizers and the kind's graceful-delete hook.
    ///
    /// `propagation_policy` must be "", Background, Foreground or Orphan. Foreground adds the
    /// finalizer `foregroundDeletion` and Orphan adds `orphan`, as Kubernetes does; whether
    /// the object has dependents is not checked — the garbage collector (in the controller
    /// manager) acts on and removes these finalizers.
    ///
    /// An object with finalizers, or one the kind's strategy keeps (a bound pod's graceful
    /// delete, a non-empty namespace), is marked with `deletionTimestamp` (now + grace period,
    /// as Kubernetes) and `deletionGracePeriodSeconds`, and returned; a later delete can only
    /// shorten the grace period. Otherwise the object is removed (CAS on the revision read)
    /// and its last state returned with the delete's revision as resourceVersion.
    pub async fn delete_object(
        &self,
        req: &DeleteRequest,
        opts: WriteOptions,
    ) -> Result<T, ApiError> {
        let info = self.info();
        let policy_finalizer = match req.propagation_policy.as_str() {
            "" | "Background" => None,
            "Foreground" => Some(FOREGROUND_FINALIZER),
            "Orphan" => Some(ORPHAN_FINALIZER),
            other => {
                return Err(ApiError::BadRequest(format!(
                    "unsupported propagation policy {other:?}: want Background, Foreground or \
                     Orphan"
                )));
            }
        };
        // Kubernetes treats negative grace periods as 1 s.
        let grace = req.grace_period_seconds.map(|g| if g < 0 { 1 } else { g });
        let namespace = self.read_namespace(&req.namespace)?;
        let name = req.name.as_str();
        let key = self.key(namespace, name);
        let precondition_rv = if req.precondition_resource_version.is_empty() {
            None
        } else {
            Some(
                parse_revision(&req.precondition_resource_version).ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "invalid precondition resourceVersion {:?}",
                        req.precondition_resource_version
                    ))
                })?,
            )
        };
        for _ in 0..RETRIES {
            let (kv, obj) = self.read(&key, name).await?;
            let meta = obj.metadata().cloned().unwrap_or_default();
            if !req.precondition_uid.is_empty() && req.precondition_uid != meta.uid {
                return Err(ApiError::Conflict(format!(
                    "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                    req.precondition_uid, meta.uid
                )));
            }
            if let Some(rv) = precondition_rv
                && rv != kv.mod_revision
            {
                return Err(ApiError::Conflict(format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, \
                     ResourceVersion in object meta: {}",
                    kv.mod_revision
                )));
            }
            let mut marked = obj.clone();
            if let Some(f) = policy_finalizer
                && !meta.finalizers.iter().any(|x| x == f)
            {
                marked.metadata_mut().finalizers.push(f.to_string());
            }
            let ctx = DeleteContext {
                store: self.store.as_ref(),
                custom_prefixes: &self.custom_prefixes,
                grace_period_seconds: grace,
            };
            let req =
                self.admission_request(Operation::Delete, "", namespace, name, Some(&obj), &opts);
            self.admission
                .validate(&req, &obj)
                .await
                .map_err(|r| opts.refused(r))?;
            let decision = marked.delete_decision(&ctx).await?;
            let has_finalizers = marked.metadata().is_some_and(|m| !m.finalizers.is_empty());
            if decision == DeleteDecision::Now && !has_finalizers {
                if opts.dry_run {
                    return Ok(obj);
                }
                match self.store.delete(&key, Some(kv.mod_revision)).await {
                    Ok((_, revision)) => {
                        debug!(resource = info.plural, namespace, name, "deleted");
                        return Ok(with_revision(obj, revision));
                    }
                    Err(StoreError::Conflict { .. }) if precondition_rv.is_none() => continue,
                    Err(StoreError::Conflict { .. }) => {
                        return Err(ApiError::modified(info, name));
                    }
                    Err(StoreError::NotFound { .. }) => {
                        return Err(ApiError::not_found(info, name));
                    }
                    Err(e) => return Err(ApiError::from_store(e)),
                }
            }
            let grace_seconds = match decision {
                DeleteDecision::Now => 0,
                DeleteDecision::Defer {
                    grace_period_seconds,
                } => grace_period_seconds.max(0),
            };
            {
                let m = marked.metadata_mut();
                let shorter = m
                    .deletion_grace_period_seconds
                    .is_none_or(|current| grace_seconds < current);
                if m.deletion_timestamp.is_empty() || shorter {
                    m.deletion_timestamp = rfc3339_in(grace_seconds);
                    m.deletion_grace_period_seconds = Some(grace_seconds);
                }
            }
            Strategy::default(&mut marked);
            if marked == obj || opts.dry_run {
                return Ok(marked);
            }
            match self
                .store
                .update(&key, encode_for_store(&mut marked), kv.mod_revision)
                .await
            {
                Ok(kv) => {
                    debug!(
                        resource = info.plural,
                        namespace, name, grace_seconds, "marked for deletion"
                    );
                    return Ok(with_revision(marked, kv.mod_revision));
                }
                Err(StoreError::Conflict { .. }) if precondition_rv.is_none() => continue,
                Err(StoreError::Conflict { .. }) => return Err(ApiError::modified(info, name)),
                Err(StoreError::NotFound { .. }) => return Err(ApiError::not_found(info, name)),
                Err(e) => return Err(ApiError::from_store(e)),
            }
        }
        Err(ApiError::modified(info, name))
    }

    /// The binding subresource: read, let the strategy bind, validate, CAS; retried on
    /// conflicts as long as the strategy still accepts (e.g. the pod is still unbound).
    pub(crate) async fn bind_object(
        &self,
        req_ns: &str,
        binding: Binding,
        opts: WriteOptions,
    ) -> Result<Written<T>, ApiError> {
        let info = self.info();
        let meta = binding.metadata.clone().unwrap_or_default();
        if meta.name.is_empty() {
            return Err(ApiError::Invalid {
                kind: "Binding".into(),
                name: String::new(),
                errors: vec![FieldError::required("metadata.name", "")],
            });
        }
        let namespace = match (req_ns, meta.namespace.as_str()) {
            (r, o) if !r.is_empty() && !o.is_empty() && r != o => {
                return Err(ApiError::BadRequest(format!(
                    "the namespace of the binding ({o:?}) does not match the namespace sent on \
                     the request ({r:?})"
                )));
            }
            ("", o) => o,
            (r, _) => r,
        };
        let namespace = self.read_namespace(namespace)?;
        let name = meta.name.as_str();
        let key = self.key(namespace, name);
        for _ in 0..RETRIES {
            let (kv, obj) = self.read(&key, name).await?;
            if !meta.uid.is_empty() && obj.metadata().is_some_and(|m| m.uid != meta.uid) {
                return Err(ApiError::Conflict(format!(
                    "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                    meta.uid,
                    obj.metadata().map(|m| m.uid.as_str()).unwrap_or("")
                )));
            }
            let mut bound = obj.clone();
            bound.bind(&binding, &now_rfc3339())?;
            if !bound.spec_eq(&obj) {
                let m = bound.metadata_mut();
                m.generation += 1;
            }
            let mut errors = Vec::new();
            if let Some(m) = bound.metadata() {
                check_object_meta(&mut errors, m, T::NAME_RULE, false);
            }
            errors.extend(bound.validate());
            if !errors.is_empty() {
                return Err(self.invalid(name, errors));
            }
            let req = self.admission_request(
                Operation::Update,
                "binding",
                namespace,
                name,
                Some(&obj),
                &opts,
            );
            self.admission
                .validate(&req, &bound)
                .await
                .map_err(|r| opts.refused(r))?;
            let revision = kv.mod_revision;
            match self
                .put(&key, bound, |bytes| {
                    self.store.update(&key, bytes, revision)
                })
                .await
            {
                Ok(stored) => return Ok(Written::Stored(stored)),
                Err((_, StoreError::Conflict { .. })) => continue,
                Err((_, StoreError::NotFound { .. })) => {
                    return Err(ApiError::not_found(info, name));
                }
                Err((_, e)) => return Err(ApiError::from_store(e)),
            }
        }
        Err(ApiError::modified(info, name))
    }

    /// A client watch served from the watch cache.
    pub async fn watch_objects(&self, req: &WatchRequest) -> Result<WatchReceiver, ApiError> {
        let filter = parse_filter::<T>(
            self.kind.as_ref(),
            &req.namespace,
            &req.label_selector,
            &req.field_selector,
        )?;
        let start =
            match req.resource_version.as_str() {
                "" | "0" => WatchStart::Snapshot,
                rv => WatchStart::After(parse_revision(rv).ok_or_else(|| {
                    ApiError::BadRequest(format!("invalid resourceVersion {rv:?}"))
                })?),
            };
        self.cache.watch(start, filter).await
    }
}

/// A handler owns its watch cache: dropping it (e.g. when starting the registry failed
/// half-way) stops the cache's feeder task.
impl<T: Strategy> Drop for Handler<T> {
    fn drop(&mut self) {
        self.cache.stop();
    }
}

#[async_trait]
impl<T: Strategy> ResourceHandler for Handler<T> {
    fn info(&self) -> &'static KindInfo {
        self.kind.info()
    }

    fn codec(&self) -> Arc<dyn DynKind> {
        Arc::clone(&self.kind) as Arc<dyn DynKind>
    }

    async fn create(
        &self,
        namespace: &str,
        object: Encoded,
        opts: WriteOptions,
    ) -> Result<Vec<u8>, ApiError> {
        let obj = decode_object::<T>(self.kind.as_ref(), object)?;
        Ok(self.create_object(namespace, obj, opts).await?.encode())
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Vec<u8>, ApiError> {
        Ok(self.get_object(namespace, name).await?.encode())
    }

    async fn list(&self, req: &ListRequest, at: Option<i64>) -> Result<ListResponse, ApiError> {
        let (items, revision) = self.list_objects(req, at).await?;
        Ok(ListResponse {
            items: items.iter().map(Object::encode).collect(),
            resource_version: revision.to_string(),
        })
    }

    async fn update(
        &self,
        namespace: &str,
        object: Encoded,
        subresource: &str,
        opts: WriteOptions,
    ) -> Result<Vec<u8>, ApiError> {
        let obj = decode_object::<T>(self.kind.as_ref(), object)?;
        Ok(self
            .update_object(namespace, obj, subresource, opts)
            .await?
            .encode())
    }

    async fn delete(&self, req: &DeleteRequest, opts: WriteOptions) -> Result<Vec<u8>, ApiError> {
        Ok(self.delete_object(req, opts).await?.encode())
    }

    async fn watch(&self, req: &WatchRequest) -> Result<WatchReceiver, ApiError> {
        self.watch_objects(req).await
    }

    async fn bind(
        &self,
        namespace: &str,
        binding: &[u8],
        opts: WriteOptions,
    ) -> Result<Vec<u8>, ApiError> {
        let binding = decode_request::<Binding>(binding, "Binding")?;
        Ok(self.bind_object(namespace, binding, opts).await?.encode())
    }

    fn store_watches(&self) -> u64 {
        self.cache.store_watches()
    }

    fn stop(&self) {
        self.cache.stop();
    }
}

/// A served custom kind: its handler and the definition it was made from.
struct Installed {
    kind: CustomKind,
    handler: Arc<dyn ResourceHandler>,
    /// The definition's uid and generation the handler reflects.
    source: (String, i64),
}

/// Every served resource type: the typed kinds by plural name, fixed at start, and the
/// custom kinds by (group, plural), installed and removed as their definitions come and go.
pub struct Registry {
    handlers: BTreeMap<&'static str, Arc<dyn ResourceHandler>>,
    custom: std::sync::RwLock<BTreeMap<(String, String), Installed>>,
    /// The store itself, for what is not per kind (snapshots).
    store: Arc<dyn Store>,
    cache_capacity: usize,
    admission: Arc<dyn Admit>,
    custom_prefixes: CustomPrefixes,
    /// Conversion webhooks' client, shared by every request.
    converter: Arc<crate::conversion::Converter>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("resources", &self.handlers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    /// Starts a handler (and its watch cache) for every type in [`skiff_api::kinds`].
    pub(crate) async fn start(
        store: Arc<dyn Store>,
        cache_capacity: usize,
        admission: Arc<dyn Admit>,
    ) -> Result<Self, StoreError> {
        struct Shared {
            store: Arc<dyn Store>,
            capacity: usize,
            admission: Arc<dyn Admit>,
            custom_prefixes: CustomPrefixes,
        }
        async fn add<T: Strategy>(
            handlers: &mut BTreeMap<&'static str, Arc<dyn ResourceHandler>>,
            shared: &Shared,
        ) -> Result<(), StoreError>
        where
            T::Kind: Default,
        {
            let handler = Handler::<T>::start(
                Arc::new(T::Kind::default()),
                Arc::clone(&shared.store),
                shared.capacity,
                Arc::clone(&shared.admission),
                Arc::clone(&shared.custom_prefixes),
            )
            .await?;
            handlers.insert(handler.info().plural, Arc::new(handler));
            Ok(())
        }
        let custom_prefixes = CustomPrefixes::default();
        let shared = Shared {
            store: Arc::clone(&store),
            capacity: cache_capacity,
            admission: Arc::clone(&admission),
            custom_prefixes: Arc::clone(&custom_prefixes),
        };
        let mut handlers = BTreeMap::new();
        let h = &mut handlers;
        // The one list of typed kinds; `missing_kinds` checks it against skiff_api::kinds().
        add::<Namespace>(h, &shared).await?;
        add::<Node>(h, &shared).await?;
        add::<Pod>(h, &shared).await?;
        add::<Service>(h, &shared).await?;
        add::<Endpoints>(h, &shared).await?;
        add::<ConfigMap>(h, &shared).await?;
        add::<Secret>(h, &shared).await?;
        add::<ServiceAccount>(h, &shared).await?;
        add::<CertificateSigningRequest>(h, &shared).await?;
        add::<Event>(h, &shared).await?;
        add::<ReplicaSet>(h, &shared).await?;
        add::<ReplicationController>(h, &shared).await?;
        add::<Deployment>(h, &shared).await?;
        add::<DaemonSet>(h, &shared).await?;
        add::<StatefulSet>(h, &shared).await?;
        add::<PodDisruptionBudget>(h, &shared).await?;
        add::<Job>(h, &shared).await?;
        add::<CronJob>(h, &shared).await?;
        add::<HorizontalPodAutoscaler>(h, &shared).await?;
        add::<NetworkPolicy>(h, &shared).await?;
        add::<PersistentVolume>(h, &shared).await?;
        add::<PersistentVolumeClaim>(h, &shared).await?;
        add::<StorageClass>(h, &shared).await?;
        add::<Lease>(h, &shared).await?;
        add::<Role>(h, &shared).await?;
        add::<ClusterRole>(h, &shared).await?;
        add::<RoleBinding>(h, &shared).await?;
        add::<ClusterRoleBinding>(h, &shared).await?;
        add::<LoadBalancerIpPool>(h, &shared).await?;
        add::<CustomResourceDefinition>(h, &shared).await?;
        add::<ValidatingWebhookConfiguration>(h, &shared).await?;
        add::<MutatingWebhookConfiguration>(h, &shared).await?;
        add::<ValidatingAdmissionPolicy>(h, &shared).await?;
        add::<ValidatingAdmissionPolicyBinding>(h, &shared).await?;
        add::<ApiService>(h, &shared).await?;
        Ok(Registry {
            handlers,
            custom: Default::default(),
            converter: Arc::new(crate::conversion::Converter::new(Arc::clone(&store))),
            store,
            cache_capacity,
            admission,
            custom_prefixes,
        })
    }

    /// The client of custom kinds' conversion webhooks.
    pub(crate) fn converter(&self) -> &Arc<crate::conversion::Converter> {
        &self.converter
    }

    /// Publishes the namespaced custom kinds' key prefixes to the handlers.
    fn refresh_custom_prefixes(&self) {
        let prefixes: Vec<String> = self
            .installed()
            .values()
            .map(|i| i.kind.info())
            .filter(|info| info.namespaced)
            .map(key_prefix)
            .collect();
        *self
            .custom_prefixes
            .write()
            .unwrap_or_else(|e| e.into_inner()) = prefixes;
    }

    fn installed(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<(String, String), Installed>> {
        self.custom.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves a custom kind (replacing the handler of an older generation of its
    /// definition, whose watchers end). A definition already served at this generation is
    /// left alone. Returns whether a handler was started.
    pub(crate) async fn install(
        &self,
        kind: CustomKind,
        generation: i64,
    ) -> Result<bool, StoreError> {
        let key = (kind.group.clone(), kind.info().plural.to_string());
        let source = (kind.crd_uid.clone(), generation);
        if self
            .installed()
            .get(&key)
            .is_some_and(|i| i.source == source)
        {
            return Ok(false);
        }
        let handler = Handler::<Unstructured>::start(
            Arc::new(kind.clone()),
            Arc::clone(&self.store),
            self.cache_capacity,
            Arc::clone(&self.admission),
            Arc::clone(&self.custom_prefixes),
        )
        .await?;
        let old = self
            .custom
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                key,
                Installed {
                    kind,
                    handler: Arc::new(handler),
                    source,
                },
            );
        if let Some(old) = old {
            old.handler.stop();
        }
        self.refresh_custom_prefixes();
        Ok(true)
    }

    /// Stops serving a custom kind.
    pub(crate) fn uninstall(&self, group: &str, plural: &str) {
        let old = self
            .custom
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(group.to_string(), plural.to_string()));
        if let Some(old) = old {
            old.handler.stop();
        }
        self.refresh_custom_prefixes();
    }

    /// The custom kind served as `resource` of `group`.
    pub fn custom_kind(&self, group: &str, resource: &str) -> Option<CustomKind> {
        self.installed()
            .get(&(group.to_string(), resource.to_string()))
            .map(|i| i.kind.clone())
    }

    /// Every served custom kind.
    pub fn custom_kinds(&self) -> Vec<CustomKind> {
        self.installed().values().map(|i| i.kind.clone()).collect()
    }

    /// The handler serving `resource` (a plural) of `group`: a typed kind's of that group,
    /// else a custom kind's (a definition never shadows a typed kind).
    pub fn resolve(&self, group: &str, resource: &str) -> Option<Arc<dyn ResourceHandler>> {
        if let Some(h) = self
            .handlers
            .get(resource)
            .filter(|h| h.info().group() == group)
        {
            return Some(Arc::clone(h));
        }
        self.installed()
            .get(&(group.to_string(), resource.to_string()))
            .map(|i| Arc::clone(&i.handler))
    }

    /// Kinds in [`skiff_api::kinds`] without a handler (empty unless the list above is
    /// stale).
    pub(crate) fn missing_kinds(&self) -> Vec<&'static str> {
        skiff_api::kinds()
            .iter()
            .map(|k| k.info().plural)
            .filter(|p| !self.handlers.contains_key(p))
            .collect()
    }

    /// The handler for a resource named by plural (or any name `find_kind` understands:
    /// `po`, `Pod`, `deployments.apps`), or a custom kind as `<plural>.<group>`.
    pub fn handler(&self, resource: &str) -> Result<Arc<dyn ResourceHandler>, ApiError> {
        if let Some(h) = self.handlers.get(resource).or_else(|| {
            skiff_api::find_kind(resource).and_then(|k| self.handlers.get(k.info().plural))
        }) {
            return Ok(Arc::clone(h));
        }
        resource
            .split_once('.')
            .and_then(|(plural, group)| {
                self.installed()
                    .get(&(group.to_string(), plural.to_string()))
                    .map(|i| Arc::clone(&i.handler))
            })
            .ok_or_else(|| ApiError::UnknownResource(resource.to_string()))
    }

    /// Every served typed kind, in the order of [`skiff_api::kinds`] (the custom ones:
    /// [`Registry::custom_kinds`]).
    pub fn infos(&self) -> Vec<&'static KindInfo> {
        skiff_api::kinds()
            .iter()
            .filter_map(|k| self.handlers.get(k.info().plural).map(|h| h.info()))
            .collect()
    }

    /// A consistent snapshot of the whole store, written to the new file `dest`
    /// ([`Store::snapshot`]).
    pub async fn snapshot(
        &self,
        dest: &std::path::Path,
    ) -> Result<skiff_store::Snapshot, StoreError> {
        self.store.snapshot(dest).await
    }

    /// Store watches opened by each type's watch cache.
    pub fn store_watches(&self) -> BTreeMap<&'static str, u64> {
        let mut all: BTreeMap<&'static str, u64> = self
            .handlers
            .iter()
            .map(|(p, h)| (*p, h.store_watches()))
            .collect();
        for i in self.installed().values() {
            *all.entry(i.kind.info().plural).or_default() += i.handler.store_watches();
        }
        all
    }

    /// Stops every watch cache (ending all watchers).
    pub fn stop(&self) {
        for h in self.handlers.values() {
            h.stop();
        }
        for i in self.installed().values() {
            i.handler.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::{KindOf, Resource};

    #[test]
    fn keys() {
        assert_eq!(object_key(&Pod::INFO, "ns", "p"), "/registry/pods/ns/p");
        assert_eq!(object_key(&Node::INFO, "", "n"), "/registry/nodes/n");
        assert_eq!(key_prefix(&Deployment::INFO), "/registry/deployments/");
    }

    #[test]
    fn generated_suffixes() {
        let s = random_suffix();
        assert_eq!(s.len(), 5);
        assert!(
            s.bytes()
                .all(|c| crate::strategy::NAME_ALPHABET.contains(&c))
        );
    }

    #[test]
    fn timestamps_are_rfc3339_seconds_utc() {
        let t = now_rfc3339();
        assert!(chrono::DateTime::parse_from_rfc3339(&t).is_ok(), "{t}");
        assert!(t.ends_with('Z') && t.len() == 20, "{t}");
    }

    #[test]
    fn field_selectors_are_checked_per_type() {
        assert!(
            parse_filter::<Pod>(
                &KindOf::default(),
                "",
                "",
                "spec.nodeName=n1,status.phase!=Failed"
            )
            .is_ok()
        );
        let err = parse_filter::<Deployment>(&KindOf::default(), "", "", "spec.nodeName=n1")
            .expect_err("unsupported");
        assert!(err.to_string().contains("spec.nodeName"), "{err}");
        assert!(parse_filter::<Pod>(&KindOf::default(), "", "a in (", "").is_err());
    }
}
