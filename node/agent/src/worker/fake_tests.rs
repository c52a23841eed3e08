//! The pod worker on the fakes: a real in-process API server, the in-memory runtime
//! (`FakeRuntime`), network (`FakeNetwork`), data path (`FakeLb`) and device confinement
//! (`FakeDevices`), sharing one journal of calls. Restart back-off, probe failures, set-up and
//! teardown order (device confinement before any container starts, privileged pods exempt),
//! without root or a kernel.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skiff_api::api::{Container, ExecAction, ObjectMeta, Pod, PodSpec, Probe};
use skiff_apiserver::ApiServerOptions;
use skiff_client::controller::EventRecorder;
use skiff_client::{Client, DeleteParams, ListParams};
use skiff_datapath::devices::fake::FakeDevices;
use skiff_datapath::lb::LbConfig;
use skiff_datapath::lb::fake::FakeLb;
use skiff_hostnet::fake::FakeNetwork;
use skiff_runtime::Runtime;
use skiff_runtime::fake::FakeRuntime;
use skiff_testkit::server::TestServer;
use skiff_testkit::{WAIT, eventually};
use tokio::sync::mpsc;

use super::{Backoff, Ctx, Msg, Worker};
use crate::EVENT_COMPONENT;
use crate::api::PodRegistry;
use crate::pod_datapath::PodDatapath;
use crate::proxy::Proxy;

type Journal = Arc<Mutex<Vec<String>>>;

/// A worker's world: the API server, the fakes and their journal.
struct Bed {
    _server: TestServer,
    client: Client,
    runtime: Arc<FakeRuntime>,
    journal: Journal,
    ctx: Arc<Ctx>,
    _state: tempfile::TempDir,
}

async fn bed(backoff_initial: Duration) -> Bed {
    bed_with_devices(backoff_initial, true).await
}

/// A bed whose device confinement works (`devices`) or could not be loaded.
async fn bed_with_devices(backoff_initial: Duration, devices: bool) -> Bed {
    let server = TestServer::start(ApiServerOptions::default()).await;
    let client = Client::connect(&server.endpoint()).await.expect("connect");
    let journal: Journal = Arc::default();
    let runtime = Arc::new(FakeRuntime::new().with_journal(journal.clone()));
    let net = Arc::new(
        FakeNetwork::new("10.244.1.0/24")
            .expect("cidr")
            .with_journal(journal.clone()),
    );
    let lb = FakeLb::new(LbConfig::default()).with_journal(journal.clone());
    let devices: Result<Arc<Mutex<dyn skiff_datapath::devices::DeviceConfinement>>, String> =
        if devices {
            Ok(Arc::new(Mutex::new(
                FakeDevices::default().with_journal(journal.clone()),
            )))
        } else {
            Err("the node agent was built without its eBPF programs".into())
        };
    let state = tempfile::tempdir().expect("state dir");
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        runtime: runtime.clone(),
        datapath: PodDatapath {
            net,
            proxy: Ok(Proxy::new(lb, "node-1", Vec::new())),
            devices,
            accounting: None,
        },
        host_ip: Some("192.168.100.1".into()),
        backoff: Backoff {
            initial: backoff_initial,
            max: backoff_initial * 8,
        },
        pods: PodRegistry::default(),
        recorder: EventRecorder::new(client.clone(), EVENT_COMPONENT, "node-1"),
        images: Err("no image store in these tests".into()),
        volumes: super::volumes::Volumes::new(state.path()),
        services: skiff_client::controller::Informers::new(client.clone())
            .get::<skiff_api::api::Service>(),
    });
    Bed {
        _server: server,
        client,
        runtime,
        journal,
        ctx,
        _state: state,
    }
}

fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: "host".into(),
        command: vec!["sleep".into(), "1000".into()],
        ..Default::default()
    }
}

fn pod(name: &str, containers: Vec<Container>) -> Pod {
    Pod {
        metadata: Some(ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            node_name: "node-1".into(),
            containers,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A running worker for a pod created in the API; its exits are forwarded as the agent's
/// pod loop does.
struct RunningWorker {
    uid: String,
    tx: mpsc::UnboundedSender<Msg>,
    task: tokio::task::JoinHandle<()>,
    forward: tokio::task::JoinHandle<()>,
}

impl Bed {
    async fn start(&self, p: Pod) -> RunningWorker {
        let created = self
            .client
            .namespaced::<Pod>("default")
            .create(&p)
            .await
            .expect("create pod");
        let uid = created
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Worker::new(self.ctx.clone(), uid.clone(), Some(created));
        let task = tokio::spawn(w.run(rx));
        let mut exits = self.runtime.exits();
        let (fwd_tx, fwd_uid) = (tx.clone(), uid.clone());
        let forward = tokio::spawn(async move {
            while let Ok((u, _)) = exits.recv().await {
                if u == fwd_uid && fwd_tx.send(Msg::Wake).is_err() {
                    return;
                }
            }
        });
        RunningWorker {
            uid,
            tx,
            task,
            forward,
        }
    }

    async fn get(&self, name: &str) -> Option<Pod> {
        self.client
            .namespaced::<Pod>("default")
            .get(name)
            .await
            .ok()
    }

    fn journal(&self) -> Vec<String> {
        self.journal.lock().map(|j| j.clone()).unwrap_or_default()
    }

    async fn events(&self, reason: &str) -> Vec<String> {
        let lp = ListParams::default();
        self.client
            .namespaced::<skiff_api::api::Event>("default")
            .list(&lp)
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter(|e| e.reason == reason)
                    .map(|e| e.message)
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn waiting_reason(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .container_statuses
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()
        .map(|w| w.reason.clone())
}

fn restart_count(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_restart_at_once_then_with_doubling_back_off() {
    let backoff = Duration::from_millis(400);
    let b = bed(backoff).await;
    let r = b.start(pod("crasher", vec![container("c")])).await;
    let starts = |n| {
        let rt = b.runtime.clone();
        let uid = r.uid.clone();
        move || rt.starts(&uid, "c") >= n
    };
    eventually("first start", async || starts(1)().then_some(())).await;

    // The first crash restarts at once.
    b.runtime.exit(&r.uid, "c", 1);
    eventually("restart after the first crash", async || {
        starts(2)().then_some(())
    })
    .await;

    // Later ones wait the back-off, doubling; meanwhile the pod says CrashLoopBackOff.
    for (n, wait) in [(3, backoff), (4, backoff * 2)] {
        let crashed = Instant::now();
        b.runtime.exit(&r.uid, "c", 1);
        let reason = eventually("CrashLoopBackOff in the status", async || {
            b.get("crasher").await.and_then(|p| waiting_reason(&p))
        })
        .await;
        assert_eq!(reason, "CrashLoopBackOff");
        assert!(!starts(n)(), "restarted before the back-off of {wait:?}");
        eventually("restart after the back-off", async || {
            starts(n)().then_some(())
        })
        .await;
        let took = crashed.elapsed();
        assert!(
            took >= wait,
            "restart {n} after {took:?}, back-off {wait:?}"
        );
    }
    let p = eventually("restartCount 3", async || {
        b.get("crasher").await.filter(|p| restart_count(p) == 3)
    })
    .await;
    let last = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.first())
        .and_then(|c| c.last_state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(last, Some(1), "lastState.terminated.exitCode: {p:?}");
    let backoffs = eventually("a BackOff event", async || {
        Some(b.events("BackOff").await).filter(|e| !e.is_empty())
    })
    .await;
    assert!(
        backoffs[0].contains("Back-off restarting failed container c"),
        "{backoffs:?}"
    );
    r.forward.abort();
    r.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_liveness_probe_kills_and_restarts_the_container() {
    let b = bed(Duration::from_millis(100)).await;
    let mut c = container("web");
    c.liveness_probe = Some(Probe {
        exec: Some(ExecAction {
            command: vec!["check".into()],
        }),
        period_seconds: 1,
        failure_threshold: 2,
        ..Default::default()
    });
    let r = b.start(pod("probed", vec![c])).await;
    eventually("started", async || {
        (b.runtime.starts(&r.uid, "web") == 1).then_some(())
    })
    .await;
    // Healthy: no restart for two periods.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(b.runtime.starts(&r.uid, "web"), 1);
    assert!(!b.journal().iter().any(|l| l.starts_with("runtime: stop")));

    b.runtime.set_exec("web", 1);
    eventually("restarted after two failed probes", async || {
        (b.runtime.starts(&r.uid, "web") == 2).then_some(())
    })
    .await;
    let journal = b.journal();
    let stop = journal
        .iter()
        .position(|l| l == &format!("runtime: stop {}/web", r.uid));
    let restart = journal
        .iter()
        .rposition(|l| l == &format!("runtime: start {}/web", r.uid));
    assert!(
        matches!((stop, restart), (Some(s), Some(t)) if s < t),
        "killed, then started again: {journal:?}"
    );
    let unhealthy = eventually("an Unhealthy event", async || {
        Some(b.events("Unhealthy").await).filter(|e| !e.is_empty())
    })
    .await;
    assert!(
        unhealthy[0].contains("Liveness probe failed"),
        "{unhealthy:?}"
    );
    let killing = eventually("a Killing event", async || {
        Some(b.events("Killing").await).filter(|e| !e.is_empty())
    })
    .await;
    assert!(killing[0].contains("will be restarted"), "{killing:?}");
    r.forward.abort();
    r.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_up_and_torn_down_in_order() {
    let b = bed(Duration::from_millis(100)).await;
    let r = b
        .start(pod("ordered", vec![container("a"), container("b")]))
        .await;
    let ip = eventually("Running with an IP", async || {
        let p = b.get("ordered").await?;
        let st = p.status.as_ref()?;
        (st.phase == "Running").then(|| st.pod_ip.clone())
    })
    .await;
    let uid = &r.uid;
    let veth = skiff_hostnet::host_veth_name(uid);
    let setup = [
        format!("runtime: create sandbox {uid}"),
        format!("devices: confine {uid}"),
        format!("net: attach {uid} {ip}"),
        format!("datapath: attach tc {veth}"),
        format!("datapath: set endpoint {ip}"),
        format!("runtime: start {uid}/a"),
        format!("runtime: start {uid}/b"),
    ];
    assert_eq!(b.journal(), setup, "set up in order");

    // A graceful delete: the worker sees the deletion timestamp, stops everything, and
    // finishes the delete.
    b.client
        .namespaced::<Pod>("default")
        .delete("ordered", &DeleteParams::default())
        .await
        .expect("delete");
    let deleting = b.get("ordered").await.expect("still there, terminating");
    assert!(
        deleting
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty()),
        "graceful: {deleting:?}"
    );
    r.tx.send(Msg::Update(Box::new(deleting)))
        .expect("worker alive");
    tokio::time::timeout(WAIT, r.task)
        .await
        .expect("the worker ends after teardown")
        .expect("worker task");
    let teardown: Vec<String> = b.journal().split_off(setup.len());
    assert_eq!(
        teardown,
        [
            format!("runtime: remove sandbox {uid}"),
            format!("devices: release {uid}"),
            format!("datapath: remove endpoint {ip}"),
            format!("datapath: detach tc {veth}"),
            format!("net: detach {uid}"),
        ],
        "containers stopped, then the data path entry removed before the veth and address go"
    );
    assert!(!b.runtime.has_sandbox(uid));
    eventually("the delete finished with grace 0", async || {
        b.get("ordered").await.is_none().then_some(())
    })
    .await;
    let killing = b.events("Killing").await;
    assert_eq!(
        killing.len(),
        2,
        "one Killing event per container: {killing:?}"
    );
    r.forward.abort();
}

fn privileged_container(name: &str) -> Container {
    Container {
        security_context: Some(skiff_api::api::SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }),
        ..container(name)
    }
}

/// A pod with a privileged container gets every device (no confinement); without device
/// confinement an unprivileged pod's containers never start, and its status says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_confinement_before_start_privileged_pods_exempt() {
    let b = bed(Duration::from_millis(100)).await;
    let r = b
        .start(pod(
            "privileged",
            vec![container("a"), privileged_container("b")],
        ))
        .await;
    eventually("Running", async || {
        let p = b.get("privileged").await?;
        (p.status.as_ref()?.phase == "Running").then_some(())
    })
    .await;
    assert!(
        !b.journal()
            .iter()
            .any(|l| l.starts_with("devices: confine")),
        "{:?}",
        b.journal()
    );
    r.forward.abort();
    r.task.abort();

    let b = bed_with_devices(Duration::from_millis(100), false).await;
    let r = b.start(pod("unconfinable", vec![container("a")])).await;
    let reason = eventually("a pod-level failure", async || {
        let p = b.get("unconfinable").await?;
        Some(p.status.as_ref()?.reason.clone()).filter(|r| !r.is_empty())
    })
    .await;
    assert_eq!(reason, "DeviceConfinementFailed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !b.journal().iter().any(|l| l.starts_with("runtime: start")),
        "a container started unconfined: {:?}",
        b.journal()
    );
    r.forward.abort();
    r.task.abort();
}
