//! Jobs (batch/v1): Kubernetes' defaults (parallelism and completions 1, backoffLimit 6,
//! NonIndexed), the generated selector (`batch.kubernetes.io/controller-uid`, with the
//! `job-name` and `controller-uid` labels on the template) unless `manualSelector`, the
//! template's restartPolicy OnFailure or Never, Indexed completions, podFailurePolicy rules;
//! selector, template, completions, completionMode and podFailurePolicy are immutable.

use async_trait::async_trait;
use skiff_api::api::{CronJob, Job, JobSpec, LabelSelector};

use super::Strategy;
use super::pod::{default_pod_spec, validate_pod_spec};
use crate::error::FieldError;
use crate::validation as v;

/// The labels a Job's pods carry and its generated selector uses.
pub const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
const LEGACY_CONTROLLER_UID: &str = "controller-uid";
const LEGACY_JOB_NAME: &str = "job-name";
const MODES: &[&str] = &["NonIndexed", "Indexed"];
const ACTIONS: &[&str] = &["Count", "FailJob", "FailIndex", "Ignore"];
/// Kubernetes' cap on an Indexed Job's completions.
const MAX_INDEXED_COMPLETIONS: i32 = 100_000;

/// A Job spec's rules at `p` (`spec`, or `spec.jobTemplate.spec` of a CronJob, whose
/// selector is generated when its Jobs are made).
pub(crate) fn validate_job_spec(
    out: &mut Vec<FieldError>,
    p: &str,
    spec: &JobSpec,
    selector_required: bool,
) {
    for (path, value) in [
        (format!("{p}.parallelism"), spec.parallelism.map(i64::from)),
        (format!("{p}.completions"), spec.completions.map(i64::from)),
        (
            format!("{p}.activeDeadlineSeconds"),
            spec.active_deadline_seconds,
        ),
        (
            format!("{p}.backoffLimit"),
            spec.backoff_limit.map(i64::from),
        ),
        (
            format!("{p}.ttlSecondsAfterFinished"),
            spec.ttl_seconds_after_finished.map(i64::from),
        ),
    ] {
        if let Some(n) = value {
            v::check_non_negative(out, &path, n);
        }
    }
    let mode = spec.completion_mode.as_deref().unwrap_or("NonIndexed");
    if !MODES.contains(&mode) {
        out.push(FieldError::not_supported(
            format!("{p}.completionMode"),
            mode,
            MODES,
        ));
    }
    if mode == "Indexed" {
        match spec.completions {
            None => out.push(FieldError::required(
                format!("{p}.completions"),
                "when completion mode is Indexed",
            )),
            Some(c) if c > MAX_INDEXED_COMPLETIONS => out.push(FieldError::invalid(
                format!("{p}.completions"),
                c,
                format!("must be less than or equal to {MAX_INDEXED_COMPLETIONS} when completion mode is Indexed"),
            )),
            _ => {}
        }
    }
    let Some(template) = &spec.template else {
        out.push(FieldError::required(format!("{p}.template"), ""));
        return;
    };
    let labels = template
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    v::check_labels(out, &format!("{p}.template.metadata.labels"), &labels);
    if selector_required {
        v::check_selector_matches_template(out, spec.selector.as_ref(), &labels);
    }
    validate_pod_spec(out, &format!("{p}.template.spec"), template.spec.as_ref());
    let restart = template
        .spec
        .as_ref()
        .map(|s| s.restart_policy.as_str())
        .unwrap_or("");
    if restart != "OnFailure" && restart != "Never" {
        out.push(FieldError::not_supported(
            format!("{p}.template.spec.restartPolicy"),
            restart,
            &["OnFailure", "Never"],
        ));
    }
    if let Some(policy) = &spec.pod_failure_policy {
        if restart != "Never" {
            out.push(FieldError::invalid(
                format!("{p}.template.spec.restartPolicy"),
                restart,
                "only \"Never\" is supported when podFailurePolicy is specified",
            ));
        }
        for (i, rule) in policy.rules.iter().enumerate() {
            let rp = format!("{p}.podFailurePolicy.rules[{i}]");
            if !ACTIONS.contains(&rule.action.as_str()) {
                out.push(FieldError::not_supported(
                    format!("{rp}.action"),
                    &rule.action,
                    ACTIONS,
                ));
            }
            match (&rule.on_exit_codes, rule.on_pod_conditions.is_empty()) {
                (Some(_), false) | (None, true) => out.push(FieldError::invalid(
                    rp.clone(),
                    "",
                    "specifying one of OnExitCodes and OnPodConditions is required",
                )),
                _ => {}
            }
            if let Some(codes) = &rule.on_exit_codes {
                if codes.operator != "In" && codes.operator != "NotIn" {
                    out.push(FieldError::not_supported(
                        format!("{rp}.onExitCodes.operator"),
                        &codes.operator,
                        &["In", "NotIn"],
                    ));
                }
                if codes.values.is_empty() {
                    out.push(FieldError::required(
                        format!("{rp}.onExitCodes.values"),
                        "at least one value is required",
                    ));
                }
                if codes.operator == "In" && codes.values.contains(&0) {
                    out.push(FieldError::invalid(
                        format!("{rp}.onExitCodes.values"),
                        0,
                        "must not be 0 for the In operator",
                    ));
                }
                if codes.values.windows(2).any(|w| w[0] >= w[1]) {
                    out.push(FieldError::invalid(
                        format!("{rp}.onExitCodes.values"),
                        format!("{:?}", codes.values),
                        "must be ordered",
                    ));
                }
            }
        }
    }
}

/// Kubernetes' Job spec defaults (also for a CronJob's job template).
fn default_job_spec(spec: &mut JobSpec) {
    if spec.completions.is_none() && spec.parallelism.is_none() {
        spec.completions = Some(1);
    }
    spec.parallelism.get_or_insert(1);
    spec.backoff_limit.get_or_insert(6);
    spec.completion_mode
        .get_or_insert_with(|| "NonIndexed".into());
    spec.suspend.get_or_insert(false);
    if let Some(t) = spec.template.as_mut().and_then(|t| t.spec.as_mut()) {
        default_pod_spec(t);
    }
}

#[async_trait]
impl Strategy for Job {
    fn default(&mut self) {
        if let Some(spec) = self.spec.as_mut() {
            default_job_spec(spec);
        }
    }

    /// The generated selector and the template's labels (the name and uid are known
    /// now), as kube-apiserver's job strategy does before validating.
    fn prepare_create(&mut self) {
        let (name, uid) = match self.metadata.as_ref() {
            Some(m) => (m.name.clone(), m.uid.clone()),
            None => return,
        };
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        if spec.manual_selector == Some(true) || spec.selector.is_some() {
            return;
        }
        let t = spec.template.get_or_insert_with(Default::default);
        let labels = &mut t.metadata.get_or_insert_with(Default::default).labels;
        for (k, val) in [
            (CONTROLLER_UID, &uid),
            (LEGACY_CONTROLLER_UID, &uid),
            (JOB_NAME, &name),
            (LEGACY_JOB_NAME, &name),
        ] {
            labels.insert(k.to_string(), val.clone());
        }
        spec.selector = Some(LabelSelector {
            match_labels: [(CONTROLLER_UID.to_string(), uid)].into(),
            ..Default::default()
        });
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        match &self.spec {
            Some(spec) => validate_job_spec(&mut out, "spec", spec, true),
            None => out.push(FieldError::required("spec", "")),
        }
        out
    }

    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let (new, old) = (
            self.spec.clone().unwrap_or_default(),
            old.spec.clone().unwrap_or_default(),
        );
        if new.selector != old.selector {
            out.push(FieldError::immutable(
                "spec.selector",
                new.selector.unwrap_or_default(),
            ));
        }
        if new.template != old.template {
            out.push(FieldError::immutable("spec.template", "..."));
        }
        if new.completions != old.completions {
            out.push(FieldError::immutable(
                "spec.completions",
                new.completions.unwrap_or_default(),
            ));
        }
        if new.completion_mode != old.completion_mode {
            out.push(FieldError::immutable(
                "spec.completionMode",
                new.completion_mode,
            ));
        }
        if new.pod_failure_policy != old.pod_failure_policy {
            out.push(FieldError::immutable("spec.podFailurePolicy", "..."));
        }
        out
    }
}

/// The longest CronJob name (its Jobs add `-<minutes>`, 11 characters).
const MAX_CRONJOB_NAME: usize = 52;
const CONCURRENCY: &[&str] = &["Allow", "Forbid", "Replace"];

impl Strategy for CronJob {
    /// concurrencyPolicy Allow, suspend false, history limits 3 successful and 1 failed,
    /// Job defaults for the template.
    fn default(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        if spec.concurrency_policy.is_empty() {
            spec.concurrency_policy = "Allow".into();
        }
        spec.suspend.get_or_insert(false);
        spec.successful_jobs_history_limit.get_or_insert(3);
        spec.failed_jobs_history_limit.get_or_insert(1);
        if let Some(js) = spec.job_template.as_mut().and_then(|t| t.spec.as_mut()) {
            default_job_spec(js);
        }
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        let name = self
            .metadata
            .as_ref()
            .map(|m| m.name.as_str())
            .unwrap_or("");
        if name.len() > MAX_CRONJOB_NAME {
            out.push(FieldError::invalid(
                "metadata.name",
                name,
                format!("must be no more than {MAX_CRONJOB_NAME} characters"),
            ));
        }
        let Some(spec) = &self.spec else {
            out.push(FieldError::required("spec", ""));
            return out;
        };
        if spec.schedule.trim().is_empty() {
            out.push(FieldError::required("spec.schedule", ""));
        } else if let Err(e) =
            skiff_api::schedule::Schedule::parse(&spec.schedule, spec.time_zone.as_deref())
        {
            let (path, value) = match e {
                skiff_api::schedule::ScheduleError::TimeZone(ref tz) => {
                    ("spec.timeZone", tz.clone())
                }
                _ => ("spec.schedule", spec.schedule.clone()),
            };
            out.push(FieldError::invalid(path, value, e.to_string()));
        }
        if !CONCURRENCY.contains(&spec.concurrency_policy.as_str()) {
            out.push(FieldError::not_supported(
                "spec.concurrencyPolicy",
                &spec.concurrency_policy,
                CONCURRENCY,
            ));
        }
        for (path, value) in [
            (
                "spec.startingDeadlineSeconds",
                spec.starting_deadline_seconds,
            ),
            (
                "spec.successfulJobsHistoryLimit",
                spec.successful_jobs_history_limit.map(i64::from),
            ),
            (
                "spec.failedJobsHistoryLimit",
                spec.failed_jobs_history_limit.map(i64::from),
            ),
        ] {
            if let Some(n) = value {
                v::check_non_negative(&mut out, path, n);
            }
        }
        match spec.job_template.as_ref().and_then(|t| t.spec.as_ref()) {
            Some(js) => validate_job_spec(&mut out, "spec.jobTemplate.spec", js, false),
            None => out.push(FieldError::required("spec.jobTemplate.spec", "")),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{JobSpec, ObjectMeta, PodSpec, PodTemplateSpec};

    fn job(restart: &str) -> Job {
        Job {
            metadata: Some(ObjectMeta {
                name: "pi".into(),
                uid: "u-1".into(),
                ..Default::default()
            }),
            spec: Some(JobSpec {
                template: Some(PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        restart_policy: restart.into(),
                        containers: vec![skiff_api::api::Container {
                            name: "c".into(),
                            image: "host".into(),
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

    #[test]
    fn defaults_and_generated_selector() {
        let mut j = job("Never");
        j.prepare_create();
        Strategy::default(&mut j);
        let spec = j.spec.as_ref().unwrap();
        assert_eq!(
            (spec.completions, spec.parallelism, spec.backoff_limit),
            (Some(1), Some(1), Some(6))
        );
        assert_eq!(spec.completion_mode.as_deref(), Some("NonIndexed"));
        let sel = spec.selector.as_ref().unwrap();
        assert_eq!(
            sel.match_labels.get(CONTROLLER_UID).map(String::as_str),
            Some("u-1")
        );
        let labels = &spec
            .template
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()
            .labels;
        assert_eq!(labels.get(JOB_NAME).map(String::as_str), Some("pi"));
        assert!(j.validate().is_empty(), "{:?}", j.validate());
    }

    #[test]
    fn cron_jobs_schedules_and_time_zones() {
        let mut cj = CronJob {
            metadata: Some(ObjectMeta {
                name: "nightly".into(),
                ..Default::default()
            }),
            spec: Some(skiff_api::api::CronJobSpec {
                schedule: "0 3 * * *".into(),
                job_template: Some(skiff_api::api::JobTemplateSpec {
                    metadata: None,
                    spec: job("Never").spec,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        Strategy::default(&mut cj);
        assert!(cj.validate().is_empty(), "{:?}", cj.validate());
        assert_eq!(cj.spec.as_ref().unwrap().concurrency_policy, "Allow");
        cj.spec.as_mut().unwrap().schedule = "61 * * * *".into();
        assert_eq!(cj.validate()[0].path, "spec.schedule");
        cj.spec.as_mut().unwrap().schedule = "0 3 * * *".into();
        cj.spec.as_mut().unwrap().time_zone = Some("Mars/Olympus".into());
        let errs = cj.validate();
        assert_eq!(errs[0].path, "spec.timeZone");
        assert!(
            errs[0]
                .to_string()
                .contains("unknown time zone Mars/Olympus")
        );
    }

    #[test]
    fn restart_policy_and_indexed_completions() {
        let mut j = job("");
        Strategy::default(&mut j);
        let errs = j.validate();
        assert!(
            errs.iter()
                .any(|e| e.path == "spec.template.spec.restartPolicy"
                    && e.to_string().contains("Unsupported value: \"Always\"")),
            "{errs:?}"
        );
        let mut j = job("Never");
        j.spec.as_mut().unwrap().completion_mode = Some("Indexed".into());
        j.spec.as_mut().unwrap().parallelism = Some(2);
        assert!(j.validate().iter().any(|e| e.path == "spec.completions"));
    }
}
