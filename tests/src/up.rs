//! A cluster started the way a user starts one: `cargo xtask up --nodes N` (with `--ha`,
//! three control machines behind a virtual address), run from the workspace's built `xtask`
//! with `--prebuilt` (the test tier has built every binary) and a state directory of the
//! test's own. Its machines are `up`'s: the namespaces `skiff-up-control[-i]`,
//! `skiff-up-node-<i>` and `skiff-up-outside`, the client outside the cluster, where the
//! test's kubectl runs (the laptop). Every component has the identity and role `up` gives it.
//!
//! Dropping the handle stops `up` with SIGTERM, as Ctrl-C would (it stops every component,
//! purges the nodes and removes its namespaces), and kills it after 60 s if it has not
//! exited; namespaces left by a killed `up` are removed then.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use skiff_client::{Client, ClientConfig};

use crate::machines::{kubectl_with, on_machine};
use crate::{KUBECTL, bin_dir, free_port};

/// `up`'s client namespace outside the cluster.
pub const OUTSIDE: &str = "skiff-up-outside";
/// The fabric's prefix (`up`'s machines are `.1`.. for nodes, `.250`.. for control).
const FABRIC: &str = "192.168.100";
/// The port the API servers listen on inside their machines.
const API_PORT: u16 = 6443;
/// How long `up` may take to say the cluster is up.
const START: Duration = Duration::from_secs(120);

/// A cluster `cargo xtask up` runs.
#[derive(Debug)]
pub struct UpCluster {
    up: Option<Child>,
    /// How many node machines (`node-1` ..).
    pub nodes: usize,
    /// How many control machines (1, or 3 with `--ha`).
    pub controls: usize,
    /// The address the laptop's kubectl uses: the control machine's, or the virtual one.
    pub api_ip: String,
    /// `up`'s state directory (PKI, logs, kubeconfigs).
    pub state: PathBuf,
    /// The laptop's kubeconfig: the administrator `up` made, at `api_ip`.
    pub laptop_kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl UpCluster {
    /// `cargo xtask up --nodes <nodes> [--ha]`; returns once `up` says the cluster is up
    /// and every node is Ready.
    pub async fn start(nodes: usize, ha: bool) -> UpCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let log = std::fs::File::create(dir.path().join("up.log")).expect("up.log");
        let mut cmd = Command::new(bin_dir().join("xtask"));
        cmd.args(["up", "--prebuilt", "--registry-port", "0", "--nodes"])
            .arg(nodes.to_string())
            .arg("--state-dir")
            .arg(&state)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", free_port()))
            .env("SKIFF_CONFIG", dir.path().join("config"))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("up.log"))
            .stderr(log);
        if ha {
            cmd.arg("--ha");
        }
        let up = cmd.spawn().expect("running xtask up");
        let controls = if ha { 3 } else { 1 };
        let api_ip = if ha {
            format!("{FABRIC}.240")
        } else {
            format!("{FABRIC}.250")
        };
        let mut c = UpCluster {
            up: Some(up),
            nodes,
            controls,
            api_ip,
            laptop_kubeconfig: dir.path().join("laptop.kubeconfig"),
            state,
            dir,
        };
        c.wait_up();
        // The administrator's kubeconfig names the host's forwarder; the laptop dials the
        // API server's own address (its certificate names it).
        let admin = std::fs::read_to_string(c.state.join("kubeconfig")).expect("admin kubeconfig");
        let laptop: String = admin
            .lines()
            .map(|l| match l.trim_start().strip_prefix("server: ") {
                Some(_) => format!("    server: https://{}:{API_PORT}", c.api_ip),
                None => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&c.laptop_kubeconfig, laptop).expect("laptop kubeconfig");
        let client = c.client().await;
        crate::cluster::wait_nodes_ready(&client, nodes, || c.logs()).await;
        c
    }

    fn up_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("up.log")).unwrap_or_default()
    }

    fn wait_up(&mut self) {
        let deadline = Instant::now() + START;
        loop {
            if self.up_log().contains("Skiff control plane is up") {
                return;
            }
            if let Some(up) = self.up.as_mut()
                && let Ok(Some(status)) = up.try_wait()
            {
                panic!("xtask up exited ({status}):\n{}", self.up_log());
            }
            assert!(
                Instant::now() < deadline,
                "xtask up did not finish within {START:?}:\n{}\n{}",
                self.up_log(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A client as the administrator, through `up`'s forwarder on the host.
    pub async fn client(&self) -> Client {
        let kubeconfig = self.state.join("kubeconfig");
        let config = ClientConfig::load(None, Some(&kubeconfig)).expect("admin kubeconfig");
        Client::connect_with(&config).await.expect("connecting")
    }

    /// Node `i`'s name (from 1).
    pub fn node_name(i: usize) -> String {
        format!("node-{i}")
    }

    /// Node `i`'s machine (from 1).
    pub fn node_netns(i: usize) -> String {
        format!("skiff-up-node-{i}")
    }

    /// Node `i`'s fabric address (from 1).
    pub fn node_ip(i: usize) -> String {
        format!("{FABRIC}.{i}")
    }

    /// Control machine `i`'s namespace (from 0).
    pub fn control_netns(&self, i: usize) -> String {
        if self.controls == 1 {
            "skiff-up-control".into()
        } else {
            format!("skiff-up-control-{}", i + 1)
        }
    }

    /// `program` on the laptop.
    pub fn laptop(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        on_machine(Some(&netns_path(OUTSIDE)), program)
    }

    /// `program` on machine `netns`.
    pub fn on(netns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        on_machine(Some(&netns_path(netns)), program)
    }

    /// kubectl 1.32 on the laptop.
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        kubectl_with(
            self.laptop(KUBECTL),
            &self.laptop_kubeconfig,
            &self.dir.path().join("kube-cache"),
            args,
        )
    }

    /// Runs kubectl on the laptop and waits for it.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("running kubectl")
    }

    /// Pids of the processes running `binary` (its file name) on machine `netns`.
    pub fn pids_on(netns: &str, binary: &str) -> Vec<u32> {
        let Ok(want) = std::fs::metadata(netns_path(netns)).map(|m| m.ino()) else {
            return Vec::new();
        };
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/exe"))
                    .is_ok_and(|e| e.file_name().is_some_and(|n| n == binary))
                    && std::fs::metadata(format!("/proc/{pid}/ns/net"))
                        .is_ok_and(|m| m.ino() == want)
            })
            .collect()
    }

    /// Node `i`'s agent (from 1).
    pub fn agent_pid(i: usize) -> Option<u32> {
        Self::pids_on(&Self::node_netns(i), "skiff-node")
            .first()
            .copied()
    }

    /// `up`'s output and the tail of every component's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!("--- xtask up ---\n{}", crate::cluster::tail(&self.up_log()));
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.state.join("logs"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            out += &format!(
                "\n--- {} ---\n{}",
                log.file_stem().unwrap_or_default().to_string_lossy(),
                crate::cluster::tail(&text)
            );
        }
        out
    }
}

fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

impl Drop for UpCluster {
    fn drop(&mut self) {
        let Some(mut up) = self.up.take() else { return };
        // SIGTERM to the child this handle spawned (not yet reaped, so the pid is its).
        let _ = Command::new("kill")
            .args(["-TERM", &up.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = up.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("xtask up did not stop within 60 s; killing it");
        let _ = up.kill();
        let _ = up.wait();
        // What a killed `up` leaves: its machines' namespaces (their processes die with
        // them only when nothing else holds them, so kill what runs inside first).
        let names: Vec<String> = std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .filter(|n| n.starts_with("skiff-up-"))
            .collect();
        for name in names {
            let _ = Command::new("ip")
                .args(["netns", "pids", &name])
                .output()
                .map(|o| {
                    for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                        let _ = Command::new("kill").args(["-9", pid]).status();
                    }
                });
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}
