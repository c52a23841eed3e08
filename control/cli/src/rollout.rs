//! `skiff rollout status|history|undo|pause|resume|restart`: the rollout of deployments, as
//! kubectl does it for apps/v1 (undo is client-side: the old ReplicaSet's template is copied
//! back into the Deployment, and the Deployment controller re-numbers that ReplicaSet).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use chrono::{SecondsFormat, Utc};
use futures::StreamExt;
use skiff_api::Resource;
use skiff_api::api::{Deployment, ReplicaSet};
use skiff_api::wellknown::{
    CHANGE_CAUSE, NOT_COPIED_ANNOTATIONS, POD_TEMPLATE_HASH, revision_of, templates_equal,
};
use skiff_client::controller::controller_of;
use skiff_client::reflector::{Event, reflector};
use skiff_client::{Client, ListParams};

use crate::resources::{object_ref, parse_targets};
use crate::update::{self, retry_on_conflict};
use crate::{output, print_out, table};

/// The pod template annotation `rollout restart` sets (as kubectl).
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// The deployments a `rollout` command names (`deploy/web`, `deployment web api`).
pub fn deployment_names(command: &str, args: &[String]) -> Result<Vec<String>> {
    let targets = parse_targets(args)?;
    let mut names = Vec::new();
    for t in targets {
        let info = t.kind.info();
        if info.kind != "Deployment" {
            bail!(
                "rollout {command} works on deployments only, not {}",
                info.plural
            );
        }
        names.extend(t.names);
    }
    if names.is_empty() {
        bail!("you must name the deployment, e.g. `skiff rollout {command} deploy/NAME`");
    }
    Ok(names)
}

fn info() -> &'static skiff_api::KindInfo {
    &Deployment::INFO
}

/// What `rollout status` says about a Deployment, and whether the rollout is done; an error
/// when it can never finish (kubectl's `DeploymentStatusViewer`).
pub fn status_message(d: &Deployment) -> Result<(String, bool)> {
    let name = d.name();
    let generation = d.metadata().map(|m| m.generation).unwrap_or(0);
    let status = d.status.clone().unwrap_or_default();
    if generation > status.observed_generation {
        return Ok((
            "Waiting for deployment spec update to be observed...".into(),
            false,
        ));
    }
    if status
        .conditions
        .iter()
        .any(|c| c.r#type == "Progressing" && c.reason == "ProgressDeadlineExceeded")
    {
        bail!("deployment {name:?} exceeded its progress deadline");
    }
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let waiting = |what: String| {
        Ok((
            format!("Waiting for deployment {name:?} rollout to finish: {what}..."),
            false,
        ))
    };
    if status.updated_replicas < replicas {
        return waiting(format!(
            "{} out of {replicas} new replicas have been updated",
            status.updated_replicas
        ));
    }
    if status.replicas > status.updated_replicas {
        return waiting(format!(
            "{} old replicas are pending termination",
            status.replicas - status.updated_replicas
        ));
    }
    if status.available_replicas < status.updated_replicas {
        return waiting(format!(
            "{} of {} updated replicas are available",
            status.available_replicas, status.updated_replicas
        ));
    }
    Ok((format!("deployment {name:?} successfully rolled out"), true))
}

/// `skiff rollout status`: follows the Deployment through a watch (the shared reflector),
/// printing each new status line, until the rollout is done (exit 0), cannot finish or
/// `timeout` passes (an error). With `watch` false, prints the status once.
pub async fn status(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Option<Duration>,
    watch: bool,
) -> Result<ExitCode> {
    let api = client.namespaced::<Deployment>(namespace);
    // The first read names a missing deployment (or an unreachable server) at once; the
    // reflector would retry those forever.
    let first = api.get(name).await?;
    let (msg, done) = status_message(&first)?;
    print_out(&msg)?;
    if done || !watch {
        return Ok(ExitCode::SUCCESS);
    }
    let mut last = msg;
    let deadline = timeout
        .filter(|t| !t.is_zero())
        .map(|t| tokio::time::Instant::now() + t);
    let lp = ListParams::default().fields(&format!("metadata.name={name}"));
    let events = reflector(api, lp);
    tokio::pin!(events);
    loop {
        let next = match deadline {
            Some(at) => match tokio::time::timeout_at(at, events.next()).await {
                Ok(next) => next,
                Err(_) => bail!(
                    "timed out after {} waiting for deployment {name:?} rollout to finish \
                     (last status: {last})",
                    format_duration(timeout.unwrap_or_default())
                ),
            },
            None => events.next().await,
        };
        let d = match next {
            Some(Event::Restarted(items)) => items
                .into_iter()
                .find(|d| d.name() == name)
                .ok_or_else(|| anyhow!("deployment {name:?} was deleted"))?,
            Some(Event::Applied(d)) => d,
            Some(Event::Deleted(_)) => bail!("deployment {name:?} was deleted"),
            None => bail!("the watch of deployment {name:?} ended"),
        };
        let (msg, done) = status_message(&d)?;
        if msg != last {
            print_out(&msg)?;
            last = msg;
        }
        if done {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// The ReplicaSets `d` controls.
async fn replica_sets_of(client: &Client, d: &Deployment) -> Result<Vec<ReplicaSet>> {
    let uid = d.metadata().map(|m| m.uid.as_str()).unwrap_or("");
    let list = client
        .namespaced::<ReplicaSet>(d.namespace())
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the replica sets of deployment {:?}", d.name()))?;
    Ok(list
        .items
        .into_iter()
        .filter(|rs| controller_of(rs).is_some_and(|o| o.uid == uid))
        .collect())
}

/// The ReplicaSets with a revision, by revision (the newest of equal ones wins).
fn by_revision(sets: Vec<ReplicaSet>) -> BTreeMap<i64, ReplicaSet> {
    sets.into_iter()
        .map(|rs| (revision_of(&rs), rs))
        .filter(|(r, _)| *r > 0)
        .collect()
}

fn change_cause(rs: &ReplicaSet) -> &str {
    rs.metadata()
        .and_then(|m| m.annotations.get(CHANGE_CAUSE))
        .map(String::as_str)
        .filter(|c| !c.is_empty())
        .unwrap_or("<none>")
}

/// The REVISION / CHANGE-CAUSE table of `rollout history`.
pub fn history_table(sets: &BTreeMap<i64, ReplicaSet>) -> Vec<String> {
    let headers = vec!["REVISION".to_string(), "CHANGE-CAUSE".to_string()];
    let rows: Vec<Vec<String>> = sets
        .iter()
        .map(|(r, rs)| vec![r.to_string(), change_cause(rs).to_string()])
        .collect();
    table::render(&headers, &rows)
}

/// `skiff rollout history`: the revisions, or with `revision` that revision's pod template.
pub async fn history(
    client: &Client,
    namespace: &str,
    name: &str,
    revision: i64,
) -> Result<ExitCode> {
    let api = client.namespaced::<Deployment>(namespace);
    let d = api.get(name).await?;
    let sets = by_revision(replica_sets_of(client, &d).await?);
    let what = object_ref(info(), name);
    if revision > 0 {
        let rs = sets
            .get(&revision)
            .ok_or_else(|| anyhow!("{what}: unable to find revision {revision} in history"))?;
        let mut template = serde_json::to_value(
            rs.spec
                .as_ref()
                .and_then(|s| s.template.as_ref())
                .cloned()
                .unwrap_or_default(),
        )
        .context("formatting the pod template")?;
        skiff_api::serde_util::prune(&mut template);
        print_out(&format!(
            "{what} with revision #{revision}\nChange cause: {}\nPod template:\n{}",
            change_cause(rs),
            output::to_yaml(&template)?.trim_end()
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    if sets.is_empty() {
        print_out(&format!("{what}\nNo rollout history found."))?;
        return Ok(ExitCode::SUCCESS);
    }
    print_out(&format!("{what}\n{}", history_table(&sets).join("\n")))?;
    Ok(ExitCode::SUCCESS)
}

/// The ReplicaSet `undo` goes back to: revision `to` or, with 0, the one before the newest
/// (kubectl's `deploymentRevision`).
pub fn rollback_target<'a>(
    sets: &'a BTreeMap<i64, ReplicaSet>,
    to: i64,
    name: &str,
) -> Result<&'a ReplicaSet> {
    if to > 0 {
        return sets.get(&to).ok_or_else(|| {
            anyhow!("unable to find revision {to} in the history of deployment {name:?}")
        });
    }
    let mut newest_first = sets.values().rev();
    newest_first.next();
    newest_first
        .next()
        .ok_or_else(|| anyhow!("no previous revision of deployment {name:?} to roll back to"))
}

/// The Deployment with `rs`'s template (without its `pod-template-hash` label) and
/// annotations (kubectl's rollback: `d` keeps its own [`NOT_COPIED_ANNOTATIONS`], takes
/// every other annotation of `rs`, and drops the rest).
pub fn rolled_back(d: &Deployment, rs: &ReplicaSet) -> Deployment {
    let mut out = d.clone();
    let mut template = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    if let Some(m) = template.metadata.as_mut() {
        m.labels.remove(POD_TEMPLATE_HASH);
    }
    out.spec.get_or_insert_with(Default::default).template = Some(template);
    let own = d
        .metadata()
        .map(|m| m.annotations.clone())
        .unwrap_or_default();
    let mut annotations: BTreeMap<String, String> = own
        .into_iter()
        .filter(|(k, _)| NOT_COPIED_ANNOTATIONS.contains(&k.as_str()))
        .collect();
    if let Some(m) = rs.metadata() {
        annotations.extend(
            m.annotations
                .iter()
                .filter(|(k, _)| !NOT_COPIED_ANNOTATIONS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
    }
    out.metadata_mut().annotations = annotations;
    out
}

/// What a change of one deployment did, for its output line.
pub enum Change {
    Done(&'static str),
    Unchanged(String),
}

async fn undo_one(client: &Client, namespace: &str, name: &str, to: i64) -> Result<Change> {
    let api = client.namespaced::<Deployment>(namespace);
    retry_on_conflict(&object_ref(info(), name), || async {
        let d = api.get(name).await?;
        if d.spec.as_ref().is_some_and(|s| s.paused) {
            bail!(
                "deployment {name:?} is paused: you cannot roll back a paused deployment; \
                 resume it first with `skiff rollout resume deployment/{name}` and try again"
            );
        }
        let sets = by_revision(replica_sets_of(client, &d).await?);
        let rs = rollback_target(&sets, to, name)?;
        let revision = revision_of(rs);
        let current = d.spec.as_ref().and_then(|s| s.template.as_ref());
        if templates_equal(rs.spec.as_ref().and_then(|s| s.template.as_ref()), current) {
            return Ok(Change::Unchanged(format!(
                "skipped rollback (current template already matches revision {revision})"
            )));
        }
        api.update(&rolled_back(&d, rs)).await?;
        Ok(Change::Done("rolled back"))
    })
    .await
}

/// What `pause`, `resume` and `restart` do to one deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    Pause,
    Resume,
    Restart,
}

/// Applies `edit` to `d`; `Ok(None)` when there is nothing to change.
pub fn edit_deployment(d: &Deployment, edit: Edit, now: &str) -> Result<Option<Deployment>> {
    let paused = d.spec.as_ref().is_some_and(|s| s.paused);
    let mut out = d.clone();
    let spec = out.spec.get_or_insert_with(Default::default);
    match edit {
        Edit::Pause | Edit::Resume => {
            let want = edit == Edit::Pause;
            if paused == want {
                return Ok(None);
            }
            spec.paused = want;
        }
        Edit::Restart => {
            if paused {
                bail!(
                    "deployment {:?} is paused: cannot restart a paused deployment (run \
                     `skiff rollout resume` first)",
                    d.name()
                );
            }
            spec.template
                .get_or_insert_with(Default::default)
                .metadata
                .get_or_insert_with(Default::default)
                .annotations
                .insert(RESTARTED_AT.into(), now.into());
        }
    }
    Ok(Some(out))
}

async fn edit_one(client: &Client, namespace: &str, name: &str, edit: Edit) -> Result<Change> {
    let api = client.namespaced::<Deployment>(namespace);
    retry_on_conflict(&object_ref(info(), name), || async {
        let d = api.get(name).await?;
        let now = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
        let (done, already) = match edit {
            Edit::Pause => ("paused", "already paused"),
            Edit::Resume => ("resumed", "already resumed"),
            Edit::Restart => ("restarted", "restarted"),
        };
        match edit_deployment(&d, edit, &now)? {
            None => Ok(Change::Unchanged(already.to_string())),
            Some(updated) => {
                api.update(&updated).await?;
                Ok(Change::Done(done))
            }
        }
    })
    .await
}

/// What to do to each named deployment.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Undo { to_revision: i64 },
    Edit(Edit),
}

/// `skiff rollout undo|pause|resume|restart`: one line per deployment; a failure for one
/// does not stop the others (exit 1 at the end).
pub async fn change(
    client: &Client,
    namespace: &str,
    names: &[String],
    op: Op,
) -> Result<ExitCode> {
    let mut failed = false;
    for name in names {
        let result = match op {
            Op::Undo { to_revision } => undo_one(client, namespace, name, to_revision).await,
            Op::Edit(edit) => edit_one(client, namespace, name, edit).await,
        };
        let what = object_ref(info(), name);
        match result {
            Ok(Change::Done(verb)) => print_out(&format!("{what} {verb}"))?,
            Ok(Change::Unchanged(msg)) => print_out(&format!("{what} {msg}"))?,
            Err(e) if update::is_unreachable(&e) => return Err(e),
            Err(e) => {
                eprintln!("error: {}", update::error_line(&e, name));
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Parses a duration as kubectl's `--timeout` takes it (Go's syntax): `30s`, `5m`, `1m30s`,
/// `1.5h`, `250ms`, or `0` (no limit).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("invalid duration {s:?}: {why} (use e.g. 30s, 5m, 1m30s)");
    let text = s.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad("empty"));
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(bad("expected a number"));
        }
        let n: f64 = rest[..num_len]
            .parse()
            .map_err(|_| bad("expected a number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(bad("missing unit")),
            u => return Err(bad(&format!("unknown unit {u:?}"))),
        };
        rest = &rest[unit_len..];
        total += n * seconds;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad("out of range"))
}

/// `1m30s`, `5s`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        Condition, DeploymentSpec, DeploymentStatus, ObjectMeta, PodTemplateSpec, ReplicaSetSpec,
    };
    use skiff_api::wellknown::REVISION;

    fn deployment(generation: i64, replicas: i32, status: DeploymentStatus) -> Deployment {
        Deployment {
            metadata: Some(ObjectMeta {
                name: "web".into(),
                generation,
                ..Default::default()
            }),
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: Some(status),
            ..Default::default()
        }
    }

    fn status(observed: i64, replicas: i32, updated: i32, available: i32) -> DeploymentStatus {
        DeploymentStatus {
            observed_generation: observed,
            replicas,
            updated_replicas: updated,
            available_replicas: available,
            ..Default::default()
        }
    }

    #[test]
    fn status_messages_like_kubectl() {
        let msg = |d: &Deployment| status_message(d).unwrap();
        assert_eq!(
            msg(&deployment(2, 10, status(1, 10, 10, 10))),
            (
                "Waiting for deployment spec update to be observed...".into(),
                false
            )
        );
        assert_eq!(
            msg(&deployment(2, 10, status(2, 12, 2, 9))).0,
            "Waiting for deployment \"web\" rollout to finish: 2 out of 10 new replicas have \
             been updated..."
        );
        assert_eq!(
            msg(&deployment(2, 10, status(2, 12, 10, 9))).0,
            "Waiting for deployment \"web\" rollout to finish: 2 old replicas are pending \
             termination..."
        );
        assert_eq!(
            msg(&deployment(2, 10, status(2, 10, 10, 7))).0,
            "Waiting for deployment \"web\" rollout to finish: 7 of 10 updated replicas are \
             available..."
        );
        assert_eq!(
            msg(&deployment(2, 10, status(2, 10, 10, 10))),
            ("deployment \"web\" successfully rolled out".into(), true)
        );
        let mut stuck = status(2, 10, 3, 3);
        stuck.conditions.push(Condition {
            r#type: "Progressing".into(),
            status: "False".into(),
            reason: "ProgressDeadlineExceeded".into(),
            ..Default::default()
        });
        assert_eq!(
            status_message(&deployment(2, 10, stuck))
                .unwrap_err()
                .to_string(),
            "deployment \"web\" exceeded its progress deadline"
        );
    }

    fn rs(revision: i64, version: &str, cause: Option<&str>) -> ReplicaSet {
        let mut annotations = BTreeMap::from([(REVISION.to_string(), revision.to_string())]);
        if let Some(c) = cause {
            annotations.insert(CHANGE_CAUSE.into(), c.into());
        }
        ReplicaSet {
            metadata: Some(ObjectMeta {
                name: format!("web-{revision}"),
                annotations,
                ..Default::default()
            }),
            spec: Some(ReplicaSetSpec {
                template: Some(template(version, Some("hash-".to_string() + version))),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn template(version: &str, hash: Option<String>) -> PodTemplateSpec {
        let mut labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        if let Some(h) = hash {
            labels.insert(POD_TEMPLATE_HASH.into(), h);
        }
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels,
                annotations: BTreeMap::from([("version".to_string(), version.to_string())]),
                ..Default::default()
            }),
            spec: None,
        }
    }

    #[test]
    fn history_table_and_rollback_target() {
        let sets = by_revision(vec![
            rs(2, "v2", Some("bump to v2")),
            rs(1, "v1", None),
            rs(3, "v3", None),
        ]);
        assert_eq!(
            history_table(&sets),
            vec![
                "REVISION   CHANGE-CAUSE",
                "1          <none>",
                "2          bump to v2",
                "3          <none>",
            ]
        );
        assert_eq!(rollback_target(&sets, 0, "web").unwrap().name(), "web-2");
        assert_eq!(rollback_target(&sets, 1, "web").unwrap().name(), "web-1");
        assert_eq!(
            rollback_target(&sets, 7, "web").unwrap_err().to_string(),
            "unable to find revision 7 in the history of deployment \"web\""
        );
        let one = by_revision(vec![rs(1, "v1", None)]);
        assert_eq!(
            rollback_target(&one, 0, "web").unwrap_err().to_string(),
            "no previous revision of deployment \"web\" to roll back to"
        );
    }

    #[test]
    fn rollback_takes_template_and_annotations_of_the_revision() {
        let mut d = deployment(3, 2, DeploymentStatus::default());
        d.spec.as_mut().unwrap().template = Some(template("v2", None));
        d.metadata.as_mut().unwrap().annotations = BTreeMap::from([
            (REVISION.to_string(), "2".to_string()),
            (CHANGE_CAUSE.to_string(), "bump to v2".to_string()),
            (
                "skiff.io/last-applied-configuration".to_string(),
                "{}".to_string(),
            ),
        ]);
        let back = rolled_back(&d, &rs(1, "v1", Some("first")));
        assert_eq!(
            back.spec.as_ref().unwrap().template,
            Some(template("v1", None)),
            "the template of revision 1, without its pod-template-hash"
        );
        let a = &back.metadata.as_ref().unwrap().annotations;
        assert_eq!(a[REVISION], "2", "the deployment's own revision stays");
        assert_eq!(a[CHANGE_CAUSE], "first");
        assert_eq!(a["skiff.io/last-applied-configuration"], "{}");
        assert_eq!(a.len(), 3, "{a:?}");
    }

    #[test]
    fn last_applied_is_never_copied() {
        assert!(NOT_COPIED_ANNOTATIONS.contains(&crate::apply::LAST_APPLIED));
    }

    #[test]
    fn pause_resume_restart() {
        let d = deployment(1, 1, DeploymentStatus::default());
        let paused = edit_deployment(&d, Edit::Pause, "t").unwrap().unwrap();
        assert!(paused.spec.as_ref().unwrap().paused);
        assert!(
            edit_deployment(&paused, Edit::Pause, "t")
                .unwrap()
                .is_none()
        );
        assert!(edit_deployment(&d, Edit::Resume, "t").unwrap().is_none());
        let resumed = edit_deployment(&paused, Edit::Resume, "t")
            .unwrap()
            .unwrap();
        assert!(!resumed.spec.as_ref().unwrap().paused);
        let restarted = edit_deployment(&d, Edit::Restart, "2024-05-01T12:00:00Z")
            .unwrap()
            .unwrap();
        let t = restarted.spec.unwrap().template.unwrap();
        assert_eq!(
            t.metadata.unwrap().annotations[RESTARTED_AT],
            "2024-05-01T12:00:00Z"
        );
        assert!(
            edit_deployment(&paused, Edit::Restart, "t")
                .unwrap_err()
                .to_string()
                .contains("cannot restart a paused deployment")
        );
    }

    #[test]
    fn durations() {
        let d = |s| parse_duration(s).unwrap();
        assert_eq!(d("0"), Duration::ZERO);
        assert_eq!(d("30s"), Duration::from_secs(30));
        assert_eq!(d("1m30s"), Duration::from_secs(90));
        assert_eq!(d("1.5h"), Duration::from_secs(5400));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert!(parse_duration("30").unwrap_err().contains("missing unit"));
        assert!(parse_duration("5x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(5)), "5s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn rollout_works_on_deployments_only() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            deployment_names("status", &args(&["deploy/web"])).unwrap(),
            vec!["web"]
        );
        assert_eq!(
            deployment_names("pause", &args(&["deployment", "a", "b"])).unwrap(),
            vec!["a", "b"]
        );
        assert_eq!(
            deployment_names("status", &args(&["rs/web"]))
                .unwrap_err()
                .to_string(),
            "rollout status works on deployments only, not replicasets"
        );
        assert!(
            deployment_names("undo", &args(&["deploy"]))
                .unwrap_err()
                .to_string()
                .starts_with("you must name the deployment")
        );
    }
}
