//! A pod's life on a real agent, end to end: the real API server, and a real `skiff-node` agent
//! whose node lives in a network namespace of its own, running pods as cgroup v2 process groups
//! with their own network namespaces, veths and pod IPs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::path::Path;
use std::time::Duration;

use skiff_api::api::{Node as ApiNode, Pod};
use skiff_client::{Api, ClientError, DeleteParams};
use skiff_tests::{ApiServer, Backend, Machine, Node, eventually_within};

const T: Duration = Duration::from_secs(30);

fn pod(value: serde_json::Value) -> Pod {
    skiff_api::manifest::decode(value).expect("a valid pod")
}

/// A python one-liner that retries `url` (bounded: 300 × 0.1 s), touches `mark` on success,
/// then sleeps.
fn reach(url: &str, mark: &Path) -> Vec<String> {
    let script = format!(
        "import urllib.request, time, pathlib\n\
         for _ in range(300):\n    \
             try:\n        urllib.request.urlopen('{url}', timeout=1); pathlib.Path('{}').touch(); break\n    \
             except Exception:\n        time.sleep(0.1)\n\
         time.sleep(3600)\n",
        mark.display()
    );
    vec!["python3".into(), "-c".into(), script]
}

fn container_status<'a>(p: &'a Pod, name: &str) -> Option<&'a skiff_api::api::ContainerStatus> {
    p.status
        .as_ref()?
        .container_statuses
        .iter()
        .find(|c| c.name == name)
}

/// The host pid of a running container, from its containerID `skiff://uid/name/pid`.
fn pid(p: &Pod, name: &str) -> Option<u32> {
    let cs = container_status(p, name)?;
    cs.state.as_ref()?.running.as_ref()?;
    cs.container_id.rsplit('/').next()?.parse().ok()
}

fn restarts(p: &Pod, name: &str) -> i32 {
    container_status(p, name)
        .map(|c| c.restart_count)
        .unwrap_or(-1)
}

fn condition(p: &Pod, kind: &str) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == kind))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

async fn get(api: &Api<Pod>, name: &str) -> Result<Pod, String> {
    api.get(name).await.map_err(|e| e.to_string())
}

async fn running(api: &Api<Pod>, name: &str, containers: &[&str]) -> Pod {
    eventually_within(&format!("pod {name} running"), T, || async {
        let p = get(api, name).await?;
        let phase = p
            .status
            .as_ref()
            .map(|s| s.phase.clone())
            .unwrap_or_default();
        let ip = p
            .status
            .as_ref()
            .map(|s| s.pod_ip.clone())
            .unwrap_or_default();
        if phase == "Running" && !ip.is_empty() && containers.iter().all(|c| pid(&p, c).is_some()) {
            Ok(p)
        } else {
            Err(format!("phase {phase:?}, ip {ip:?}, status {:?}", p.status))
        }
    })
    .await
}

fn kill9(pid: u32) {
    let st = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -9 {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_pods_end_to_end() {
    let fabric = skiff_tests::fabric();
    let control = Machine::on(&fabric, "control");
    let server = ApiServer::start_on(&control, Backend::Embedded, &[]);
    let node_name = format!("e2e-{}", skiff_tests::unique());
    let mut node = Node::start(&server, &fabric, &node_name, "10.244.3.0/24");
    let marks = tempfile::tempdir().expect("tempdir");
    let m = |name: &str| marks.path().join(name);
    let client = server.client().await;
    let pods = client.namespaced::<Pod>("default");

    // The node registers, is Ready and says which cgroup controllers it lacks.
    let nodes = client.cluster::<ApiNode>();
    eventually_within("node registered and Ready", T, || async {
        let n = nodes.get(&node_name).await.map_err(|e| e.to_string())?;
        let st = n.status.clone().unwrap_or_default();
        let ready = st
            .conditions
            .iter()
            .any(|c| c.r#type == "Ready" && c.status == "True");
        let limits = st
            .conditions
            .iter()
            .any(|c| c.r#type == skiff_node_limits() && !c.message.is_empty());
        let cidr = n
            .spec
            .as_ref()
            .map(|s| s.pod_cidr.clone())
            .unwrap_or_default();
        if ready && limits && cidr == "10.244.3.0/24" && st.capacity.contains_key("cpu") {
            Ok(())
        } else {
            Err(format!("{n:?}"))
        }
    })
    .await;

    // A pod with two containers: the second reaches the first on localhost.
    pods.create(&pod(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"nodeName": node_name, "terminationGracePeriodSeconds": 3, "containers": [
            {"name": "server", "image": "host",
             "command": ["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"],
             "workingDir": marks.path().to_str().unwrap()},
            {"name": "sidecar", "image": "host",
             "command": reach("http://127.0.0.1:8080/", &m("localhost-ok"))},
        ]}
    })))
    .await
    .expect("create web");
    let web = running(&pods, "web", &["server", "sidecar"]).await;
    let web_ip = web.status.as_ref().unwrap().pod_ip.clone();
    assert!(
        web_ip.starts_with("10.244.3."),
        "pod IP from the node's CIDR: {web_ip}"
    );
    eventually_within("sidecar reached the server on localhost", T, || async {
        m("localhost-ok")
            .exists()
            .then_some(())
            .ok_or_else(|| node.agent_log())
    })
    .await;

    // A second pod reaches it by pod IP.
    pods.create(&pod(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {"nodeName": node_name, "containers": [
            {"name": "c", "image": "host",
             "resources": {"limits": {"memory": "64Mi"}},
             "command": reach(&format!("http://{web_ip}:8080/"), &m("podip-ok"))},
        ]}
    })))
    .await
    .expect("create client");
    let client_pod = running(&pods, "client", &["c"]).await;
    // A memory limit this host cannot enforce (no memory controller in cgroup v2) is said so
    // in the pod's status; where the controller exists, it is enforced and nothing is said.
    let v2 = skiff_tests::cgroup2_root();
    let has_memory = std::fs::read_to_string(v2.join("cgroup.controllers"))
        .unwrap_or_default()
        .split_whitespace()
        .any(|c| c == "memory");
    let limits = client_pod
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.r#type == skiff_node_limits())
        })
        .cloned();
    if has_memory {
        assert!(limits.is_none(), "{limits:?}");
    } else {
        let c = limits.expect("a ResourceLimitsEnforced condition");
        assert_eq!(c.status, "False");
        assert!(c.message.contains("memory"), "{}", c.message);
    }
    eventually_within("second pod reached the first by pod IP", T, || async {
        m("podip-ok").exists().then_some(()).ok_or_else(String::new)
    })
    .await;

    // Killing a container's process: it is restarted and restartCount grows.
    let old = pid(&web, "server").unwrap();
    kill9(old);
    eventually_within("server restarted after kill -9", T, || async {
        let p = get(&pods, "web").await?;
        match pid(&p, "server") {
            Some(new) if new != old && restarts(&p, "server") >= 1 => Ok(()),
            _ => Err(format!("{:?}", container_status(&p, "server"))),
        }
    })
    .await;

    // Probes: readiness gates Ready, a failing liveness probe restarts the container.
    std::fs::write(m("alive"), "").unwrap();
    pods.create(&pod(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probed"},
        "spec": {"nodeName": node_name, "containers": [
            {"name": "app", "image": "host", "command": ["sleep", "3600"],
             "livenessProbe": {"exec": {"command": ["test", "-e", m("alive").to_str().unwrap()]},
                               "periodSeconds": 1, "failureThreshold": 1},
             "readinessProbe": {"exec": {"command": ["test", "-e", m("ready").to_str().unwrap()]},
                                "periodSeconds": 1, "failureThreshold": 1}},
        ]}
    })))
    .await
    .expect("create probed");
    let probed = running(&pods, "probed", &["app"]).await;
    assert_eq!(
        condition(&probed, "Ready"),
        "False",
        "readiness probe fails: not Ready"
    );
    std::fs::write(m("ready"), "").unwrap();
    eventually_within("Ready once the readiness probe passes", T, || async {
        let p = get(&pods, "probed").await?;
        (condition(&p, "Ready") == "True")
            .then_some(())
            .ok_or(condition(&p, "Ready"))
    })
    .await;
    std::fs::remove_file(m("ready")).unwrap();
    eventually_within("not Ready again when it fails", T, || async {
        let p = get(&pods, "probed").await?;
        (condition(&p, "Ready") == "False")
            .then_some(())
            .ok_or(condition(&p, "Ready"))
    })
    .await;
    std::fs::remove_file(m("alive")).unwrap();
    eventually_within("liveness failure restarts the container", T, || async {
        let p = get(&pods, "probed").await?;
        (restarts(&p, "app") >= 1)
            .then_some(())
            .ok_or_else(|| format!("{:?}", p.status))
    })
    .await;
    std::fs::write(m("alive"), "").unwrap();

    // Bad specs: a clear reason in the pod's status, and the agent keeps serving others.
    for (name, container, want) in [
        (
            "no-command",
            serde_json::json!({"name": "c", "image": "host"}),
            "command: required",
        ),
        (
            "no-rootfs",
            serde_json::json!({"name": "c", "image": "/nonexistent/rootfs", "command": ["sh"]}),
            "does not exist",
        ),
        (
            "bad-probe",
            serde_json::json!({"name": "c", "image": "host", "command": ["sleep", "60"],
                "livenessProbe": {"tcpSocket": {"port": "metrics"}}}),
            "livenessProbe.tcpSocket.port",
        ),
    ] {
        pods.create(&pod(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node_name, "containers": [container]}
        })))
        .await
        .expect("create bad pod");
        eventually_within(&format!("{name} shows why it cannot run"), T, || async {
            let p = get(&pods, name).await?;
            let waiting = container_status(&p, "c")
                .and_then(|c| c.state.as_ref()?.waiting.clone())
                .unwrap_or_default();
            if waiting.message.contains(want) && !waiting.reason.is_empty() {
                Ok(())
            } else {
                Err(format!("{:?}", p.status))
            }
        })
        .await;
    }
    assert!(pid(&get(&pods, "client").await.unwrap(), "c").is_some());

    // kill -9 the agent and start it again: pods are adopted, not restarted.
    let before = get(&pods, "web").await.unwrap();
    let (server_pid, sidecar_pid) = (
        pid(&before, "server").unwrap(),
        pid(&before, "sidecar").unwrap(),
    );
    let server_restarts = restarts(&before, "server");
    node.kill_agent();
    node.start_agent();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = get(&pods, "web").await.unwrap();
    assert_eq!(
        pid(&after, "server"),
        Some(server_pid),
        "same pid after agent restart"
    );
    assert_eq!(
        pid(&after, "sidecar"),
        Some(sidecar_pid),
        "same pid after agent restart"
    );
    assert!(Path::new(&format!("/proc/{server_pid}")).exists());
    // Status updates resume: a new crash is seen and counted.
    kill9(sidecar_pid);
    eventually_within(
        "status updates resume after the agent restart",
        T,
        || async {
            let p = get(&pods, "web").await?;
            match pid(&p, "sidecar") {
                Some(new) if new != sidecar_pid && restarts(&p, "sidecar") >= 1 => Ok(()),
                _ => Err(format!("{:?}", container_status(&p, "sidecar"))),
            }
        },
    )
    .await;
    assert_eq!(
        restarts(&get(&pods, "web").await.unwrap(), "server"),
        server_restarts
    );

    // Deleting the pod: processes gone within the grace period, cgroup, netns, veth, IP freed.
    let web = get(&pods, "web").await.unwrap();
    let uid = web.metadata.as_ref().unwrap().uid.clone();
    let pids = [pid(&web, "server").unwrap(), pid(&web, "sidecar").unwrap()];
    let netns_before = node.pod_netns_names();
    let veths_before = node.ip(&["-o", "link"]);
    pods.delete("web", &DeleteParams::default())
        .await
        .expect("delete web");
    eventually_within(
        "web deleted through the agent",
        Duration::from_secs(15),
        || async {
            match pods.get("web").await {
                Err(ClientError::NotFound { .. }) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    for p in pids {
        assert!(
            !Path::new(&format!("/proc/{p}")).exists(),
            "process {p} still alive"
        );
    }
    assert!(
        !node.cgroup_parent.join(format!("pod-{uid}")).exists(),
        "pod cgroup removed"
    );
    let netns_after = node.pod_netns_names();
    assert_eq!(
        netns_after.len() + 1,
        netns_before.len(),
        "one pod netns fewer"
    );
    for n in netns_before.iter().filter(|n| !netns_after.contains(n)) {
        assert!(!Path::new("/run/netns").join(n).exists(), "{n} removed");
    }
    let veth = skiff_node_veth(&uid);
    assert!(veths_before.contains(&veth), "{veth} existed");
    assert!(!node.ip(&["-o", "link"]).contains(&veth), "{veth} removed");
    let ipam = node.state_dir.path().join("state/net/ipam").join(&web_ip);
    assert!(!ipam.exists(), "IP {web_ip} released");
}

fn skiff_node_limits() -> &'static str {
    skiff_node::LIMITS_CONDITION
}

fn skiff_node_veth(uid: &str) -> String {
    skiff_hostnet::host_veth_name(uid)
}
