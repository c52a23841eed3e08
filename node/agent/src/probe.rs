//! Container probes: exec, tcpSocket and httpGet, with Kubernetes' timing and thresholds.
//!
//! Network probes connect to the pod's IP from inside the pod's network namespace (a
//! short-lived thread enters it; see `skiff_hostnet::run_in_netns`), so they work whatever
//! namespace the agent itself runs in.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_api::api::{Container, Probe};

use skiff_runtime::{Runtime, Sandbox};

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Startup,
    Liveness,
    Readiness,
}

/// A probe with Kubernetes' defaults filled in.
#[derive(Debug, Clone)]
pub struct Spec {
    pub handler: Handler,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    Exec(Vec<String>),
    Tcp { port: u16 },
    Http { port: u16, path: String },
}

/// Why a probe spec cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadProbe(pub String);

fn secs(v: i32, default: u64) -> Duration {
    Duration::from_secs(if v > 0 { v as u64 } else { default })
}

/// Resolves a port number or the name of one of the container's ports.
fn port(container: &Container, port: &str, field: &str) -> Result<u16, BadProbe> {
    if let Ok(n) = port.parse::<u16>()
        && n > 0
    {
        return Ok(n);
    }
    container
        .ports
        .iter()
        .find(|p| p.name == port && !port.is_empty())
        .and_then(|p| u16::try_from(p.container_port).ok())
        .ok_or_else(|| {
            BadProbe(format!(
                "{field}.port: {port:?} is neither a port number nor a named port of the container"
            ))
        })
}

impl Spec {
    /// Builds a probe from the API form; `field` names it in errors
    /// (`containers[web].livenessProbe`).
    pub fn from_api(container: &Container, probe: &Probe, field: &str) -> Result<Spec, BadProbe> {
        let handlers = [
            probe.exec.is_some(),
            probe.http_get.is_some(),
            probe.tcp_socket.is_some(),
        ];
        let handler = match (&probe.exec, &probe.http_get, &probe.tcp_socket) {
            _ if handlers.iter().filter(|h| **h).count() != 1 => {
                return Err(BadProbe(format!(
                    "{field}: exactly one of exec, httpGet and tcpSocket must be set"
                )));
            }
            (Some(e), _, _) if e.command.is_empty() => {
                return Err(BadProbe(format!("{field}.exec.command: must not be empty")));
            }
            (Some(e), _, _) => Handler::Exec(e.command.clone()),
            (_, Some(h), _) => Handler::Http {
                port: port(container, &h.port, &format!("{field}.httpGet"))?,
                path: if h.path.is_empty() {
                    "/".into()
                } else {
                    h.path.clone()
                },
            },
            (_, _, Some(t)) => Handler::Tcp {
                port: port(container, &t.port, &format!("{field}.tcpSocket"))?,
            },
            _ => unreachable!("exactly one handler is set"),
        };
        Ok(Spec {
            handler,
            initial_delay: Duration::from_secs(probe.initial_delay_seconds.max(0) as u64),
            period: secs(probe.period_seconds, 10),
            timeout: secs(probe.timeout_seconds, 1),
            success_threshold: probe.success_threshold.max(1) as u32,
            failure_threshold: probe.failure_threshold.max(0) as u32,
        }
        .with_default_failures())
    }

    fn with_default_failures(mut self) -> Self {
        if self.failure_threshold == 0 {
            self.failure_threshold = 3;
        }
        self
    }
}

/// The running state of one probe of one container run.
#[derive(Debug, Clone)]
pub struct Tracker {
    pub spec: Spec,
    successes: u32,
    failures: u32,
    /// The probe's verdict so far: `None` until it has one.
    pub passing: Option<bool>,
    next_run: Instant,
    pub last_message: String,
}

impl Tracker {
    pub fn new(spec: Spec, container_started: Instant) -> Self {
        let next_run = container_started + spec.initial_delay;
        Tracker {
            spec,
            successes: 0,
            failures: 0,
            passing: None,
            next_run,
            last_message: String::new(),
        }
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_run
    }

    pub fn next_run(&self) -> Instant {
        self.next_run
    }

    /// Records one result; returns the verdict when it changed.
    pub fn record(&mut self, ok: bool, message: String, now: Instant) -> Option<bool> {
        self.next_run = now + self.spec.period;
        self.last_message = message;
        if ok {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= self.spec.success_threshold && self.passing != Some(true) {
                self.passing = Some(true);
                return Some(true);
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= self.spec.failure_threshold && self.passing != Some(false) {
                self.passing = Some(false);
                return Some(false);
            }
        }
        None
    }
}

/// Where a network probe connects.
pub struct Target {
    pub netns: PathBuf,
    pub ip: IpAddr,
}

/// Runs one probe: `Ok(())` on success, `Err(reason)` on failure.
pub async fn run(
    handler: &Handler,
    timeout: Duration,
    runtime: &Arc<dyn Runtime>,
    sandbox: &Sandbox,
    container: &str,
    target: Option<&Target>,
) -> Result<(), String> {
    match handler {
        Handler::Exec(argv) => match runtime.exec(sandbox, container, argv, timeout).await {
            Ok(out) if out.exit_code == 0 => Ok(()),
            Ok(out) => Err(format!(
                "exec {:?} exited with {}: {}",
                argv,
                out.exit_code,
                String::from_utf8_lossy(&out.stdout).trim()
            )),
            Err(e) => Err(format!("exec {argv:?}: {e}")),
        },
        Handler::Tcp { port } | Handler::Http { port, .. } => {
            let Some(target) = target else {
                return Err("the pod has no IP yet".into());
            };
            let addr = SocketAddr::new(target.ip, *port);
            let path = match handler {
                Handler::Http { path, .. } => Some(path.clone()),
                _ => None,
            };
            skiff_hostnet::run_in_netns(&target.netns, move || network_probe(addr, path, timeout))
                .await
                .map_err(|e| e.to_string())?
        }
    }
}

/// A blocking TCP or HTTP probe; runs on a thread inside the pod's network namespace.
fn network_probe(
    addr: SocketAddr,
    http_path: Option<String>,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("dial {addr}: {e}"))?;
    let Some(path) = http_path else {
        return Ok(());
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
    stream
        .set_read_timeout(Some(left))
        .and_then(|()| stream.set_write_timeout(Some(left)))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: skiff-probe/1.0\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
    let mut head = [0u8; 64];
    let mut len = 0;
    while len < head.len() {
        match stream.read(&mut head[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) => return Err(format!("GET http://{addr}{path}: {e}")),
        }
        if head[..len].contains(&b'\n') {
            break;
        }
    }
    let line = String::from_utf8_lossy(&head[..len]);
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("GET http://{addr}{path}: not an HTTP response"))?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("GET http://{addr}{path}: HTTP status {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::api::{ContainerPort, ExecAction, HttpGetAction, TcpSocketAction};

    fn container() -> Container {
        Container {
            name: "web".into(),
            ports: vec![ContainerPort {
                name: "http".into(),
                container_port: 8080,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn defaults_and_named_ports() {
        let p = Probe {
            http_get: Some(HttpGetAction {
                port: "http".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = Spec::from_api(&container(), &p, "livenessProbe").unwrap();
        assert_eq!(
            s.handler,
            Handler::Http {
                port: 8080,
                path: "/".into()
            }
        );
        assert_eq!(s.period, Duration::from_secs(10));
        assert_eq!(s.timeout, Duration::from_secs(1));
        assert_eq!(s.failure_threshold, 3);
        assert_eq!(s.success_threshold, 1);
    }

    #[test]
    fn bad_probes_name_the_field() {
        let none = Probe::default();
        let e = Spec::from_api(&container(), &none, "containers[web].livenessProbe").unwrap_err();
        assert!(
            e.0.starts_with("containers[web].livenessProbe: exactly one"),
            "{e}"
        );
        let bad_port = Probe {
            tcp_socket: Some(TcpSocketAction {
                port: "metrics".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = Spec::from_api(&container(), &bad_port, "readinessProbe").unwrap_err();
        assert!(e.0.contains("readinessProbe.tcpSocket.port"), "{e}");
        let empty = Probe {
            exec: Some(ExecAction { command: vec![] }),
            ..Default::default()
        };
        assert!(Spec::from_api(&container(), &empty, "p").is_err());
    }

    #[test]
    fn thresholds() {
        let spec = Spec {
            handler: Handler::Tcp { port: 1 },
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 2,
        };
        let t0 = Instant::now();
        let mut t = Tracker::new(spec, t0);
        assert!(t.due(t0));
        assert_eq!(t.record(true, String::new(), t0), Some(true));
        assert!(!t.due(t0));
        assert_eq!(t.record(false, "x".into(), t0), None);
        assert_eq!(t.record(false, "x".into(), t0), Some(false));
        assert_eq!(t.passing, Some(false));
        assert_eq!(t.record(true, String::new(), t0), Some(true));
    }
}
