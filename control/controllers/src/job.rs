//! The Job controller: runs a Job's pods to completion, as Kubernetes' `job` controller
//! does, with its TTL-after-finished deletion.
//!
//! - NonIndexed: up to `parallelism` active pods until `completions` have succeeded (without
//!   `completions`, until one has succeeded and none is active). Indexed: one pod per
//!   index `0..completions` not yet succeeded, lowest first, each with the
//!   `batch.kubernetes.io/job-completion-index` annotation and label, the hostname
//!   `<job>-<index>` and `JOB_COMPLETION_INDEX` in every container's environment.
//! - Failure: more failed pods than `backoffLimit` (restartPolicy Never), container
//!   restarts reaching it (OnFailure), `activeDeadlineSeconds` passed, or a failed pod
//!   matching a `FailJob` rule of the `podFailurePolicy` (an `Ignore` rule keeps a failure
//!   from counting) ends the Job: active pods are deleted, `FailureTarget` then `Failed`
//!   with Kubernetes' reasons (BackoffLimitExceeded, DeadlineExceeded, PodFailurePolicy) and
//!   messages. A failed pod is replaced after Kubernetes' back-off (10 s doubling per
//!   failure, at most 6 minutes).
//! - Success: `SuccessCriteriaMet` and `Complete`, `completionTime`.
//! - `suspend`: active pods are deleted and the `Suspended` condition set; resumed, pods
//!   come back.
//! - `ttlSecondsAfterFinished`: the finished Job is deleted (foreground, so its pods go
//!   first) that long after it finished.
//!
//! Counts come from the Job's pods as they are: a finished pod deleted by hand no longer
//! counts (Kubernetes tracks them with a finalizer; not built).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use skiff_api::Resource;
use skiff_api::api::{
    Condition, EnvVar, EnvVarSource, Job, JobStatus, ObjectFieldSelector, ObjectMeta, Pod,
};
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler,
};
use skiff_client::{DeleteParams, PropagationPolicy};

use crate::podcontrol::{PodControl, adopters};
use crate::util::{self, controller_ref, format_time, is_terminating, parse_time};
use crate::{Context, Error};

/// The index of an Indexed Job's pod (annotation and label).
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Kubernetes' pod failure back-off: 10 s, doubling, at most 6 minutes.
const BACKOFF_BASE: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(360);

fn phase(p: &Pod) -> &str {
    p.status.as_ref().map(|s| s.phase.as_str()).unwrap_or("")
}

/// The completion index of a pod of an Indexed Job.
pub fn pod_index(p: &Pod) -> Option<i32> {
    p.metadata
        .as_ref()?
        .annotations
        .get(COMPLETION_INDEX)?
        .parse()
        .ok()
}

/// `0-2,4,6-7`: Kubernetes' compressed form of a set of indexes.
pub fn format_indexes(indexes: &BTreeSet<i32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = indexes.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

/// What a failed pod means under the Job's podFailurePolicy: the first matching rule's
/// action and, for FailJob, Kubernetes' message. `None`: no rule matches (it counts).
pub fn failure_rule(job: &Job, pod: &Pod) -> Option<(String, String)> {
    let policy = job.spec.as_ref()?.pod_failure_policy.as_ref()?;
    let status = pod.status.as_ref()?;
    for (i, rule) in policy.rules.iter().enumerate() {
        if let Some(codes) = &rule.on_exit_codes {
            for cs in &status.container_statuses {
                let Some(t) = cs.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
                    continue;
                };
                if t.exit_code == 0 {
                    continue;
                }
                if codes
                    .container_name
                    .as_deref()
                    .is_some_and(|n| n != cs.name)
                {
                    continue;
                }
                let listed = codes.values.contains(&t.exit_code);
                if (codes.operator == "In") == listed {
                    return Some((
                        rule.action.clone(),
                        format!(
                            "Container {} for pod {}/{} failed with exit code {} matching {} rule at index {i}",
                            cs.name,
                            pod.namespace(),
                            pod.name(),
                            t.exit_code,
                            rule.action
                        ),
                    ));
                }
            }
        }
        for pattern in &rule.on_pod_conditions {
            if status
                .conditions
                .iter()
                .any(|c| c.r#type == pattern.r#type && c.status == pattern.status)
            {
                return Some((
                    rule.action.clone(),
                    format!(
                        "Pod {}/{} has condition {} matching {} rule at index {i}",
                        pod.namespace(),
                        pod.name(),
                        pattern.r#type,
                        rule.action
                    ),
                ));
            }
        }
    }
    None
}

/// When a pod finished (its containers' latest finishedAt).
fn finished_at(p: &Pod) -> Option<DateTime<Utc>> {
    p.status
        .as_ref()?
        .container_statuses
        .iter()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .filter_map(|t| parse_time(&t.finished_at))
        .max()
}

/// What one reconcile does.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct JobPlan {
    /// Pods to create: `None` for a NonIndexed pod, `Some(i)` for index `i`.
    pub create: Vec<Option<i32>>,
    /// Pods to delete, by name.
    pub delete: Vec<String>,
    /// The status to write.
    pub status: JobStatus,
    /// Events: (warning?, reason, message).
    pub events: Vec<(bool, String, String)>,
    /// When to look again (back-off, deadline).
    pub requeue: Option<Duration>,
}

fn condition(ty: &str, reason: &str, message: &str, now: DateTime<Utc>) -> Condition {
    Condition {
        r#type: ty.into(),
        status: "True".into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: format_time(now),
        last_probe_time: format_time(now),
        ..Default::default()
    }
}

fn has(status: &JobStatus, ty: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.r#type == ty && c.status == "True")
}

/// Whether the Job has finished (Complete or Failed).
pub fn is_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .is_some_and(|s| has(s, "Complete") || has(s, "Failed"))
}

/// The planner (pure): the Job's pods (owned, every phase) at `now`.
pub fn plan(job: &Job, pods: &[Arc<Pod>], now: DateTime<Utc>) -> JobPlan {
    let spec = job.spec.clone().unwrap_or_default();
    let mut status = job.status.clone().unwrap_or_default();
    let mut out = JobPlan::default();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let suspended = spec.suspend == Some(true);
    let live: Vec<&Arc<Pod>> = pods.iter().filter(|p| !is_terminating(&***p)).collect();
    let active: Vec<&Arc<Pod>> = live
        .iter()
        .copied()
        .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
        .collect();
    let succeeded: Vec<&Arc<Pod>> = pods.iter().filter(|p| phase(p) == "Succeeded").collect();
    let failed: Vec<&Arc<Pod>> = pods.iter().filter(|p| phase(p) == "Failed").collect();
    let rules: Vec<Option<(String, String)>> =
        failed.iter().map(|p| failure_rule(job, p)).collect();
    let counted_failures = rules
        .iter()
        .filter(|r| r.as_ref().is_none_or(|(a, _)| a != "Ignore"))
        .count();
    let done_indexes: BTreeSet<i32> = succeeded.iter().filter_map(|p| pod_index(p)).collect();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    status.active = count(active.len());
    status.failed = count(counted_failures);
    status.succeeded = if indexed {
        count(done_indexes.len())
    } else {
        count(succeeded.len())
    };
    status.ready = Some(count(active.iter().filter(|p| p.is_ready()).count()));
    status.terminating = Some(count(pods.iter().filter(|p| is_terminating(&***p)).count()));
    status.completed_indexes = indexed.then(|| format_indexes(&done_indexes));
    if is_finished(job) {
        out.status = status;
        return out;
    }
    if suspended {
        out.delete
            .extend(active.iter().map(|p| p.name().to_string()));
        util::set_condition(
            &mut status.conditions,
            condition("Suspended", "JobSuspended", "Job suspended", now),
        );
        out.status = status;
        return out;
    }
    if util::remove_condition(&mut status.conditions, "Suspended") {
        out.events
            .push((false, "Resumed".into(), "Job resumed".into()));
    }
    let start = status
        .start_time
        .as_deref()
        .and_then(parse_time)
        .unwrap_or(now);
    status.start_time.get_or_insert_with(|| format_time(now));

    // Failure first (a failing Job is not completed by a late success).
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let restarts: i32 = active
        .iter()
        .flat_map(|p| p.status.iter().flat_map(|s| &s.container_statuses))
        .map(|c| c.restart_count)
        .sum();
    let on_failure = spec
        .template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .is_some_and(|s| s.restart_policy == "OnFailure");
    let failure = if let Some((_, msg)) = rules
        .iter()
        .flatten()
        .find(|(action, _)| action == "FailJob")
    {
        Some(("PodFailurePolicy", msg.clone()))
    } else if status.failed > backoff_limit
        || (on_failure
            && (if backoff_limit == 0 {
                restarts > 0
            } else {
                restarts >= backoff_limit
            }))
    {
        Some((
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit".into(),
        ))
    } else if spec
        .active_deadline_seconds
        .is_some_and(|d| (now - start).num_seconds() >= d)
    {
        Some((
            "DeadlineExceeded",
            "Job was active longer than specified deadline".into(),
        ))
    } else {
        None
    };
    let failure = failure.or_else(|| {
        status
            .conditions
            .iter()
            .find(|c| c.r#type == "FailureTarget" && c.status == "True")
            .map(|c| {
                let reason: &'static str = match c.reason.as_str() {
                    "PodFailurePolicy" => "PodFailurePolicy",
                    "DeadlineExceeded" => "DeadlineExceeded",
                    _ => "BackoffLimitExceeded",
                };
                (reason, c.message.clone())
            })
    });
    if let Some((reason, message)) = failure {
        if util::set_condition(
            &mut status.conditions,
            condition("FailureTarget", reason, &message, now),
        ) {
            out.events.push((true, reason.into(), message.clone()));
        }
        out.delete
            .extend(active.iter().map(|p| p.name().to_string()));
        if active.is_empty() {
            util::set_condition(
                &mut status.conditions,
                condition("Failed", reason, &message, now),
            );
        }
        out.status = status;
        return out;
    }

    let completions = spec.completions;
    let complete = match (indexed, completions) {
        (true, Some(c)) => (0..c).all(|i| done_indexes.contains(&i)),
        (_, Some(c)) => status.succeeded >= c,
        (_, None) => status.succeeded > 0 && active.is_empty(),
    };
    if complete {
        // Pods still running past the completions (a work queue's) are not waited for.
        out.delete
            .extend(active.iter().map(|p| p.name().to_string()));
        util::set_condition(
            &mut status.conditions,
            condition(
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now,
            ),
        );
        util::set_condition(
            &mut status.conditions,
            condition(
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now,
            ),
        );
        status.completion_time = Some(format_time(now));
        out.events
            .push((false, "Completed".into(), "Job completed".into()));
        out.status = status;
        return out;
    }

    // Back-off after failures: the next pod waits.
    if counted_failures > 0 {
        let exp = u32::try_from(counted_failures - 1)
            .unwrap_or(u32::MAX)
            .min(16);
        let delay = BACKOFF_BASE.saturating_mul(1 << exp).min(BACKOFF_MAX);
        if let Some(last) = failed.iter().filter_map(|p| finished_at(p)).max() {
            let waited = (now - last).to_std().unwrap_or_default();
            if waited < delay {
                out.requeue = Some(delay - waited);
                out.status = status;
                return out;
            }
        }
    }
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    if indexed {
        let running: BTreeSet<i32> = active.iter().filter_map(|p| pod_index(p)).collect();
        let slots = usize::try_from(parallelism - count(active.len())).unwrap_or(0);
        out.create = (0..completions.unwrap_or(0))
            .filter(|i| !done_indexes.contains(i) && !running.contains(i))
            .take(slots)
            .map(Some)
            .collect();
    } else {
        let want = match completions {
            Some(c) => (c - status.succeeded).clamp(0, parallelism),
            None if status.succeeded > 0 => 0,
            None => parallelism,
        };
        let have = count(active.len());
        if want > have {
            out.create = vec![None; usize::try_from(want - have).unwrap_or(0)];
        } else if have > want {
            let mut newest: Vec<&&Arc<Pod>> = active.iter().collect();
            newest.sort_by_key(|p| std::cmp::Reverse(util::creation_timestamp(&****p).to_string()));
            out.delete.extend(
                newest
                    .iter()
                    .take(usize::try_from(have - want).unwrap_or(0))
                    .map(|p| p.name().to_string()),
            );
        }
    }
    if let Some(d) = spec.active_deadline_seconds {
        let left = d - (now - start).num_seconds();
        if left > 0 {
            out.requeue = Some(Duration::from_secs(u64::try_from(left).unwrap_or(0)));
        }
    }
    out.status = status;
    out
}

/// A pod of `job` (for `index` of an Indexed Job), from its template.
pub fn pod_for(job: &Job, index: Option<i32>) -> Pod {
    let template = job
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    let tm = template.metadata.unwrap_or_default();
    let mut spec = template.spec.unwrap_or_default();
    let (mut labels, mut annotations) = (tm.labels, tm.annotations);
    let mut generate_name = format!("{}-", job.name());
    if let Some(i) = index {
        labels.insert(COMPLETION_INDEX.into(), i.to_string());
        annotations.insert(COMPLETION_INDEX.into(), i.to_string());
        generate_name = format!("{}-{i}-", job.name());
        if spec.hostname.is_empty() {
            spec.hostname = format!("{}-{i}", job.name());
        }
        let env = EnvVar {
            name: "JOB_COMPLETION_INDEX".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut())
        {
            if !c.env.iter().any(|e| e.name == env.name) {
                c.env.push(env.clone());
            }
        }
    }
    Pod {
        metadata: Some(ObjectMeta {
            generate_name,
            namespace: job.namespace().to_string(),
            labels,
            annotations,
            finalizers: tm.finalizers,
            owner_references: vec![controller_ref(job)],
            ..Default::default()
        }),
        spec: Some(spec),
        ..Default::default()
    }
}

/// The reconciler of Jobs.
pub struct JobController {
    jobs: Informer<Job>,
    pods: PodControl,
}

impl std::fmt::Debug for JobController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobController").finish_non_exhaustive()
    }
}

impl JobController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        JobController {
            jobs: informers.get::<Job>(),
            pods: PodControl::new(informers.client().clone(), recorder, informers.get::<Pod>()),
        }
    }

    /// The controller: Jobs, the pods they own, orphans their selectors match.
    pub fn controller(informers: &Informers) -> Controller<Job> {
        let jobs = informers.get::<Job>();
        let pods = informers.get::<Pod>();
        Controller::<Job>::new(informers)
            .named("job")
            .watches_owned::<Pod>()
            .watches(&pods, move |pod: &Pod| {
                adopters(&jobs, pod, |j| {
                    j.spec
                        .as_ref()
                        .and_then(|s| s.selector.as_ref())
                        .map(std::borrow::Cow::Borrowed)
                })
            })
    }

    /// Runs the Job controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(JobController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    /// Deletes a finished Job once its TTL has passed; otherwise when to look again.
    async fn ttl(&self, job: &Job, now: DateTime<Utc>) -> Result<Option<Duration>, Error> {
        let Some(ttl) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
            return Ok(None);
        };
        let st = job.status.clone().unwrap_or_default();
        let finished = st
            .completion_time
            .as_deref()
            .and_then(parse_time)
            .or_else(|| {
                st.conditions
                    .iter()
                    .find(|c| c.r#type == "Failed" && c.status == "True")
                    .and_then(|c| parse_time(&c.last_transition_time))
            })
            .unwrap_or(now);
        let left = i64::from(ttl) - (now - finished).num_seconds();
        if left > 0 {
            return Ok(Some(Duration::from_secs(u64::try_from(left).unwrap_or(0))));
        }
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..Default::default()
        };
        match self
            .pods
            .client
            .namespaced::<Job>(job.namespace())
            .delete(job.name(), &params)
            .await
        {
            Ok(_) => {
                tracing::info!(job = job.name(), "deleted after ttlSecondsAfterFinished");
                Ok(None)
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e).during(|| format!("deleting finished job {}", job.name())),
        }
    }
}

impl Reconciler for JobController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(job) = self.jobs.get(key) else {
            self.pods.expectations.forget(key);
            return Ok(Action::Done);
        };
        if is_terminating(&*job) {
            return Ok(Action::Done);
        }
        let now = Utc::now();
        if is_finished(&job) {
            return Ok(self.ttl(&job, now).await?.map_or(Action::Done, |d| {
                Action::RequeueAfter(d + Duration::from_millis(100))
            }));
        }
        let selector = job.spec.as_ref().and_then(|s| s.selector.as_ref());
        let Some(owned) = self.pods.claim(&*job, selector).await? else {
            return Ok(Action::Done);
        };
        let pending = self.pods.expectations.pending(key, &self.pods.pods);
        let mut plan = plan(&job, &owned, now);
        if pending.is_some() {
            // Our last creates or deletes are not all seen yet: status only.
            plan.create.clear();
            plan.delete.clear();
        }
        let create: Vec<Pod> = plan.create.iter().map(|i| pod_for(&job, *i)).collect();
        let applied = self.pods.apply(key, &*job, &plan.delete, &create).await;
        for (warning, reason, message) in &plan.events {
            let ty = if *warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.pods.recorder.publish(&*job, ty, reason, message).await;
        }
        if job.status.as_ref() != Some(&plan.status) {
            let mut updated = (*job).clone();
            updated.status = Some(plan.status.clone());
            self.pods
                .client
                .namespaced::<Job>(job.namespace())
                .update_status(&updated)
                .await
                .during(|| format!("updating the status of job {key}"))?;
        }
        applied?;
        let next = match (pending, plan.requeue) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(next.map_or(Action::Done, |d| {
            Action::RequeueAfter(d + Duration::from_millis(100))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{
        ContainerState, ContainerStateTerminated, ContainerStatus, JobSpec, PodFailurePolicy,
        PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule, PodSpec, PodStatus,
        PodTemplateSpec,
    };

    fn job(completions: Option<i32>, parallelism: i32, indexed: bool) -> Job {
        Job {
            metadata: Some(ObjectMeta {
                name: "work".into(),
                namespace: "default".into(),
                uid: "j1".into(),
                ..Default::default()
            }),
            spec: Some(JobSpec {
                completions,
                parallelism: Some(parallelism),
                backoff_limit: Some(1),
                completion_mode: Some(if indexed { "Indexed" } else { "NonIndexed" }.into()),
                template: Some(PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        restart_policy: "Never".into(),
                        containers: vec![skiff_api::api::Container {
                            name: "c".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(
        name: &str,
        phase: &str,
        index: Option<i32>,
        exit: Option<(i32, DateTime<Utc>)>,
    ) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: "default".into(),
                annotations: index
                    .map(|i| [(COMPLETION_INDEX.to_string(), i.to_string())].into())
                    .unwrap_or_default(),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: phase.into(),
                container_statuses: exit
                    .map(|(code, at)| {
                        vec![ContainerStatus {
                            name: "c".into(),
                            state: Some(ContainerState {
                                terminated: Some(ContainerStateTerminated {
                                    exit_code: code,
                                    finished_at: format_time(at),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]
                    })
                    .unwrap_or_default(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn runs_parallelism_pods_until_completions() {
        let now = Utc::now();
        let j = job(Some(3), 2, false);
        let p = plan(&j, &[], now);
        assert_eq!(p.create, [None, None]);
        let p = plan(
            &j,
            &[
                pod("a", "Succeeded", None, None),
                pod("b", "Running", None, None),
            ],
            now,
        );
        assert_eq!(p.create, [None], "one more: 3 - 1 succeeded, 1 active");
        let done = [
            pod("a", "Succeeded", None, None),
            pod("b", "Succeeded", None, None),
            pod("c", "Succeeded", None, None),
        ];
        let p = plan(&j, &done, now);
        assert!(has(&p.status, "Complete") && has(&p.status, "SuccessCriteriaMet"));
        assert_eq!(p.status.succeeded, 3);
        assert!(p.status.completion_time.is_some());
    }

    #[test]
    fn indexed_jobs_give_each_index_one_pod() {
        let now = Utc::now();
        let j = job(Some(4), 2, true);
        let p = plan(
            &j,
            &[
                pod("w-0", "Succeeded", Some(0), None),
                pod("w-2", "Running", Some(2), None),
            ],
            now,
        );
        assert_eq!(p.create, [Some(1)]);
        assert_eq!(p.status.completed_indexes.as_deref(), Some("0"));
        let new = pod_for(&j, Some(3));
        assert_eq!(pod_index(&new), Some(3));
        let spec = new.spec.unwrap();
        assert_eq!(spec.hostname, "work-3");
        assert!(
            spec.containers[0]
                .env
                .iter()
                .any(|e| e.name == "JOB_COMPLETION_INDEX")
        );
        assert_eq!(new.metadata.unwrap().generate_name, "work-3-");
        let set: BTreeSet<i32> = [0, 1, 2, 4, 6, 7].into();
        assert_eq!(format_indexes(&set), "0-2,4,6-7");
    }

    #[test]
    fn failures_back_off_then_exceed_the_limit() {
        let now = Utc::now();
        let j = job(Some(1), 1, false);
        // One failure (limit 1): replaced after 10 s.
        let failed = pod(
            "a",
            "Failed",
            None,
            Some((1, now - chrono::TimeDelta::seconds(3))),
        );
        let p = plan(&j, std::slice::from_ref(&failed), now);
        assert!(p.create.is_empty());
        assert!(p.requeue.is_some_and(|d| d <= Duration::from_secs(7)));
        let later = now + chrono::TimeDelta::seconds(8);
        assert_eq!(
            plan(&j, std::slice::from_ref(&failed), later).create,
            [None]
        );
        // Two failures: over the limit.
        let two = [failed.clone(), pod("b", "Failed", None, Some((1, now)))];
        let p = plan(&j, &two, now);
        assert!(has(&p.status, "FailureTarget"));
        let failed_cond = p
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "Failed")
            .unwrap();
        assert_eq!(failed_cond.reason, "BackoffLimitExceeded");
        assert_eq!(
            failed_cond.message,
            "Job has reached the specified backoff limit"
        );
    }

    #[test]
    fn pod_failure_policy_fails_or_ignores() {
        let now = Utc::now();
        let mut j = job(Some(1), 1, false);
        j.spec.as_mut().unwrap().pod_failure_policy = Some(PodFailurePolicy {
            rules: vec![
                PodFailurePolicyRule {
                    action: "Ignore".into(),
                    on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                        operator: "In".into(),
                        values: vec![3],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                PodFailurePolicyRule {
                    action: "FailJob".into(),
                    on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                        operator: "In".into(),
                        values: vec![42],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
        });
        let ignored = pod(
            "a",
            "Failed",
            None,
            Some((3, now - chrono::TimeDelta::seconds(60))),
        );
        let p = plan(
            &j,
            &[ignored.clone(), ignored.clone(), ignored.clone()],
            now,
        );
        assert_eq!(p.status.failed, 0, "ignored failures do not count");
        assert!(!has(&p.status, "FailureTarget"));
        let fatal = pod("b", "Failed", None, Some((42, now)));
        let p = plan(&j, &[fatal], now);
        let c = p
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "Failed")
            .unwrap();
        assert_eq!(c.reason, "PodFailurePolicy");
        assert_eq!(
            c.message,
            "Container c for pod default/b failed with exit code 42 matching FailJob rule at index 1"
        );
    }

    #[test]
    fn deadline_and_suspend() {
        let now = Utc::now();
        let mut j = job(Some(1), 1, false);
        j.spec.as_mut().unwrap().active_deadline_seconds = Some(5);
        j.status = Some(JobStatus {
            start_time: Some(format_time(now - chrono::TimeDelta::seconds(6))),
            ..Default::default()
        });
        let p = plan(&j, &[pod("a", "Running", None, None)], now);
        assert_eq!(p.delete, ["a"]);
        let c = p
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "FailureTarget")
            .unwrap();
        assert_eq!(c.reason, "DeadlineExceeded");
        assert!(!has(&p.status, "Failed"), "Failed once the pod is gone");
        let mut s = job(Some(1), 1, false);
        s.spec.as_mut().unwrap().suspend = Some(true);
        let p = plan(&s, &[pod("a", "Running", None, None)], now);
        assert_eq!(p.delete, ["a"]);
        assert!(has(&p.status, "Suspended"));
    }
}
