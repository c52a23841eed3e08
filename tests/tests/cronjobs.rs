//! CronJobs with the real kubectl on a real cluster, in real minutes: a Job at each
//! scheduled time (in the CronJob's time zone, stamped on the Job), `concurrencyPolicy:
//! Forbid` never running two at once (checked every second over two scheduled times, until
//! the controller reports JobAlreadyActive), the history limit, `kubectl create job
//! --from=cronjob/...`, `kubectl get cronjobs` columns, bad schedules and time zones
//! refused with the field named.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::{Duration, Instant};

use skiff_tests::cluster::Cluster;

fn cron_job(name: &str, extra: &str, script: &str) -> String {
    format!(
        r#"apiVersion: batch/v1
kind: CronJob
metadata: {{name: {name}}}
spec:
  schedule: "* * * * *"
{extra}
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          terminationGracePeriodSeconds: 1
          containers:
          - name: work
            image: host
            command: ["busybox", "sh", "-c", {script:?}]
"#
    )
}

/// (name, finished) of the Jobs whose name starts with `prefix-`.
fn jobs_of(c: &Cluster, prefix: &str) -> Vec<(String, bool)> {
    let (ok, out, err) = c.kubectl(&["get", "jobs", "-o", "json"], None);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| {
            j["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("{prefix}-")))
        })
        .map(|j| {
            let finished = j["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True"
                })
            });
            (
                j["metadata"]["name"].as_str().unwrap().to_string(),
                finished,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_jobs_run_on_schedule_and_forbid_overlaps() {
    let c = Cluster::start(1).await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}\n{}", c.logs());
        out
    };
    let docs = [
        cron_job("tick", "  concurrencyPolicy: Forbid", "sleep 200"),
        cron_job(
            "quick",
            "  timeZone: Europe/Berlin\n  successfulJobsHistoryLimit: 1",
            "echo hi",
        ),
        // Never scheduled: the source of a Job made by hand, which quick's history limit of
        // one would otherwise prune as soon as a scheduled Job of quick finishes after it.
        cron_job("hand", "  suspend: true", "echo by hand"),
    ]
    .join("---\n");
    k(&["apply", "-f", "-"], Some(&docs));
    let table = k(&["get", "cronjobs"], None);
    assert!(
        table.starts_with(
            "NAME    SCHEDULE    TIMEZONE        SUSPEND   ACTIVE   LAST SCHEDULE   AGE"
        ),
        "{table}"
    );
    assert!(
        table.contains("quick   * * * * *   Europe/Berlin   False     0        <none>"),
        "{table}"
    );

    // Two scheduled times at most 2 minutes away; tick must never have two active Jobs.
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut tick_jobs_seen = 0;
    loop {
        let tick = jobs_of(&c, "tick");
        let active = tick.iter().filter(|(_, done)| !done).count();
        assert!(active <= 1, "two tick Jobs at once: {tick:?}");
        tick_jobs_seen = tick_jobs_seen.max(tick.len());
        let (_, events, _) = c.kubectl(
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=tick",
                "-o",
                "jsonpath={.items[*].reason}",
            ],
            None,
        );
        if events.contains("JobAlreadyActive") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no JobAlreadyActive within two scheduled times: {tick:?} {events}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(tick_jobs_seen, 1, "Forbid: the second time was skipped");
    let active = k(
        &[
            "get",
            "cronjob",
            "tick",
            "-o",
            "jsonpath={.status.active[*].name}",
        ],
        None,
    );
    assert_eq!(active, jobs_of(&c, "tick")[0].0);
    assert!(
        !k(
            &[
                "get",
                "cronjob",
                "tick",
                "-o",
                "jsonpath={.status.lastScheduleTime}"
            ],
            None
        )
        .is_empty()
    );

    // quick ran too (every minute, echo): its Jobs completed, the history kept to 1, the
    // scheduled time stamped in Berlin time.
    skiff_testkit::eventually_blocking("a successful quick run", Duration::from_secs(60), || {
        (!k(
            &[
                "get",
                "cronjob",
                "quick",
                "-o",
                "jsonpath={.status.lastSuccessfulTime}",
            ],
            None,
        )
        .is_empty())
        .then_some(())
    });
    skiff_testkit::eventually_blocking(
        "quick's history at its limit",
        Duration::from_secs(30),
        || {
            let done = jobs_of(&c, "quick").iter().filter(|(_, f)| *f).count();
            (done <= 1).then_some(())
        },
    );
    let quick = jobs_of(&c, "quick");
    let stamp = k(
        &[
            "get",
            "job",
            &quick[0].0,
            "-o",
            "jsonpath={.metadata.annotations.batch\\.kubernetes\\.io/cronjob-scheduled-timestamp}",
        ],
        None,
    );
    assert!(stamp.ends_with("+01:00"), "{stamp}");

    // kubectl makes a Job from the CronJob's template.
    k(&["create", "job", "by-hand", "--from=cronjob/hand"], None);
    k(
        &[
            "wait",
            "--for=condition=complete",
            "job/by-hand",
            "--timeout=60s",
        ],
        None,
    );

    // Bad input names the field.
    let bad = cron_job("bad", "", "true").replace("\"* * * * *\"", "\"61 * * * *\"");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&bad));
    assert!(!ok);
    assert!(
        err.contains("The CronJob \"bad\" is invalid")
            && err.contains("spec.schedule: Invalid value: \"61 * * * *\""),
        "{err}"
    );
    let bad = cron_job("bad", "  timeZone: Mars/Olympus", "true");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&bad));
    assert!(!ok);
    assert!(
        err.contains(
            "spec.timeZone: Invalid value: \"Mars/Olympus\": unknown time zone Mars/Olympus"
        ),
        "{err}"
    );
    let bad = cron_job("bad", "", "true").replace("\"* * * * *\"", "\"TZ=UTC * * * * *\"");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&bad));
    assert!(!ok);
    assert!(
        err.contains("cannot use TZ or CRON_TZ in schedule, use timeZone field instead"),
        "{err}"
    );

    // Deleting the CronJob takes its Jobs with it.
    k(&["delete", "cronjob", "tick"], None);
    skiff_testkit::eventually_blocking("tick's Jobs gone", Duration::from_secs(60), || {
        jobs_of(&c, "tick").is_empty().then_some(())
    });
}
