//! LoadBalancer Services get addresses from LoadBalancerIPPools (`skiff.io/v1`), as with
//! Cilium's LB-IPAM: a pool applied with kubectl, a LoadBalancer Service applied with kubectl
//! has `status.loadBalancer.ingress` within 1 s and `kubectl get svc` shows its EXTERNAL-IP;
//! a Service that asks for an address gets it; a pool that overlaps another pool or the
//! service CIDR, and a Service that asks for an address outside every pool, are refused with
//! kubectl's 422 text naming the field; a full pool leaves a Service pending with a Warning
//! `AllocationFailed`; deleting a Service frees its address for the waiting one; a restarted
//! controller manager moves nobody and hands out nothing twice; the pool's status counts.
//! Real binaries (`skiff-apiserver`, `skiff-controller-manager`) and kubectl 1.32; no node
//! is needed (the addresses are the control plane's business).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::{Duration, Instant};

use skiff_api::api::{Event, LoadBalancerIpPool, Service};
use skiff_client::{Client, ListParams};
use skiff_tests::{ApiServer, Backend, Component, eventually_within, unique};

const T: Duration = Duration::from_secs(30);

fn kubectl(server: &ApiServer, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let out = match stdin {
        Some(s) => server.kubectl_stdin(args, s),
        None => server.kubectl(args),
    };
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn apply(server: &ApiServer, manifest: &str) {
    let (ok, out, err) = kubectl(server, &["apply", "-f", "-"], Some(manifest));
    assert!(ok, "kubectl apply failed:\n{out}\n{err}\n{manifest}");
}

/// kubectl apply that must be refused: its stderr.
fn refused(server: &ApiServer, manifest: &str) -> String {
    let (ok, out, err) = kubectl(server, &["apply", "-f", "-"], Some(manifest));
    assert!(!ok, "kubectl apply succeeded:\n{out}\n{manifest}");
    err.trim().to_string()
}

fn pool_manifest(name: &str, cidr: &str) -> String {
    format!(
        "apiVersion: skiff.io/v1\nkind: LoadBalancerIPPool\nmetadata:\n  name: {name}\n\
         spec:\n  blocks:\n  - cidr: {cidr}\n  serviceSelector:\n    matchLabels:\n      \
         lb: lan\n"
    )
}

/// A LoadBalancer Service in `ns`, with `extra` lines appended to its spec.
fn service_manifest(ns: &str, name: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
         labels:\n    lb: lan\nspec:\n  type: LoadBalancer\n  selector:\n    app: {name}\n  \
         ports:\n  - port: 80\n    targetPort: 8080\n{extra}"
    )
}

async fn ingress(client: &Client, ns: &str, name: &str) -> Vec<(String, String)> {
    let Ok(svc) = client.namespaced::<Service>(ns).get(name).await else {
        return Vec::new();
    };
    svc.status
        .and_then(|s| s.load_balancer)
        .map(|lb| {
            lb.ingress
                .into_iter()
                .map(|i| (i.ip, i.ip_mode.unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_ingress(client: &Client, ns: &str, name: &str, ip: &str) {
    eventually_within(&format!("{name} gets {ip}"), T, || async {
        ingress(client, ns, name).await == [(ip.to_string(), "VIP".to_string())]
    })
    .await;
}

/// The pool's count conditions (total, available, used) and its conflict status.
async fn pool_counts(client: &Client, name: &str) -> (String, String, String, String) {
    let pool = client
        .cluster::<LoadBalancerIpPool>()
        .get(name)
        .await
        .unwrap();
    let conditions = pool.status.map(|s| s.conditions).unwrap_or_default();
    let get = |ty: &str, field: fn(&skiff_api::api::Condition) -> String| {
        conditions
            .iter()
            .find(|c| c.r#type == ty)
            .map(field)
            .unwrap_or_default()
    };
    (
        get("skiff.io/IPsTotal", |c| c.message.clone()),
        get("skiff.io/IPsAvailable", |c| c.message.clone()),
        get("skiff.io/IPsUsed", |c| c.message.clone()),
        get("skiff.io/PoolConflict", |c| c.status.clone()),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn load_balancer_services_get_addresses_from_pools() {
    let server = ApiServer::start(Backend::Embedded);
    let mut cm = Component::start(
        &server,
        "skiff-controller-manager",
        &["--lease-duration", "4", "--identity", "cm-lbipam"],
    );
    let admin = server.client().await;
    let id = unique();
    let ns = format!("lb-{id}");
    let pool = format!("lan-{id}");
    let (ok, _, err) = kubectl(&server, &["create", "namespace", &ns], None);
    assert!(ok, "{err}");

    // A pool of two usable addresses: 192.168.100.240/30 without its network and broadcast
    // addresses.
    apply(&server, &pool_manifest(&pool, "192.168.100.240/30"));
    let (ok, out, err) = kubectl(&server, &["get", "lbippool", &pool], None);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("NAME") && out.contains("DISABLED") && out.contains("IPS AVAILABLE"),
        "{out}"
    );

    // The first Service gets the lowest address within 1 s (the controller manager is
    // leading once the pool's status is written).
    eventually_within("the pool's status written", T, || async {
        pool_counts(&admin, &pool).await.0 == "2"
    })
    .await;
    let manifest = service_manifest(&ns, "web", "");
    let started = Instant::now();
    apply(&server, &manifest);
    let applied = started.elapsed();
    eventually_within("web gets 192.168.100.241", T, || async {
        ingress(&admin, &ns, "web").await == [("192.168.100.241".to_string(), "VIP".to_string())]
    })
    .await;
    let after_apply = started.elapsed() - applied;
    // The Service was created while kubectl ran: the address came at most `applied +
    // after_apply` after its creation.
    println!(
        "status.loadBalancer.ingress seen {after_apply:?} after kubectl apply returned, at \
         most {:?} after the Service's creation (kubectl ran {applied:?})",
        applied + after_apply
    );
    assert!(
        after_apply < Duration::from_secs(1),
        "the address took {after_apply:?}; controller manager log:\n{}",
        cm.log()
    );
    let (ok, out, err) = kubectl(&server, &["get", "svc", "web", "-n", &ns], None);
    assert!(ok, "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ],
        "{out}"
    );
    assert_eq!(lines[1][..2], ["web", "LoadBalancer"], "{out}");
    assert_eq!(lines[1][3], "192.168.100.241", "{out}");
    assert!(lines[1][4].starts_with("80:3"), "a nodePort: {out}");

    // Whoever may write services/status cannot point the cluster at an address outside the
    // pools (CVE-2020-8554's class: every node would take 8.8.8.8's traffic).
    let (ok, _, err) = kubectl(
        &server,
        &[
            "patch",
            "svc",
            "web",
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"loadBalancer":{"ingress":[{"ip":"8.8.8.8"}]}}}"#,
        ],
        None,
    );
    assert!(!ok, "the status patch was accepted");
    assert_eq!(
        err.trim(),
        "The Service \"web\" is invalid: status.loadBalancer.ingress[0].ip: Invalid value: \
         \"8.8.8.8\": 8.8.8.8 is not in any LoadBalancerIPPool's addresses"
    );
    assert_eq!(
        ingress(&admin, &ns, "web").await[0].0,
        "192.168.100.241",
        "the status keeps its address"
    );

    // Refused with kubectl's words: a pool overlapping this one, one overlapping the service
    // CIDR, a Service asking for an address of no pool.
    let other = format!("other-{id}");
    assert_eq!(
        refused(&server, &pool_manifest(&other, "192.168.100.240/29")),
        format!(
            "The LoadBalancerIPPool \"{other}\" is invalid: spec.blocks[0].cidr: Invalid \
             value: \"192.168.100.240/29\": overlaps LoadBalancerIPPool \"{pool}\" \
             (192.168.100.240-192.168.100.243)"
        )
    );
    assert_eq!(
        refused(&server, &pool_manifest(&other, "10.96.0.0/24")),
        format!(
            "The LoadBalancerIPPool \"{other}\" is invalid: spec.blocks[0].cidr: Invalid \
             value: \"10.96.0.0/24\": overlaps the service CIDR 10.96.0.0/16"
        )
    );
    assert_eq!(
        refused(
            &server,
            &service_manifest(&ns, "outside", "  loadBalancerIP: 192.168.100.250\n")
        ),
        "The Service \"outside\" is invalid: spec.loadBalancerIP: Invalid value: \"192.168.100.250\": 192.168.100.250 is \
         not in any LoadBalancerIPPool's addresses"
    );
    let annotated = service_manifest(&ns, "outside", "").replace(
        "  labels:\n",
        "  annotations:\n    skiff.io/lb-ips: 192.168.100.99\n  labels:\n",
    );
    assert_eq!(
        refused(&server, &annotated),
        "The Service \"outside\" is invalid: metadata.annotations[skiff.io/lb-ips]: Invalid value: \"192.168.100.99\": \
         192.168.100.99 is not in any LoadBalancerIPPool's addresses"
    );
    assert!(
        admin
            .cluster::<LoadBalancerIpPool>()
            .get_opt(&other)
            .await
            .unwrap()
            .is_none()
    );

    // A Service asking for the other address gets exactly it; the pool is then full, and a
    // third Service waits with a Warning.
    apply(
        &server,
        &service_manifest(&ns, "asks", "  loadBalancerIP: 192.168.100.242\n"),
    );
    wait_ingress(&admin, &ns, "asks", "192.168.100.242").await;
    apply(&server, &service_manifest(&ns, "waits", ""));
    let events = admin.namespaced::<Event>(&ns);
    let warning = eventually_within("an AllocationFailed event for waits", T, || async {
        events
            .list(&ListParams::default().fields("involvedObject.name=waits"))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason == "AllocationFailed" && e.r#type == "Warning")
    })
    .await;
    assert!(
        warning.message.contains("no free IPv4 address") && warning.message.contains(pool.as_str()),
        "{}",
        warning.message
    );
    assert!(ingress(&admin, &ns, "waits").await.is_empty());
    eventually_within("the pool counts two used, none available", T, || async {
        pool_counts(&admin, &pool).await == ("2".into(), "0".into(), "2".into(), "False".into())
    })
    .await;
    let (_, out, _) = kubectl(&server, &["get", "svc", "waits", "-n", &ns], None);
    assert!(out.contains("<pending>"), "{out}");
    let (_, out, _) = kubectl(&server, &["get", "lbippool", &pool], None);
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(row[..4], [pool.as_str(), "false", "False", "0"], "{out}");

    // kubectl's typed command (a protobuf body): a Service the pool does not select (no
    // `lb: lan` label) is told so.
    let (ok, _, err) = kubectl(
        &server,
        &[
            "create",
            "service",
            "loadbalancer",
            "typed",
            "--tcp=80:8080",
            "-n",
            &ns,
        ],
        None,
    );
    assert!(ok, "{err}");
    let warning = eventually_within("an AllocationFailed event for typed", T, || async {
        events
            .list(&ListParams::default().fields("involvedObject.name=typed"))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason == "AllocationFailed")
    })
    .await;
    assert!(
        warning
            .message
            .contains("no enabled LoadBalancerIPPool selects the service"),
        "{}",
        warning.message
    );

    // A restarted controller manager keeps every address where it is and hands out none
    // twice.
    cm.kill();
    cm.restart();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        ingress(&admin, &ns, "web").await,
        [("192.168.100.241".to_string(), "VIP".to_string())]
    );
    assert_eq!(
        ingress(&admin, &ns, "asks").await,
        [("192.168.100.242".to_string(), "VIP".to_string())]
    );
    assert!(
        ingress(&admin, &ns, "waits").await.is_empty(),
        "log:\n{}",
        cm.log()
    );

    // Deleting a Service frees its address: the waiting Service gets it.
    let (ok, _, err) = kubectl(&server, &["delete", "svc", "web", "-n", &ns], None);
    assert!(ok, "{err}");
    wait_ingress(&admin, &ns, "waits", "192.168.100.241").await;

    // A Service that stops being a LoadBalancer gives its address back.
    let (ok, _, err) = kubectl(
        &server,
        &[
            "patch",
            "svc",
            "asks",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"type":"ClusterIP","loadBalancerIP":null}}"#,
        ],
        None,
    );
    assert!(ok, "{err}");
    eventually_within("asks loses its address", T, || async {
        ingress(&admin, &ns, "asks").await.is_empty()
    })
    .await;
    eventually_within("the pool counts one used", T, || async {
        pool_counts(&admin, &pool).await == ("2".into(), "1".into(), "1".into(), "False".into())
    })
    .await;

    // A pool over addresses nodes have (a whole LAN, say) does not make a node's address a
    // Service's: the node answering ARP for it would take that machine's traffic. Asked
    // for, it is refused with whose it is; handed out, it is skipped (the pool "edge-" is
    // tried first, by name).
    let edge = format!("edge-{id}");
    let node = format!("lb-node-{id}");
    apply(&server, &pool_manifest(&edge, "192.168.101.0/29"));
    apply(
        &server,
        &format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n"),
    );
    let (ok, _, err) = kubectl(
        &server,
        &[
            "patch",
            "node",
            &node,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"addresses":[{"type":"InternalIP","address":"192.168.101.1"}]}}"#,
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(
        refused(
            &server,
            &service_manifest(&ns, "hijack", "  loadBalancerIP: 192.168.101.1\n")
        ),
        format!(
            "The Service \"hijack\" is invalid: spec.loadBalancerIP: Invalid value: \
             \"192.168.101.1\": 192.168.101.1 is node {node}'s address (InternalIP): no \
             Service may have it"
        )
    );
    apply(&server, &service_manifest(&ns, "beside", ""));
    wait_ingress(&admin, &ns, "beside", "192.168.101.2").await;
}
