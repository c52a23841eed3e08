//! The definitions loop: the API server serves each CustomResourceDefinition's kind while
//! the definition lives, as kube-apiserver's apiextensions controllers do (naming,
//! establishing, finalizing).
//!
//! Level-triggered over the definitions' watch (through the registry's own handler, as the
//! authorizer's mirrors read theirs): for each definition
//! - **names**: its plural, singular, short names, kind and list kind must not be taken by
//!   another definition of its group (by their accepted names) nor by a typed kind of that
//!   group; the status gets `acceptedNames` and `NamesAccepted` (True `NoConflicts`, or False
//!   with `PluralConflict`, `SingularConflict`, `ShortNamesConflict`, `KindConflict` or
//!   `ListKindConflict`: `"x" is already in use`);
//! - **established**: once its names are accepted, the registry starts a handler (and watch
//!   cache) for its kind ([`Registry::install`]; a new generation of the definition gets a
//!   new handler) and the status says `Established` True `InitialNamesAccepted`;
//! - **finalizing**: a definition being deleted (the delete added the cleanup finalizer)
//!   has every object of its kind deleted; once none is left, the handler stops and the
//!   finalizer is removed, which lets the store drop the definition.
//!
//! The ClusterRole `system:controller:custom-kinds` follows the served custom kinds, so the
//! controller manager may empty namespaces of them and collect their garbage, and reach no
//! other custom kind.
//!
//! Every API server runs this loop; their writes are compare-and-swap, so two servers
//! converge on the same status. Before the server serves, [`start`] installs the kinds of
//! every established definition, so a restart never answers 404 for a custom kind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use skiff_api::Resource;
use skiff_api::api::{
    ClusterRole, Condition, CustomResourceDefinition, CustomResourceDefinitionNames,
};
use skiff_api::rpc::{DeleteRequest, ListRequest, WatchRequest};
use tracing::{debug, info, warn};

use crate::auth::policy::{CUSTOM_KINDS_ROLE, custom_kind_rules};
use crate::custom::CustomKind;
use crate::error::ApiError;
use crate::registry::{Registry, ResourceHandler, WriteOptions};
use crate::strategy::apiextensions::{CLEANUP_FINALIZER, condition_true, set_condition};

/// How soon a definition whose objects are still going away is looked at again.
const FINALIZE_RETRY: Duration = Duration::from_millis(300);

fn name_of(crd: &CustomResourceDefinition) -> String {
    crd.metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default()
}

/// Installs the kinds of established definitions, then follows the definitions in a
/// background task (ended by the registry's stop, which ends the watch).
pub(crate) async fn start(registry: &Arc<Registry>) -> Result<(), ApiError> {
    let handler = registry.handler(CustomResourceDefinition::INFO.plural)?;
    let listing = handler
        .list(
            &ListRequest {
                resource: CustomResourceDefinition::INFO.plural.into(),
                ..Default::default()
            },
            None,
        )
        .await?;
    for bytes in &listing.items {
        let crd = CustomResourceDefinition::decode(bytes.as_slice())
            .map_err(|e| ApiError::Internal(format!("decoding a definition: {e}")))?;
        if condition_true(&crd, "Established")
            && crd
                .metadata
                .as_ref()
                .is_some_and(|m| m.deletion_timestamp.is_empty())
            && let Some(kind) = CustomKind::from_crd(&crd)
        {
            let generation = crd.metadata.as_ref().map_or(0, |m| m.generation);
            registry
                .install(kind, generation)
                .await
                .map_err(ApiError::from_store)?;
        }
    }
    sync_role(registry).await?;
    tokio::spawn(follow(Arc::downgrade(registry), handler));
    Ok(())
}

/// Writes [`CUSTOM_KINDS_ROLE`]'s rules for the custom kinds now served.
async fn sync_role(registry: &Registry) -> Result<(), ApiError> {
    let mut kinds: Vec<(String, String)> = registry
        .custom_kinds()
        .iter()
        .map(|k| (k.group.clone(), k.info().plural.to_string()))
        .collect();
    kinds.sort();
    let rules = custom_kind_rules(&kinds);
    let roles = registry.handler(ClusterRole::INFO.plural)?;
    for _ in 0..5 {
        let mut role = match roles.get("", CUSTOM_KINDS_ROLE).await {
            Ok(bytes) => ClusterRole::decode(bytes.as_slice())
                .map_err(|e| ApiError::Internal(format!("decoding a ClusterRole: {e}")))?,
            // Bootstrap makes it; someone deleted it since: leave it gone.
            Err(ApiError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        if role.rules == rules {
            return Ok(());
        }
        role.rules = rules.clone();
        match roles
            .update(
                "",
                skiff_api::Encoded::proto(&role),
                "",
                WriteOptions::default(),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(ApiError::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Follows the definitions' watch, reconciling each change (and, after a definition goes,
/// the others of its group, whose names may now be free).
async fn follow(registry: std::sync::Weak<Registry>, handler: Arc<dyn ResourceHandler>) {
    loop {
        // Every watch starts from a snapshot, so `known` is complete.
        let request = WatchRequest {
            resource: CustomResourceDefinition::INFO.plural.into(),
            ..Default::default()
        };
        let mut known: BTreeMap<String, CustomResourceDefinition> = BTreeMap::new();
        match handler.watch(&request).await {
            Ok(mut events) => loop {
                let pending: Vec<String> = known
                    .values()
                    .filter(|c| needs_attention(c))
                    .map(name_of)
                    .collect();
                let next = if pending.is_empty() {
                    events.recv().await
                } else {
                    match tokio::time::timeout(FINALIZE_RETRY, events.recv()).await {
                        Ok(ev) => ev,
                        Err(_) => {
                            let Some(reg) = registry.upgrade() else {
                                return;
                            };
                            for name in pending {
                                if let Some(crd) = known.get(&name).cloned() {
                                    reconcile(&reg, handler.as_ref(), &known, crd).await;
                                }
                            }
                            continue;
                        }
                    }
                };
                // The watch ended: the cache is stopping, or this watcher fell behind.
                let Some(Ok(ev)) = next else {
                    break;
                };
                let Ok(crd) = CustomResourceDefinition::decode(ev.object.as_slice()) else {
                    continue;
                };
                let Some(reg) = registry.upgrade() else {
                    return;
                };
                if ev.r#type == "DELETED" {
                    forget(&reg, handler.as_ref(), &mut known, &crd).await;
                } else {
                    known.insert(name_of(&crd), crd.clone());
                    reconcile(&reg, handler.as_ref(), &known, crd).await;
                }
            },
            Err(e) => debug!(error = %e, "definitions watch failed"),
        }
        if registry.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(FINALIZE_RETRY).await;
    }
}

/// A definition is gone: its kind stops being served (unless another definition serves the
/// same names), and the others of its group may now take the names it held.
async fn forget(
    registry: &Arc<Registry>,
    handler: &dyn ResourceHandler,
    known: &mut BTreeMap<String, CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
) {
    known.remove(&name_of(crd));
    let Some(group) = crd.spec.as_ref().map(|s| s.group.clone()) else {
        return;
    };
    let plural = accepted(crd).plural;
    if !plural.is_empty()
        && !known.values().any(|c| {
            c.spec.as_ref().is_some_and(|s| s.group == group) && accepted(c).plural == plural
        })
    {
        registry.uninstall(&group, &plural);
        if let Err(e) = sync_role(registry).await {
            warn!(error = %e, "updating the custom kinds' role failed");
        }
    }
    for other in group_members(known, &group) {
        reconcile(registry, handler, known, other).await;
    }
}

fn group_members(
    known: &BTreeMap<String, CustomResourceDefinition>,
    group: &str,
) -> Vec<CustomResourceDefinition> {
    known
        .values()
        .filter(|c| c.spec.as_ref().is_some_and(|s| s.group == group))
        .cloned()
        .collect()
}

/// Whether a definition still needs work without a new event: being finalized, or not yet
/// established though its names are accepted.
fn needs_attention(crd: &CustomResourceDefinition) -> bool {
    let deleting = crd.metadata.as_ref().is_some_and(|m| {
        !m.deletion_timestamp.is_empty() && m.finalizers.iter().any(|f| f == CLEANUP_FINALIZER)
    });
    deleting || (condition_true(crd, "NamesAccepted") && !condition_true(crd, "Established"))
}

fn accepted(crd: &CustomResourceDefinition) -> CustomResourceDefinitionNames {
    crd.status
        .as_ref()
        .and_then(|s| s.accepted_names.clone())
        .unwrap_or_default()
}

/// The names and the NamesAccepted condition a definition gets, given the others.
fn names_and_condition(
    crd: &CustomResourceDefinition,
    known: &BTreeMap<String, CustomResourceDefinition>,
) -> (CustomResourceDefinitionNames, Condition) {
    let spec = crd.spec.clone().unwrap_or_default();
    let requested = spec.names.clone().unwrap_or_default();
    let old = accepted(crd);
    let me = name_of(crd);
    let mut resources: Vec<String> = Vec::new();
    let mut kinds: Vec<String> = Vec::new();
    for other in known.values() {
        if name_of(other) == me || other.spec.as_ref().is_none_or(|s| s.group != spec.group) {
            continue;
        }
        let n = accepted(other);
        resources.extend([n.plural, n.singular]);
        resources.extend(n.short_names);
        kinds.extend([n.kind, n.list_kind]);
    }
    // The typed kinds of the group hold their names too.
    for k in skiff_api::kinds() {
        let info = k.info();
        if info.group() == spec.group {
            resources.push(info.plural.to_string());
            resources.push(info.kind.to_lowercase());
            resources.extend(info.short_names.iter().map(|s| s.to_string()));
            kinds.push(info.kind.to_string());
            kinds.push(format!("{}List", info.kind));
        }
    }
    let taken = |requested: &str, accepted: &str, used: &[String]| {
        requested != accepted && used.iter().any(|u| u == requested)
    };
    let mut names = old.clone();
    let mut condition = None;
    let mut conflict = |reason: &str, value: &str| {
        condition = Some(Condition {
            r#type: "NamesAccepted".into(),
            status: "False".into(),
            reason: reason.into(),
            message: format!("{value:?} is already in use"),
            ..Default::default()
        });
    };
    if taken(&requested.plural, &old.plural, &resources) {
        conflict("PluralConflict", &requested.plural);
    } else {
        names.plural = requested.plural.clone();
    }
    if taken(&requested.singular, &old.singular, &resources) {
        conflict("SingularConflict", &requested.singular);
    } else {
        names.singular = requested.singular.clone();
    }
    if requested.short_names != old.short_names {
        match requested
            .short_names
            .iter()
            .find(|s| !old.short_names.contains(s) && resources.contains(s))
        {
            Some(s) => conflict("ShortNamesConflict", s),
            None => names.short_names = requested.short_names.clone(),
        }
    }
    if taken(&requested.kind, &old.kind, &kinds) {
        conflict("KindConflict", &requested.kind);
    } else {
        names.kind = requested.kind.clone();
    }
    if taken(&requested.list_kind, &old.list_kind, &kinds) {
        conflict("ListKindConflict", &requested.list_kind);
    } else {
        names.list_kind = requested.list_kind.clone();
    }
    names.categories = requested.categories.clone();
    let condition = condition.unwrap_or_else(|| Condition {
        r#type: "NamesAccepted".into(),
        status: "True".into(),
        reason: "NoConflicts".into(),
        message: "no conflicts found".into(),
        ..Default::default()
    });
    (names, condition)
}

/// Brings one definition's kind and status to what it says.
async fn reconcile(
    registry: &Arc<Registry>,
    handler: &dyn ResourceHandler,
    known: &BTreeMap<String, CustomResourceDefinition>,
    crd: CustomResourceDefinition,
) {
    let name = name_of(&crd);
    let result = if crd
        .metadata
        .as_ref()
        .is_some_and(|m| !m.deletion_timestamp.is_empty())
    {
        finalize(registry, handler, &crd).await
    } else {
        establish(registry, handler, known, &crd).await
    };
    match result {
        Ok(()) => {}
        // Someone else wrote it first; the watch brings the new state.
        Err(ApiError::Conflict(_) | ApiError::NotFound { .. }) => {}
        Err(e) => warn!(definition = name, error = %e, "reconciling a definition failed"),
    }
}

async fn write_status(
    handler: &dyn ResourceHandler,
    crd: &CustomResourceDefinition,
) -> Result<(), ApiError> {
    handler
        .update(
            "",
            skiff_api::Encoded::proto(crd),
            "status",
            WriteOptions::default(),
        )
        .await
        .map(|_| ())
}

async fn establish(
    registry: &Arc<Registry>,
    handler: &dyn ResourceHandler,
    known: &BTreeMap<String, CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
) -> Result<(), ApiError> {
    let (names, naming) = names_and_condition(crd, known);
    let mut next = crd.clone();
    let status = next.status.get_or_insert_with(Default::default);
    status.accepted_names = Some(names);
    let accepted = naming.status == "True";
    set_condition(status, naming);
    if accepted {
        if let Some(kind) = CustomKind::from_crd(&next) {
            let generation = crd.metadata.as_ref().map_or(0, |m| m.generation);
            if registry
                .install(kind, generation)
                .await
                .map_err(ApiError::from_store)?
            {
                info!(definition = name_of(crd), generation, "serving custom kind");
                sync_role(registry).await?;
            }
            set_condition(
                next.status.get_or_insert_with(Default::default),
                Condition {
                    r#type: "Established".into(),
                    status: "True".into(),
                    reason: "InitialNamesAccepted".into(),
                    message: "the initial names have been accepted".into(),
                    ..Default::default()
                },
            );
        }
    } else if !condition_true(crd, "Established") {
        set_condition(
            next.status.get_or_insert_with(Default::default),
            Condition {
                r#type: "Established".into(),
                status: "False".into(),
                reason: "NotAccepted".into(),
                message: "not all names are accepted".into(),
                ..Default::default()
            },
        );
    }
    if next.status != crd.status {
        write_status(handler, &next).await?;
    }
    Ok(())
}

/// Deletes the kind's objects; once none is left, stops serving the kind and removes the
/// cleanup finalizer.
async fn finalize(
    registry: &Arc<Registry>,
    handler: &dyn ResourceHandler,
    crd: &CustomResourceDefinition,
) -> Result<(), ApiError> {
    let meta = crd.metadata.clone().unwrap_or_default();
    if !meta.finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
        return Ok(());
    }
    let spec = crd.spec.clone().unwrap_or_default();
    let plural = accepted(crd).plural;
    if let Some(kind) = registry
        .resolve(&spec.group, &plural)
        .filter(|_| !plural.is_empty())
        && !skiff_api::is_typed(kind.info())
    {
        let listing = kind
            .list(
                &ListRequest {
                    resource: plural.clone(),
                    ..Default::default()
                },
                None,
            )
            .await?;
        if !listing.items.is_empty() {
            let mut next = crd.clone();
            set_condition(
                next.status.get_or_insert_with(Default::default),
                Condition {
                    r#type: "Terminating".into(),
                    status: "True".into(),
                    reason: "InstanceDeletionInProgress".into(),
                    message: "CustomResource deletion is in progress".into(),
                    ..Default::default()
                },
            );
            if next.status != crd.status {
                write_status(handler, &next).await?;
            }
            for item in &listing.items {
                let obj: serde_json::Value = serde_json::from_slice(item).unwrap_or_default();
                let request = DeleteRequest {
                    resource: plural.clone(),
                    namespace: obj["metadata"]["namespace"].as_str().unwrap_or("").into(),
                    name: obj["metadata"]["name"].as_str().unwrap_or("").into(),
                    ..Default::default()
                };
                match kind.delete(&request, WriteOptions::default()).await {
                    Ok(_) | Err(ApiError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(());
        }
        registry.uninstall(&spec.group, &plural);
        sync_role(registry).await?;
    }
    let mut next = crd.clone();
    if let Some(m) = next.metadata.as_mut() {
        m.finalizers.retain(|f| f != CLEANUP_FINALIZER);
    }
    handler
        .update(
            "",
            skiff_api::Encoded::proto(&next),
            "",
            WriteOptions::default(),
        )
        .await?;
    info!(definition = name_of(crd), "custom kind removed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        CustomResourceDefinitionSpec, CustomResourceDefinitionStatus, ObjectMeta,
    };

    fn crd(group: &str, plural: &str, kind: &str, accepted: bool) -> CustomResourceDefinition {
        let names = CustomResourceDefinitionNames {
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            ..Default::default()
        };
        CustomResourceDefinition {
            metadata: Some(ObjectMeta {
                name: format!("{plural}.{group}"),
                ..Default::default()
            }),
            spec: Some(CustomResourceDefinitionSpec {
                group: group.into(),
                names: Some(names.clone()),
                ..Default::default()
            }),
            status: accepted.then(|| CustomResourceDefinitionStatus {
                accepted_names: Some(names),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn known(crds: &[CustomResourceDefinition]) -> BTreeMap<String, CustomResourceDefinition> {
        crds.iter().map(|c| (name_of(c), c.clone())).collect()
    }

    #[test]
    fn fresh_names_are_accepted() {
        let a = crd("example.com", "widgets", "Widget", false);
        let (names, cond) = names_and_condition(&a, &known(std::slice::from_ref(&a)));
        assert_eq!(names.plural, "widgets");
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("True", "NoConflicts")
        );
    }

    #[test]
    fn a_kind_taken_in_the_group_is_a_conflict() {
        let a = crd("example.com", "widgets", "Widget", true);
        let b = crd("example.com", "gadgets", "Widget", false);
        let (names, cond) = names_and_condition(&b, &known(&[a, b.clone()]));
        // As in kube-apiserver, the last conflict found names the condition.
        assert_eq!(cond.status, "False");
        assert_eq!(cond.reason, "ListKindConflict");
        assert_eq!(cond.message, "\"WidgetList\" is already in use");
        assert_eq!(names.kind, "", "the conflicting kind is not accepted");
        assert_eq!(names.list_kind, "");
        assert_eq!(names.plural, "gadgets");
    }

    #[test]
    fn another_group_does_not_conflict() {
        let a = crd("example.com", "widgets", "Widget", true);
        let b = crd("other.com", "widgets", "Widget", false);
        let (_, cond) = names_and_condition(&b, &known(&[a, b.clone()]));
        assert_eq!(cond.status, "True");
    }

    #[test]
    fn a_typed_kind_of_the_group_keeps_its_names() {
        let c = crd("skiff.io", "loadbalancerippools", "Pool", false);
        let (_, cond) = names_and_condition(&c, &known(std::slice::from_ref(&c)));
        assert_eq!(cond.reason, "PluralConflict");
    }
}
