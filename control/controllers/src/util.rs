//! Helpers the controllers share: pod state, controller references, selectors, the
//! pod-template hash, IntOrString arithmetic, conditions and time.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use prost::Message;
use skiff_api::Resource;
use skiff_api::api::{Condition, LabelSelector, OwnerReference, Pod, PodTemplateSpec};
use skiff_api::selector::Selector;
use skiff_api::wellknown::POD_TEMPLATE_HASH;

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

/// The labels of an object.
pub fn labels<T: Resource>(o: &T) -> &BTreeMap<String, String> {
    o.metadata().map(|m| &m.labels).unwrap_or(&EMPTY)
}

/// Whether a delete of the object has started.
pub fn is_terminating<T: Resource>(o: &T) -> bool {
    o.metadata()
        .is_some_and(|m| !m.deletion_timestamp.is_empty())
}

pub fn uid<T: Resource>(o: &T) -> &str {
    o.metadata().map(|m| m.uid.as_str()).unwrap_or("")
}

pub fn generation<T: Resource>(o: &T) -> i64 {
    o.metadata().map(|m| m.generation).unwrap_or(0)
}

pub fn annotation<'a, T: Resource>(o: &'a T, key: &str) -> Option<&'a str> {
    o.metadata()
        .and_then(|m| m.annotations.get(key))
        .map(String::as_str)
}

pub fn creation_timestamp<T: Resource>(o: &T) -> &str {
    o.metadata()
        .map(|m| m.creation_timestamp.as_str())
        .unwrap_or("")
}

/// The ownerReference a controller puts on what it creates or adopts.
pub fn controller_ref<T: Resource>(owner: &T) -> OwnerReference {
    OwnerReference {
        api_version: T::INFO.api_version.to_string(),
        kind: T::INFO.kind.to_string(),
        name: owner.name().to_string(),
        uid: uid(owner).to_string(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Converts a workload's selector; `None` or an empty one is an error (it would select
/// every pod of the namespace).
pub fn workload_selector(sel: Option<&LabelSelector>) -> Result<Selector, String> {
    let sel = sel.ok_or("the selector is missing")?;
    let parsed = Selector::from_label_selector(sel).map_err(|e| e.to_string())?;
    if parsed.is_empty() {
        return Err("the selector is empty".into());
    }
    Ok(parsed)
}

/// A pod that counts towards a workload's replicas: not finished, not being deleted.
pub fn is_pod_active(p: &Pod) -> bool {
    let phase = p.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("");
    !matches!(phase, "Succeeded" | "Failed") && !is_terminating(p)
}

fn ready_condition(p: &Pod) -> Option<&Condition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
}

/// Since when the pod has been ready (its Ready condition's lastTransitionTime).
pub fn ready_since(p: &Pod) -> Option<DateTime<Utc>> {
    ready_condition(p)
        .filter(|c| c.status == "True")
        .and_then(|c| parse_time(&c.last_transition_time))
}

/// How long until a ready pod counts as available (`Some(ZERO)`: it is available); `None`
/// for a pod that is not ready. A ready pod without a transition time counts as available.
pub fn available_in(p: &Pod, min_ready_seconds: i32, now: DateTime<Utc>) -> Option<Duration> {
    if !p.is_ready() {
        return None;
    }
    if min_ready_seconds <= 0 {
        return Some(Duration::ZERO);
    }
    let Some(since) = ready_since(p) else {
        return Some(Duration::ZERO);
    };
    let at = since + chrono::Duration::seconds(i64::from(min_ready_seconds));
    Some((at - now).to_std().unwrap_or(Duration::ZERO))
}

/// When to look again at a workload: `pending` (its expectations' deadline), or earlier
/// when one of `pods` becomes available after `min_ready_seconds` (a little after, so it is).
pub fn requeue_for_availability<'a>(
    pending: Option<std::time::Duration>,
    pods: impl IntoIterator<Item = &'a std::sync::Arc<Pod>>,
    min_ready_seconds: i32,
    now: DateTime<Utc>,
) -> Option<std::time::Duration> {
    let mut next = pending;
    if min_ready_seconds > 0 {
        for p in pods {
            if let Some(d) = available_in(p, min_ready_seconds, now).filter(|d| !d.is_zero()) {
                let d = d + std::time::Duration::from_millis(100);
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
    }
    next
}

pub fn is_pod_available(p: &Pod, min_ready_seconds: i32, now: DateTime<Utc>) -> bool {
    available_in(p, min_ready_seconds, now).is_some_and(|d| d.is_zero())
}

pub fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Sets (or adds) the condition of `cond.type`, keeping its lastTransitionTime when the
/// status does not change. Returns whether anything but times changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut cond: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.r#type == cond.r#type) {
        Some(existing) => {
            let same = existing.status == cond.status
                && existing.reason == cond.reason
                && existing.message == cond.message;
            if existing.status == cond.status && !existing.last_transition_time.is_empty() {
                cond.last_transition_time = existing.last_transition_time.clone();
            }
            if same {
                // Keep lastUpdateTime too: nothing happened.
                cond.last_update_time = existing.last_update_time.clone();
            }
            *existing = cond;
            !same
        }
        None => {
            conditions.push(cond);
            true
        }
    }
}

pub fn remove_condition(conditions: &mut Vec<Condition>, ty: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.r#type != ty);
    conditions.len() != before
}

/// Kubernetes' `rand.SafeEncodeString` alphabet (no vowels, no confusable characters).
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn fnv32a(data: &[u8], mut h: u32) -> u32 {
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The `pod-template-hash` of a template: FNV-1a over its (deterministic) protobuf encoding
/// and the collision count, encoded like Kubernetes' (digits mapped to safe characters).
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut t = template.clone();
    if let Some(m) = t.metadata.as_mut() {
        m.labels.remove(POD_TEMPLATE_HASH);
    }
    let mut h = fnv32a(&t.encode_to_vec(), 0x811c_9dc5);
    if let Some(c) = collision_count {
        h = fnv32a(&c.to_le_bytes(), h);
    }
    h.to_string()
        .bytes()
        .map(|b| char::from(SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()]))
        .collect()
}

/// Resolves an IntOrString (`"3"`, `"25%"`) against `total`: percentages round up or down.
pub fn scaled_value(value: Option<&str>, total: i32, round_up: bool) -> Result<i32, String> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(0);
    };
    match v.strip_suffix('%') {
        Some(p) => {
            let p: i64 = p.parse().map_err(|_| format!("invalid percentage {v:?}"))?;
            let scaled = p * i64::from(total);
            let n = if round_up {
                (scaled + 99).div_euclid(100)
            } else {
                scaled.div_euclid(100)
            };
            i32::try_from(n).map_err(|_| format!("{v:?} of {total} is out of range"))
        }
        None => v
            .parse()
            .map_err(|_| format!("invalid value {v:?}: want an integer or a percentage")),
    }
}

/// maxSurge and maxUnavailable of a rolling update with `replicas` replicas: surge rounds up,
/// unavailable rounds down; both 0 would block the rollout, so unavailable becomes 1 (as in
/// Kubernetes). Unavailable never exceeds `replicas`.
pub fn resolve_fenceposts(
    max_surge: Option<&str>,
    max_unavailable: Option<&str>,
    replicas: i32,
) -> Result<(i32, i32), String> {
    let surge = scaled_value(max_surge, replicas, true)?.max(0);
    let mut unavailable = scaled_value(max_unavailable, replicas, false)?.max(0);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok((surge, unavailable.min(replicas.max(0))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ObjectMeta, PodStatus};
    use skiff_api::wellknown::templates_equal;

    #[test]
    fn int_or_percent() {
        assert_eq!(scaled_value(Some("25%"), 10, true), Ok(3));
        assert_eq!(scaled_value(Some("25%"), 10, false), Ok(2));
        assert_eq!(scaled_value(Some("3"), 10, false), Ok(3));
        assert_eq!(scaled_value(Some("0%"), 10, true), Ok(0));
        assert_eq!(scaled_value(Some("100%"), 7, false), Ok(7));
        assert_eq!(scaled_value(Some("30%"), 1, true), Ok(1));
        assert_eq!(scaled_value(Some("30%"), 1, false), Ok(0));
        assert_eq!(scaled_value(None, 10, true), Ok(0));
        assert!(scaled_value(Some("x%"), 10, true).is_err());
        assert!(scaled_value(Some("abc"), 10, true).is_err());
    }

    #[test]
    fn fenceposts() {
        // Kubernetes' defaults on 10 replicas: surge 3 (2.5 up), unavailable 2 (2.5 down).
        assert_eq!(resolve_fenceposts(Some("25%"), Some("25%"), 10), Ok((3, 2)));
        // Both zero after rounding: one may be unavailable.
        assert_eq!(resolve_fenceposts(Some("0"), Some("10%"), 5), Ok((0, 1)));
        assert_eq!(resolve_fenceposts(Some("1"), Some("0"), 5), Ok((1, 0)));
        // Unavailable is capped at the replica count.
        assert_eq!(resolve_fenceposts(Some("0"), Some("10"), 3), Ok((0, 3)));
        assert_eq!(resolve_fenceposts(Some("25%"), Some("25%"), 0), Ok((0, 0)));
    }

    #[test]
    fn template_hash_ignores_its_own_label_and_tracks_collisions() {
        let mut t = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            }),
            spec: None,
        };
        let h = pod_template_hash(&t, None);
        assert!(!h.is_empty());
        assert!(h.bytes().all(|b| SAFE_ALPHABET.contains(&b)), "{h}");
        assert_ne!(h, pod_template_hash(&t, Some(1)));
        let mut labelled = t.clone();
        if let Some(m) = labelled.metadata.as_mut() {
            m.labels.insert(POD_TEMPLATE_HASH.into(), h.clone());
        }
        assert_eq!(pod_template_hash(&labelled, None), h);
        assert!(templates_equal(Some(&t), Some(&labelled)));
        if let Some(m) = t.metadata.as_mut() {
            m.labels.insert("v".into(), "2".into());
        }
        assert_ne!(pod_template_hash(&t, None), h);
        assert!(!templates_equal(Some(&t), Some(&labelled)));
    }

    #[test]
    fn availability_waits_for_min_ready_seconds() {
        let now = Utc::now();
        let pod = |ready: &str, since: DateTime<Utc>| Pod {
            status: Some(PodStatus {
                conditions: vec![Condition {
                    r#type: "Ready".into(),
                    status: ready.into(),
                    last_transition_time: format_time(since),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let p = pod("True", now - chrono::Duration::seconds(3));
        assert!(is_pod_available(&p, 0, now));
        assert!(is_pod_available(&p, 3, now));
        assert!(!is_pod_available(&p, 10, now));
        let wait = available_in(&p, 10, now).expect("ready");
        assert!(
            wait > Duration::from_secs(6) && wait <= Duration::from_secs(7),
            "{wait:?}"
        );
        assert_eq!(available_in(&pod("False", now), 0, now), None);
    }

    #[test]
    fn conditions_keep_transition_times() {
        let mut cs = Vec::new();
        let c = |status: &str, t: &str| Condition {
            r#type: "Available".into(),
            status: status.into(),
            last_transition_time: t.into(),
            last_update_time: t.into(),
            ..Default::default()
        };
        assert!(set_condition(&mut cs, c("True", "t1")));
        assert!(!set_condition(&mut cs, c("True", "t2")));
        assert_eq!(cs[0].last_transition_time, "t1");
        assert_eq!(cs[0].last_update_time, "t1");
        assert!(set_condition(&mut cs, c("False", "t3")));
        assert_eq!(cs[0].last_transition_time, "t3");
        assert!(remove_condition(&mut cs, "Available"));
        assert!(cs.is_empty());
    }
}
