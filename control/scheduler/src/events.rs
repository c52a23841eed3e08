//! Events about pods (`Scheduled`, `FailedScheduling`), as Kubernetes' event recorder writes
//! them: a repeat of the same event for the same pod bumps `count` and `lastTimestamp` of the
//! existing Event instead of creating another.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{SecondsFormat, Utc};
use skiff_api::Resource;
use skiff_api::api::{Event, EventSource, ObjectMeta, ObjectReference, Pod};
use skiff_client::{Client, ClientError};

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// Most (pod, reason, message) entries remembered for aggregation.
const MAX_REMEMBERED: usize = 4096;

type EventKey = (String, String, String);

/// Writes Events for one component.
#[derive(Debug)]
pub struct EventRecorder {
    client: Client,
    component: String,
    instance: String,
    recent: Mutex<HashMap<EventKey, Event>>,
}

impl EventRecorder {
    /// `component` is the source (`default-scheduler`); `instance` tells replicas apart.
    pub fn new(client: Client, component: &str, instance: &str) -> EventRecorder {
        EventRecorder {
            client,
            component: component.to_string(),
            instance: instance.to_string(),
            recent: Mutex::new(HashMap::new()),
        }
    }

    fn remembered(&self, key: &EventKey) -> Option<Event> {
        self.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    fn remember(&self, key: EventKey, event: Event) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() >= MAX_REMEMBERED {
            recent.clear();
        }
        recent.insert(key, event);
    }

    /// Records an event about `pod`. `kind` is [`NORMAL`] or [`WARNING`].
    pub async fn pod_event(
        &self,
        pod: &Pod,
        kind: &str,
        reason: &str,
        action: &str,
        message: &str,
    ) -> Result<(), ClientError> {
        let meta = pod.metadata.clone().unwrap_or_default();
        let api = self.client.namespaced::<Event>(&meta.namespace);
        let key = (meta.uid.clone(), reason.to_string(), message.to_string());
        let now = Utc::now();
        let stamp = now.to_rfc3339_opts(SecondsFormat::Secs, true);
        if let Some(mut previous) = self.remembered(&key) {
            previous.count += 1;
            previous.last_timestamp = stamp.clone();
            match api.update(&previous).await {
                Ok(updated) => {
                    self.remember(key, updated);
                    return Ok(());
                }
                // Gone (expired, deleted) or changed by someone else: write a new one.
                Err(e) if e.is_not_found() || e.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        let event = Event {
            api_version: "v1".into(),
            kind: "Event".into(),
            metadata: Some(ObjectMeta {
                name: format!(
                    "{}.{:x}",
                    meta.name,
                    now.timestamp_nanos_opt().unwrap_or_default()
                ),
                namespace: meta.namespace.clone(),
                ..Default::default()
            }),
            involved_object: Some(ObjectReference {
                kind: "Pod".into(),
                namespace: meta.namespace.clone(),
                name: meta.name.clone(),
                uid: meta.uid.clone(),
                api_version: "v1".into(),
                resource_version: meta.resource_version.clone(),
                ..Default::default()
            }),
            reason: reason.into(),
            message: message.into(),
            source: Some(EventSource {
                component: self.component.clone(),
                ..Default::default()
            }),
            first_timestamp: stamp.clone(),
            last_timestamp: stamp,
            count: 1,
            r#type: kind.into(),
            event_time: now.to_rfc3339_opts(SecondsFormat::Micros, true),
            action: action.into(),
            reporting_component: self.component.clone(),
            reporting_instance: self.instance.clone(),
        };
        let created = api.create(&event).await?;
        tracing::debug!(pod = %pod.name(), reason, message, "event recorded");
        self.remember(key, created);
        Ok(())
    }
}
