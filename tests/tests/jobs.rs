//! Jobs with the real kubectl on a real cluster: completions with parallelism, `kubectl wait
//! --for=condition=complete`, an Indexed Job whose pods each get their index, a failing pod
//! retried to backoffLimit and the Job Failed with Kubernetes' reason, a podFailurePolicy
//! FailJob rule, activeDeadlineSeconds, ttlSecondsAfterFinished, `kubectl create job`, and
//! bad input refused with Kubernetes' messages.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::collections::BTreeSet;
use std::time::Duration;

use skiff_tests::cluster::Cluster;

const T: Duration = Duration::from_secs(90);

/// A Job running `script` in a host busybox shell.
fn job(name: &str, extra_spec: &str, script: &str) -> String {
    format!(
        r#"apiVersion: batch/v1
kind: Job
metadata: {{name: {name}}}
spec:
{extra_spec}
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

fn condition(c: &Cluster, name: &str, ty: &str) -> String {
    let (_, out, _) = c.kubectl(
        &[
            "get",
            "job",
            name,
            "-o",
            &format!("jsonpath={{.status.conditions[?(@.type==\"{ty}\")].reason}}|{{.status.conditions[?(@.type==\"{ty}\")].message}}"),
        ],
        None,
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_to_completion_or_fail_as_kubernetes_says() {
    let c = Cluster::start(1).await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}\n{}", c.logs());
        out
    };
    let docs = [
        job("ok", "  completions: 3\n  parallelism: 2", "echo done"),
        job(
            "indexed",
            "  completions: 3\n  parallelism: 3\n  completionMode: Indexed",
            "echo index=$JOB_COMPLETION_INDEX host=$(hostname)",
        ),
        job("flaky", "  backoffLimit: 1", "exit 1"),
        job(
            "fatal",
            "  backoffLimit: 5\n  podFailurePolicy:\n    rules:\n    - action: FailJob\n      onExitCodes: {operator: In, values: [42]}",
            "exit 42",
        ),
        job("slow", "  activeDeadlineSeconds: 2", "sleep 60"),
        job("brief", "  ttlSecondsAfterFinished: 0", "true"),
    ]
    .join("---\n");
    k(&["apply", "-f", "-"], Some(&docs));

    // Completions with parallelism; kubectl waits on the condition.
    k(
        &[
            "wait",
            "--for=condition=complete",
            "job/ok",
            "--timeout=60s",
        ],
        None,
    );
    let table = k(&["get", "job", "ok"], None);
    assert!(
        table.starts_with("NAME   STATUS     COMPLETIONS   DURATION   AGE"),
        "{table}"
    );
    assert!(table.contains("ok     Complete   3/3"), "{table}");
    let phases = k(
        &[
            "get",
            "pods",
            "-l",
            "job-name=ok",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ],
        None,
    );
    assert_eq!(
        phases.split(' ').collect::<Vec<_>>(),
        ["Succeeded"; 3],
        "{phases}"
    );
    assert_eq!(
        condition(&c, "ok", "Complete"),
        "CompletionsReached|Reached expected number of succeeded pods"
    );

    // Indexed: each pod ran its own index, with the hostname <job>-<index>.
    k(
        &[
            "wait",
            "--for=condition=complete",
            "job/indexed",
            "--timeout=60s",
        ],
        None,
    );
    assert_eq!(
        k(
            &[
                "get",
                "job",
                "indexed",
                "-o",
                "jsonpath={.status.completedIndexes}"
            ],
            None
        ),
        "0-2"
    );
    let pods = k(
        &[
            "get",
            "pods",
            "-l",
            "job-name=indexed",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    );
    let mut seen = BTreeSet::new();
    for pod in pods.split(' ') {
        let index = k(
            &[
                "get",
                "pod",
                pod,
                "-o",
                "jsonpath={.metadata.annotations.batch\\.kubernetes\\.io/job-completion-index}",
            ],
            None,
        );
        let log = k(&["logs", pod], None);
        assert_eq!(
            log.trim(),
            format!("index={index} host=indexed-{index}"),
            "{pod}"
        );
        seen.insert(index);
    }
    assert_eq!(seen, ["0", "1", "2"].map(String::from).into());

    // A failing pod: retried once (backoffLimit 1, after the 10 s back-off), then Failed.
    k(
        &[
            "wait",
            "--for=condition=failed",
            "job/flaky",
            "--timeout=60s",
        ],
        None,
    );
    assert_eq!(
        condition(&c, "flaky", "Failed"),
        "BackoffLimitExceeded|Job has reached the specified backoff limit"
    );
    assert_eq!(
        k(
            &["get", "job", "flaky", "-o", "jsonpath={.status.failed}"],
            None
        ),
        "2"
    );
    assert!(k(&["get", "job", "flaky"], None).contains("Failed"));

    // podFailurePolicy: exit code 42 fails the Job at once, whatever the backoffLimit.
    k(
        &[
            "wait",
            "--for=condition=failed",
            "job/fatal",
            "--timeout=60s",
        ],
        None,
    );
    let (reason, message) = condition(&c, "fatal", "Failed")
        .split_once('|')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .unwrap();
    assert_eq!(reason, "PodFailurePolicy");
    assert!(
        message.starts_with("Container work for pod default/fatal-")
            && message.ends_with("failed with exit code 42 matching FailJob rule at index 0"),
        "{message}"
    );
    assert_eq!(
        k(
            &["get", "job", "fatal", "-o", "jsonpath={.status.failed}"],
            None
        ),
        "1"
    );

    // activeDeadlineSeconds: the running pod is stopped and the Job fails.
    k(
        &[
            "wait",
            "--for=condition=failed",
            "job/slow",
            "--timeout=60s",
        ],
        None,
    );
    assert_eq!(
        condition(&c, "slow", "Failed"),
        "DeadlineExceeded|Job was active longer than specified deadline"
    );

    // ttlSecondsAfterFinished: 0: gone once finished, with its pods.
    skiff_testkit::eventually_blocking("the finished Job deleted", T, || {
        let (ok, _, err) = c.kubectl(&["get", "job", "brief"], None);
        (!ok && err.contains("NotFound")).then_some(())
    });

    // kubectl create job, as users start one-off work.
    k(
        &[
            "create",
            "job",
            "hello",
            "--image=host",
            "--",
            "busybox",
            "echo",
            "hi",
        ],
        None,
    );
    k(
        &[
            "wait",
            "--for=condition=complete",
            "job/hello",
            "--timeout=60s",
        ],
        None,
    );
    assert_eq!(k(&["logs", "job/hello"], None).trim(), "hi");

    // Bad input, with Kubernetes' messages.
    let always = job("bad", "", "true").replace("restartPolicy: Never", "restartPolicy: Always");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&always));
    assert!(!ok);
    assert!(
        err.contains("The Job \"bad\" is invalid")
            && err.contains(
                "spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
            ),
        "{err}"
    );
    let unindexed = job("bad", "  completionMode: Indexed\n  parallelism: 2", "true");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(&unindexed));
    assert!(!ok);
    assert!(
        err.contains("spec.completions: Required value: when completion mode is Indexed"),
        "{err}"
    );
    let (ok, _, err) = c.kubectl(
        &[
            "patch",
            "job",
            "ok",
            "--type=merge",
            "-p",
            r#"{"spec":{"completions":5}}"#,
        ],
        None,
    );
    assert!(!ok);
    assert!(
        err.contains("spec.completions: Invalid value: 5: field is immutable"),
        "{err}"
    );
}
