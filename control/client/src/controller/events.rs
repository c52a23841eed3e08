//! [`EventRecorder`]: core/v1 Events about objects ("Scaled up replica set web-5d4f to 3"),
//! with repeats of the same event aggregated into one object whose `count` goes up.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use skiff_api::Resource;
use skiff_api::api::{Event, EventSource, ObjectMeta, ObjectReference};

use super::time;
use crate::{Client, ClientError};

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(&self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What makes two events "the same" for aggregation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AggregateKey {
    namespace: String,
    kind: String,
    name: String,
    uid: String,
    event_type: EventType,
    reason: String,
    message: String,
}

/// Most distinct events remembered for aggregation (the memory is cleared beyond it).
const MAX_REMEMBERED: usize = 4096;

/// Writes Events on behalf of one component (`source.component`, `reportingComponent`) and
/// instance (`source.host`, `reportingInstance`). Cheap to clone.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    component: String,
    instance: String,
    /// The last written Event for each aggregate key.
    seen: Arc<Mutex<HashMap<AggregateKey, Event>>>,
}

impl fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// A reference to `obj` for `involvedObject`.
pub fn object_reference<T: Resource>(obj: &T) -> ObjectReference {
    let meta = obj.metadata().cloned().unwrap_or_default();
    ObjectReference {
        kind: T::INFO.kind.to_string(),
        namespace: meta.namespace,
        name: meta.name,
        uid: meta.uid,
        api_version: T::INFO.api_version.to_string(),
        resource_version: meta.resource_version,
        field_path: String::new(),
    }
}

impl EventRecorder {
    pub fn new(client: Client, component: &str, instance: &str) -> Self {
        EventRecorder {
            client,
            component: component.to_string(),
            instance: instance.to_string(),
            seen: Arc::default(),
        }
    }

    /// Records an event about `obj`; a repeat of an event this recorder wrote before bumps
    /// that event's count. Events of cluster-scoped objects go to `default`.
    pub async fn record<T: Resource>(
        &self,
        obj: &T,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> Result<Event, ClientError> {
        self.record_about(object_reference(obj), event_type, reason, message)
            .await
    }

    /// [`EventRecorder::record`] about the object `involved` names (of any kind, a custom
    /// one too).
    pub async fn record_about(
        &self,
        involved: ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> Result<Event, ClientError> {
        let namespace = if involved.namespace.is_empty() {
            "default".to_string()
        } else {
            involved.namespace.clone()
        };
        let key = AggregateKey {
            namespace: namespace.clone(),
            kind: involved.kind.clone(),
            name: involved.name.clone(),
            uid: involved.uid.clone(),
            event_type,
            reason: reason.to_string(),
            message: message.to_string(),
        };
        let now = time::now();
        let previous = self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let api = self.client.namespaced::<Event>(&namespace);
        if let Some(mut ev) = previous {
            ev.count = ev.count.saturating_add(1);
            ev.last_timestamp = now.clone();
            ev.involved_object = Some(involved.clone());
            match api.update(&ev).await {
                Ok(updated) => {
                    self.remember(key, updated.clone());
                    return Ok(updated);
                }
                // Deleted or changed by someone else: start a new one.
                Err(e) if e.is_conflict() || e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let ev = Event {
            metadata: Some(ObjectMeta {
                name: format!("{}.{nanos:x}", involved.name),
                namespace,
                ..Default::default()
            }),
            involved_object: Some(involved),
            reason: reason.to_string(),
            message: message.to_string(),
            source: Some(EventSource {
                component: self.component.clone(),
                host: self.instance.clone(),
            }),
            first_timestamp: now.clone(),
            last_timestamp: now,
            count: 1,
            r#type: event_type.as_str().to_string(),
            event_time: time::now_micros(),
            action: String::new(),
            reporting_component: self.component.clone(),
            reporting_instance: self.instance.clone(),
            ..Default::default()
        };
        let created = api.create(&ev).await?;
        self.remember(key, created.clone());
        Ok(created)
    }

    /// Like [`EventRecorder::record`] but never fails: errors are logged (an event is not
    /// worth failing a reconcile for).
    pub async fn publish<T: Resource>(
        &self,
        obj: &T,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        self.publish_about(object_reference(obj), event_type, reason, message)
            .await;
    }

    /// [`EventRecorder::publish`] about the object `involved` names.
    pub async fn publish_about(
        &self,
        involved: ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        let (kind, name) = (involved.kind.clone(), involved.name.clone());
        if let Err(e) = self
            .record_about(involved, event_type, reason, message)
            .await
        {
            tracing::warn!(%kind, %name, reason, error = %e, "could not record an event");
        }
    }

    fn remember(&self, key: AggregateKey, ev: Event) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= MAX_REMEMBERED && !seen.contains_key(&key) {
            seen.clear();
        }
        seen.insert(key, ev);
    }
}
