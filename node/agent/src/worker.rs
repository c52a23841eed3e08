//! The pod worker: one task per pod bound to this node, converging it level-triggered.
//!
//! Every wake-up (a new version of the pod, a container exit, a due probe or back-off, or the
//! periodic resync) runs [`Worker::reconcile`], which looks at what is (the runtime's sandbox
//! and containers, the pod's network) and does the next step towards what the pod asks for.
//! It is idempotent: running it twice in a row changes nothing the second time.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

mod failure;
mod inputs;

use skiff_api::api::{Container, ContainerStateTerminated, Pod, PodStatus, Service};
use skiff_api::{Resource, quantity};
use skiff_client::controller::{EventRecorder, EventType, Informer};
use skiff_client::{Client, ClientError, DeleteParams, Preconditions};
use skiff_image::auth::RegistryAuths;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::api::PodRegistry;
use super::images::ImageService;
use super::pod_datapath::PodDatapath;
use super::probe::{self, Tracker};
use super::security::{self, ImageUser};
use super::status::{self, ContainerView, PodFacts};
use super::volumes::{self, PodVolumes};
use failure::{PodFailure, StartError};
use inputs::{InputError, Resolver, TokenCache};
use skiff_runtime::{
    ContainerSpec, ContainerState, Image, Limits, Runtime, Sandbox, SandboxSpec, StdioSpec,
};

/// What the pod workers share: the API, the runtime and the node's layers a pod uses.
pub(crate) struct Ctx {
    pub client: Client,
    pub runtime: Arc<dyn Runtime>,
    /// The pod network, the eBPF data path, device confinement and traffic counters.
    pub datapath: PodDatapath,
    pub host_ip: Option<String>,
    pub backoff: Backoff,
    /// The pods this agent runs, as their workers publish them (for the HTTP API and image
    /// garbage collection).
    pub pods: PodRegistry,
    /// Events about pods (Started, Killing, BackOff, Unhealthy, Failed).
    pub recorder: EventRecorder,
    /// Images and container root filesystems made from them, or why the store could not be
    /// opened (containers of registry images then wait with that reason).
    pub images: Result<Arc<ImageService>, String>,
    /// The pods' volumes and generated /etc files.
    pub volumes: volumes::Volumes,
    /// Every Service, for the containers' service environment variables.
    pub services: Informer<Service>,
}

/// Crash-loop and image-pull back-off: the first delay, doubling up to `max`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

/// The resolver of a pod's inputs (a function of the fields, so a caller can borrow the
/// worker's token cache mutably next to it).
fn resolver<'a>(ctx: &'a Ctx, pod: &'a Pod, uid: &'a str, pod_ip: Option<IpAddr>) -> Resolver<'a> {
    Resolver {
        client: &ctx.client,
        services: &ctx.services,
        pod,
        uid,
        pod_ip,
        host_ip: ctx.host_ip.as_deref(),
    }
}

/// What the agent tells a worker.
#[derive(Debug)]
pub enum Msg {
    /// The latest version of the pod.
    Update(Box<Pod>),
    /// The pod no longer exists in the API (or was never there: an orphan sandbox).
    Gone,
    /// Something happened to one of the pod's containers.
    Wake,
}

/// Resync period: a pod is reconciled at least this often even if nothing is heard.
const RESYNC: Duration = Duration::from_secs(30);
/// A container that ran this long without failing gets its back-off reset.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);
/// Retry delay after an infrastructure failure (sandbox, network, status write).
const RETRY: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
struct Track {
    restart_count: i32,
    last_terminated: Option<ContainerStateTerminated>,
    /// The back-off to apply to the next crash.
    backoff: Option<Duration>,
    /// When the container may be started again.
    restart_at: Option<Instant>,
    waiting: Option<(String, String)>,
    /// `finished_at` of the exit already accounted for.
    handled_exit: Option<SystemTime>,
    /// The pid whose probes `probes` track.
    pid: Option<u32>,
    cgroup_id: Option<u64>,
    startup: Option<Tracker>,
    liveness: Option<Tracker>,
    readiness: Option<Tracker>,
    /// Started (startup probe passed or none) for the current run.
    started: bool,
    ready: bool,
    /// The back-off before the next pull of this container's image after a failed one.
    pull_backoff: Option<Duration>,
    /// `repository@digest` of the image the current run started from (registry images).
    image_id: String,
}

/// A container's startup, liveness and readiness probes.
type Probes = (
    Option<probe::Spec>,
    Option<probe::Spec>,
    Option<probe::Spec>,
);

impl Track {
    /// A new run (or one adopted after an agent restart) of pid `pid`: fresh probe state.
    fn new_run(&mut self, pid: u32, started_at: SystemTime, probes: Probes, now: Instant) {
        let age = SystemTime::now()
            .duration_since(started_at)
            .unwrap_or_default();
        let started = now.checked_sub(age).unwrap_or(now);
        self.pid = Some(pid);
        self.startup = probes.0.map(|s| Tracker::new(s, started));
        self.liveness = probes.1.map(|s| Tracker::new(s, started));
        self.readiness = probes.2.map(|s| Tracker::new(s, started));
        self.started = self.startup.is_none();
        self.ready = self.started && self.readiness.is_none();
        if age > BACKOFF_RESET_AFTER {
            self.backoff = None;
        }
    }

    /// After a crash: the first restarts at once; later ones back off, doubling.
    fn schedule_restart(&mut self, backoff: Backoff, now: Instant) {
        let delay = self.backoff.unwrap_or(Duration::ZERO);
        self.restart_at = Some(now + delay);
        self.backoff = Some(if delay.is_zero() {
            backoff.initial
        } else {
            (delay * 2).min(backoff.max)
        });
    }
}

pub struct Worker {
    ctx: Arc<Ctx>,
    uid: String,
    pod: Pod,
    gone: bool,
    sandbox: Option<Sandbox>,
    /// The pod's device confinement is in place (or it needs none: privileged).
    devices_confined: bool,
    pod_ip: Option<IpAddr>,
    tracks: BTreeMap<String, Track>,
    /// A pod-level problem shown in status.reason/message.
    failure: Option<PodFailure>,
    /// The pod's volumes and generated /etc files, as last set up.
    volumes: Option<PodVolumes>,
    /// The last volume failure reported in a FailedMount event (reported once).
    mount_failure: Option<String>,
    start_time: Option<SystemTime>,
    written: Option<PodStatus>,
    /// ServiceAccount tokens of projected volumes.
    tokens: TokenCache,
}

fn grace_of(pod: &Pod) -> Duration {
    let meta = pod.metadata.as_ref();
    let secs = meta
        .and_then(|m| m.deletion_grace_period_seconds)
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30);
    Duration::from_secs(secs.max(0) as u64)
}

fn limits_of(c: &Container) -> Limits {
    let limits = c.resources.as_ref().map(|r| &r.limits);
    let get = |k: &str| limits.and_then(|l| l.get(k)).map(String::as_str);
    let milli = |k| get(k).and_then(|q| quantity::parse_milli(q).ok());
    let value = |k| get(k).and_then(|q| quantity::parse_value(q).ok());
    Limits {
        cpu_millis: milli("cpu").and_then(|m| u64::try_from(m).ok()),
        memory_bytes: value("memory").and_then(|v| u64::try_from(v).ok()),
        pids: value("pids").and_then(|v| u64::try_from(v).ok()),
    }
}

/// The repository of an image reference: without its tag or digest.
fn repository_of(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[slash..].rfind(':') {
        Some(i) => &name[..slash + i],
        None => name,
    }
}

/// Whether a container's image is a registry reference (not `host`, not a root directory).
fn from_registry(c: &Container) -> bool {
    c.image != "host" && !c.image.starts_with('/')
}

/// The runtime's view of a container of a `host` or root-directory image, or the reason it
/// cannot be run.
fn container_spec(
    pod: &Pod,
    c: &Container,
    vols: Option<&PodVolumes>,
    env: Vec<(String, String)>,
) -> Result<ContainerSpec, String> {
    let field = format!("containers[{}]", c.name);
    let image = Image::parse(&c.image).map_err(|e| format!("{field}.image: {e}"))?;
    if let Image::RootFs(dir) = &image
        && !dir.is_dir()
    {
        return Err(format!(
            "{field}.image: root directory {} does not exist",
            dir.display()
        ));
    }
    let argv: Vec<String> = c.command.iter().chain(&c.args).cloned().collect();
    if c.command.is_empty() {
        return Err(format!(
            "{field}.command: required (images have no default command in Skiff)"
        ));
    }
    let working_dir = (!c.working_dir.is_empty()).then(|| c.working_dir.clone().into());
    let mut spec = ContainerSpec {
        name: c.name.clone(),
        image,
        argv,
        env,
        working_dir,
        limits: limits_of(c),
        mounts: Vec::new(),
        security: Default::default(),
        stdio: stdio_of(c),
        target: None,
    };
    confine(&mut spec, pod, c, None, vols)?;
    Ok(spec)
}

/// Sets a container's confinement (securityContext), bind mounts (volumes, /etc files) and
/// default `HOME`: for a `host` container the node's view with the identity asked for; for
/// a root filesystem the image's user (`image_user`, its `User`) and containerd's defaults.
fn confine(
    spec: &mut ContainerSpec,
    pod: &Pod,
    c: &Container,
    image_user: Option<&str>,
    vols: Option<&PodVolumes>,
) -> Result<(), String> {
    let pod_spec = pod.spec.clone().unwrap_or_default();
    let pod_name = format!("{}/{}", pod.namespace(), pod.name());
    let field = format!("containers[{}]", c.name);
    let home = match &spec.image {
        Image::Host => {
            if !c.volume_mounts.is_empty() {
                return Err(format!(
                    "{field}.volumeMounts: volumes need a root filesystem image (not \"host\")"
                ));
            }
            spec.security = security::host_security(&pod_spec, c, &pod_name)
                .map_err(|m| format!("{field}.securityContext: {m}"))?;
            None
        }
        Image::RootFs(root) => {
            let user: ImageUser = security::image_user(image_user, Some(root))?;
            let (sec, home) = security::security(&pod_spec, c, &user, Some(root), &pod_name)?;
            spec.security = sec;
            let empty = PodVolumes::default();
            spec.mounts = volumes::mounts_for(c, vols.unwrap_or(&empty))?;
            Some(home)
        }
    };
    if let Some(home) = home
        && !spec.env.iter().any(|(k, _)| k == "HOME")
    {
        spec.env.push(("HOME".into(), home));
    }
    Ok(())
}

fn containers(pod: &Pod) -> Vec<Container> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default()
}

/// The pod's ephemeral containers (`kubectl debug`), as containers, each with the container
/// whose PID namespace it joins (`None`: the pod's own).
fn ephemeral_containers(pod: &Pod) -> Vec<(Container, Option<String>)> {
    pod.spec
        .iter()
        .flat_map(|s| &s.ephemeral_containers)
        .map(|e| {
            let target = Some(e.target_container_name.clone()).filter(|t| !t.is_empty());
            (e.to_container(), target)
        })
        .collect()
}

/// A container's `stdin`, `stdinOnce` and `tty`.
fn stdio_of(c: &Container) -> StdioSpec {
    StdioSpec {
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
    }
}

/// Whether any container of the pod (init containers included) is privileged: such a pod gets
/// every device, as runc gives a privileged container.
fn privileged(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(&s.init_containers)
            .any(|c| c.security_context.as_ref().and_then(|sc| sc.privileged) == Some(true))
    })
}

fn restart_policy(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .map(|s| s.restart_policy.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "Always".into())
}

impl Worker {
    pub fn new(ctx: Arc<Ctx>, uid: String, pod: Option<Pod>) -> Worker {
        let gone = pod.is_none();
        let pod = pod.unwrap_or_default();
        // Restart counts and last terminations survive agent restarts through the API.
        let mut tracks = BTreeMap::new();
        if let Some(st) = &pod.status {
            for cs in &st.container_statuses {
                tracks.insert(
                    cs.name.clone(),
                    Track {
                        restart_count: cs.restart_count,
                        last_terminated: cs.last_state.as_ref().and_then(|s| s.terminated.clone()),
                        image_id: cs.image_id.clone(),
                        ..Default::default()
                    },
                );
            }
        }
        let start_time = pod.status.as_ref().and_then(|s| {
            chrono::DateTime::parse_from_rfc3339(&s.start_time)
                .ok()
                .map(SystemTime::from)
        });
        Worker {
            ctx,
            uid,
            written: pod.status.clone(),
            pod,
            gone,
            sandbox: None,
            devices_confined: false,
            pod_ip: None,
            tracks,
            failure: None,
            volumes: None,
            mount_failure: None,
            start_time,
            tokens: TokenCache::new(),
        }
    }

    /// Runs until the pod is gone and torn down.
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut wake = Instant::now();
        loop {
            let sleep = tokio::time::sleep_until(wake.into());
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(Msg::Update(pod)) => self.pod = *pod,
                    Some(Msg::Gone) | None => self.gone = true,
                    Some(Msg::Wake) => {}
                },
                () = sleep => {}
            }
            // Take everything queued so one reconcile sees the latest state.
            while let Ok(msg) = rx.try_recv() {
                match msg {
                    Msg::Update(pod) => self.pod = *pod,
                    Msg::Gone => self.gone = true,
                    Msg::Wake => {}
                }
            }
            match self.reconcile().await {
                Some(next) => {
                    self.publish();
                    wake = next;
                }
                None => {
                    self.ctx.pods.remove(&self.uid);
                    return;
                }
            }
        }
    }

    fn name(&self) -> String {
        format!("{}/{}", self.pod.namespace(), self.pod.name())
    }

    /// Tells the agent's HTTP API about the pod (names, sandbox, container cgroups).
    fn publish(&self) {
        if self.gone || self.pod.name().is_empty() {
            return;
        }
        self.ctx.pods.publish(super::api::PodInfo {
            uid: self.uid.clone(),
            namespace: self.pod.namespace().to_string(),
            name: self.pod.name().to_string(),
            sandbox: self.sandbox.clone(),
            containers: containers(&self.pod)
                .into_iter()
                .chain(ephemeral_containers(&self.pod).into_iter().map(|(c, _)| c))
                .map(|c| c.name)
                .collect(),
            images: self
                .pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter().chain(&s.init_containers))
                .map(|c| c.image.clone())
                .chain(
                    ephemeral_containers(&self.pod)
                        .into_iter()
                        .map(|(c, _)| c.image),
                )
                .collect(),
            cgroup_ids: self.tracks.values().filter_map(|t| t.cgroup_id).collect(),
        });
    }

    /// One convergence step. Returns when to run again, or `None` when the worker is done.
    pub async fn reconcile(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let deleting = self
            .pod
            .metadata
            .as_ref()
            .is_some_and(|m| !m.deletion_timestamp.is_empty());
        if self.gone || deleting {
            return match self.teardown().await {
                Ok(()) => None,
                Err(e) => {
                    warn!(pod = %self.name(), error = %e, "teardown failed, retrying");
                    Some(now + RETRY)
                }
            };
        }
        let mut next = now + RESYNC;
        // Published before anything starts, so image garbage collection sees the images
        // this pod is about to use.
        self.publish();

        if let Err(e) = self.ensure_sandbox_and_network().await {
            warn!(pod = %self.name(), error = %e, "pod infrastructure");
            self.failure = Some(e);
            self.write_status().await;
            return Some(now + RETRY);
        }
        let Some(sandbox) = self.sandbox.clone() else {
            return Some(now + RETRY);
        };
        self.start_time.get_or_insert_with(SystemTime::now);
        let inputs = resolver(&self.ctx, &self.pod, &self.uid, self.pod_ip);
        let secrets = inputs.volume_secrets().await;
        let tokens = inputs.volume_tokens(&mut self.tokens).await;
        let claims = inputs.volume_claims().await;
        let ensured = secrets.and_then(|secrets| {
            let tokens = tokens?;
            self.ctx.volumes.ensure(
                &self.uid,
                &self.pod,
                self.pod_ip,
                &secrets,
                &tokens,
                &claims,
            )
        });
        match ensured {
            Ok(v) => {
                self.volumes = Some(v);
                self.mount_failure = None;
            }
            Err(e) => {
                let msg = e.to_string();
                warn!(pod = %self.name(), error = %msg, "volumes");
                if self.mount_failure.as_ref() != Some(&msg) {
                    self.event(EventType::Warning, "FailedMount", &msg).await;
                    self.mount_failure = Some(msg.clone());
                }
                self.failure = Some(InputError::FailedMount(msg).into());
                self.write_status().await;
                return Some(now + RETRY);
            }
        }

        let policy = restart_policy(&self.pod);
        let mut bad_spec = None;
        for c in containers(&self.pod) {
            if let Some(n) = self.container(&sandbox, &c, &policy, now).await {
                next = next.min(n);
            }
            if let Some((reason, msg)) = &self.tracks.get(&c.name).and_then(|t| t.waiting.clone())
                && reason.starts_with("CreateContainer")
            {
                bad_spec = Some(InputError::CreateContainerConfigError(msg.clone()).into());
            }
        }
        for (c, target) in ephemeral_containers(&self.pod) {
            if let Some(n) = self.ephemeral(&sandbox, &c, target, now).await {
                next = next.min(n);
            }
        }
        self.failure = bad_spec;
        if !self.write_status().await {
            next = next.min(now + RETRY);
        }
        Some(next)
    }

    async fn ensure_sandbox_and_network(&mut self) -> Result<(), PodFailure> {
        if self.sandbox.is_none() {
            let spec = SandboxSpec {
                uid: self.uid.clone(),
                namespace: self.pod.namespace().to_string(),
                name: self.pod.name().to_string(),
                hostname: self
                    .pod
                    .spec
                    .as_ref()
                    .map(|s| s.hostname.clone())
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| self.pod.name().to_string()),
                pid_namespace: false,
                share_pid_namespace: self
                    .pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.share_process_namespace)
                    == Some(true),
                mount_namespace: false,
                limits: Limits::default(),
            };
            let sb = self
                .ctx
                .runtime
                .create_sandbox(&spec)
                .await
                .map_err(|e| PodFailure::SandboxCreateFailed(e.to_string()))?;
            self.sandbox = Some(sb);
        }
        // Before any container starts (and again for a sandbox adopted after a restart,
        // taking over the earlier agent's pinned confinement).
        if !self.devices_confined
            && let Some(cgroup_dir) = self.sandbox.as_ref().map(|s| s.cgroup_dir.clone())
        {
            self.ctx
                .datapath
                .confine_devices(&self.uid, &cgroup_dir, privileged(&self.pod))
                .await
                .map_err(PodFailure::DeviceConfinementFailed)?;
            self.devices_confined = true;
        }
        if self.pod_ip.is_none() {
            let netns = self
                .sandbox
                .as_ref()
                .map(|s| s.netns_path.clone())
                .unwrap_or_default();
            let att = self
                .ctx
                .datapath
                .net
                .attach_pod(&self.uid, &netns)
                .await
                .map_err(|e| PodFailure::NetworkSetupFailed(e.to_string()))?;
            info!(pod = %self.name(), ip = %att.pod_ip, "pod network ready");
            self.ctx.datapath.attach_pod(&self.uid, &att).await;
            self.pod_ip = Some(att.pod_ip);
        }
        Ok(())
    }

    /// Converges one container; returns when it needs attention next.
    async fn container(
        &mut self,
        sandbox: &Sandbox,
        c: &Container,
        policy: &str,
        now: Instant,
    ) -> Option<Instant> {
        let (spec, probes) = match self.container_inputs(c).await {
            Ok(inputs) => inputs,
            Err(e) => {
                self.tracks.entry(c.name.clone()).or_default().waiting =
                    Some((e.reason().into(), e.to_string()));
                return None;
            }
        };
        let state = match self.container_state(sandbox, &c.name, now).await {
            Ok(s) => s,
            Err(retry) => return Some(retry),
        };
        match state {
            None => {
                self.start_container(sandbox, c, spec.as_ref(), None, now)
                    .await
            }
            Some(ContainerState::Running {
                pid,
                started_at,
                cgroup_id,
            }) => {
                let track = self.tracks.entry(c.name.clone()).or_default();
                track.waiting = None;
                track.cgroup_id = Some(cgroup_id);
                if track.pid != Some(pid) {
                    track.new_run(pid, started_at, probes, now);
                }
                self.run_probes(sandbox, &c.name, now).await
            }
            Some(exited @ ContainerState::Exited { .. }) => {
                self.exited(sandbox, c, spec.as_ref(), &exited, policy, now)
                    .await
            }
        }
    }

    /// The runtime's state of container `name`; when the runtime cannot tell, the failure
    /// is logged and the time to look again is the error.
    async fn container_state(
        &self,
        sandbox: &Sandbox,
        name: &str,
        now: Instant,
    ) -> Result<Option<ContainerState>, Instant> {
        self.ctx
            .runtime
            .container_state(sandbox, name)
            .await
            .map_err(|e| {
                warn!(pod = %self.name(), container = %name, error = %e, "container state");
                now + RETRY
            })
    }

    /// Converges an ephemeral container: started once (in the PID namespace of `target`
    /// when named), never restarted; its state is reported in
    /// `status.ephemeralContainerStatuses`.
    async fn ephemeral(
        &mut self,
        sandbox: &Sandbox,
        c: &Container,
        target: Option<String>,
        now: Instant,
    ) -> Option<Instant> {
        let state = match self.container_state(sandbox, &c.name, now).await {
            Ok(s) => s,
            Err(retry) => return Some(retry),
        };
        match state {
            None => {
                let spec = match self.container_inputs(c).await {
                    Ok((spec, _)) => spec,
                    Err(e) => {
                        self.tracks.entry(c.name.clone()).or_default().waiting =
                            Some((e.reason().into(), e.to_string()));
                        return Some(now + RETRY);
                    }
                };
                self.start_container(sandbox, c, spec.as_ref(), target, now)
                    .await
            }
            Some(ContainerState::Running { cgroup_id, .. }) => {
                let track = self.tracks.entry(c.name.clone()).or_default();
                track.waiting = None;
                track.cgroup_id = Some(cgroup_id);
                track.started = true;
                None
            }
            Some(ContainerState::Exited { .. }) => {
                let track = self.tracks.entry(c.name.clone()).or_default();
                track.waiting = None;
                track.started = false;
                None
            }
        }
    }

    /// What a container of the pod is started from: its runtime spec (`None` for a registry
    /// image, resolved only when it starts) and its probes.
    async fn container_inputs(
        &self,
        c: &Container,
    ) -> Result<(Option<ContainerSpec>, Probes), InputError> {
        // A registry image is resolved (pulled, mounted) only when the container starts.
        let spec = if from_registry(c) {
            None
        } else {
            let env = self.inputs().env(c).await?;
            Some(
                container_spec(&self.pod, c, self.volumes.as_ref(), env)
                    .map_err(InputError::CreateContainerConfigError)?,
            )
        };
        let probes = self
            .probe_specs(c)
            .map_err(InputError::CreateContainerConfigError)?;
        Ok((spec, probes))
    }

    /// Converges a container that exited: accounts for the exit once, then restarts it as
    /// the restart policy says, backing off after repeated crashes.
    async fn exited(
        &mut self,
        sandbox: &Sandbox,
        c: &Container,
        spec: Option<&ContainerSpec>,
        state: &ContainerState,
        policy: &str,
        now: Instant,
    ) -> Option<Instant> {
        let ContainerState::Exited {
            exit_code,
            finished_at,
            ref reason,
            ..
        } = *state
        else {
            return None;
        };
        let (backoff, pod_name) = (self.ctx.backoff, self.name());
        let restart = status::should_restart(policy, exit_code);
        let track = self.tracks.entry(c.name.clone()).or_default();
        track.pid = None;
        track.ready = false;
        track.started = false;
        if track.handled_exit != Some(finished_at) {
            track.handled_exit = Some(finished_at);
            track.last_terminated = status::terminated(state);
            info!(pod = %pod_name, container = %c.name, exit_code, reason = %reason, "container exited");
            if restart {
                track.schedule_restart(backoff, now);
            }
        }
        if !restart {
            track.waiting = None;
            return None;
        }
        let at = track.restart_at.unwrap_or(now);
        if now >= at {
            track.waiting = None;
            return self.start_container(sandbox, c, spec, None, now).await;
        }
        let wait = at - now;
        let entering = !matches!(&track.waiting, Some((r, _)) if r == "CrashLoopBackOff");
        track.waiting = Some((
            "CrashLoopBackOff".into(),
            format!(
                "back-off {}s restarting failed container={} pod={}",
                wait.as_secs().max(1),
                c.name,
                pod_name
            ),
        ));
        if entering {
            let msg = format!("Back-off restarting failed container {}", c.name);
            self.event(EventType::Warning, "BackOff", &msg).await;
        }
        Some(at)
    }

    /// Starts container `c`: with its `spec`, or, for a registry image, once the image is
    /// there (pulled as `imagePullPolicy` says) and mounted as its root filesystem. A failed
    /// pull waits (`ErrImagePull`, then `ImagePullBackOff`) and is retried with back-off.
    async fn start_container(
        &mut self,
        sandbox: &Sandbox,
        c: &Container,
        spec: Option<&ContainerSpec>,
        target: Option<String>,
        now: Instant,
    ) -> Option<Instant> {
        if let Some(spec) = spec {
            let spec = ContainerSpec {
                target,
                ..spec.clone()
            };
            return self.start(sandbox, &spec, now).await;
        }
        let e = match self.image_spec(c).await {
            Ok(spec) => {
                let track = self.tracks.entry(c.name.clone()).or_default();
                track.pull_backoff = None;
                let spec = ContainerSpec { target, ..spec };
                return self.start(sandbox, &spec, now).await;
            }
            Err(e) => e,
        };
        let backoff = self.ctx.backoff;
        let track = self.tracks.entry(c.name.clone()).or_default();
        let delay = track.pull_backoff.unwrap_or(backoff.initial);
        track.pull_backoff = Some((delay * 2).min(backoff.max));
        let again = e.is_pull()
            && matches!(&track.waiting, Some((r, _)) if r == "ErrImagePull" || r == "ImagePullBackOff");
        track.waiting = Some(if again {
            (
                "ImagePullBackOff".into(),
                format!("Back-off pulling image \"{}\": {e}", c.image),
            )
        } else {
            (e.reason().to_string(), e.to_string())
        });
        if again {
            let m = format!("Back-off pulling image \"{}\"", c.image);
            self.event(EventType::Normal, "BackOff", &m).await;
        } else {
            let m = format!("Failed to pull image \"{}\": {e}", c.image);
            self.event(EventType::Warning, "Failed", &m).await;
        }
        Some(now + delay)
    }

    /// The image of container `c` present on the node: pulled (with the pod's pull secrets
    /// and Pulling/Pulled events) when `policy` says so.
    async fn ensure_image(
        &self,
        images: &ImageService,
        c: &Container,
        policy: &skiff_image::process::PullPolicy,
    ) -> Result<skiff_image::Image, StartError> {
        let present = images.present(&c.image).map_err(StartError::ErrImagePull)?;
        let pull = policy
            .should_pull(present.is_some(), &c.image)
            .map_err(StartError::ErrImageNeverPull)?;
        if !pull && let Some(image) = present {
            return Ok(image);
        }
        let pod_auths = self.pull_secrets().await;
        let m = format!("Pulling image \"{}\"", c.image);
        self.event(EventType::Normal, "Pulling", &m).await;
        let started = Instant::now();
        let image = images
            .pull(&c.image, pod_auths)
            .await
            .map_err(|(reason, message)| StartError::Pull { reason, message })?;
        let m = format!(
            "Successfully pulled image \"{}\" in {:.3}s. Image size: {} bytes.",
            c.image,
            started.elapsed().as_secs_f64(),
            image.size
        );
        self.event(EventType::Normal, "Pulled", &m).await;
        Ok(image)
    }

    /// The runtime spec of a registry-image container: the image present (pulled when the
    /// policy says so, with Pulling/Pulled events), its root filesystem mounted, and the
    /// image's Entrypoint/Cmd/Env/WorkingDir combined with the spec's as Kubernetes does.
    async fn image_spec(&mut self, c: &Container) -> Result<ContainerSpec, StartError> {
        use skiff_image::process::{ContainerProcess, PullPolicy, process};
        let field = format!("containers[{}]", c.name);
        let images = self
            .ctx
            .images
            .clone()
            .map_err(|e| StartError::ErrImagePull(format!("the node's image store: {e}")))?;
        let policy = PullPolicy::of(&c.image_pull_policy, &c.image)
            .map_err(|m| InputError::CreateContainerConfigError(format!("{field}.{m}")))?;
        let env = self.inputs().env(c).await?;
        // Garbage collection waits until the image is pulled and mounted.
        let _using = images.using().await;
        let image = self.ensure_image(&images, c, &policy).await?;
        let rootfs = images
            .rootfs(&self.uid, &c.name, &image)
            .map_err(StartError::CreateContainerError)?;
        self.tracks.entry(c.name.clone()).or_default().image_id =
            format!("{}@{}", repository_of(&c.image), image.manifest);
        let p = process(
            &image.config,
            &ContainerProcess {
                command: &c.command,
                args: &c.args,
                env: &env,
                working_dir: &c.working_dir,
            },
        )
        .ok_or_else(|| {
            StartError::CreateContainerError(format!(
                "{field}: no command specified: the image has no Entrypoint or Cmd and the \
                 container no command"
            ))
        })?;
        let mut spec = ContainerSpec {
            name: c.name.clone(),
            image: Image::RootFs(rootfs),
            argv: p.argv,
            env: p.env,
            working_dir: Some(p.working_dir.into()),
            limits: limits_of(c),
            mounts: Vec::new(),
            security: Default::default(),
            stdio: stdio_of(c),
            target: None,
        };
        confine(
            &mut spec,
            &self.pod,
            c,
            p.user.as_deref(),
            self.volumes.as_ref(),
        )
        .map_err(InputError::CreateContainerConfigError)?;
        Ok(spec)
    }

    /// The pod's inputs, read through the API.
    fn inputs(&self) -> Resolver<'_> {
        resolver(&self.ctx, &self.pod, &self.uid, self.pod_ip)
    }

    /// The registry credentials of the pod's `imagePullSecrets`. Secrets that cannot be read
    /// are left out with a warning event, as the kubelet does; their contents never reach a
    /// log or an event.
    async fn pull_secrets(&self) -> RegistryAuths {
        let (auths, missing) = self.inputs().pull_secrets().await;
        if !missing.is_empty() {
            let m = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                missing.join(", ")
            );
            self.event(EventType::Warning, "FailedToRetrieveImagePullSecret", &m)
                .await;
        }
        auths
    }

    async fn start(
        &mut self,
        sandbox: &Sandbox,
        spec: &ContainerSpec,
        now: Instant,
    ) -> Option<Instant> {
        let result = self.ctx.runtime.start_container(sandbox, spec).await;
        let track = self.tracks.entry(spec.name.clone()).or_default();
        let (next, event) = match result {
            Ok(state) => {
                if track.handled_exit.is_some() || track.last_terminated.is_some() {
                    track.restart_count += 1;
                }
                track.waiting = None;
                debug!(container = %spec.name, ?state, "started");
                // Look again right away: record the run (or its immediate failure).
                let msg = format!("Started container {}", spec.name);
                (Some(now), (EventType::Normal, "Started", msg))
            }
            Err(e) => {
                let delay = track.backoff.unwrap_or(self.ctx.backoff.initial);
                track.backoff = Some((delay * 2).min(self.ctx.backoff.max));
                track.waiting = Some(("CreateContainerError".into(), e.to_string()));
                let msg = format!("Error: starting container {}: {e}", spec.name);
                (Some(now + delay), (EventType::Warning, "Failed", msg))
            }
        };
        self.event(event.0, event.1, &event.2).await;
        next
    }

    /// Records an Event about this pod (kubelet's Started, Killing, BackOff, Unhealthy, ...);
    /// failures are logged, never fatal.
    async fn event(&self, ty: EventType, reason: &str, message: &str) {
        self.ctx
            .recorder
            .publish(&self.pod, ty, reason, message)
            .await;
    }

    fn probe_specs(&self, c: &Container) -> Result<Probes, String> {
        let one = |p: &Option<skiff_api::api::Probe>, what: &str| {
            p.as_ref()
                .map(|p| probe::Spec::from_api(c, p, &format!("containers[{}].{what}", c.name)))
                .transpose()
                .map_err(|e| e.0)
        };
        Ok((
            one(&c.startup_probe, "startupProbe")?,
            one(&c.liveness_probe, "livenessProbe")?,
            one(&c.readiness_probe, "readinessProbe")?,
        ))
    }

    /// Runs the probes that are due; returns when the next one is.
    async fn run_probes(&mut self, sandbox: &Sandbox, name: &str, now: Instant) -> Option<Instant> {
        let target = self.pod_ip.map(|ip| probe::Target {
            netns: sandbox.netns_path.clone(),
            ip,
        });
        let runtime = self.ctx.runtime.clone();
        let pod_name = self.name();
        let grace = grace_of(&self.pod);
        let mut events = Vec::new();
        let track = self.tracks.get_mut(name)?;
        let mut kill = None;
        for kind in [
            probe::Kind::Startup,
            probe::Kind::Liveness,
            probe::Kind::Readiness,
        ] {
            // Liveness and readiness wait for the startup probe.
            if kind != probe::Kind::Startup && !track.started {
                continue;
            }
            let tracker = match kind {
                probe::Kind::Startup if !track.started => track.startup.as_mut(),
                probe::Kind::Startup => None,
                probe::Kind::Liveness => track.liveness.as_mut(),
                probe::Kind::Readiness => track.readiness.as_mut(),
            };
            let Some(t) = tracker else { continue };
            if !t.due(now) {
                continue;
            }
            let result = probe::run(
                &t.spec.handler,
                t.spec.timeout,
                &runtime,
                sandbox,
                name,
                target.as_ref(),
            )
            .await;
            let message = result.clone().err().unwrap_or_default();
            let changed = t.record(result.is_ok(), message.clone(), Instant::now());
            if changed == Some(false) {
                events.push((
                    EventType::Warning,
                    "Unhealthy",
                    format!("{kind:?} probe failed: {message}"),
                ));
            }
            match (kind, changed) {
                (probe::Kind::Startup, Some(true)) => {
                    track.started = true;
                    track.ready = track.readiness.is_none();
                }
                (probe::Kind::Readiness, Some(ok)) => {
                    info!(pod = %pod_name, container = %name, ready = ok, %message, "readiness changed");
                    track.ready = ok;
                }
                (probe::Kind::Startup | probe::Kind::Liveness, Some(false)) => {
                    kill = Some(format!("{kind:?} probe failed: {message}"));
                }
                _ => {}
            }
        }
        let next = if let Some(why) = kill {
            info!(pod = %pod_name, container = %name, %why, "restarting container");
            track.ready = false;
            events.push((
                EventType::Normal,
                "Killing",
                format!("Container {name} {why}, will be restarted"),
            ));
            if let Err(e) = self.ctx.runtime.stop_container(sandbox, name, grace).await {
                warn!(pod = %pod_name, container = %name, error = %e, "stopping failed container");
            }
            Some(Instant::now())
        } else {
            [&track.startup, &track.liveness, &track.readiness]
                .into_iter()
                .flatten()
                .map(Tracker::next_run)
                .min()
        };
        for (ty, reason, message) in events {
            self.event(ty, reason, &message).await;
        }
        next
    }

    fn views(
        &self,
        list: &[Container],
        states: &BTreeMap<String, Option<ContainerState>>,
    ) -> Vec<ContainerView> {
        list.iter()
            .map(|c| {
                let t = self.tracks.get(&c.name);
                let state = states.get(&c.name).cloned().flatten();
                let running = state.as_ref().is_some_and(ContainerState::is_running);
                ContainerView {
                    name: c.name.clone(),
                    image: c.image.clone(),
                    image_id: t.map(|t| t.image_id.clone()).unwrap_or_default(),
                    waiting: t.and_then(|t| t.waiting.clone()),
                    restart_count: t.map(|t| t.restart_count).unwrap_or(0),
                    last_terminated: t.and_then(|t| {
                        // Only a previous run's termination is "last": the current one shows
                        // as the state.
                        if running || t.waiting.is_some() {
                            t.last_terminated.clone()
                        } else {
                            None
                        }
                    }),
                    ready: running && t.is_some_and(|t| t.ready),
                    started: running && t.is_some_and(|t| t.started),
                    state,
                }
            })
            .collect()
    }

    /// The limits of the pod's containers that this node cannot enforce.
    fn limits_not_enforced(&self) -> Vec<String> {
        let mut out: Vec<String> = containers(&self.pod)
            .iter()
            .flat_map(|c| self.ctx.runtime.limit_report(&limits_of(c)).not_enforced)
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Writes the pod's status if it changed. Returns false if the write must be retried.
    async fn write_status(&mut self) -> bool {
        let mut states = BTreeMap::new();
        let ephemeral: Vec<Container> = ephemeral_containers(&self.pod)
            .into_iter()
            .map(|(c, _)| c)
            .collect();
        if let Some(sb) = &self.sandbox {
            for c in containers(&self.pod).iter().chain(&ephemeral) {
                let s = self
                    .ctx
                    .runtime
                    .container_state(sb, &c.name)
                    .await
                    .ok()
                    .flatten();
                states.insert(c.name.clone(), s);
            }
        }
        let facts = PodFacts {
            pod_ip: self.pod_ip.map(|ip| ip.to_string()),
            host_ip: self.ctx.host_ip.clone(),
            start_time: self.start_time,
            failure: self.failure.as_ref().map(|f| (f.reason(), f.to_string())),
            limits_not_enforced: self.limits_not_enforced(),
            now: SystemTime::now(),
        };
        let mut status = status::pod_status(
            &self.pod,
            &self.views(&containers(&self.pod), &states),
            &facts,
        );
        status.ephemeral_container_statuses = self
            .views(&ephemeral, &states)
            .iter()
            .map(|v| {
                status::container_status(
                    v,
                    self.pod
                        .metadata
                        .as_ref()
                        .map(|m| m.uid.as_str())
                        .unwrap_or(""),
                )
            })
            .collect();
        // Compared with the API's copy (not only with what this agent last wrote): another
        // writer, e.g. the node lifecycle controller marking pods not ready while the node was
        // unreachable, is corrected as soon as the agent sees it.
        let current = self.pod.status.as_ref().or(self.written.as_ref());
        if current.is_some_and(|w| status::same_status(w, &status)) {
            return true;
        }
        let api = self.ctx.client.namespaced::<Pod>(self.pod.namespace());
        let mut pod = self.pod.clone();
        pod.status = Some(status.clone());
        match api.update_status(&pod).await {
            Ok(updated) => {
                self.pod = updated;
                self.written = Some(status);
                true
            }
            Err(ClientError::Conflict { .. }) => {
                // Our copy is stale: fetch the latest and write again on the next pass.
                if let Ok(latest) = api.get(self.pod.name()).await {
                    self.pod = latest;
                }
                false
            }
            Err(ClientError::NotFound { .. }) => {
                self.gone = true;
                false
            }
            Err(e) => {
                warn!(pod = %self.name(), error = %e, "writing pod status");
                false
            }
        }
    }

    /// Stops the pod (grace period, then kill), releases its network and cgroups, and, when it
    /// was deleted gracefully through the API, finishes the delete.
    async fn teardown(&mut self) -> Result<(), String> {
        let grace = grace_of(&self.pod);
        let sandbox = match self.sandbox.take() {
            Some(s) => Some(s),
            None => self
                .ctx
                .runtime
                .list_sandboxes()
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .find(|s| s.uid == self.uid),
        };
        if let Some(sb) = &sandbox {
            info!(pod = %format!("{}/{}", sb.namespace, sb.name), ?grace, "stopping pod");
            if self.pod.metadata().is_some() {
                for c in containers(&self.pod) {
                    let msg = format!("Stopping container {}", c.name);
                    self.event(EventType::Normal, "Killing", &msg).await;
                }
            }
            if let Err(e) = self.ctx.runtime.remove_sandbox(sb, grace).await {
                self.sandbox = sandbox.clone();
                return Err(format!("removing sandbox: {e}"));
            }
        }
        self.ctx.datapath.release_devices(&self.uid);
        self.devices_confined = false;
        if let Ok(images) = &self.ctx.images {
            images.release_pod(&self.uid);
        }
        self.ctx.volumes.release_pod(&self.uid);
        self.ctx.datapath.detach_pod(&self.uid);
        self.ctx
            .datapath
            .net
            .detach_pod(&self.uid)
            .await
            .map_err(|e| format!("detaching network: {e}"))?;
        let ids: Vec<u64> = self.tracks.values().filter_map(|t| t.cgroup_id).collect();
        self.ctx.datapath.forget_counters(&ids);
        if !self.gone {
            let api = self.ctx.client.namespaced::<Pod>(self.pod.namespace());
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(self.uid.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            };
            match api.delete(self.pod.name(), &dp).await {
                Ok(_) | Err(ClientError::NotFound { .. }) => {}
                // The uid precondition failed: a new pod of the same name; not ours to delete.
                Err(ClientError::Conflict { .. }) => {}
                Err(e) => return Err(format!("finishing the delete: {e}")),
            }
        }
        info!(uid = %self.uid, "pod torn down");
        Ok(())
    }
}

#[cfg(test)]
mod fake_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_drop_tags_and_digests_not_ports() {
        assert_eq!(
            repository_of("127.0.0.1:5000/demo/web:v2"),
            "127.0.0.1:5000/demo/web"
        );
        assert_eq!(
            repository_of("127.0.0.1:5000/demo/web@sha256:ab"),
            "127.0.0.1:5000/demo/web"
        );
        assert_eq!(repository_of("localhost:5000/web"), "localhost:5000/web");
        assert_eq!(repository_of("busybox"), "busybox");
    }

    #[test]
    fn container_spec_errors_name_the_field() {
        let c = Container {
            name: "web".into(),
            image: "host".into(),
            ..Default::default()
        };
        let e = container_spec(&Pod::default(), &c, None, Vec::new()).unwrap_err();
        assert!(e.starts_with("containers[web].command: required"), "{e}");
        let c = Container {
            name: "web".into(),
            image: "/no/such/rootfs".into(),
            command: vec!["sh".into()],
            ..Default::default()
        };
        let e = container_spec(&Pod::default(), &c, None, Vec::new()).unwrap_err();
        assert!(
            e.contains("containers[web].image: root directory /no/such/rootfs does not exist"),
            "{e}"
        );
        let c = Container {
            name: "web".into(),
            image: "busybox:latest".into(),
            command: vec!["sh".into()],
            ..Default::default()
        };
        assert!(
            container_spec(&Pod::default(), &c, None, Vec::new())
                .unwrap_err()
                .starts_with("containers[web].image")
        );
    }
}
