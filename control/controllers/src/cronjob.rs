//! The CronJob controller: a Job for each scheduled time, as Kubernetes' `cronjob`
//! controller (v2) does.
//!
//! The schedule ([`skiff_api::schedule`]) is evaluated in the CronJob's `timeZone`. At most
//! the most recent missed time is run (never a backlog); more than 100 missed times since
//! the last one is the TooManyMissedTimes warning; with `startingDeadlineSeconds`, a time
//! older than that is missed (MissSchedule). `concurrencyPolicy`: Allow runs Jobs side by
//! side, Forbid skips a time while a Job is active (JobAlreadyActive), Replace deletes the
//! active Jobs first. `suspend` stops new Jobs. A Job is named `<cronjob>-<scheduled time in
//! minutes since the epoch>` (so one time is never run twice) and carries the
//! `batch.kubernetes.io/cronjob-scheduled-timestamp` annotation. Finished Jobs beyond
//! `successfulJobsHistoryLimit` and `failedJobsHistoryLimit` are deleted, oldest first. The
//! status lists the active Jobs, `lastScheduleTime` and `lastSuccessfulTime`. Woken by its
//! Jobs and at the next scheduled time.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use skiff_api::Resource;
use skiff_api::api::{CronJob, CronJobStatus, Job, ObjectMeta, ObjectReference};
use skiff_api::schedule::Schedule;
use skiff_client::controller::{
    Action, CancelToken, Controller, EventRecorder, EventType, Informer, Informers, ObjectKey,
    Reconciler, controller_of,
};
use skiff_client::{DeleteParams, PropagationPolicy};

use crate::job::is_finished;
use crate::util::{self, controller_ref, format_time, is_terminating, parse_time};
use crate::{Context, Error};

/// The annotation with the time a Job was scheduled for.
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// Kubernetes' limit on missed times before it warns.
const MAX_MISSED: usize = 100;

/// The name of the Job for the time `t`.
pub fn job_name(cj: &CronJob, t: DateTime<Utc>) -> String {
    format!("{}-{}", cj.name(), t.timestamp().div_euclid(60))
}

/// What one reconcile does.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CronJobPlan {
    /// The scheduled time to create a Job for.
    pub create: Option<DateTime<Utc>>,
    /// Jobs to delete (Replace, history), by name.
    pub delete: Vec<String>,
    pub status: CronJobStatus,
    /// Events: (warning?, reason, message).
    pub events: Vec<(bool, String, String)>,
    /// The next scheduled time, to look again then.
    pub next: Option<DateTime<Utc>>,
}

fn job_succeeded(j: &Job) -> bool {
    j.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == "Complete" && c.status == "True")
    })
}

fn finished_time(j: &Job) -> String {
    let st = j.status.clone().unwrap_or_default();
    st.completion_time.unwrap_or_else(|| {
        st.conditions
            .iter()
            .find(|c| c.r#type == "Failed" && c.status == "True")
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| util::creation_timestamp(j).to_string())
    })
}

/// The planner (pure): the CronJob, the Jobs it owns, its parsed schedule, at `now`.
pub fn plan(
    cj: &CronJob,
    jobs: &[Arc<Job>],
    schedule: &Schedule,
    now: DateTime<Utc>,
) -> CronJobPlan {
    let spec = cj.spec.clone().unwrap_or_default();
    let mut out = CronJobPlan {
        status: cj.status.clone().unwrap_or_default(),
        ..Default::default()
    };
    let live: Vec<&Arc<Job>> = jobs.iter().filter(|j| !is_terminating(&***j)).collect();
    let active: Vec<&Arc<Job>> = live.iter().copied().filter(|j| !is_finished(j)).collect();
    out.status.active = active
        .iter()
        .map(|j| ObjectReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            namespace: j.namespace().into(),
            name: j.name().into(),
            uid: util::uid(&***j).into(),
            resource_version: j.resource_version().into(),
            ..Default::default()
        })
        .collect();
    let newest_success = live
        .iter()
        .filter(|j| job_succeeded(j))
        .filter_map(|j| j.status.as_ref()?.completion_time.clone())
        .max();
    if let Some(t) = newest_success
        && out
            .status
            .last_successful_time
            .as_ref()
            .is_none_or(|old| *old < t)
    {
        out.status.last_successful_time = Some(t);
    }
    // History: the oldest finished Jobs beyond the limits go.
    for (succeeded, limit) in [
        (true, spec.successful_jobs_history_limit.unwrap_or(3)),
        (false, spec.failed_jobs_history_limit.unwrap_or(1)),
    ] {
        let mut done: Vec<&&Arc<Job>> = live
            .iter()
            .filter(|j| is_finished(j) && job_succeeded(j) == succeeded)
            .collect();
        done.sort_by_key(|j| finished_time(j));
        let excess = done
            .len()
            .saturating_sub(usize::try_from(limit).unwrap_or(0));
        out.delete
            .extend(done.iter().take(excess).map(|j| j.name().to_string()));
    }
    out.next = schedule.next_after(now);
    if spec.suspend == Some(true) {
        return out;
    }
    let mut earliest = out
        .status
        .last_schedule_time
        .as_deref()
        .and_then(parse_time)
        .or_else(|| parse_time(util::creation_timestamp(cj)))
        .unwrap_or(now);
    if let Some(d) = spec.starting_deadline_seconds {
        earliest = earliest.max(now - chrono::TimeDelta::seconds(d));
    }
    let missed = schedule.times_between(earliest, now, MAX_MISSED);
    if missed.len() > MAX_MISSED {
        out.events.push((
            true,
            "TooManyMissedTimes".into(),
            format!(
                "too many missed start times: {}. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
                missed.len()
            ),
        ));
    }
    let latest = if missed.len() > MAX_MISSED {
        schedule.latest_until(now)
    } else {
        missed.last().copied()
    };
    let Some(scheduled) = latest else {
        return out;
    };
    if let Some(d) = spec.starting_deadline_seconds
        && scheduled + chrono::TimeDelta::seconds(d) < now
    {
        out.events.push((
            true,
            "MissSchedule".into(),
            format!(
                "Missed scheduled time to start a job: {}",
                format_time(scheduled)
            ),
        ));
        return out;
    }
    let name = job_name(cj, scheduled);
    if jobs.iter().any(|j| j.name() == name) {
        // Already run (our status write may have been lost).
        out.status.last_schedule_time = Some(format_time(scheduled));
        return out;
    }
    match spec.concurrency_policy.as_str() {
        "Forbid" if !active.is_empty() => {
            out.events.push((
                false,
                "JobAlreadyActive".into(),
                "Not starting job because prior execution is running and concurrency policy is Forbid"
                    .into(),
            ));
            return out;
        }
        "Replace" => {
            out.delete
                .extend(active.iter().map(|j| j.name().to_string()));
        }
        _ => {}
    }
    out.create = Some(scheduled);
    out.status.last_schedule_time = Some(format_time(scheduled));
    out
}

/// The Job of `cj` for the time `scheduled`, from its job template.
pub fn job_for(cj: &CronJob, scheduled: DateTime<Utc>, schedule: &Schedule) -> Job {
    let template = cj
        .spec
        .as_ref()
        .and_then(|s| s.job_template.clone())
        .unwrap_or_default();
    let tm = template.metadata.unwrap_or_default();
    let mut annotations = tm.annotations;
    annotations.insert(
        SCHEDULED_TIMESTAMP.into(),
        schedule.local_rfc3339(scheduled),
    );
    Job {
        metadata: Some(ObjectMeta {
            name: job_name(cj, scheduled),
            namespace: cj.namespace().to_string(),
            labels: tm.labels,
            annotations,
            owner_references: vec![controller_ref(cj)],
            ..Default::default()
        }),
        spec: template.spec,
        ..Default::default()
    }
}

/// The reconciler of CronJobs.
pub struct CronJobController {
    client: skiff_client::Client,
    recorder: EventRecorder,
    cron_jobs: Informer<CronJob>,
    jobs: Informer<Job>,
}

impl std::fmt::Debug for CronJobController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CronJobController").finish_non_exhaustive()
    }
}

impl CronJobController {
    pub fn new(informers: &Informers, recorder: EventRecorder) -> Self {
        CronJobController {
            client: informers.client().clone(),
            recorder,
            cron_jobs: informers.get::<CronJob>(),
            jobs: informers.get::<Job>(),
        }
    }

    /// The controller: CronJobs and the Jobs they own.
    pub fn controller(informers: &Informers) -> Controller<CronJob> {
        Controller::<CronJob>::new(informers)
            .named("cronjob")
            .watches_owned::<Job>()
    }

    /// Runs the CronJob controller with `workers` workers until `stop` is cancelled.
    pub async fn run(
        informers: &Informers,
        recorder: EventRecorder,
        workers: usize,
        stop: CancelToken,
    ) {
        let reconciler = Arc::new(CronJobController::new(informers, recorder));
        Self::controller(informers)
            .graceful_shutdown_on(stop)
            .run(reconciler, workers)
            .await;
    }

    async fn event(&self, cj: &CronJob, warning: bool, reason: &str, message: &str) {
        let ty = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.recorder.publish(cj, ty, reason, message).await;
    }
}

impl Reconciler for CronJobController {
    type Error = Error;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, Error> {
        let Some(cj) = self.cron_jobs.get(key) else {
            return Ok(Action::Done);
        };
        if is_terminating(&*cj) {
            return Ok(Action::Done);
        }
        let spec = cj.spec.clone().unwrap_or_default();
        let schedule = match Schedule::parse(&spec.schedule, spec.time_zone.as_deref()) {
            Ok(s) => s,
            Err(e) => {
                self.event(
                    &cj,
                    true,
                    "UnparseableSchedule",
                    &format!("unparseable schedule: {:?} : {e}", spec.schedule),
                )
                .await;
                return Ok(Action::Done);
            }
        };
        let uid = util::uid(&*cj).to_string();
        let jobs: Vec<Arc<Job>> = self
            .jobs
            .by_owner(&uid)
            .into_iter()
            .filter(|j| controller_of(&**j).is_some_and(|o| o.uid == uid))
            .collect();
        let now = Utc::now();
        let plan = plan(&cj, &jobs, &schedule, now);
        let api = self.client.namespaced::<Job>(cj.namespace());
        let background = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        for name in &plan.delete {
            match api.delete(name, &background).await {
                Ok(_) => {
                    self.event(
                        &cj,
                        false,
                        "SuccessfulDelete",
                        &format!("Deleted job {name}"),
                    )
                    .await
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e).during(|| format!("deleting job {name} of {key}")),
            }
        }
        for (warning, reason, message) in &plan.events {
            self.event(&cj, *warning, reason, message).await;
        }
        let mut status = plan.status.clone();
        if let Some(t) = plan.create {
            let job = job_for(&cj, t, &schedule);
            match api.create(&job).await {
                Ok(j) => {
                    self.event(
                        &cj,
                        false,
                        "SuccessfulCreate",
                        &format!("Created job {}", j.name()),
                    )
                    .await;
                    status.active.push(ObjectReference {
                        api_version: "batch/v1".into(),
                        kind: "Job".into(),
                        namespace: j.namespace().into(),
                        name: j.name().into(),
                        uid: util::uid(&j).into(),
                        resource_version: j.resource_version().into(),
                        ..Default::default()
                    });
                }
                // Made by an earlier reconcile whose status write was lost.
                Err(e) if e.is_already_exists() => {}
                Err(e) => {
                    self.event(
                        &cj,
                        true,
                        "FailedCreate",
                        &format!("Error creating job: {e}"),
                    )
                    .await;
                    return Err(e).during(|| format!("creating a job for {key}"));
                }
            }
        }
        if cj.status.as_ref() != Some(&status)
            && !(cj.status.is_none() && status == CronJobStatus::default())
        {
            let mut updated = (*cj).clone();
            updated.status = Some(status);
            self.client
                .namespaced::<CronJob>(cj.namespace())
                .update_status(&updated)
                .await
                .during(|| format!("updating the status of cron job {key}"))?;
        }
        Ok(plan.next.map_or(Action::Done, |n| {
            let wait = (n - now).to_std().unwrap_or_default();
            Action::RequeueAfter(wait + Duration::from_millis(100))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{Condition, CronJobSpec, JobStatus};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn cron(policy: &str, last: Option<&str>) -> CronJob {
        CronJob {
            metadata: Some(ObjectMeta {
                name: "tick".into(),
                namespace: "default".into(),
                uid: "cj1".into(),
                creation_timestamp: "2026-11-26T10:00:30Z".into(),
                ..Default::default()
            }),
            spec: Some(CronJobSpec {
                schedule: "* * * * *".into(),
                concurrency_policy: policy.into(),
                ..Default::default()
            }),
            status: last.map(|l| CronJobStatus {
                last_schedule_time: Some(l.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn job(name: &str, finished: Option<(&str, &str)>) -> Arc<Job> {
        Arc::new(Job {
            metadata: Some(ObjectMeta {
                name: name.into(),
                namespace: "default".into(),
                creation_timestamp: "2026-11-26T10:01:00Z".into(),
                ..Default::default()
            }),
            status: finished.map(|(ty, at)| JobStatus {
                completion_time: (ty == "Complete").then(|| at.to_string()),
                conditions: vec![Condition {
                    r#type: ty.into(),
                    status: "True".into(),
                    last_transition_time: at.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn runs_the_most_recent_time_once() {
        let s = Schedule::parse("* * * * *", None).unwrap();
        let cj = cron("Allow", None);
        // Created at 10:00:30; at 10:03:10 three times were missed: only 10:03 runs.
        let p = plan(&cj, &[], &s, at("2026-11-26T10:03:10Z"));
        assert_eq!(p.create, Some(at("2026-11-26T10:03:00Z")));
        assert_eq!(
            p.status.last_schedule_time.as_deref(),
            Some("2026-11-26T10:03:00Z")
        );
        assert_eq!(p.next, Some(at("2026-11-26T10:04:00Z")));
        assert_eq!(
            job_name(&cj, at("2026-11-26T10:03:00Z")),
            format!("tick-{}", at("2026-11-26T10:03:00Z").timestamp() / 60)
        );
        // Before the first time: nothing, look again at 10:01.
        let p = plan(&cj, &[], &s, at("2026-11-26T10:00:40Z"));
        assert_eq!(p.create, None);
        assert_eq!(p.next, Some(at("2026-11-26T10:01:00Z")));
        // The Job exists already: not again.
        let made = job(&job_name(&cj, at("2026-11-26T10:03:00Z")), None);
        assert_eq!(
            plan(&cj, &[made], &s, at("2026-11-26T10:03:10Z")).create,
            None
        );
    }

    #[test]
    fn forbid_skips_while_active_and_replace_deletes() {
        let s = Schedule::parse("* * * * *", None).unwrap();
        let running = job("tick-1", None);
        let p = plan(
            &cron("Forbid", Some("2026-11-26T10:01:00Z")),
            std::slice::from_ref(&running),
            &s,
            at("2026-11-26T10:02:05Z"),
        );
        assert_eq!(p.create, None);
        assert_eq!(p.events[0].1, "JobAlreadyActive");
        assert_eq!(p.status.active.len(), 1);
        let p = plan(
            &cron("Replace", Some("2026-11-26T10:01:00Z")),
            std::slice::from_ref(&running),
            &s,
            at("2026-11-26T10:02:05Z"),
        );
        assert_eq!(p.create, Some(at("2026-11-26T10:02:00Z")));
        assert_eq!(p.delete, ["tick-1"]);
        let p = plan(
            &cron("Allow", Some("2026-11-26T10:01:00Z")),
            &[running],
            &s,
            at("2026-11-26T10:02:05Z"),
        );
        assert_eq!(p.create, Some(at("2026-11-26T10:02:00Z")));
        assert!(p.delete.is_empty());
    }

    #[test]
    fn deadlines_suspend_and_history() {
        let s = Schedule::parse("* * * * *", None).unwrap();
        let mut cj = cron("Allow", Some("2026-11-26T10:01:00Z"));
        cj.spec.as_mut().unwrap().starting_deadline_seconds = Some(10);
        // 10:02 was 30 s ago, past the 10 s deadline.
        let p = plan(&cj, &[], &s, at("2026-11-26T10:02:30Z"));
        assert_eq!(p.create, None);
        cj.spec.as_mut().unwrap().starting_deadline_seconds = None;
        cj.spec.as_mut().unwrap().suspend = Some(true);
        assert_eq!(plan(&cj, &[], &s, at("2026-11-26T10:02:30Z")).create, None);
        let mut cj = cron("Allow", Some("2026-11-26T10:05:00Z"));
        cj.spec.as_mut().unwrap().successful_jobs_history_limit = Some(2);
        cj.spec.as_mut().unwrap().failed_jobs_history_limit = Some(0);
        let jobs = [
            job("a", Some(("Complete", "2026-11-26T10:01:10Z"))),
            job("b", Some(("Complete", "2026-11-26T10:02:10Z"))),
            job("c", Some(("Complete", "2026-11-26T10:03:10Z"))),
            job("d", Some(("Failed", "2026-11-26T10:04:10Z"))),
        ];
        let p = plan(&cj, &jobs, &s, at("2026-11-26T10:05:30Z"));
        assert_eq!(p.delete, ["a", "d"]);
        assert_eq!(
            p.status.last_successful_time.as_deref(),
            Some("2026-11-26T10:03:10Z")
        );
        // Too many missed times: a warning, and still only the latest runs.
        let p = plan(&cron("Allow", None), &[], &s, at("2026-11-27T10:00:00Z"));
        assert_eq!(p.events[0].1, "TooManyMissedTimes");
        assert_eq!(p.create, Some(at("2026-11-27T10:00:00Z")));
    }
}
