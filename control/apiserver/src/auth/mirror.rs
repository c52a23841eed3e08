//! An in-memory copy of one kind's objects, kept by listing and watching the registry in
//! process (the way kube-apiserver's RBAC and Node authorizers read informers of its own
//! loopback client): the authorizers read objects without a store round trip. It relists
//! when its watch falls too far behind and stops when the mirror is dropped.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::rpc::{ListRequest, WatchRequest};
use tracing::{debug, warn};

use crate::error::ApiError;
use crate::registry::{Registry, ResourceHandler};

/// `(namespace, name)` → object.
type Objects<T> = HashMap<(String, String), Arc<T>>;

/// A kind's objects, current as of the last watch event.
pub struct Mirror<T> {
    items: RwLock<Objects<T>>,
    /// Counts changes, for loops that wait for one ([`Mirror::changes`]).
    changes: tokio::sync::watch::Sender<u64>,
}

impl<T> std::fmt::Debug for Mirror<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror").finish_non_exhaustive()
    }
}

fn key_of<T: Resource>(o: &T) -> (String, String) {
    let m = o.metadata().cloned().unwrap_or_default();
    (m.namespace, m.name)
}

impl<T: Resource + Send + Sync + 'static> Mirror<T> {
    /// Lists the kind (so the mirror is complete when this returns) and keeps it current in
    /// a background task.
    pub async fn start(registry: &Registry) -> Result<Arc<Mirror<T>>, ApiError> {
        let handler = registry.handler(T::INFO.plural)?;
        let (items, rv) = list::<T>(handler.as_ref()).await?;
        let mirror = Arc::new(Mirror {
            items: RwLock::new(items),
            changes: tokio::sync::watch::Sender::new(0),
        });
        tokio::spawn(follow(Arc::downgrade(&mirror), handler, rv));
        Ok(mirror)
    }

    /// One object.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<T>> {
        self.items
            .read()
            .ok()?
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every object for which `keep` holds.
    pub fn filter(&self, keep: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        self.items
            .read()
            .map(|m| m.values().filter(|o| keep(o)).cloned().collect())
            .unwrap_or_default()
    }

    /// Wakes when the mirror changed (a watch event or a relist), for a loop that
    /// recomputes what depends on the objects.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn replace(&self, items: Objects<T>) {
        if let Ok(mut m) = self.items.write() {
            *m = items;
        }
        self.changes.send_modify(|n| *n += 1);
    }

    fn apply(&self, event_type: &str, obj: T) {
        let Ok(mut m) = self.items.write() else {
            return;
        };
        let key = key_of(&obj);
        if event_type == "DELETED" {
            m.remove(&key);
        } else {
            m.insert(key, Arc::new(obj));
        }
        drop(m);
        self.changes.send_modify(|n| *n += 1);
    }
}

async fn list<T: Resource>(h: &dyn ResourceHandler) -> Result<(Objects<T>, String), ApiError> {
    let listing = h.list(&ListRequest::default(), None).await?;
    let mut items = HashMap::new();
    for bytes in &listing.items {
        let obj = T::decode(bytes.as_slice())
            .map_err(|e| ApiError::Internal(format!("decoding a stored {}: {e}", T::INFO.kind)))?;
        items.insert(key_of(&obj), Arc::new(obj));
    }
    Ok((items, listing.resource_version))
}

/// Watches from `rv` for as long as the mirror lives; relists when the watch cannot resume.
async fn follow<T: Resource + Send + Sync + 'static>(
    mirror: Weak<Mirror<T>>,
    handler: Arc<dyn ResourceHandler>,
    mut rv: String,
) {
    loop {
        if mirror.strong_count() == 0 {
            return;
        }
        let req = WatchRequest {
            resource: T::INFO.plural.to_string(),
            resource_version: rv.clone(),
            ..WatchRequest::default()
        };
        let mut relist = false;
        match handler.watch(&req).await {
            Ok(mut rx) => {
                while let Some(ev) = rx.recv().await {
                    let Some(m) = mirror.upgrade() else { return };
                    match ev {
                        Ok(ev) => match T::decode(ev.object.as_slice()) {
                            Ok(obj) => {
                                m.apply(&ev.r#type, obj);
                                if !ev.resource_version.is_empty() {
                                    rv = ev.resource_version;
                                }
                            }
                            Err(e) => {
                                warn!(kind = T::INFO.kind, error = %e, "undecodable watch event")
                            }
                        },
                        Err(status) => {
                            debug!(kind = T::INFO.kind, error = %status, "authorizer watch ended");
                            relist = status.code() == tonic::Code::OutOfRange;
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                debug!(kind = T::INFO.kind, error = %e, "authorizer watch failed");
                relist = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if relist {
            match list::<T>(handler.as_ref()).await {
                Ok((items, new_rv)) => {
                    let Some(m) = mirror.upgrade() else { return };
                    m.replace(items);
                    rv = new_rv;
                }
                Err(e) => {
                    debug!(kind = T::INFO.kind, error = %e, "authorizer relist failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}
