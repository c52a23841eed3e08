//! Pure computation of a pod's status from what the agent observed. No I/O here, so every
//! rule (phase, conditions, container states) is unit-tested.

use std::time::SystemTime;

use chrono::{DateTime, SecondsFormat, Utc};
use skiff_api::api::{
    Condition, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodIp, PodStatus,
};

use skiff_runtime::ContainerState;

/// Pod (and Node) condition type saying which resource limits the node cannot enforce.
pub const LIMITS_CONDITION: &str = "ResourceLimitsEnforced";

/// RFC 3339 in UTC with seconds precision, as Kubernetes writes timestamps.
pub fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// What the agent knows about one container of a pod.
#[derive(Debug, Clone, Default)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    /// The image the current run started from, by digest (`repository@sha256:...`), for
    /// registry images.
    pub image_id: String,
    /// The runtime's state; `None` before the first start.
    pub state: Option<ContainerState>,
    /// Why the container is not running, when it is waiting (e.g. `CrashLoopBackOff`).
    pub waiting: Option<(String, String)>,
    pub restart_count: i32,
    /// The previous termination, shown as `lastState`.
    pub last_terminated: Option<ContainerStateTerminated>,
    /// Readiness: running, started, and the readiness probe (if any) passing.
    pub ready: bool,
    /// Startup probe passed (or there is none) while running.
    pub started: bool,
}

/// Whether a container that exited with `exit_code` is started again under `policy`.
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true, // Always, and the default
    }
}

pub fn terminated(state: &ContainerState) -> Option<ContainerStateTerminated> {
    match state {
        ContainerState::Exited {
            exit_code,
            signal,
            started_at,
            finished_at,
            reason,
            message,
        } => Some(ContainerStateTerminated {
            exit_code: *exit_code,
            signal: signal.unwrap_or(0),
            reason: reason.clone(),
            message: message.clone(),
            started_at: rfc3339(*started_at),
            finished_at: rfc3339(*finished_at),
            container_id: String::new(),
        }),
        ContainerState::Running { .. } => None,
    }
}

pub(crate) fn container_status(c: &ContainerView, pod_uid: &str) -> ContainerStatus {
    let state = match (&c.waiting, &c.state) {
        (Some((reason, message)), _) => ApiState {
            waiting: Some(ContainerStateWaiting {
                reason: reason.clone(),
                message: message.clone(),
            }),
            ..Default::default()
        },
        (None, Some(ContainerState::Running { started_at, .. })) => ApiState {
            running: Some(ContainerStateRunning {
                started_at: rfc3339(*started_at),
            }),
            ..Default::default()
        },
        (None, Some(s @ ContainerState::Exited { .. })) => ApiState {
            terminated: terminated(s),
            ..Default::default()
        },
        (None, None) => ApiState {
            waiting: Some(ContainerStateWaiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            }),
            ..Default::default()
        },
    };
    let container_id = match &c.state {
        Some(ContainerState::Running { pid, .. }) => format!("skiff://{pod_uid}/{}/{pid}", c.name),
        _ => String::new(),
    };
    ContainerStatus {
        name: c.name.clone(),
        state: Some(state),
        last_state: c.last_terminated.clone().map(|t| ApiState {
            terminated: Some(t),
            ..Default::default()
        }),
        ready: c.ready,
        restart_count: c.restart_count,
        image: c.image.clone(),
        image_id: c.image_id.clone(),
        container_id,
        started: Some(c.started),
    }
}

/// The pod phase, by Kubernetes' rules.
pub fn phase(policy: &str, containers: &[ContainerView]) -> &'static str {
    let running = containers
        .iter()
        .filter(|c| matches!(c.state, Some(ContainerState::Running { .. })))
        .count();
    let exited: Vec<i32> = containers
        .iter()
        .filter_map(|c| match &c.state {
            Some(ContainerState::Exited { exit_code, .. }) => Some(*exit_code),
            _ => None,
        })
        .collect();
    if containers.is_empty() {
        return "Pending";
    }
    if exited.len() == containers.len() && !exited.iter().any(|c| should_restart(policy, *c)) {
        // Every container has finished for good.
        return if exited.iter().all(|c| *c == 0) {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    if running > 0 || !exited.is_empty() {
        // Running, or restarting after an exit.
        return "Running";
    }
    "Pending"
}

fn condition(kind: &str, ok: bool, now: &str, previous: &PodStatus) -> Condition {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time when the status did not change.
    let last_transition_time = previous
        .conditions
        .iter()
        .find(|c| c.r#type == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    Condition {
        r#type: kind.into(),
        status: status.into(),
        last_transition_time,
        ..Default::default()
    }
}

/// Inputs for [`pod_status`] besides the containers.
#[derive(Debug)]
pub struct PodFacts<'a> {
    pub pod_ip: Option<String>,
    pub host_ip: Option<String>,
    pub start_time: Option<SystemTime>,
    /// Why the pod cannot run at all (bad spec, sandbox failure): (reason, message).
    pub failure: Option<(&'a str, String)>,
    /// Limits the pod asks for that this node cannot enforce (one entry per limit kind).
    pub limits_not_enforced: Vec<String>,
    pub now: SystemTime,
}

/// The status the agent reports for `pod`.
pub fn pod_status(pod: &Pod, containers: &[ContainerView], facts: &PodFacts<'_>) -> PodStatus {
    let previous = pod.status.clone().unwrap_or_default();
    let policy = pod
        .spec
        .as_ref()
        .map(|s| s.restart_policy.as_str())
        .unwrap_or("Always");
    let now = rfc3339(facts.now);
    let all_ready = !containers.is_empty() && containers.iter().all(|c| c.ready);
    let mut conditions: Vec<Condition> = previous
        .conditions
        .iter()
        .filter(|c| c.r#type == "PodScheduled")
        .cloned()
        .collect();
    conditions.push(condition("Initialized", true, &now, &previous));
    conditions.push(condition("ContainersReady", all_ready, &now, &previous));
    conditions.push(condition("Ready", all_ready, &now, &previous));
    if !facts.limits_not_enforced.is_empty() {
        let mut c = condition(LIMITS_CONDITION, false, &now, &previous);
        c.reason = "CgroupControllersMissing".into();
        c.message = format!(
            "limits not enforced on this node: {}",
            facts.limits_not_enforced.join("; ")
        );
        conditions.push(c);
    }
    let (reason, message) = match &facts.failure {
        Some((r, m)) => (r.to_string(), m.clone()),
        None => (String::new(), String::new()),
    };
    PodStatus {
        phase: phase(policy, containers).into(),
        conditions,
        message,
        reason,
        host_ip: facts.host_ip.clone().unwrap_or_default(),
        host_ips: facts
            .host_ip
            .iter()
            .map(|ip| PodIp { ip: ip.clone() })
            .collect(),
        pod_ip: facts.pod_ip.clone().unwrap_or_default(),
        pod_ips: facts
            .pod_ip
            .iter()
            .map(|ip| PodIp { ip: ip.clone() })
            .collect(),
        start_time: facts.start_time.map(rfc3339).unwrap_or(previous.start_time),
        container_statuses: containers
            .iter()
            .map(|c| container_status(c, pod_uid(pod)))
            .collect(),
        qos_class: previous.qos_class,
        ..Default::default()
    }
}

fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.as_ref().map(|m| m.uid.as_str()).unwrap_or("")
}

/// Whether two statuses differ in anything but condition timestamps (to skip no-op writes).
pub fn same_status(a: &PodStatus, b: &PodStatus) -> bool {
    fn strip(s: &PodStatus) -> PodStatus {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time.clear();
            c.last_probe_time.clear();
            c.last_heartbeat_time.clear();
        }
        s
    }
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn running() -> Option<ContainerState> {
        Some(ContainerState::Running {
            pid: 42,
            started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            cgroup_id: 7,
        })
    }

    fn exited(code: i32) -> Option<ContainerState> {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        Some(ContainerState::Exited {
            exit_code: code,
            signal: None,
            started_at: t,
            finished_at: t,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: String::new(),
        })
    }

    fn view(state: Option<ContainerState>) -> ContainerView {
        ContainerView {
            name: "c".into(),
            state,
            ..Default::default()
        }
    }

    #[test]
    fn restart_policy() {
        assert!(should_restart("Always", 0));
        assert!(should_restart("", 0));
        assert!(should_restart("OnFailure", 1));
        assert!(!should_restart("OnFailure", 0));
        assert!(!should_restart("Never", 1));
    }

    #[test]
    fn phases() {
        assert_eq!(phase("Always", &[view(None)]), "Pending");
        assert_eq!(phase("Always", &[view(running())]), "Running");
        assert_eq!(phase("Always", &[view(exited(0))]), "Running");
        assert_eq!(phase("Never", &[view(exited(0))]), "Succeeded");
        assert_eq!(
            phase("Never", &[view(exited(0)), view(exited(2))]),
            "Failed"
        );
        assert_eq!(phase("OnFailure", &[view(exited(0))]), "Succeeded");
        assert_eq!(phase("OnFailure", &[view(exited(1))]), "Running");
        assert_eq!(
            phase("Never", &[view(running()), view(exited(1))]),
            "Running"
        );
    }

    #[test]
    fn status_reports_ready_and_ips() {
        let pod = Pod::default();
        let mut c = view(running());
        c.ready = true;
        c.started = true;
        let facts = PodFacts {
            pod_ip: Some("10.244.1.5".into()),
            host_ip: None,
            start_time: Some(SystemTime::UNIX_EPOCH),
            failure: None,
            limits_not_enforced: vec![],
            now: SystemTime::UNIX_EPOCH,
        };
        let s = pod_status(&pod, &[c.clone()], &facts);
        assert_eq!(s.phase, "Running");
        assert_eq!(s.pod_ip, "10.244.1.5");
        assert_eq!(s.pod_ips.len(), 1);
        let ready = s.conditions.iter().find(|c| c.r#type == "Ready").unwrap();
        assert_eq!(ready.status, "True");
        let cs = &s.container_statuses[0];
        assert!(cs.state.as_ref().unwrap().running.is_some());
        assert!(cs.container_id.ends_with("/c/42"));
        c.ready = false;
        c.waiting = Some(("CrashLoopBackOff".into(), "back-off 10s".into()));
        let s2 = pod_status(&pod, &[c], &facts);
        assert!(!same_status(&s, &s2));
        let w = s2.container_statuses[0]
            .state
            .as_ref()
            .unwrap()
            .waiting
            .clone();
        assert_eq!(w.unwrap().reason, "CrashLoopBackOff");
    }

    #[test]
    fn transition_time_kept_when_status_unchanged() {
        let mut pod = Pod::default();
        let facts = |secs| PodFacts {
            pod_ip: None,
            host_ip: None,
            start_time: None,
            failure: None,
            limits_not_enforced: vec![],
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        };
        let s1 = pod_status(&pod, &[view(running())], &facts(10));
        pod.status = Some(s1.clone());
        let s2 = pod_status(&pod, &[view(running())], &facts(20));
        assert_eq!(s1.conditions, s2.conditions);
        assert!(same_status(&s1, &s2));
    }

    #[test]
    fn unenforced_limits_show_as_a_condition() {
        let facts = PodFacts {
            pod_ip: None,
            host_ip: None,
            start_time: None,
            failure: None,
            limits_not_enforced: vec!["memory: controller missing from cgroup v2".into()],
            now: SystemTime::UNIX_EPOCH,
        };
        let s = pod_status(&Pod::default(), &[view(running())], &facts);
        let c = s
            .conditions
            .iter()
            .find(|c| c.r#type == LIMITS_CONDITION)
            .unwrap();
        assert_eq!(c.status, "False");
        assert!(c.message.contains("memory"), "{}", c.message);
    }
}
