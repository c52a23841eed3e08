//! How objects sit in the store: one key per object under `/registry/<plural>/`
//! (`<namespace>/<name>` or `<name>`), the value the object's protobuf encoding with its type
//! meta set and its resourceVersion cleared (the store's revision is the resourceVersion).
//!
//! The registry, the watch cache, admission's lookups and encryption at rest all read and
//! write through these few functions, so the layout is written once.

use skiff_api::{DynKind, KindInfo, KindOf, Resource};
use skiff_store::KeyValue;

use crate::error::ApiError;
use crate::object::Object;

/// `/registry/<plural>/` for the typed kinds, `/registry/<group>/<plural>/` for custom ones
/// (whose plurals may repeat across groups), as kube-apiserver lays them out.
pub fn key_prefix(info: &KindInfo) -> String {
    if skiff_api::is_typed(info) {
        format!("/registry/{}/", info.plural)
    } else {
        format!("/registry/{}/{}/", info.group(), info.plural)
    }
}

pub(crate) fn object_key(info: &KindInfo, namespace: &str, name: &str) -> String {
    if info.namespaced {
        format!("{}{namespace}/{name}", key_prefix(info))
    } else {
        format!("{}{name}", key_prefix(info))
    }
}

/// Decodes a stored object of `kind`, setting its type meta and its resourceVersion from
/// `revision`.
pub(crate) fn decode<T: Object>(
    kind: &T::Kind,
    bytes: &[u8],
    revision: i64,
) -> Result<T, ApiError> {
    let mut obj = T::decode(kind, bytes).map_err(|e| {
        ApiError::Internal(format!("cannot decode a stored {}: {e}", kind.info().kind))
    })?;
    obj.set_type_meta();
    obj.metadata_mut().resource_version = revision.to_string();
    Ok(obj)
}

/// Decodes a stored object of a typed kind.
pub(crate) fn decode_kv<T: Resource>(kv: &KeyValue) -> Result<T, ApiError> {
    decode(&KindOf::<T>::default(), &kv.value, kv.mod_revision)
}

/// The object `name` of the typed kind `T` in `namespace`, as the store has it now.
pub(crate) async fn get<T: Resource>(
    store: &dyn skiff_store::Store,
    namespace: &str,
    name: &str,
) -> Result<Option<T>, ApiError> {
    let key = object_key(&T::INFO, namespace, name);
    match store.get(&key).await.map_err(ApiError::from_store)? {
        Some(kv) => decode_kv(&kv).map(Some),
        None => Ok(None),
    }
}

/// The stored encoding: type meta set, resourceVersion cleared.
pub(crate) fn encode_for_store<T: Object>(obj: &mut T) -> Vec<u8> {
    // The resourceVersion is put back after encoding rather than the object copied.
    obj.set_type_meta();
    let rv = std::mem::take(&mut obj.metadata_mut().resource_version);
    let bytes = obj.encode();
    obj.metadata_mut().resource_version = rv;
    bytes
}

pub(crate) fn with_revision<T: Object>(mut obj: T, revision: i64) -> T {
    obj.metadata_mut().resource_version = revision.to_string();
    obj
}
