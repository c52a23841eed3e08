//! What the generic registry, the watch cache and the store layout need of an object,
//! whatever its kind: the one trait [`Object`] that typed kinds (every
//! [`skiff_api::Resource`], through a blanket impl) and custom resources (`crate::custom`)
//! both implement.
//!
//! A kind's run-time facts travel beside its objects as [`Object::Kind`]: for a typed kind a
//! zero-sized [`KindOf`], for a custom resource its definition. The kind is the object's
//! codec too ([`DynKind`]), so the REST layer encodes and decodes any kind through it.

use skiff_api::api::ObjectMeta;
use skiff_api::{DynKind, KindOf, Resource};

/// An object the registry can store, cache, select and compare.
pub trait Object: Clone + PartialEq + Send + Sync + 'static {
    /// The kind's run-time facts and codec.
    type Kind: DynKind + 'static;

    /// Decodes the stored (or request) encoding of an object of `kind`.
    fn decode(kind: &Self::Kind, bytes: &[u8]) -> Result<Self, String>;
    /// Decodes what the kind's codec made of a request ([`skiff_api::Encoded`]).
    fn decode_encoded(kind: &Self::Kind, encoded: skiff_api::Encoded) -> Result<Self, String> {
        match encoded {
            skiff_api::Encoded::Bytes(b) => Self::decode(kind, &b),
            skiff_api::Encoded::Json(v) => Self::from_json(kind, v),
        }
    }
    /// The stored encoding.
    fn encode(&self) -> Vec<u8>;
    /// [`Object::encode`] of this object, whose resourceVersion is `revision`, given its
    /// stored encoding `stored` (the same object without a resourceVersion). Kinds whose
    /// encoding is costly derive it from `stored` rather than encode again.
    fn encode_at(&self, stored: &[u8], revision: i64) -> Vec<u8> {
        let _ = (stored, revision);
        self.encode()
    }
    fn metadata(&self) -> Option<&ObjectMeta>;
    fn metadata_mut(&mut self) -> &mut ObjectMeta;
    fn api_version(&self) -> &str;
    fn kind(&self) -> &str;
    /// Sets `apiVersion` and `kind` to the kind's (storage) version.
    fn set_type_meta(&mut self);
    /// Drops the status (no-op for kinds without one).
    fn clear_status(&mut self);
    /// Replaces this object's status with `other`'s.
    fn copy_status_from(&mut self, other: &Self);
    /// The value of a field for field selectors; `None` if the kind has no such field.
    fn field(&self, path: &str) -> Option<String>;
    /// Whether field selectors of `kind` may name `path`.
    fn selectable(kind: &Self::Kind, path: &str) -> bool;
    /// Whether two objects have the same desired state (everything but metadata, type meta
    /// and status); `generation` is bumped when not.
    fn spec_eq(&self, other: &Self) -> bool;
    /// The object as Kubernetes' JSON (what admission webhooks are sent).
    fn to_json(&self) -> serde_json::Value;
    /// An object from Kubernetes' JSON, decoded as a request body of `kind` is (what a
    /// mutating webhook's patch made of it).
    fn from_json(kind: &Self::Kind, value: serde_json::Value) -> Result<Self, String>;

    fn name(&self) -> &str {
        self.metadata().map(|m| m.name.as_str()).unwrap_or("")
    }

    fn namespace(&self) -> &str {
        self.metadata().map(|m| m.namespace.as_str()).unwrap_or("")
    }

    fn resource_version(&self) -> &str {
        self.metadata()
            .map(|m| m.resource_version.as_str())
            .unwrap_or("")
    }
}

impl<T: Resource> Object for T {
    type Kind = KindOf<T>;

    fn decode(_kind: &KindOf<T>, bytes: &[u8]) -> Result<Self, String> {
        <T as prost::Message>::decode(bytes).map_err(|e| e.to_string())
    }
    fn encode(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(self)
    }
    fn metadata(&self) -> Option<&ObjectMeta> {
        Resource::metadata(self)
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        Resource::metadata_mut(self)
    }
    fn api_version(&self) -> &str {
        Resource::api_version(self)
    }
    fn kind(&self) -> &str {
        Resource::kind(self)
    }
    fn set_type_meta(&mut self) {
        Resource::set_type_meta(self);
    }
    fn clear_status(&mut self) {
        Resource::clear_status(self);
    }
    fn copy_status_from(&mut self, other: &Self) {
        Resource::copy_status_from(self, other);
    }
    fn field(&self, path: &str) -> Option<String> {
        Resource::field(self, path)
    }
    fn selectable(_kind: &KindOf<T>, path: &str) -> bool {
        Resource::field(&T::default(), path).is_some()
    }
    fn spec_eq(&self, other: &Self) -> bool {
        Resource::spec_eq(self, other)
    }
    fn to_json(&self) -> serde_json::Value {
        Resource::to_json(self)
    }
    fn from_json(_kind: &KindOf<T>, value: serde_json::Value) -> Result<Self, String> {
        skiff_api::manifest::decode::<T>(value).map_err(|e| e.to_string())
    }
}
