//! Each struct's `args()` against the command lines its launchers wrote by hand before they
//! shared this crate: `cargo xtask up`, the units of `cargo xtask install` and the
//! end-to-end harness, for the same inputs.

use super::*;

fn words(args: &[OsString]) -> Vec<&str> {
    args.iter()
        .map(|a| a.to_str().unwrap_or("<non-utf8>"))
        .collect()
}

fn etcd_tls(dir: &str) -> Option<EtcdClientTls> {
    Some(EtcdClientTls {
        ca: format!("{dir}/ca.crt").into(),
        cert: format!("{dir}/apiserver-etcd-client.crt").into(),
        key: format!("{dir}/apiserver-etcd-client.key").into(),
    })
}

#[test]
fn api_server_as_up_install_and_the_harness_start_it() {
    // `up`, embedded store.
    let up = ApiServerFlags {
        listen: "127.0.0.1:7443".parse().unwrap(),
        pki_dir: "/repo/.skiff/pki".into(),
        store: ApiStore::Embedded {
            data_dir: "/repo/.skiff/data".into(),
        },
        tls_sans: None,
        extra: Vec::new(),
    };
    assert_eq!(
        words(&up.args()),
        [
            "--listen",
            "127.0.0.1:7443",
            "--pki-dir",
            "/repo/.skiff/pki",
            "--store",
            "embedded",
            "--data-dir",
            "/repo/.skiff/data",
            "--proxy-client-cert-file",
            "/repo/.skiff/pki/front-proxy-client.crt",
            "--proxy-client-key-file",
            "/repo/.skiff/pki/front-proxy-client.key",
            "--requestheader-client-ca-file",
            "/repo/.skiff/pki/front-proxy-ca.crt",
            "--requestheader-allowed-names",
            "front-proxy-client"
        ]
    );
    // `up --ha`: etcd with TLS.
    let ha = ApiServerFlags {
        listen: "127.0.0.1:7445".parse().unwrap(),
        store: ApiStore::Etcd {
            endpoints: "https://127.0.0.1:2379,https://127.0.0.1:2381".into(),
            tls: etcd_tls("/repo/.skiff/pki/etcd"),
        },
        ..up.clone()
    };
    assert_eq!(
        words(&ha.args()),
        [
            "--listen",
            "127.0.0.1:7445",
            "--pki-dir",
            "/repo/.skiff/pki",
            "--store",
            "etcd",
            "--etcd-endpoints",
            "https://127.0.0.1:2379,https://127.0.0.1:2381",
            "--etcd-cafile",
            "/repo/.skiff/pki/etcd/ca.crt",
            "--etcd-certfile",
            "/repo/.skiff/pki/etcd/apiserver-etcd-client.crt",
            "--etcd-keyfile",
            "/repo/.skiff/pki/etcd/apiserver-etcd-client.key",
            "--proxy-client-cert-file",
            "/repo/.skiff/pki/front-proxy-client.crt",
            "--proxy-client-key-file",
            "/repo/.skiff/pki/front-proxy-client.key",
            "--requestheader-client-ca-file",
            "/repo/.skiff/pki/front-proxy-ca.crt",
            "--requestheader-allowed-names",
            "front-proxy-client"
        ]
    );
    // `install --role server --etcd-endpoints ... --tls-san ...`, one unit line per flag.
    let unit = ApiServerFlags {
        listen: "0.0.0.0:7443".parse().unwrap(),
        pki_dir: "/var/lib/skiff/pki".into(),
        store: ApiStore::Etcd {
            endpoints: "https://10.0.0.2:2379".into(),
            tls: etcd_tls("/etc/etcd"),
        },
        tls_sans: Some("10.0.0.10,cp.example".into()),
        extra: Vec::new(),
    };
    assert_eq!(
        grouped(&unit.args()),
        [
            "--listen 0.0.0.0:7443",
            "--pki-dir /var/lib/skiff/pki",
            "--store etcd",
            "--etcd-endpoints https://10.0.0.2:2379",
            "--etcd-cafile /etc/etcd/ca.crt",
            "--etcd-certfile /etc/etcd/apiserver-etcd-client.crt",
            "--etcd-keyfile /etc/etcd/apiserver-etcd-client.key",
            "--tls-san 10.0.0.10,cp.example",
            "--proxy-client-cert-file /var/lib/skiff/pki/front-proxy-client.crt",
            "--proxy-client-key-file /var/lib/skiff/pki/front-proxy-client.key",
            "--requestheader-client-ca-file /var/lib/skiff/pki/front-proxy-ca.crt",
            "--requestheader-allowed-names front-proxy-client"
        ]
    );
    // The harness: a test's own flags after the typed ones.
    let harness = ApiServerFlags {
        listen: "127.0.0.1:40000".parse().unwrap(),
        pki_dir: "/tmp/x/pki".into(),
        store: ApiStore::Etcd {
            endpoints: "http://127.0.0.1:2379".into(),
            tls: None,
        },
        tls_sans: None,
        extra: vec!["--max-watches-per-user".into(), "2".into()],
    };
    assert_eq!(
        words(&harness.args()),
        [
            "--listen",
            "127.0.0.1:40000",
            "--pki-dir",
            "/tmp/x/pki",
            "--store",
            "etcd",
            "--etcd-endpoints",
            "http://127.0.0.1:2379",
            "--proxy-client-cert-file",
            "/tmp/x/pki/front-proxy-client.crt",
            "--proxy-client-key-file",
            "/tmp/x/pki/front-proxy-client.key",
            "--requestheader-client-ca-file",
            "/tmp/x/pki/front-proxy-ca.crt",
            "--requestheader-allowed-names",
            "front-proxy-client",
            "--max-watches-per-user",
            "2"
        ]
    );
}

#[test]
fn api_server_subcommands_as_up_and_install_run_them() {
    let k = KubeconfigFlags {
        pki_dir: "/var/lib/skiff/pki".into(),
        user: "system:node:n1".into(),
        groups: vec!["system:nodes".into()],
        server: "https://127.0.0.1:7443".into(),
        out: "/var/lib/skiff/node/kubeconfig".into(),
    };
    assert_eq!(
        display(&k.args()),
        "kubeconfig --pki-dir /var/lib/skiff/pki --user system:node:n1 --group system:nodes \
         --server https://127.0.0.1:7443 --out /var/lib/skiff/node/kubeconfig"
    );
    assert_eq!(
        grouped(&k.args())[..2],
        ["kubeconfig", "--pki-dir /var/lib/skiff/pki"]
    );
    let e = EtcdCertsFlags {
        dir: "/repo/.skiff/pki/etcd".into(),
        members: vec!["etcd-1".into(), "etcd-2".into(), "etcd-3".into()],
        sans: Vec::new(),
    };
    assert_eq!(
        words(&e.args()),
        [
            "etcd-certs",
            "--dir",
            "/repo/.skiff/pki/etcd",
            "--member",
            "etcd-1",
            "--member",
            "etcd-2",
            "--member",
            "etcd-3"
        ]
    );
    let on_machines = EtcdCertsFlags {
        sans: vec!["192.168.100.251".into(), "127.0.0.1".into()],
        ..e
    };
    assert!(
        words(&on_machines.args()).ends_with(&["--san", "192.168.100.251,127.0.0.1"]),
        "{:?}",
        words(&on_machines.args())
    );
}

#[test]
fn vip_flags_are_the_binarys() {
    let v = VipFlags {
        kubeconfig: "/p/vip.kubeconfig".into(),
        server: "https://a:6443,https://b:6443".into(),
        address: "192.168.100.240/24".into(),
        interface: "eth0".into(),
        health: "192.168.100.251:6443".into(),
        identity: "control-1".into(),
        lease_duration_seconds: 1,
    };
    assert_eq!(
        grouped(&v.args()),
        [
            "--kubeconfig /p/vip.kubeconfig",
            "--server https://a:6443,https://b:6443",
            "--address 192.168.100.240/24",
            "--interface eth0",
            "--health 192.168.100.251:6443",
            "--identity control-1",
            "--lease-duration 1"
        ]
    );
}

#[test]
fn scheduler_as_install_up_ha_and_the_harness_start_it() {
    let unit = SchedulerFlags {
        kubeconfig: "/var/lib/skiff/pki/scheduler.kubeconfig".into(),
        election: Election::default(),
        extra: Vec::new(),
    };
    assert_eq!(
        words(&unit.args()),
        ["--kubeconfig", "/var/lib/skiff/pki/scheduler.kubeconfig"]
    );
    let ha = SchedulerFlags {
        election: Election {
            server: Some("https://a:7443,https://b:7443".into()),
            lease_duration: None,
            identity: Some("scheduler-2".into()),
        },
        ..unit.clone()
    };
    assert_eq!(
        grouped(&ha.args()),
        [
            "--kubeconfig /var/lib/skiff/pki/scheduler.kubeconfig",
            "--server https://a:7443,https://b:7443",
            "--identity scheduler-2"
        ]
    );
    let harness = SchedulerFlags {
        election: Election {
            server: None,
            lease_duration: Some(4),
            identity: Some("sched-1".into()),
        },
        ..unit
    };
    assert_eq!(
        words(&harness.args())[2..],
        ["--lease-duration", "4", "--identity", "sched-1"]
    );
}

#[test]
fn controller_manager_as_install_up_and_the_harness_start_it() {
    let pki = "/var/lib/skiff/pki";
    let unit = ControllerManagerFlags {
        kubeconfig: format!("{pki}/controller-manager.kubeconfig").into(),
        signing: Some(SigningCa {
            cert: format!("{pki}/ca.crt").into(),
            key: format!("{pki}/ca.key").into(),
        }),
        local_path_root: Some("/var/lib/skiff/local-path".into()),
        election: Election::default(),
        extra: Vec::new(),
    };
    assert_eq!(
        display(&unit.args()),
        "--kubeconfig /var/lib/skiff/pki/controller-manager.kubeconfig \
         --cluster-signing-cert-file /var/lib/skiff/pki/ca.crt \
         --cluster-signing-key-file /var/lib/skiff/pki/ca.key \
         --local-path-root /var/lib/skiff/local-path"
    );
    let ha = ControllerManagerFlags {
        election: Election {
            server: Some("https://a:7443,https://b:7443".into()),
            lease_duration: Some(4),
            identity: Some("cm-1".into()),
        },
        ..unit
    };
    assert_eq!(
        words(&ha.args())[8..],
        [
            "--server",
            "https://a:7443,https://b:7443",
            "--lease-duration",
            "4",
            "--identity",
            "cm-1"
        ]
    );
}

#[test]
fn node_as_install_up_and_the_harness_start_it() {
    // install, joining: `join` takes one server; the token is not on the command line.
    let join = NodeFlags::new(
        NodeMode::Join {
            server: "https://cp.example:7443".into(),
            ca_cert_hash: "sha256:ab".into(),
            join_timeout: None,
        },
        "/var/lib/skiff/node/kubeconfig".into(),
        "n1".into(),
        "/var/lib/skiff/node".into(),
    );
    assert_eq!(
        grouped(&join.args()),
        [
            "join",
            "--server https://cp.example:7443",
            "--ca-cert-hash sha256:ab",
            "--kubeconfig /var/lib/skiff/node/kubeconfig",
            "--node-name n1",
            "--state-dir /var/lib/skiff/node"
        ]
    );
    // install, joined: every server, last.
    let run = NodeFlags {
        mode: NodeMode::Run {
            server: Some("https://a:7443,https://b:7443".into()),
        },
        ..join.clone()
    };
    assert_eq!(
        display(&run.args()),
        "run --kubeconfig /var/lib/skiff/node/kubeconfig --node-name n1 \
         --state-dir /var/lib/skiff/node --server https://a:7443,https://b:7443"
    );
    // up: a node in its own namespace with its pod CIDR.
    let up = NodeFlags {
        mode: NodeMode::Run { server: None },
        node_netns: Some("/run/netns/skiff-up-node-1".into()),
        address: Some([127, 0, 0, 1].into()),
        port: Some(0),
        pod_cidr: Some("10.244.1.0/24".into()),
        ..NodeFlags::new(
            NodeMode::Run { server: None },
            "/repo/.skiff/nodes/node-1/kubeconfig".into(),
            "node-1".into(),
            "/repo/.skiff/nodes/node-1".into(),
        )
    };
    assert_eq!(
        display(&up.args()),
        "run --kubeconfig /repo/.skiff/nodes/node-1/kubeconfig --node-name node-1 \
         --state-dir /repo/.skiff/nodes/node-1 --node-netns /run/netns/skiff-up-node-1 \
         --address 127.0.0.1 --port 0 --pod-cidr 10.244.1.0/24"
    );
    // The harness: a join with a timeout, its cgroup, short back-off and lease, extras.
    let harness = NodeFlags {
        mode: NodeMode::Join {
            server: "https://127.0.0.1:4000".into(),
            ca_cert_hash: "sha256:cd".into(),
            join_timeout: Some(Duration::from_secs(60)),
        },
        node_labels: Some("zone=a".into()),
        cgroup_parent: Some("/sys/fs/cgroup/unified/skiff-e2e-1".into()),
        backoff: Some(Duration::from_secs(1)),
        lease_duration: Some(Duration::from_millis(8500)),
        extra: vec!["--cert-check-interval".into(), "1s".into()],
        ..up
    };
    assert_eq!(
        display(&harness.args()),
        "join --server https://127.0.0.1:4000 --ca-cert-hash sha256:cd --join-timeout 60s \
         --kubeconfig /repo/.skiff/nodes/node-1/kubeconfig --node-name node-1 \
         --state-dir /repo/.skiff/nodes/node-1 --node-netns /run/netns/skiff-up-node-1 \
         --address 127.0.0.1 --port 0 --pod-cidr 10.244.1.0/24 --node-labels zone=a \
         --cgroup-parent /sys/fs/cgroup/unified/skiff-e2e-1 --backoff 1s \
         --lease-duration 8500ms --cert-check-interval 1s"
    );
    let purge = NodePurgeFlags {
        node_name: "n1".into(),
        state_dir: "/var/lib/skiff/node".into(),
    };
    assert_eq!(
        words(&purge.args()),
        [
            "purge",
            "--node-name",
            "n1",
            "--state-dir",
            "/var/lib/skiff/node"
        ]
    );
}

#[test]
fn etcd_as_up_ha_and_the_test_etcd_start_it() {
    let member = EtcdFlags {
        name: "etcd-2".into(),
        data_dir: "/repo/.skiff/etcd/etcd-2".into(),
        client_url: "https://127.0.0.1:2381".into(),
        peer_url: "https://127.0.0.1:2382".into(),
        initial_cluster: "etcd-1=https://127.0.0.1:2380,etcd-2=https://127.0.0.1:2382".into(),
        initial_cluster_token: "skiff-up-ha".into(),
        tls: Some(EtcdMemberTls {
            cert: "/p/etcd-2.crt".into(),
            key: "/p/etcd-2.key".into(),
            ca: "/p/ca.crt".into(),
        }),
        log_to_stderr: false,
    };
    assert_eq!(
        words(&member.args()),
        [
            "--name=etcd-2",
            "--data-dir=/repo/.skiff/etcd/etcd-2",
            "--listen-client-urls=https://127.0.0.1:2381",
            "--advertise-client-urls=https://127.0.0.1:2381",
            "--listen-peer-urls=https://127.0.0.1:2382",
            "--initial-advertise-peer-urls=https://127.0.0.1:2382",
            "--initial-cluster=etcd-1=https://127.0.0.1:2380,etcd-2=https://127.0.0.1:2382",
            "--initial-cluster-state=new",
            "--initial-cluster-token=skiff-up-ha",
            "--cert-file=/p/etcd-2.crt",
            "--key-file=/p/etcd-2.key",
            "--trusted-ca-file=/p/ca.crt",
            "--client-cert-auth",
            "--peer-cert-file=/p/etcd-2.crt",
            "--peer-key-file=/p/etcd-2.key",
            "--peer-trusted-ca-file=/p/ca.crt",
            "--peer-client-cert-auth"
        ]
    );
    let test = EtcdFlags {
        name: "skiff-test".into(),
        client_url: "http://127.0.0.1:1".into(),
        peer_url: "http://127.0.0.1:2".into(),
        initial_cluster: "skiff-test=http://127.0.0.1:2".into(),
        initial_cluster_token: "skiff-test-2".into(),
        tls: None,
        log_to_stderr: true,
        ..member
    };
    assert_eq!(
        words(&test.args())[7..],
        [
            "--initial-cluster-state=new",
            "--initial-cluster-token=skiff-test-2",
            "--logger=zap",
            "--log-outputs=stderr"
        ]
    );
}
