//! Chaos: a highly available cluster (3 etcd members, 2 API servers, 2 schedulers and
//! 2 controller managers electing leaders, 3 real nodes) rolls out a Deployment of 30
//! replicas while a client in a namespace outside the cluster sends requests to its NodePort
//! Service without pause, and the test kills with SIGKILL, in random order at random times,
//! one etcd member, one API server, the leading controller manager, the leading scheduler
//! and one node agent, each started again a few seconds later. Then: every write a client
//! saw acknowledged is there; at every revision the rollout stayed within maxSurge and
//! maxUnavailable; no ReplicaSet created more pods than its slots; at least 99.9% of the
//! client's requests succeeded (the count is printed). The schedule comes from a seed
//! printed at the start; `SKIFF_CHAOS_SEED=<n>` replays it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skiff_api::Resource;
use skiff_api::api::{ConfigMap, Deployment, Service};
use skiff_client::ListParams;
use skiff_tests::eventually_within;
use skiff_tests::ha::HaCluster;
use skiff_tests::rollout::Sampler;

const T: Duration = Duration::from_secs(180);
const REPLICAS: i32 = 30;
/// 25% of 30, rounded up (Kubernetes' default maxSurge).
const SURGE: usize = 8;
/// 25% of 30, rounded down (the default maxUnavailable).
const UNAVAILABLE: usize = 7;

/// xorshift64*: a small seeded generator, so a schedule can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The backend: answers every connection on 8080 with its pod IP. On SIGTERM it keeps
/// serving for 2 s (while its endpoint leaves the load balancer), then exits, as a
/// well-behaved server drains.
const BACKEND: &str = "import os, signal, socket, threading, time\n\
def stop(*_):\n    \
    threading.Timer(2.0, lambda: os._exit(0)).start()\n\
signal.signal(signal.SIGTERM, stop)\n\
s = socket.socket()\n\
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
s.bind(('0.0.0.0', 8080))\n\
s.listen(128)\n\
while True:\n    \
    c, a = s.accept()\n    \
    try:\n        \
        c.sendall(c.getsockname()[0].encode())\n    \
    except OSError:\n        \
        pass\n    \
    c.close()\n";

fn app(version: &str) -> String {
    let script = serde_json::to_string(BACKEND).unwrap();
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: {REPLICAS}
  selector:
    matchLabels:
      app: web
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 25%
      maxUnavailable: 25%
  template:
    metadata:
      labels:
        app: web
      annotations:
        e2e/version: "{version}"
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: main
          image: host
          command: ["python3", "-c", {script}]
          ports:
            - name: http
              containerPort: 8080
          readinessProbe:
            tcpSocket:
              port: 8080
            periodSeconds: 1
            timeoutSeconds: 5
            failureThreshold: 3
          resources:
            requests:
              cpu: 10m
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  type: NodePort
  selector:
    app: web
  ports:
    - name: http
      port: 80
      targetPort: http
"#
    )
}

/// The client in the outside namespace: connects to the NodePort of each node in turn
/// without pause (at most one connection at a time, 2 s timeout), until `stop` exists or
/// 300 s passed; prints its counts as JSON.
fn client_script(node_ips: &[String], port: i32, stop: &std::path::Path) -> String {
    let ips = serde_json::to_string(node_ips).unwrap();
    format!(
        "import socket, json, os, time\n\
         ips, port, stop = {ips}, {port}, '{stop}'\n\
         ok = failed = 0; errors = {{}}; started = time.time(); i = 0\n\
         while not os.path.exists(stop) and time.time() - started < 300:\n    \
             ip = ips[i % len(ips)]; i += 1\n    \
             try:\n        \
                 s = socket.create_connection((ip, port), timeout=2)\n        \
                 s.settimeout(2)\n        \
                 if s.recv(64):\n            \
                     ok += 1\n        \
                 else:\n            \
                     failed += 1; errors['empty'] = errors.get('empty', 0) + 1\n        \
                 s.close()\n    \
             except Exception as e:\n        \
                 failed += 1; k = type(e).__name__; errors[k] = errors.get(k, 0) + 1\n\
         print(json.dumps({{'ok': ok, 'failed': failed, 'errors': errors}}), flush=True)\n",
        stop = stop.display()
    )
}

/// What the chaos does, in order of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Etcd,
    ApiServer,
    Manager,
    Scheduler,
    Agent,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollout_survives_control_plane_chaos() {
    let seed = skiff_tests::seed("SKIFF_CHAOS_SEED");
    println!("chaos seed {seed} (SKIFF_CHAOS_SEED={seed} replays the schedule)");
    let mut rng = Rng(seed);
    let mut c = HaCluster::start(3).await;
    let server = &c.servers[0];
    let out = server.kubectl_stdin(&["apply", "-f", "-"], &app("1"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deployments = c.client.namespaced::<Deployment>("default");
    let rolled_out = |generation_at_least: i64| {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("web").await.map_err(|e| e.to_string())?;
            let generation = d.metadata().map(|m| m.generation).unwrap_or(0);
            let s = d.status.clone().unwrap_or_default();
            (generation >= generation_at_least
                && s.observed_generation >= generation
                && s.updated_replicas == REPLICAS
                && s.replicas == REPLICAS
                && s.available_replicas == REPLICAS)
                .then_some(generation)
                .ok_or_else(|| format!("status {s:?}"))
        }
    };
    let first = eventually_within("30 replicas of version 1 available", T, || rolled_out(1)).await;
    let port = c
        .client
        .namespaced::<Service>("default")
        .get("web")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.ports.first().map(|p| p.node_port))
        .unwrap();
    let node_ips: Vec<String> = c.nodes.iter().map(|n| n.node_ip.clone()).collect();

    // The outside client, the writer and the rollout sampler run through everything below.
    let outside = skiff_tests::outside(&c.fabric);
    let stop_dir = tempfile::tempdir().unwrap();
    let stop = stop_dir.path().join("stop");
    let client = tokio::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{outside}"))
        .args(["python3", "-c", &client_script(&node_ips, port, &stop)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let (api, acked, writing) = (
            c.client.namespaced::<ConfigMap>("default"),
            acked.clone(),
            writing.clone(),
        );
        tokio::spawn(async move {
            let mut i = 0;
            while writing.load(std::sync::atomic::Ordering::Relaxed) && i < 5_000 {
                let cm: ConfigMap = skiff_api::manifest::decode(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("chaos-{i:05}"), "namespace": "default"},
                    "data": {"i": i.to_string()},
                }))
                .unwrap();
                if let Ok(Ok(_)) =
                    tokio::time::timeout(Duration::from_secs(10), api.create(&cm)).await
                {
                    acked.lock().unwrap().push(cm.name().to_string());
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let sampler = Sampler::start(&c.client, "web").await;

    // The schedule: each target once, in random order, at a random time in the first 30 s
    // of the rollout, down for 1–4 s.
    let mut targets = vec![
        Target::Etcd,
        Target::ApiServer,
        Target::Manager,
        Target::Scheduler,
        Target::Agent,
    ];
    for i in (1..targets.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        targets.swap(i, j);
    }
    let mut schedule: Vec<(Duration, Target, Duration)> = targets
        .into_iter()
        .map(|t| {
            (
                Duration::from_millis(rng.below(30_000)),
                t,
                Duration::from_millis(1_000 + rng.below(3_000)),
            )
        })
        .collect();
    schedule.sort_by_key(|(at, _, _)| *at);
    println!("schedule (kill at, target, down for): {schedule:?}");

    // The rollout.
    let out = c.servers[0].kubectl_stdin(&["apply", "-f", "-"], &app("2"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = Instant::now();
    for (at, target, down) in schedule {
        tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
        let what = match target {
            Target::Etcd => {
                let i = rng.below(3) as usize;
                c.etcd.members[i].kill();
                tokio::time::sleep(down).await;
                tokio::task::block_in_place(|| c.etcd.members[i].restart())
                    .unwrap_or_else(|e| panic!("etcd member {i} back: {e}"));
                format!("etcd member {i}")
            }
            Target::ApiServer => {
                let i = rng.below(2) as usize;
                c.servers[i].kill();
                tokio::time::sleep(down).await;
                tokio::task::block_in_place(|| c.servers[i].restart());
                format!("API server {i}")
            }
            Target::Manager => {
                let i = c
                    .leader("skiff-controller-manager", &c.managers)
                    .await
                    .unwrap_or(0);
                c.managers[i].kill();
                tokio::time::sleep(down).await;
                c.managers[i].restart();
                format!("controller manager {i} (the leader)")
            }
            Target::Scheduler => {
                let i = c
                    .leader("skiff-scheduler", &c.schedulers)
                    .await
                    .unwrap_or(0);
                c.schedulers[i].kill();
                tokio::time::sleep(down).await;
                c.schedulers[i].restart();
                format!("scheduler {i} (the leader)")
            }
            Target::Agent => {
                let i = rng.below(c.nodes.len() as u64) as usize;
                c.nodes[i].kill_agent();
                tokio::time::sleep(down).await;
                c.nodes[i].start_agent();
                format!("agent of {}", c.nodes[i].name)
            }
        };
        println!(
            "{:>6.1} s: killed {what}, back after {down:?}",
            started.elapsed().as_secs_f64()
        );
    }
    let generation = eventually_within("the rollout to version 2 finished", T, || {
        rolled_out(first + 1)
    })
    .await;
    println!(
        "rollout (generation {generation}) finished {:.1} s after it began",
        started.elapsed().as_secs_f64()
    );

    // Stop the client and the writer; collect.
    std::fs::write(&stop, b"").unwrap();
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), client.wait_with_output())
        .await
        .expect("the outside client stopped")
        .unwrap();
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client output {:?}: {e}; {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let ok = result["ok"].as_u64().unwrap();
    let failed = result["failed"].as_u64().unwrap();
    let rate = ok as f64 / (ok + failed).max(1) as f64;
    println!(
        "Service requests: {ok} succeeded, {failed} failed ({:.3}%); errors {}",
        rate * 100.0,
        result["errors"]
    );

    // Every acknowledged write is there.
    let acked = acked.lock().unwrap().clone();
    let present: std::collections::BTreeSet<String> = c
        .client
        .namespaced::<ConfigMap>("default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|cm| cm.name().to_string())
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|n| !present.contains(*n)).collect();
    println!(
        "{} writes acknowledged during the chaos, {} lost",
        acked.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(
        acked.len() > 100,
        "the writer made progress: {}",
        acked.len()
    );

    // The rollout stayed within its bounds at every revision; no slot got a second pod.
    let s = sampler.get();
    println!(
        "rollout: {} pod states seen, at most {} active (limit {}), at least {} ready (limit {}), ReplicaSets' replicas at most {}",
        s.samples,
        s.max_active,
        REPLICAS as usize + SURGE,
        s.min_ready,
        REPLICAS as usize - UNAVAILABLE,
        s.max_rs_replicas
    );
    assert!(s.max_active <= REPLICAS as usize + SURGE, "{s:?}");
    assert!(s.max_rs_replicas <= REPLICAS + SURGE as i32, "{s:?}");
    assert!(s.min_ready >= REPLICAS as usize - UNAVAILABLE, "{s:?}");
    assert_eq!(
        s.created.len(),
        2,
        "two ReplicaSets' pods: {:?}",
        s.created.keys()
    );
    for (rs, pods) in &s.created {
        assert_eq!(
            pods.len(),
            REPLICAS as usize,
            "ReplicaSet {rs} created {} pods for {REPLICAS} slots",
            pods.len()
        );
    }
    assert!(
        rate >= 0.999,
        "{ok} of {} Service requests succeeded (want 99.9%); {}",
        ok + failed,
        c.logs()
    );
}
