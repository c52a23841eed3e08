//! Per-kind table columns, as pure functions of the object: what kubectl shows for each kind
//! (the API server's `Table` responses and `skiff get` both use them), and kubectl's ages.

use std::collections::BTreeMap;

use crate::api::{
    CertificateSigningRequest, ConfigMap, ContainerStatus, CronJob, DaemonSet, Deployment,
    Endpoints, Event, HorizontalPodAutoscaler, Job, LabelSelector, Lease, LoadBalancerIpPool,
    Namespace, NetworkPolicy, Node, PersistentVolume, PersistentVolumeClaim, Pod,
    PodDisruptionBudget, PodTemplateSpec, ReplicaSet, ReplicaSetSpec, ReplicationController,
    RoleBinding, Secret, Service, ServicePort, StatefulSet, StorageClass,
};
use chrono::{DateTime, TimeDelta, Utc};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A string at a JSON pointer, or "".
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

pub fn name_of(v: &Value) -> &str {
    str_at(v, "/metadata/name")
}

pub fn namespace_of(v: &Value) -> &str {
    str_at(v, "/metadata/namespace")
}

fn typed<T: DeserializeOwned + Default>(v: &Value) -> T {
    match serde_json::from_value(v.clone()) {
        Ok(t) => t,
        Err(e) => {
            let _ = e; // An object that does not decode as its kind shows blanks.
            T::default()
        }
    }
}

fn none_if_empty(s: String) -> String {
    if s.is_empty() { "<none>".into() } else { s }
}

/// The column headers of `kind` (its Kind, e.g. `Pod`). Every table but events' starts with
/// NAME.
pub fn headers(kind: &str, wide: bool) -> Vec<String> {
    let (base, extra): (&[&str], &[&str]) = match kind {
        "Namespace" => (&["NAME", "STATUS", "AGE"], &[]),
        "Node" => (
            &["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
            &[
                "INTERNAL-IP",
                "EXTERNAL-IP",
                "OS-IMAGE",
                "KERNEL-VERSION",
                "CONTAINER-RUNTIME",
            ],
        ),
        "Pod" => (
            &["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
            &["IP", "NODE", "NOMINATED NODE", "READINESS GATES"],
        ),
        "Service" => (
            &[
                "NAME",
                "TYPE",
                "CLUSTER-IP",
                "EXTERNAL-IP",
                "PORT(S)",
                "AGE",
            ],
            &["SELECTOR"],
        ),
        "Endpoints" => (&["NAME", "ENDPOINTS", "AGE"], &[]),
        "Deployment" => (
            &["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"],
            &["CONTAINERS", "IMAGES", "SELECTOR"],
        ),
        "ReplicaSet" | "ReplicationController" => (
            &["NAME", "DESIRED", "CURRENT", "READY", "AGE"],
            &["CONTAINERS", "IMAGES", "SELECTOR"],
        ),
        "HorizontalPodAutoscaler" => (
            &[
                "NAME",
                "REFERENCE",
                "TARGETS",
                "MINPODS",
                "MAXPODS",
                "REPLICAS",
                "AGE",
            ],
            &[],
        ),
        "CronJob" => (
            &[
                "NAME",
                "SCHEDULE",
                "TIMEZONE",
                "SUSPEND",
                "ACTIVE",
                "LAST SCHEDULE",
                "AGE",
            ],
            &["CONTAINERS", "IMAGES", "SELECTOR"],
        ),
        "Job" => (
            &["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"],
            &["CONTAINERS", "IMAGES", "SELECTOR"],
        ),
        "PodDisruptionBudget" => (
            &[
                "NAME",
                "MIN AVAILABLE",
                "MAX UNAVAILABLE",
                "ALLOWED DISRUPTIONS",
                "AGE",
            ],
            &[],
        ),
        "NetworkPolicy" => (&["NAME", "POD-SELECTOR", "AGE"], &[]),
        "PersistentVolume" => (
            &[
                "NAME",
                "CAPACITY",
                "ACCESS MODES",
                "RECLAIM POLICY",
                "STATUS",
                "CLAIM",
                "STORAGECLASS",
                "VOLUMEATTRIBUTESCLASS",
                "REASON",
                "AGE",
            ],
            &["VOLUMEMODE"],
        ),
        "PersistentVolumeClaim" => (
            &[
                "NAME",
                "STATUS",
                "VOLUME",
                "CAPACITY",
                "ACCESS MODES",
                "STORAGECLASS",
                "VOLUMEATTRIBUTESCLASS",
                "AGE",
            ],
            &["VOLUMEMODE"],
        ),
        "StorageClass" => (
            &[
                "NAME",
                "PROVISIONER",
                "RECLAIMPOLICY",
                "VOLUMEBINDINGMODE",
                "ALLOWVOLUMEEXPANSION",
                "AGE",
            ],
            &[],
        ),
        "StatefulSet" => (&["NAME", "READY", "AGE"], &["CONTAINERS", "IMAGES"]),
        "DaemonSet" => (
            &[
                "NAME",
                "DESIRED",
                "CURRENT",
                "READY",
                "UP-TO-DATE",
                "AVAILABLE",
                "NODE SELECTOR",
                "AGE",
            ],
            &["CONTAINERS", "IMAGES", "SELECTOR"],
        ),
        "Lease" => (&["NAME", "HOLDER", "AGE"], &[]),
        "Secret" => (&["NAME", "TYPE", "DATA", "AGE"], &[]),
        "ConfigMap" => (&["NAME", "DATA", "AGE"], &[]),
        "ServiceAccount" => (&["NAME", "SECRETS", "AGE"], &[]),
        "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration" => {
            (&["NAME", "WEBHOOKS", "AGE"], &[])
        }
        "ValidatingAdmissionPolicy" => (&["NAME", "VALIDATIONS", "PARAMKIND", "AGE"], &[]),
        "ValidatingAdmissionPolicyBinding" => (&["NAME", "POLICYNAME", "PARAMREF", "AGE"], &[]),
        "Role" | "ClusterRole" | "CustomResourceDefinition" => (&["NAME", "CREATED AT"], &[]),
        "APIService" => (&["NAME", "SERVICE", "AVAILABLE", "AGE"], &[]),
        "CertificateSigningRequest" => (
            &[
                "NAME",
                "AGE",
                "SIGNERNAME",
                "REQUESTOR",
                "REQUESTEDDURATION",
                "CONDITION",
            ],
            &[],
        ),
        // Cilium's columns for its CiliumLoadBalancerIPPool.
        "LoadBalancerIPPool" => (
            &["NAME", "DISABLED", "CONFLICTING", "IPS AVAILABLE", "AGE"],
            &[],
        ),
        "RoleBinding" | "ClusterRoleBinding" => (
            &["NAME", "ROLE", "AGE"],
            &["USERS", "GROUPS", "SERVICEACCOUNTS"],
        ),
        "Event" => (
            &["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
            &["SUBOBJECT", "SOURCE", "FIRST SEEN", "COUNT", "NAME"],
        ),
        _ => (&["NAME", "AGE"], &[]),
    };
    let mut h: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    if wide {
        if kind == "Event" {
            // kubectl puts SUBOBJECT and SOURCE before MESSAGE.
            h.insert(4, "SUBOBJECT".into());
            h.insert(5, "SOURCE".into());
            h.extend(["FIRST SEEN", "COUNT", "NAME"].map(String::from));
        } else {
            h.extend(extra.iter().map(|s| s.to_string()));
        }
    }
    h
}

/// The cells of one object, matching [`headers`].
pub fn cells(kind: &str, obj: &Value, wide: bool, now: DateTime<Utc>) -> Vec<String> {
    let name = name_of(obj).to_string();
    let created = age(str_at(obj, "/metadata/creationTimestamp"), now);
    let mut c = match kind {
        "Namespace" => {
            let ns: Namespace = typed(obj);
            let phase = ns.status.map(|s| s.phase).unwrap_or_default();
            vec![
                name,
                if phase.is_empty() {
                    "Active".into()
                } else {
                    phase
                },
                created,
            ]
        }
        "Node" => {
            let n: Node = typed(obj);
            let mut c = vec![
                name,
                node_status(&n),
                node_roles(n.metadata.as_ref().map(|m| &m.labels)),
                created,
                n.status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.kubelet_version.clone())
                    .unwrap_or_default(),
            ];
            if wide {
                let st = n.status.unwrap_or_default();
                let addr = |t: &str| {
                    none_if_empty(
                        st.addresses
                            .iter()
                            .filter(|a| a.r#type == t)
                            .map(|a| a.address.clone())
                            .collect::<Vec<_>>()
                            .join(","),
                    )
                };
                let info = st.node_info.clone().unwrap_or_default();
                c.extend([
                    addr("InternalIP"),
                    addr("ExternalIP"),
                    none_if_empty(info.os_image),
                    none_if_empty(info.kernel_version),
                    none_if_empty(info.container_runtime_version),
                ]);
            }
            c
        }
        "Pod" => {
            let p: Pod = typed(obj);
            let (ready, total) = pod_ready(&p);
            let mut c = vec![
                name,
                format!("{ready}/{total}"),
                pod_status(&p),
                pod_restarts(&p, now),
                created,
            ];
            if wide {
                let st = p.status.clone().unwrap_or_default();
                let node = p
                    .spec
                    .as_ref()
                    .map(|s| s.node_name.clone())
                    .unwrap_or_default();
                c.extend([
                    none_if_empty(st.pod_ip),
                    none_if_empty(node),
                    none_if_empty(st.nominated_node_name),
                    // Skiff has no readiness gates (spec.readinessGates) yet.
                    "<none>".to_string(),
                ]);
            }
            c
        }
        "Service" => {
            let s: Service = typed(obj);
            let spec = s.spec.clone().unwrap_or_default();
            let ty = if spec.r#type.is_empty() {
                "ClusterIP".to_string()
            } else {
                spec.r#type.clone()
            };
            let external = if ty == "ExternalName" {
                spec.external_name.clone()
            } else if !spec.external_ips.is_empty() {
                spec.external_ips.join(",")
            } else if ty == "LoadBalancer" {
                let ips: Vec<String> = s
                    .status
                    .and_then(|st| st.load_balancer)
                    .map(|lb| {
                        lb.ingress
                            .into_iter()
                            .map(|i| if i.ip.is_empty() { i.hostname } else { i.ip })
                            .collect()
                    })
                    .unwrap_or_default();
                if ips.is_empty() {
                    "<pending>".into()
                } else {
                    ips.join(",")
                }
            } else {
                "<none>".into()
            };
            let mut c = vec![
                name,
                ty,
                none_if_empty(spec.cluster_ip.clone()),
                external,
                service_ports(&spec.ports),
                created,
            ];
            if wide {
                c.push(map_selector(&spec.selector));
            }
            c
        }
        "Endpoints" => {
            let e: Endpoints = typed(obj);
            vec![name, endpoints(&e), created]
        }
        "Deployment" => {
            let d: Deployment = typed(obj);
            let spec = d.spec.clone().unwrap_or_default();
            let st = d.status.clone().unwrap_or_default();
            let desired = spec.replicas.unwrap_or(1);
            let mut c = vec![
                name,
                format!("{}/{desired}", st.ready_replicas),
                st.updated_replicas.to_string(),
                st.available_replicas.to_string(),
                created,
            ];
            if wide {
                c.extend(template_columns(
                    spec.template.as_ref(),
                    spec.selector.as_ref(),
                ));
            }
            c
        }
        "ReplicaSet" | "ReplicationController" => {
            // A ReplicationController is a ReplicaSet with an equality-only selector.
            let r: ReplicaSet = if kind == "ReplicaSet" {
                typed(obj)
            } else {
                let rc: ReplicationController = typed(obj);
                let spec = rc.spec.unwrap_or_default();
                ReplicaSet {
                    spec: Some(ReplicaSetSpec {
                        replicas: spec.replicas,
                        selector: Some(LabelSelector {
                            match_labels: spec.selector,
                            ..Default::default()
                        }),
                        template: spec.template,
                        ..Default::default()
                    }),
                    status: rc.status,
                    ..Default::default()
                }
            };
            let spec = r.spec.clone().unwrap_or_default();
            let st = r.status.clone().unwrap_or_default();
            let mut c = vec![
                name,
                spec.replicas.unwrap_or(1).to_string(),
                st.replicas.to_string(),
                st.ready_replicas.to_string(),
                created,
            ];
            if wide {
                c.extend(template_columns(
                    spec.template.as_ref(),
                    spec.selector.as_ref(),
                ));
            }
            c
        }
        "HorizontalPodAutoscaler" => {
            let h: HorizontalPodAutoscaler = typed(obj);
            let spec = h.spec.clone().unwrap_or_default();
            let st = h.status.clone().unwrap_or_default();
            let target = spec.scale_target_ref.clone().unwrap_or_default();
            let targets: Vec<String> = spec
                .metrics
                .iter()
                .filter_map(|m| m.resource.as_ref())
                .map(|r| {
                    let t = r.target.clone().unwrap_or_default();
                    let current = st
                        .current_metrics
                        .iter()
                        .filter_map(|c| c.resource.as_ref())
                        .find(|c| c.name == r.name)
                        .and_then(|c| c.current.clone());
                    let (cur, want) = match t.average_utilization {
                        Some(u) => (
                            current
                                .and_then(|c| c.average_utilization)
                                .map_or("<unknown>".to_string(), |c| format!("{c}%")),
                            format!("{u}%"),
                        ),
                        None => (
                            current
                                .and_then(|c| c.average_value)
                                .unwrap_or_else(|| "<unknown>".into()),
                            t.average_value.clone().unwrap_or_default(),
                        ),
                    };
                    format!("{}: {cur}/{want}", r.name)
                })
                .collect();
            vec![
                name,
                format!("{}/{}", target.kind, target.name),
                if targets.is_empty() {
                    "<none>".into()
                } else {
                    targets.join(", ")
                },
                spec.min_replicas.unwrap_or(1).to_string(),
                spec.max_replicas.to_string(),
                st.current_replicas.to_string(),
                created,
            ]
        }
        "CronJob" => {
            let cj: CronJob = typed(obj);
            let spec = cj.spec.clone().unwrap_or_default();
            let st = cj.status.clone().unwrap_or_default();
            let job_spec = spec.job_template.as_ref().and_then(|t| t.spec.as_ref());
            let mut c = vec![
                name,
                spec.schedule.clone(),
                spec.time_zone.clone().unwrap_or_else(|| "<none>".into()),
                if spec.suspend == Some(true) {
                    "True"
                } else {
                    "False"
                }
                .into(),
                st.active.len().to_string(),
                st.last_schedule_time
                    .as_deref()
                    .map(|t| age(t, now))
                    .unwrap_or_else(|| "<none>".into()),
                created,
            ];
            if wide {
                c.extend(template_columns(
                    job_spec.and_then(|s| s.template.as_ref()),
                    job_spec.and_then(|s| s.selector.as_ref()),
                ));
            }
            c
        }
        "Job" => {
            let j: Job = typed(obj);
            let spec = j.spec.clone().unwrap_or_default();
            let st = j.status.clone().unwrap_or_default();
            let mut c = vec![
                name,
                job_status(&j),
                job_completions(&j),
                job_duration(&st, now),
                created,
            ];
            if wide {
                c.extend(template_columns(
                    spec.template.as_ref(),
                    spec.selector.as_ref(),
                ));
            }
            c
        }
        "PodDisruptionBudget" => {
            let p: PodDisruptionBudget = typed(obj);
            let spec = p.spec.clone().unwrap_or_default();
            let st = p.status.clone().unwrap_or_default();
            let or_na = |v: Option<String>| v.unwrap_or_else(|| "N/A".into());
            vec![
                name,
                or_na(spec.min_available),
                or_na(spec.max_unavailable),
                st.disruptions_allowed.to_string(),
                created,
            ]
        }
        "NetworkPolicy" => {
            let p: NetworkPolicy = typed(obj);
            // kubectl prints the spec's selector; absent is the empty one (every pod).
            let sel = p.spec.and_then(|s| s.pod_selector).unwrap_or_default();
            vec![name, label_selector(Some(&sel)), created]
        }
        "PersistentVolume" => {
            let pv: PersistentVolume = typed(obj);
            let class = pv.storage_class().to_string();
            let spec = pv.spec.unwrap_or_default();
            let status = pv.status.unwrap_or_default();
            // kubectl prints `<namespace>/<name>` of the claim it is bound to, or nothing.
            let claim = spec
                .claim_ref
                .as_ref()
                .map(|r| format!("{}/{}", r.namespace, r.name))
                .unwrap_or_default();
            let mut c = vec![
                name,
                storage_quantity(&spec.capacity),
                access_modes(&spec.access_modes),
                spec.persistent_volume_reclaim_policy,
                phase_or_terminating(obj, status.phase),
                claim,
                class,
                UNSET.into(),
                status.reason,
                created,
            ];
            if wide {
                c.push(spec.volume_mode.unwrap_or_else(|| UNSET.into()));
            }
            c
        }
        "PersistentVolumeClaim" => {
            let pvc: PersistentVolumeClaim = typed(obj);
            let class = pvc.storage_class().to_string();
            let spec = pvc.spec.unwrap_or_default();
            let status = pvc.status.unwrap_or_default();
            // Capacity and access modes are the bound volume's (the claim's status), shown
            // only once the claim names a volume.
            let (capacity, modes) = if spec.volume_name.is_empty() {
                (String::new(), String::new())
            } else {
                (
                    storage_quantity(&status.capacity),
                    access_modes(&status.access_modes),
                )
            };
            let mut c = vec![
                name,
                phase_or_terminating(obj, status.phase),
                spec.volume_name,
                capacity,
                modes,
                class,
                UNSET.into(),
                created,
            ];
            if wide {
                c.push(spec.volume_mode.unwrap_or_else(|| UNSET.into()));
            }
            c
        }
        "StorageClass" => {
            let sc: StorageClass = typed(obj);
            let shown = if sc.is_default() {
                format!("{name} (default)")
            } else {
                name
            };
            vec![
                shown,
                sc.provisioner,
                sc.reclaim_policy.unwrap_or_else(|| "Delete".into()),
                sc.volume_binding_mode.unwrap_or_else(|| "Immediate".into()),
                sc.allow_volume_expansion.unwrap_or(false).to_string(),
                created,
            ]
        }
        "StatefulSet" => {
            let st: StatefulSet = typed(obj);
            let spec = st.spec.clone().unwrap_or_default();
            let status = st.status.clone().unwrap_or_default();
            let mut c = vec![
                name,
                format!("{}/{}", status.ready_replicas, spec.replicas.unwrap_or(1)),
                created,
            ];
            if wide {
                let [containers, images, _] =
                    template_columns(spec.template.as_ref(), spec.selector.as_ref());
                c.extend([containers, images]);
            }
            c
        }
        "DaemonSet" => {
            let d: DaemonSet = typed(obj);
            let spec = d.spec.clone().unwrap_or_default();
            let st = d.status.clone().unwrap_or_default();
            let node_selector = spec
                .template
                .as_ref()
                .and_then(|t| t.spec.as_ref())
                .map(|s| {
                    s.node_selector
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            let mut c = vec![
                name,
                st.desired_number_scheduled.to_string(),
                st.current_number_scheduled.to_string(),
                st.number_ready.to_string(),
                st.updated_number_scheduled.to_string(),
                st.number_available.to_string(),
                node_selector,
                created,
            ];
            if wide {
                c.extend(template_columns(
                    spec.template.as_ref(),
                    spec.selector.as_ref(),
                ));
            }
            c
        }
        // kube-aggregator's columns: the Service or Local; True, or False (reason).
        "APIService" => {
            let service = match obj["spec"]["service"].as_object() {
                Some(s) => format!(
                    "{}/{}",
                    s.get("namespace").and_then(|v| v.as_str()).unwrap_or(""),
                    s.get("name").and_then(|v| v.as_str()).unwrap_or("")
                ),
                None => "Local".to_string(),
            };
            let available = obj["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
                .map(|c| {
                    let status = c["status"].as_str().unwrap_or("Unknown");
                    match c["reason"].as_str() {
                        Some(r) if status != "True" && !r.is_empty() => format!("{status} ({r})"),
                        _ => status.to_string(),
                    }
                })
                .unwrap_or_else(|| "Unknown".to_string());
            vec![name, service, available, created]
        }
        "Role" | "ClusterRole" | "CustomResourceDefinition" => {
            let at = obj["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            vec![name, at]
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let b: RoleBinding = typed(obj);
            let role = b
                .role_ref
                .as_ref()
                .map(|r| format!("{}/{}", r.kind, r.name))
                .unwrap_or_default();
            let mut c = vec![name, role, created];
            if wide {
                let of = |kind: &str| {
                    b.subjects
                        .iter()
                        .filter(|s| s.kind == kind)
                        .map(|s| match kind {
                            "ServiceAccount" => format!("{}/{}", s.namespace, s.name),
                            _ => s.name.clone(),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                c.extend([of("User"), of("Group"), of("ServiceAccount")]);
            }
            c
        }
        "ServiceAccount" => {
            let secrets = obj["secrets"].as_array().map(Vec::len).unwrap_or(0);
            vec![name, secrets.to_string(), created]
        }
        "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration" => {
            let hooks = obj["webhooks"].as_array().map(Vec::len).unwrap_or(0);
            vec![name, hooks.to_string(), created]
        }
        "ValidatingAdmissionPolicy" => {
            let spec = &obj["spec"];
            let validations = spec["validations"].as_array().map(Vec::len).unwrap_or(0);
            let param = &spec["paramKind"];
            let param = match (param["apiVersion"].as_str(), param["kind"].as_str()) {
                (Some(v), Some(k)) => format!("{v}/{k}"),
                _ => "<unset>".to_string(),
            };
            vec![name, validations.to_string(), param, created]
        }
        "ValidatingAdmissionPolicyBinding" => {
            let spec = &obj["spec"];
            let policy = spec["policyName"].as_str().unwrap_or("").to_string();
            let param = &spec["paramRef"];
            let param = match (param["namespace"].as_str(), param["name"].as_str()) {
                (Some(ns), Some(n)) if !ns.is_empty() => format!("{ns}/{n}"),
                (_, Some(n)) => format!("*/{n}"),
                _ => "<unset>".to_string(),
            };
            vec![name, policy, param, created]
        }
        "ConfigMap" => {
            let m: ConfigMap = typed(obj);
            vec![
                name,
                (m.data.len() + m.binary_data.len()).to_string(),
                created,
            ]
        }
        "Secret" => {
            let s: Secret = typed(obj);
            vec![name, s.r#type.clone(), s.data.len().to_string(), created]
        }
        "CertificateSigningRequest" => {
            let r: CertificateSigningRequest = typed(obj);
            let spec = r.spec.unwrap_or_default();
            let status = r.status.unwrap_or_default();
            // kubectl: the condition types, then Issued once a certificate is there.
            let mut conditions: Vec<String> =
                status.conditions.iter().map(|c| c.r#type.clone()).collect();
            if !status.certificate.is_empty() {
                conditions.push("Issued".into());
            }
            let condition = if conditions.is_empty() {
                "Pending".to_string()
            } else {
                conditions.join(",")
            };
            let duration = spec
                .expiration_seconds
                .map(|s| human_duration(TimeDelta::seconds(i64::from(s))))
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                created,
                spec.signer_name,
                spec.username,
                duration,
                condition,
            ]
        }
        "LoadBalancerIPPool" => {
            let p: LoadBalancerIpPool = typed(obj);
            let conditions = p.status.map(|s| s.conditions).unwrap_or_default();
            let condition = |ty: &str| conditions.iter().find(|c| c.r#type == ty);
            let conflicting = match condition(crate::lb_pool::POOL_CONFLICT) {
                Some(c) if c.status == "True" => "True",
                Some(_) => "False",
                None => "Unknown",
            };
            let available = condition(crate::lb_pool::IPS_AVAILABLE)
                .map(|c| c.message.clone())
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                p.spec.is_some_and(|s| s.disabled).to_string(),
                conflicting.to_string(),
                available,
                created,
            ]
        }
        "Lease" => {
            let l: Lease = typed(obj);
            let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            vec![name, none_if_empty(holder), created]
        }
        "Event" => {
            let e: Event = typed(obj);
            let last = event_time(&e);
            let obj_ref = e.involved_object.clone().unwrap_or_default();
            let object = format!("{}/{}", obj_ref.kind.to_ascii_lowercase(), obj_ref.name);
            let message = e.message.trim().to_string();
            let mut c = vec![
                age(last, now),
                e.r#type.clone(),
                e.reason.clone(),
                object,
                message,
            ];
            if wide {
                let src = e.source.clone().unwrap_or_default();
                let source = match (src.component.as_str(), src.host.as_str()) {
                    ("", "") => e.reporting_component.clone(),
                    (c, "") => c.to_string(),
                    (c, h) => format!("{c}, {h}"),
                };
                c.insert(4, obj_ref.field_path.clone());
                c.insert(5, source);
                let first = if e.first_timestamp.is_empty() {
                    last
                } else {
                    &e.first_timestamp
                };
                c.extend([age(first, now), e.count.max(1).to_string(), name]);
            }
            c
        }
        _ => vec![name, created],
    };
    // Keep the row as long as the header even for odd objects.
    c.resize(headers(kind, wide).len(), String::new());
    c
}

/// What kubectl prints for an optional class or mode that is not set.
const UNSET: &str = "<unset>";

/// The `storage` quantity of a capacity, as kubectl prints it ("0" when absent).
fn storage_quantity(capacity: &BTreeMap<String, String>) -> String {
    capacity
        .get("storage")
        .cloned()
        .unwrap_or_else(|| "0".into())
}

/// kubectl's ACCESS MODES: `RWO`, `ROX`, `RWX`, `RWOP`, in that order, each once, joined by
/// commas (`GetAccessModesAsString`); unknown modes are left out.
pub fn access_modes(modes: &[String]) -> String {
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(mode, _)| modes.iter().any(|m| m == mode))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

/// A volume's or claim's phase, or Terminating once its delete started.
fn phase_or_terminating(obj: &Value, phase: String) -> String {
    if str_at(obj, "/metadata/deletionTimestamp").is_empty() {
        phase
    } else {
        "Terminating".into()
    }
}

/// When an event last happened: lastTimestamp, eventTime, firstTimestamp or creation.
pub fn event_time(e: &Event) -> &str {
    [
        e.last_timestamp.as_str(),
        e.event_time.as_str(),
        e.first_timestamp.as_str(),
        e.metadata
            .as_ref()
            .map(|m| m.creation_timestamp.as_str())
            .unwrap_or(""),
    ]
    .into_iter()
    .find(|s| !s.is_empty())
    .unwrap_or("")
}

/// Ready/NotReady, plus SchedulingDisabled for a cordoned node.
pub fn node_status(n: &Node) -> String {
    let ready = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready"))
        .map(|c| c.status == "True")
        .unwrap_or(false);
    let mut s = if ready { "Ready" } else { "NotReady" }.to_string();
    if n.spec.as_ref().is_some_and(|s| s.unschedulable) {
        s.push_str(",SchedulingDisabled");
    }
    s
}

/// Roles from `node-role.kubernetes.io/<role>` and `kubernetes.io/role` labels.
pub fn node_roles(labels: Option<&BTreeMap<String, String>>) -> String {
    let mut roles: Vec<String> = Vec::new();
    for (k, v) in labels.into_iter().flatten() {
        if let Some(r) = k.strip_prefix("node-role.kubernetes.io/") {
            if !r.is_empty() {
                roles.push(r.to_string());
            }
        } else if k == "kubernetes.io/role" && !v.is_empty() {
            roles.push(v.clone());
        }
    }
    roles.sort();
    roles.dedup();
    none_if_empty(roles.join(","))
}

/// (ready containers, containers in the spec).
pub fn pod_ready(p: &Pod) -> (usize, usize) {
    let total = p.spec.as_ref().map(|s| s.containers.len()).unwrap_or(0);
    let ready = p
        .status
        .as_ref()
        .map(|s| s.container_statuses.iter().filter(|c| c.ready).count())
        .unwrap_or(0);
    (ready, total)
}

fn terminated_reason(t: &crate::api::ContainerStateTerminated) -> String {
    if !t.reason.is_empty() {
        t.reason.clone()
    } else if t.signal != 0 {
        format!("Signal:{}", t.signal)
    } else {
        format!("ExitCode:{}", t.exit_code)
    }
}

/// The STATUS column of a pod, following kubectl: init progress, a waiting or terminated
/// container's reason, Terminating, else the phase.
pub fn pod_status(p: &Pod) -> String {
    let st = p.status.clone().unwrap_or_default();
    let spec = p.spec.clone().unwrap_or_default();
    let mut reason = if !st.reason.is_empty() {
        st.reason.clone()
    } else if !st.phase.is_empty() {
        st.phase.clone()
    } else {
        "Pending".into()
    };
    let mut initializing = false;
    let init_total = spec
        .init_containers
        .len()
        .max(st.init_container_statuses.len());
    for (i, c) in st.init_container_statuses.iter().enumerate() {
        let state = c.state.clone().unwrap_or_default();
        if let Some(t) = &state.terminated {
            if t.exit_code == 0 {
                continue;
            }
            reason = format!("Init:{}", terminated_reason(t));
        } else if let Some(w) = state
            .waiting
            .as_ref()
            .filter(|w| !w.reason.is_empty() && w.reason != "PodInitializing")
        {
            reason = format!("Init:{}", w.reason);
        } else {
            reason = format!("Init:{i}/{init_total}");
        }
        initializing = true;
        break;
    }
    if !initializing {
        let mut has_running = false;
        for c in st.container_statuses.iter().rev() {
            let state = c.state.clone().unwrap_or_default();
            if let Some(w) = state.waiting.as_ref().filter(|w| !w.reason.is_empty()) {
                reason = w.reason.clone();
            } else if let Some(t) = &state.terminated {
                reason = terminated_reason(t);
            } else if state.running.is_some() && c.ready {
                has_running = true;
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    }
    let deleting = p
        .metadata
        .as_ref()
        .is_some_and(|m| !m.deletion_timestamp.is_empty());
    if deleting {
        reason = if st.reason == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

/// Total restarts, with the age of the last one like kubectl (`3 (2m ago)`).
pub fn pod_restarts(p: &Pod, now: DateTime<Utc>) -> String {
    let st = p.status.clone().unwrap_or_default();
    let all: Vec<&ContainerStatus> = st
        .init_container_statuses
        .iter()
        .chain(st.container_statuses.iter())
        .collect();
    let restarts: i64 = all.iter().map(|c| i64::from(c.restart_count)).sum();
    let last = all
        .iter()
        .filter_map(|c| c.last_state.as_ref()?.terminated.as_ref())
        .filter_map(|t| DateTime::parse_from_rfc3339(&t.finished_at).ok())
        .max();
    match last {
        Some(t) if restarts > 0 => format!(
            "{restarts} ({} ago)",
            human_duration(now.signed_duration_since(t.with_timezone(&Utc)))
        ),
        _ => restarts.to_string(),
    }
}

/// `80/TCP`, `80:30080/TCP`, joined by commas; `<none>` without ports.
pub fn service_ports(ports: &[ServicePort]) -> String {
    let parts: Vec<String> = ports
        .iter()
        .map(|p| {
            let proto = if p.protocol.is_empty() {
                "TCP"
            } else {
                &p.protocol
            };
            if p.node_port > 0 {
                format!("{}:{}/{proto}", p.port, p.node_port)
            } else {
                format!("{}/{proto}", p.port)
            }
        })
        .collect();
    none_if_empty(parts.join(","))
}

/// `k=v,k2=v2`; `<none>` when empty.
pub fn map_selector(sel: &BTreeMap<String, String>) -> String {
    none_if_empty(
        sel.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// A LabelSelector in selector syntax as kubectl prints it (`metav1.FormatLabelSelector`):
/// requirements sorted by key, the values of `in`/`notin` sorted; `<none>` when empty or
/// absent, `<error>` when it is not a selector (an unknown operator, `In` without values).
pub fn label_selector(sel: Option<&LabelSelector>) -> String {
    let Some(sel) = sel else {
        return "<none>".into();
    };
    if crate::selector::Selector::from_label_selector(sel).is_err() {
        return "<error>".into();
    }
    let mut parts: Vec<(&str, String)> = sel
        .match_labels
        .iter()
        .map(|(k, v)| (k.as_str(), format!("{k}={v}")))
        .collect();
    for e in &sel.match_expressions {
        let mut values = e.values.clone();
        values.sort();
        let values = values.join(",");
        let text = match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        };
        parts.push((e.key.as_str(), text));
    }
    parts.sort_by(|a, b| a.0.cmp(b.0));
    none_if_empty(
        parts
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
            .join(","),
    )
}

fn template_columns(t: Option<&PodTemplateSpec>, sel: Option<&LabelSelector>) -> [String; 3] {
    let containers = t
        .and_then(|t| t.spec.as_ref())
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    [
        none_if_empty(
            containers
                .iter()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
                .join(","),
        ),
        none_if_empty(
            containers
                .iter()
                .map(|c| c.image.clone())
                .collect::<Vec<_>>()
                .join(","),
        ),
        label_selector(sel),
    ]
}

/// Ready endpoint addresses as `ip:port`, at most three, then `+ N more...`.
pub fn endpoints(e: &Endpoints) -> String {
    const MAX: usize = 3;
    let mut list = Vec::new();
    for s in &e.subsets {
        if s.ports.is_empty() {
            list.extend(s.addresses.iter().map(|a| a.ip.clone()));
        } else {
            for p in &s.ports {
                list.extend(s.addresses.iter().map(|a| format!("{}:{}", a.ip, p.port)));
            }
        }
    }
    if list.is_empty() {
        return "<none>".into();
    }
    let more = list.len().saturating_sub(MAX);
    let mut out = list[..list.len().min(MAX)].join(",");
    if more > 0 {
        out.push_str(&format!(" + {more} more..."));
    }
    out
}

/// The age of an RFC 3339 timestamp at `now`, like kubectl (`45s`, `3m12s`, `5h`, `2d`);
/// `<unknown>` when the timestamp is missing or unreadable.
/// kubectl's Job STATUS: the first of Complete, Failed, Terminating, Suspended,
/// FailureTarget, SuccessCriteriaMet that holds, else Running.
pub fn job_status(j: &Job) -> String {
    let st = j.status.clone().unwrap_or_default();
    let has = |t: &str| {
        st.conditions
            .iter()
            .any(|c| c.r#type == t && c.status == "True")
    };
    let terminating = j
        .metadata
        .as_ref()
        .is_some_and(|m| !m.deletion_timestamp.is_empty());
    if has("Complete") {
        "Complete"
    } else if has("Failed") {
        "Failed"
    } else if terminating {
        "Terminating"
    } else if has("Suspended") {
        "Suspended"
    } else if has("FailureTarget") {
        "FailureTarget"
    } else if has("SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    }
    .to_string()
}

/// kubectl's Job COMPLETIONS: `succeeded/completions`, or `succeeded/1 of parallelism`
/// for a work queue.
fn job_completions(j: &Job) -> String {
    let spec = j.spec.clone().unwrap_or_default();
    let succeeded = j.status.as_ref().map(|s| s.succeeded).unwrap_or(0);
    match spec.completions {
        Some(c) => format!("{succeeded}/{c}"),
        None => match spec.parallelism.unwrap_or(1) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    }
}

/// kubectl's Job DURATION: start to completion, or to now while running.
fn job_duration(st: &crate::api::JobStatus, now: DateTime<Utc>) -> String {
    let parse = |t: &Option<String>| {
        t.as_deref()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    match (parse(&st.start_time), parse(&st.completion_time)) {
        (None, _) => String::new(),
        (Some(start), None) => human_duration(now - start),
        (Some(start), Some(end)) => human_duration(end - start),
    }
}

pub fn age(timestamp: &str, now: DateTime<Utc>) -> String {
    match DateTime::parse_from_rfc3339(timestamp) {
        Ok(t) => human_duration(now.signed_duration_since(t.with_timezone(&Utc))),
        Err(_) => "<unknown>".to_string(),
    }
}

/// kubectl's `duration.HumanDuration`: two significant units while they matter.
pub fn human_duration(d: TimeDelta) -> String {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".into();
    } else if seconds < 0 {
        return "0s".into();
    } else if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    } else if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    } else if hours < 48 {
        return format!("{hours}h");
    } else if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    } else if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    } else if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages_look_like_kubectl() {
        let d = TimeDelta::seconds;
        assert_eq!(human_duration(d(-5)), "<invalid>");
        assert_eq!(human_duration(d(-1)), "0s");
        assert_eq!(human_duration(d(45)), "45s");
        assert_eq!(human_duration(d(119)), "119s");
        assert_eq!(human_duration(d(192)), "3m12s");
        assert_eq!(human_duration(d(300)), "5m");
        assert_eq!(human_duration(d(11 * 60 + 5)), "11m");
        assert_eq!(human_duration(d(5 * 3600)), "5h");
        assert_eq!(human_duration(d(5 * 3600 + 60 * 7)), "5h7m");
        assert_eq!(human_duration(d(20 * 3600)), "20h");
        assert_eq!(human_duration(d(2 * 86400)), "2d");
        assert_eq!(human_duration(d(2 * 86400 + 3 * 3600)), "2d3h");
        assert_eq!(human_duration(d(30 * 86400)), "30d");
        assert_eq!(human_duration(d(3 * 365 * 86400 + 86400)), "3y1d");
        assert_eq!(human_duration(d(10 * 365 * 86400)), "10y");
    }

    #[test]
    fn age_of_timestamps() {
        let now = DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(age("2024-05-01T11:59:15Z", now), "45s");
        assert_eq!(age("2024-05-01T13:59:15+02:00", now), "45s");
        assert_eq!(age("", now), "<unknown>");
        assert_eq!(age("yesterday", now), "<unknown>");
    }
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn pod_columns() {
        let pod = json!({
            "metadata": {"name": "web-1", "creationTimestamp": "2024-05-01T11:59:15Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2,
                 "state": {"running": {}},
                 "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-05-01T11:58:00Z"}}},
                {"name": "b", "ready": false, "state": {"running": {}}}
            ]}
        });
        assert_eq!(
            cells("Pod", &pod, true, now()),
            vec![
                "web-1",
                "1/2",
                "Running",
                "2 (2m ago)",
                "45s",
                "10.0.0.5",
                "n1",
                "<none>",
                "<none>"
            ]
        );
        assert_eq!(headers("Pod", true).len(), 9);
        assert_eq!(
            headers("Pod", false).len(),
            cells("Pod", &pod, false, now()).len()
        );
    }

    #[test]
    fn pod_status_reasons() {
        let p = |status: Value| -> Pod {
            serde_json::from_value(
                json!({"spec": {"containers": [{"name": "a"}]}, "status": status}),
            )
            .unwrap()
        };
        assert_eq!(pod_status(&p(json!({}))), "Pending");
        assert_eq!(
            pod_status(&p(json!({"phase": "Pending", "containerStatuses": [
                {"name": "a", "state": {"waiting": {"reason": "ContainerCreating"}}}]}))),
            "ContainerCreating"
        );
        assert_eq!(
            pod_status(&p(json!({"phase": "Running", "containerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 137}}}]}))),
            "ExitCode:137"
        );
        assert_eq!(
            pod_status(&p(json!({"phase": "Pending", "initContainerStatuses": [
                {"name": "i", "state": {"running": {}}}]}))),
            "Init:0/1"
        );
        let mut deleting = p(json!({"phase": "Running"}));
        deleting.metadata = Some(crate::api::ObjectMeta {
            deletion_timestamp: "2024-05-01T11:00:00Z".into(),
            ..Default::default()
        });
        assert_eq!(pod_status(&deleting), "Terminating");
    }

    #[test]
    fn service_columns() {
        let svc = json!({
            "metadata": {"name": "web", "creationTimestamp": "2024-05-01T11:57:00Z"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "selector": {"app": "web"},
                     "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"},
                               {"port": 53, "protocol": "UDP"}]}
        });
        assert_eq!(
            cells("Service", &svc, true, now()),
            vec![
                "web",
                "NodePort",
                "10.96.0.10",
                "<none>",
                "80:30080/TCP,53/UDP",
                "3m",
                "app=web"
            ]
        );
        assert_eq!(service_ports(&[]), "<none>");
        let plain: Vec<ServicePort> =
            serde_json::from_value(json!([{"port": 80, "targetPort": 8080}])).unwrap();
        assert_eq!(service_ports(&plain), "80/TCP");
    }

    #[test]
    fn deployment_columns() {
        let d = json!({
            "metadata": {"name": "web", "creationTimestamp": "2024-04-29T12:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": [{"name": "web", "image": "host"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}
        });
        assert_eq!(
            cells("Deployment", &d, true, now()),
            vec!["web", "2/3", "3", "2", "2d", "web", "host", "app=web"]
        );
        // No status yet: 0/N.
        let fresh = json!({"metadata": {"name": "x"}, "spec": {}});
        assert_eq!(cells("Deployment", &fresh, false, now())[1], "0/1");
    }

    #[test]
    fn persistent_volume_columns() {
        assert_eq!(
            headers("PersistentVolume", true),
            [
                "NAME",
                "CAPACITY",
                "ACCESS MODES",
                "RECLAIM POLICY",
                "STATUS",
                "CLAIM",
                "STORAGECLASS",
                "VOLUMEATTRIBUTESCLASS",
                "REASON",
                "AGE",
                "VOLUMEMODE"
            ]
        );
        let pv = json!({
            "metadata": {"name": "pv1", "creationTimestamp": "2024-04-29T12:00:00Z"},
            "spec": {"capacity": {"storage": "5Gi"},
                     "accessModes": ["ReadWriteOncePod", "ReadWriteOnce", "ReadWriteMany",
                                     "ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": "shop", "name": "data"},
                     "storageClassName": "fast", "hostPath": {"path": "/srv"},
                     "volumeMode": "Filesystem"},
            "status": {"phase": "Bound"}
        });
        assert_eq!(
            cells("PersistentVolume", &pv, true, now()),
            vec![
                "pv1",
                "5Gi",
                "RWO,RWX,RWOP",
                "Retain",
                "Bound",
                "shop/data",
                "fast",
                "<unset>",
                "",
                "2d",
                "Filesystem"
            ]
        );
        // Unbound, no class; the beta annotation names the class; a delete shows
        // Terminating.
        let pv = json!({
            "metadata": {"name": "pv2", "deletionTimestamp": "2024-05-01T12:00:00Z",
                         "annotations": {"volume.beta.kubernetes.io/storage-class": "old"}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"]},
            "status": {"phase": "Released", "reason": "Lost"}
        });
        let c = cells("PersistentVolume", &pv, false, now());
        assert_eq!(
            c[2..9],
            ["ROX", "", "Terminating", "", "old", "<unset>", "Lost"]
        );
    }

    #[test]
    fn persistent_volume_claim_columns() {
        assert_eq!(
            headers("PersistentVolumeClaim", false),
            [
                "NAME",
                "STATUS",
                "VOLUME",
                "CAPACITY",
                "ACCESS MODES",
                "STORAGECLASS",
                "VOLUMEATTRIBUTESCLASS",
                "AGE"
            ]
        );
        let pending = json!({
            "metadata": {"name": "data", "creationTimestamp": "2024-04-29T12:00:00Z"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                     "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Pending"}
        });
        assert_eq!(
            cells("PersistentVolumeClaim", &pending, true, now()),
            vec![
                "data", "Pending", "", "", "", "standard", "<unset>", "2d", "<unset>"
            ]
        );
        // Bound: the volume's capacity and modes from the status.
        let bound = json!({
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv1",
                     "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Block"},
            "status": {"phase": "Bound", "capacity": {"storage": "5Gi"},
                       "accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}
        });
        assert_eq!(
            cells("PersistentVolumeClaim", &bound, true, now())[1..7],
            ["Bound", "pv1", "5Gi", "RWO,ROX", "", "<unset>"]
        );
        assert_eq!(
            cells("PersistentVolumeClaim", &bound, true, now())[8],
            "Block"
        );
    }

    #[test]
    fn storage_class_columns() {
        assert_eq!(
            headers("StorageClass", true),
            [
                "NAME",
                "PROVISIONER",
                "RECLAIMPOLICY",
                "VOLUMEBINDINGMODE",
                "ALLOWVOLUMEEXPANSION",
                "AGE"
            ]
        );
        let sc = json!({
            "metadata": {"name": "local", "creationTimestamp": "2024-04-29T12:00:00Z",
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "skiff.io/local-path", "reclaimPolicy": "Retain",
            "volumeBindingMode": "WaitForFirstConsumer", "allowVolumeExpansion": true
        });
        assert_eq!(
            cells("StorageClass", &sc, false, now()),
            vec![
                "local (default)",
                "skiff.io/local-path",
                "Retain",
                "WaitForFirstConsumer",
                "true",
                "2d"
            ]
        );
        // Unset fields print Kubernetes' defaults; "false" is not the default marker.
        let sc = json!({"metadata": {"name": "plain",
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "false"}},
                        "provisioner": "p"});
        assert_eq!(
            cells("StorageClass", &sc, false, now())[..5],
            ["plain", "p", "Delete", "Immediate", "false"]
        );
    }

    #[test]
    fn load_balancer_ip_pool_columns() {
        assert_eq!(
            headers("LoadBalancerIPPool", true),
            ["NAME", "DISABLED", "CONFLICTING", "IPS AVAILABLE", "AGE"]
        );
        let p = json!({
            "metadata": {"name": "lan", "creationTimestamp": "2024-04-29T12:00:00Z"},
            "spec": {"blocks": [{"cidr": "192.168.100.240/29"}]},
            "status": {"conditions": [
                {"type": "skiff.io/IPsAvailable", "status": "Unknown", "message": "5"},
                {"type": "skiff.io/PoolConflict", "status": "False"}
            ]}
        });
        assert_eq!(
            cells("LoadBalancerIPPool", &p, false, now()),
            ["lan", "false", "False", "5", "2d"]
        );
        let fresh = json!({"metadata": {"name": "new"}, "spec": {"disabled": true}});
        assert_eq!(
            cells("LoadBalancerIPPool", &fresh, false, now())[..4],
            ["new", "true", "Unknown", "<none>"]
        );
    }

    #[test]
    fn network_policy_columns() {
        assert_eq!(
            headers("NetworkPolicy", true),
            ["NAME", "POD-SELECTOR", "AGE"]
        );
        let p = json!({
            "metadata": {"name": "web", "creationTimestamp": "2024-04-29T12:00:00Z"},
            "spec": {"podSelector": {"matchLabels": {"app": "web"},
                     "matchExpressions": [{"key": "env", "operator": "In",
                                           "values": ["prod", "dev"]}]},
                     "policyTypes": ["Ingress"]}
        });
        assert_eq!(
            cells("NetworkPolicy", &p, false, now()),
            vec!["web", "app=web,env in (dev,prod)", "2d"]
        );
        // An empty selector (every pod of the namespace) and none at all both print <none>.
        for spec in [json!({"podSelector": {}}), json!({})] {
            let p = json!({"metadata": {"name": "all"}, "spec": spec});
            assert_eq!(cells("NetworkPolicy", &p, false, now())[1], "<none>");
        }
    }

    #[test]
    fn node_columns() {
        let n = json!({
            "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"kubeletVersion": "v0.1.0", "kernelVersion": "6.1"},
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}
        });
        let c = cells("Node", &n, true, now());
        assert_eq!(c[1], "Ready,SchedulingDisabled");
        assert_eq!(c[2], "control-plane");
        assert_eq!(c[4], "v0.1.0");
        assert_eq!(c[5], "10.0.0.1");
        assert_eq!(c[8], "6.1");
        let n = json!({"metadata": {"name": "n2"}});
        assert_eq!(
            cells("Node", &n, false, now())[1..3],
            ["NotReady", "<none>"]
        );
    }

    #[test]
    fn endpoints_are_truncated() {
        let e: Endpoints = serde_json::from_value(json!({"subsets": [{
            "addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}, {"ip": "10.0.0.4"}],
            "ports": [{"port": 8080}]}]}))
        .unwrap();
        assert_eq!(
            endpoints(&e),
            "10.0.0.1:8080,10.0.0.2:8080,10.0.0.3:8080 + 1 more..."
        );
        assert_eq!(endpoints(&Endpoints::default()), "<none>");
    }

    #[test]
    fn selectors_and_events() {
        let sel: LabelSelector = serde_json::from_value(json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                 {"key": "x", "operator": "DoesNotExist"}]}))
        .unwrap();
        assert_eq!(label_selector(Some(&sel)), "app=web,tier in (a,b),!x");
        // kubectl sorts requirements by key and values, whatever order they came in.
        let sel: LabelSelector = serde_json::from_value(json!({"matchLabels": {"z": "1"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["b", "a"]},
                                 {"key": "app", "operator": "Exists"}]}))
        .unwrap();
        assert_eq!(label_selector(Some(&sel)), "app,tier notin (a,b),z=1");
        let bad: LabelSelector =
            serde_json::from_value(json!({"matchExpressions": [{"key": "a", "operator": "Is"}]}))
                .unwrap();
        assert_eq!(label_selector(Some(&bad)), "<error>");
        assert_eq!(label_selector(Some(&LabelSelector::default())), "<none>");
        let ev = json!({"metadata": {"name": "web.1"}, "type": "Normal", "reason": "Scheduled",
            "involvedObject": {"kind": "Pod", "name": "web-1"}, "message": "assigned\n",
            "lastTimestamp": "2024-05-01T11:59:50Z"});
        assert_eq!(
            cells("Event", &ev, false, now()),
            vec!["10s", "Normal", "Scheduled", "pod/web-1", "assigned"]
        );
        assert_eq!(
            headers("Event", true).len(),
            cells("Event", &ev, true, now()).len()
        );
        assert_eq!(headers("Event", true)[4], "SUBOBJECT");
    }
}
