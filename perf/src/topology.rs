//! Network baselines the pod-net suite builds itself, in network namespaces of its own:
//!
//! - [`bridge`]: the classic Docker / flannel `host-gw` layout. Per node a namespace with a
//!   Linux bridge `cbr0` (the pods' gateway), every pod namespace attached to it by a veth,
//!   `ip_forward` on, `bridge-nf-call-iptables` on, and Docker's iptables rules (FORWARD policy
//!   DROP, conntrack `RELATED,ESTABLISHED` accept, per-pod published-port accepts, the
//!   isolation chains, flannel's MASQUERADE for traffic leaving the cluster). The two node
//!   namespaces are joined by a bridge in a third namespace (the same shape as the e2e
//!   harness' fabric), each routing the other's pod subnet via the other's address.
//! - [`plain`]: the limit. Same node: two namespaces joined directly by one veth pair. Across
//!   nodes: client — veth — router namespace (`ip_forward`) — veth — server.
//!
//! A [`Plan`] is pure data (the `ip`, `sysctl` and `iptables-restore` commands, each confined
//! to one of the suite's namespaces by `ip -n` or `nsenter --net`), so it can be checked
//! without running it; [`Namespaces`] creates the namespaces and deletes them (and so every
//! veth, bridge, route and rule in them) when dropped, also on error or panic. Nothing is
//! created in, or sent through, the root namespace.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};

/// Directory of the namespace files `ip netns` manages.
pub const NETNS_DIR: &str = "/run/netns";

/// The network namespaces one suite run created; dropping it deletes them.
#[derive(Debug)]
pub struct Namespaces {
    prefix: String,
    names: Mutex<Vec<String>>,
}

impl Namespaces {
    /// Namespaces named `skiff-bench-<suite>-<pid>-<short name>`.
    pub fn new(suite: &str) -> Namespaces {
        Namespaces {
            prefix: format!("skiff-bench-{suite}-{}-", std::process::id()),
            names: Mutex::new(Vec::new()),
        }
    }

    /// The full name of the namespace `short`.
    pub fn name(&self, short: &str) -> String {
        format!("{}{short}", self.prefix)
    }

    /// Creates namespace `short` with `lo` up; returns its full name.
    pub fn add(&self, short: &str) -> Result<String> {
        let name = self.name(short);
        run(&Cmd::new("ip", ["netns", "add", name.as_str()]))?;
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.clone());
        run(&Cmd::ip(&name, &["link", "set", "lo", "up"]))?;
        Ok(name)
    }

    /// Whether `name` is one of this run's namespaces.
    pub fn owns(&self, name: &str) -> bool {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|n| n == name)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let names = std::mem::take(self.names.get_mut().unwrap_or_else(|e| e.into_inner()));
        for name in names.iter().rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The path of namespace `name`'s file.
pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// One command of a [`Plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<String>,
    pub stdin: Option<String>,
}

impl Cmd {
    fn new<'a>(program: &str, args: impl IntoIterator<Item = &'a str>) -> Cmd {
        Cmd {
            program: program.into(),
            args: args.into_iter().map(String::from).collect(),
            stdin: None,
        }
    }

    /// `ip -n <ns> ARGS`.
    pub fn ip(ns: &str, args: &[&str]) -> Cmd {
        Cmd::new("ip", ["-n", ns].into_iter().chain(args.iter().copied()))
    }

    /// `nsenter --net=/run/netns/<ns> ARGS` (for tools without a namespace option).
    pub fn inside(ns: &str, args: &[&str]) -> Cmd {
        let net = format!("--net={}", netns_path(ns).display());
        Cmd::new(
            "nsenter",
            [net.as_str()].into_iter().chain(args.iter().copied()),
        )
    }

    fn sysctl(ns: &str, key: &str, value: &str) -> Cmd {
        Cmd::inside(ns, &["sysctl", "-q", "-w", &format!("{key}={value}")])
    }

    /// The namespace the command is confined to (`ip -n NS` or `nsenter --net=…/NS`).
    pub fn namespace(&self) -> Option<&str> {
        match (self.program.as_str(), self.args.as_slice()) {
            ("ip", [flag, ns, ..]) if flag == "-n" => Some(ns),
            ("nsenter", [net, ..]) => net
                .strip_prefix("--net=")?
                .strip_prefix(NETNS_DIR)?
                .strip_prefix('/'),
            _ => None,
        }
    }
}

/// Runs one command, failing with its stderr.
pub fn run(cmd: &Cmd) -> Result<()> {
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c.stdin(if cmd.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = c
        .spawn()
        .with_context(|| format!("running {} (is it installed?)", cmd.program))?;
    if let (Some(text), Some(mut stdin)) = (&cmd.stdin, child.stdin.take()) {
        use std::io::Write;
        stdin
            .write_all(text.as_bytes())
            .with_context(|| format!("feeding {}", cmd.program))?;
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("waiting for {}", cmd.program))?;
    if !out.status.success() {
        bail!(
            "`{} {}` failed ({}): {}",
            cmd.program,
            cmd.args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// What a baseline is built from: its commands, and where its clients and server are.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Namespaces to create first (short names, see [`Namespaces::add`]).
    pub namespaces: Vec<String>,
    pub commands: Vec<Cmd>,
    /// The namespace the servers run in.
    pub server_ns: String,
    /// Same-node client namespace and the server address it dials.
    pub same_node: (String, Ipv4Addr),
    /// Cross-node client namespace and the server address it dials.
    pub cross_node: (String, Ipv4Addr),
}

impl Plan {
    /// Creates the namespaces in `ns` and runs every command.
    pub fn build(&self, ns: &Namespaces) -> Result<()> {
        for short in &self.namespaces {
            ns.add(short)?;
        }
        for cmd in &self.commands {
            match cmd.namespace() {
                Some(n) if ns.owns(n) => run(cmd)?,
                other => {
                    bail!("refusing {cmd:?}: not confined to this run's namespaces ({other:?})")
                }
            }
        }
        Ok(())
    }
}

/// A veth pair: `a` in namespace `ns_a`, `b` in `ns_b`, both up.
fn veth(ns_a: &str, a: &str, ns_b: &str, b: &str) -> Vec<Cmd> {
    vec![
        Cmd::ip(
            ns_a,
            &[
                "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns_b,
            ],
        ),
        Cmd::ip(ns_a, &["link", "set", a, "up"]),
        Cmd::ip(ns_b, &["link", "set", b, "up"]),
    ]
}

fn addr(ns: &str, cidr: &str, dev: &str) -> Cmd {
    Cmd::ip(ns, &["addr", "add", cidr, "dev", dev])
}

/// Addresses of the bridge baseline (inside its namespaces only).
pub const BRIDGE_CLUSTER_CIDR: &str = "10.201.0.0/16";
const BRIDGE_FABRIC_PREFIX: &str = "192.168.201";
const BRIDGE: &str = "cbr0";

fn bridge_subnet(node: u8) -> String {
    format!("10.201.{node}")
}

/// The Docker filter rules (and flannel's masquerade) of one node whose bridge is `cbr0`, for
/// the server pods `published` (pod address, published ports) on it, as `iptables-restore` input.
pub fn docker_rules(cluster_cidr: &str, published: &[(Ipv4Addr, &[u16])]) -> String {
    let mut r = String::from(
        "*filter\n\
         :INPUT ACCEPT [0:0]\n\
         :FORWARD DROP [0:0]\n\
         :OUTPUT ACCEPT [0:0]\n\
         :DOCKER - [0:0]\n\
         :DOCKER-ISOLATION-STAGE-1 - [0:0]\n\
         :DOCKER-ISOLATION-STAGE-2 - [0:0]\n\
         :DOCKER-USER - [0:0]\n\
         -A FORWARD -j DOCKER-USER\n\
         -A FORWARD -j DOCKER-ISOLATION-STAGE-1\n",
    );
    r += &format!(
        "-A FORWARD -o {BRIDGE} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         -A FORWARD -o {BRIDGE} -j DOCKER\n\
         -A FORWARD -i {BRIDGE} ! -o {BRIDGE} -j ACCEPT\n\
         -A FORWARD -i {BRIDGE} -o {BRIDGE} -j ACCEPT\n"
    );
    for (ip, ports) in published {
        for port in *ports {
            r += &format!(
                "-A DOCKER -d {ip}/32 -o {BRIDGE} -p tcp -m tcp --dport {port} -j ACCEPT\n"
            );
        }
    }
    r += &format!(
        "-A DOCKER-ISOLATION-STAGE-1 -i {BRIDGE} ! -o {BRIDGE} -j DOCKER-ISOLATION-STAGE-2\n\
         -A DOCKER-ISOLATION-STAGE-1 -j RETURN\n\
         -A DOCKER-ISOLATION-STAGE-2 -o {BRIDGE} -j DROP\n\
         -A DOCKER-ISOLATION-STAGE-2 -j RETURN\n\
         -A DOCKER-USER -j RETURN\n\
         COMMIT\n\
         *nat\n\
         :PREROUTING ACCEPT [0:0]\n\
         :INPUT ACCEPT [0:0]\n\
         :OUTPUT ACCEPT [0:0]\n\
         :POSTROUTING ACCEPT [0:0]\n\
         -A POSTROUTING -s {cluster_cidr} ! -d {cluster_cidr} -j MASQUERADE\n\
         COMMIT\n"
    );
    r
}

/// The bridge + veth + iptables baseline: node namespaces `node-a`, `node-b` on a bridge in
/// `fab`; the server pod `srv` and the same-node client `cli-a` on node a, the cross-node
/// client `cli-b` on node b.
pub fn bridge(ns: &Namespaces, ports: &[u16]) -> Plan {
    let (fab, node_a, node_b) = (
        ns.name("br-fab"),
        ns.name("br-node-a"),
        ns.name("br-node-b"),
    );
    let (srv, cli_a, cli_b) = (ns.name("br-srv"), ns.name("br-cli-a"), ns.name("br-cli-b"));
    let mut c = vec![
        Cmd::ip(&fab, &["link", "add", "br0", "type", "bridge"]),
        Cmd::ip(&fab, &["link", "set", "br0", "up"]),
    ];
    let nodes = [(&node_a, 1u8, 2u8), (&node_b, 2, 1)];
    for (node, i, other) in nodes {
        let fab_end = format!("fab{i}");
        c.extend(veth(node, "eth0", &fab, &fab_end));
        c.push(Cmd::ip(&fab, &["link", "set", &fab_end, "master", "br0"]));
        c.push(addr(
            node,
            &format!("{BRIDGE_FABRIC_PREFIX}.{i}/24"),
            "eth0",
        ));
        c.push(Cmd::ip(node, &["link", "add", BRIDGE, "type", "bridge"]));
        c.push(addr(node, &format!("{}.1/24", bridge_subnet(i)), BRIDGE));
        c.push(Cmd::ip(node, &["link", "set", BRIDGE, "up"]));
        c.push(Cmd::sysctl(node, "net.ipv4.ip_forward", "1"));
        c.push(Cmd::sysctl(node, "net.bridge.bridge-nf-call-iptables", "1"));
        c.push(Cmd::ip(
            node,
            &[
                "route",
                "add",
                &format!("{}.0/24", bridge_subnet(other)),
                "via",
                &format!("{BRIDGE_FABRIC_PREFIX}.{other}"),
            ],
        ));
    }
    let srv_ip = Ipv4Addr::new(10, 201, 1, 2);
    let pods = [
        (&srv, &node_a, 1u8, srv_ip, "veth1"),
        (&cli_a, &node_a, 1, Ipv4Addr::new(10, 201, 1, 3), "veth2"),
        (&cli_b, &node_b, 2, Ipv4Addr::new(10, 201, 2, 2), "veth1"),
    ];
    for (pod, node, i, ip, host_end) in pods {
        c.extend(veth(pod, "eth0", node, host_end));
        c.push(Cmd::ip(node, &["link", "set", host_end, "master", BRIDGE]));
        c.push(addr(pod, &format!("{ip}/24"), "eth0"));
        c.push(Cmd::ip(
            pod,
            &[
                "route",
                "add",
                "default",
                "via",
                &format!("{}.1", bridge_subnet(i)),
            ],
        ));
    }
    for (node, published) in [(&node_a, vec![(srv_ip, ports)]), (&node_b, vec![])] {
        let mut restore = Cmd::inside(node, &["iptables-restore"]);
        restore.stdin = Some(docker_rules(BRIDGE_CLUSTER_CIDR, &published));
        c.push(restore);
    }
    Plan {
        namespaces: [
            "br-fab",
            "br-node-a",
            "br-node-b",
            "br-srv",
            "br-cli-a",
            "br-cli-b",
        ]
        .map(String::from)
        .to_vec(),
        commands: c,
        server_ns: srv,
        same_node: (cli_a, srv_ip),
        cross_node: (cli_b, srv_ip),
    }
}

/// The plain-veth baseline: `srv` — veth — `cli-same`; `srv` — veth — `rtr` — veth —
/// `cli-cross`.
pub fn plain(ns: &Namespaces) -> Plan {
    let (srv, same, rtr, cross) = (
        ns.name("pv-srv"),
        ns.name("pv-cli-same"),
        ns.name("pv-rtr"),
        ns.name("pv-cli-cross"),
    );
    let mut c = veth(&srv, "eth0", &same, "eth0");
    c.push(addr(&srv, "10.202.0.1/24", "eth0"));
    c.push(addr(&same, "10.202.0.2/24", "eth0"));
    c.extend(veth(&srv, "eth1", &rtr, "r0"));
    c.push(addr(&srv, "10.202.1.1/24", "eth1"));
    c.push(addr(&rtr, "10.202.1.254/24", "r0"));
    c.extend(veth(&cross, "eth0", &rtr, "r1"));
    c.push(addr(&cross, "10.202.2.1/24", "eth0"));
    c.push(addr(&rtr, "10.202.2.254/24", "r1"));
    c.push(Cmd::sysctl(&rtr, "net.ipv4.ip_forward", "1"));
    c.push(Cmd::ip(
        &srv,
        &["route", "add", "10.202.2.0/24", "via", "10.202.1.254"],
    ));
    c.push(Cmd::ip(
        &cross,
        &["route", "add", "default", "via", "10.202.2.254"],
    ));
    Plan {
        namespaces: ["pv-srv", "pv-cli-same", "pv-rtr", "pv-cli-cross"]
            .map(String::from)
            .to_vec(),
        commands: c,
        server_ns: srv,
        same_node: (same, Ipv4Addr::new(10, 202, 0, 1)),
        cross_node: (cross, Ipv4Addr::new(10, 202, 1, 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command of a plan runs inside one of the plan's own namespaces.
    fn assert_confined(plan: &Plan, ns: &Namespaces) {
        let mine: Vec<String> = plan.namespaces.iter().map(|s| ns.name(s)).collect();
        for cmd in &plan.commands {
            let n = cmd
                .namespace()
                .unwrap_or_else(|| panic!("unconfined: {cmd:?}"));
            assert!(mine.iter().any(|m| m == n), "{cmd:?} outside {mine:?}");
            if cmd.program == "ip" && cmd.args.contains(&"netns".to_string()) {
                let target = &cmd.args[cmd.args.iter().position(|a| a == "netns").unwrap() + 1];
                assert!(mine.contains(target), "{cmd:?} moves a link elsewhere");
            }
        }
        assert!(mine.contains(&plan.server_ns));
        assert!(mine.contains(&plan.same_node.0) && mine.contains(&plan.cross_node.0));
    }

    #[test]
    fn namespace_names_and_confinement() {
        let ns = Namespaces::new("pod-net");
        let name = ns.name("br-srv");
        assert_eq!(
            name,
            format!("skiff-bench-pod-net-{}-br-srv", std::process::id())
        );
        assert_eq!(Cmd::ip(&name, &["link"]).namespace(), Some(name.as_str()));
        assert_eq!(
            Cmd::inside(&name, &["sysctl"]).namespace(),
            Some(name.as_str())
        );
        assert_eq!(Cmd::new("ip", ["link"]).namespace(), None);
        assert_eq!(
            Cmd::new("nsenter", ["--net=/proc/1/ns/net", "x"]).namespace(),
            None
        );
        assert_confined(&bridge(&ns, &[5201]), &ns);
        assert_confined(&plain(&ns), &ns);
        // Building refuses anything outside the namespaces it created.
        let stray = Plan {
            namespaces: vec![],
            commands: vec![Cmd::ip("somebody-else", &["link"])],
            ..plain(&ns)
        };
        let err = stray.build(&ns).unwrap_err();
        assert!(err.to_string().contains("refusing"), "{err}");
    }

    #[test]
    fn docker_rules_accept_replies_and_published_ports_only() {
        let srv = Ipv4Addr::new(10, 201, 1, 2);
        let r = docker_rules(BRIDGE_CLUSTER_CIDR, &[(srv, &[5201, 5300][..])]);
        assert!(r.contains(":FORWARD DROP"), "{r}");
        assert!(
            r.contains("-A FORWARD -o cbr0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
        );
        for port in [5201, 5300] {
            assert!(r.contains(&format!(
                "-A DOCKER -d 10.201.1.2/32 -o cbr0 -p tcp -m tcp --dport {port} -j ACCEPT"
            )));
        }
        assert!(r.contains("-A POSTROUTING -s 10.201.0.0/16 ! -d 10.201.0.0/16 -j MASQUERADE"));
        assert_eq!(r.matches("COMMIT").count(), 2);
        assert!(!docker_rules(BRIDGE_CLUSTER_CIDR, &[]).contains("--dport"));
    }

    #[test]
    fn bridge_layout() {
        let ns = Namespaces::new("t");
        let p = bridge(&ns, &[5201]);
        let text: Vec<String> = p
            .commands
            .iter()
            .map(|c| format!("{} {}", c.program, c.args.join(" ")))
            .collect();
        let has = |s: &str| text.iter().any(|t| t.contains(s));
        // Each node routes the other's pod subnet through the other's fabric address.
        assert!(
            has("route add 10.201.2.0/24 via 192.168.201.2"),
            "{text:#?}"
        );
        assert!(has("route add 10.201.1.0/24 via 192.168.201.1"));
        assert!(has("sysctl -q -w net.bridge.bridge-nf-call-iptables=1"));
        assert_eq!(p.same_node.1, p.cross_node.1);
        let restores = p.commands.iter().filter(|c| c.stdin.is_some()).count();
        assert_eq!(restores, 2, "one rule set per node");
        assert_eq!(p.namespaces.len(), 6);
    }
}
