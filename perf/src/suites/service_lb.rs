//! `service-lb`: ClusterIP load balancing against the number of Services, four ways on the
//! same private network ([`crate::lbnet::Topology`]) with the same client in the same run:
//!
//! - Skiff: the real `skiff-lb` eBPF object loaded through `skiff_datapath::lb::ServiceLb`,
//!   attached to the cgroup the client runs in, every service programmed with
//!   `sync_service` (translation at `connect()`, no per-packet work);
//! - kube-proxy's iptables mode and its nftables mode: the rules it would write for the same
//!   services ([`crate::kproxy`]), loaded with `iptables-restore` / `nft -f` in the client
//!   namespace (DNAT per connection through conntrack);
//! - a direct connection to one backend's pod IP: the limit.
//!
//! Per service count N (1, 1k, 10k, 50k; `--quick`: 1 and 100) every method is installed, the
//! client measures TCP_CRR-like and TCP_RR-like transactions against the service's VIP (the
//! backend's address for the direct method), and the method is torn down fully before the
//! next (LB pins removed, which detaches it; `nft flush ruleset`, checked empty) so exactly
//! one is active.

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use serde_json::json;
use skiff_datapath::lb::ServiceLb;
use tracing::info;

use super::Options;
use crate::host;
use crate::kproxy::{BACKEND_PATTERN, BACKEND_PORT, SERVICE_PORT, ServiceSet};
use crate::lbnet::{self, ClientOutput, Topology};
use crate::report::{Measured, Role, Series, SuiteReport};

pub const NAME: &str = "service-lb";
pub const TITLE: &str = "ClusterIP load balancing vs number of services";

const SIZES: &[usize] = &[1, 1_000, 10_000, 50_000];
const QUICK_SIZES: &[usize] = &[1, 100];
const CRR: usize = 2_000;
const RR: usize = 5_000;
const QUICK_CRR: usize = 100;
const QUICK_RR: usize = 200;
/// kube-proxy's rules are loaded up to this many services: on the 2-core CI-sized machine
/// one `iptables-restore` of the 50k-service ruleset (≈180k endpoints, 63 MB) alone takes
/// minutes, past the suite's time budget. Skiff and the direct connection go on to 50k.
pub const RULES_MAX: usize = 10_000;
/// Time bound of one client run (it stops there with what it measured).
const CLIENT_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Skiff,
    Iptables,
    Nftables,
    Direct,
}

impl Method {
    pub(crate) const ALL: [Method; 4] = [
        Method::Skiff,
        Method::Iptables,
        Method::Nftables,
        Method::Direct,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Method::Skiff => "skiff eBPF socket LB",
            Method::Iptables => "kube-proxy iptables",
            Method::Nftables => "kube-proxy nftables",
            Method::Direct => "direct to pod IP",
        }
    }

    /// Whether this method is measured at `n` services: the rule-based ones up to
    /// `rules_max` (default [`RULES_MAX`], `--rules-max`).
    pub(crate) fn runs_at(self, n: usize, rules_max: usize) -> bool {
        match self {
            Method::Iptables | Method::Nftables => n <= rules_max,
            Method::Skiff | Method::Direct => true,
        }
    }

    pub(crate) fn role(self) -> Role {
        match self {
            Method::Skiff => Role::Skiff,
            _ => Role::Baseline,
        }
    }
}

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(async move {
        // Namespaces, rule loads and the client are blocking work.
        let (quick, rules_max) = (opts.quick, opts.rules_max);
        lbnet::blocking(move |cancel| measure(quick, rules_max, &cancel)).await
    })
}

/// `1`, `1k`, `10k`, `50k`.
pub(crate) fn fmt_n(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

pub(crate) fn services_label(n: usize) -> String {
    if n == 1 {
        "1 service".into()
    } else {
        format!("{} services", fmt_n(n))
    }
}

/// The service in the middle of the list is measured: kube-proxy's iptables chain is
/// scanned in order, so this is its average case.
pub(crate) fn measured_index(n: usize) -> usize {
    n / 2
}

fn measure(quick: bool, rules_max: usize, cancel: &lbnet::Cancel) -> Result<SuiteReport> {
    host::require_root()?;
    let started_at = chrono::Utc::now();
    let env = host::environment();
    let (sizes, crr, rr) = if quick {
        (QUICK_SIZES, QUICK_CRR, QUICK_RR)
    } else {
        (SIZES, CRR, RR)
    };
    let topo = Topology::new(NAME)?;
    let real = lbnet::real_backends();
    let mut series = Vec::new();
    let mut details = BTreeMap::new();
    let t_suite = Instant::now();
    for &n in sizes {
        let set = ServiceSet::new(n, measured_index(n), &real);
        let vip = set.measured().vip;
        for method in Method::ALL {
            if !method.runs_at(n, rules_max) {
                continue;
            }
            cancel.check()?;
            let t_install = Instant::now();
            let mut lb = install(&topo, &set, method)?;
            let install_ms = t_install.elapsed().as_secs_f64() * 1e3;
            let target = match method {
                Method::Direct => SocketAddrV4::new(real[0], BACKEND_PORT),
                _ => SocketAddrV4::new(vip, SERVICE_PORT),
            };
            info!(
                services = n,
                method = method.name(),
                install_ms,
                "measuring"
            );
            let result = topo.client(target, crr, rr, CLIENT_LIMIT);
            // Tear down before looking at the result, so a failure leaves nothing active.
            drop(lb.take());
            teardown(&topo, method)?;
            let out = result.with_context(|| format!("{} at {n} services", method.name()))?;
            check_backends(method, &out, &real)?;
            let (crr_s, rr_s) = series_of(method, n, &out)?;
            series.push(crr_s);
            series.push(rr_s);
            details.insert(
                format!("{} · {}", services_label(n), method.name()),
                json!({ "install_ms": install_ms, "answers_per_backend": out.backends }),
            );
        }
    }
    info!(secs = t_suite.elapsed().as_secs(), "service-lb done");
    // CRR groups first, then RR, each by size: the report reads per transaction kind.
    series.sort_by_key(|s: &Series| s.group.as_deref().is_some_and(|g| g.ends_with("TCP_RR")));
    let notes = vec![
        format!(
            "Topology: a client and a server network namespace created for the run, joined by a \
             veth pair; the server namespace holds {} backend addresses (10.200.0.11–13), each \
             served on port {BACKEND_PORT} by threads of one server process that answer every \
             request line with their address. The client runs in the client namespace and in \
             a cgroup v2 directory of the run. All four methods use the same namespaces, \
             server, client and cgroup.",
            lbnet::REAL_BACKENDS
        ),
        format!(
            "Services: N ClusterIP services, VIPs 10.96.0.1 + i, port {SERVICE_PORT}/TCP. The \
             measured one (index N/2: kube-proxy's iptables chain is scanned in order, so the \
             middle is its average case) has the 3 real backends; the others cycle through \
             {BACKEND_PATTERN:?} endpoints each (2–10, mean 3.6) at addresses nothing answers \
             on (never contacted)."
        ),
        "skiff eBPF socket LB: the `skiff-lb` object (cgroup connect4/sendmsg4/recvmsg4/\
         getpeername4 programs) loaded and attached to the client's cgroup through \
         skiff_datapath::lb::ServiceLb, maps sized for N, every service programmed with \
         sync_service. The VIP is rewritten to a backend once, at connect(); packets then \
         flow as for the direct connection."
            .into(),
        "kube-proxy iptables: kube-proxy's iptables-mode nat layout (KUBE-SERVICES from OUTPUT \
         and PREROUTING, one -d VIP/32 --dport rule per service, KUBE-SVC chains with \
         statistic-random jumps to KUBE-SEP chains doing DNAT, KUBE-MARK-MASQ / \
         KUBE-POSTROUTING, the filter-table hooks; no comments above 1000 endpoints as \
         kube-proxy) loaded with one iptables-restore in the client namespace. `iptables` is \
         Debian's default, the nf_tables backend (iptables-nft): the rules are nf_tables rules \
         evaluated one after another, as with legacy iptables."
            .into(),
        "kube-proxy nftables: kube-proxy's nftables-mode table `ip kube-proxy` (services chain \
         with one `ip daddr . meta l4proto . th dport vmap @service-ips` lookup, per service a \
         chain with `numgen random mod n vmap`, per endpoint a chain with `dnat to`, the \
         masquerade chains, the filter-hook no-endpoint check) loaded with one `nft -f` in \
         the client namespace."
            .into(),
        "direct to pod IP: the client connects to backend 10.200.0.11:8080 with no rules and no \
         program: the limit of every method."
            .into(),
        format!(
            "TCP_CRR: per transaction, connect() + one 32-byte request + the response line + \
             close(), sequentially, {crr} per method and N after 20 unmeasured ones (bounded by \
             {CLIENT_LIMIT:?}); rate = transactions / wall time. TCP_RR: request/response on one \
             kept connection, {rr} per method and N after 20 unmeasured. TCP_NODELAY on both \
             sides."
        ),
        format!(
            "kube-proxy's iptables and nftables rules are loaded up to {} services: on this \
             2-core machine one iptables-restore of the 50k-service ruleset (≈180k endpoints, \
             63 MB of rules) took 7.2 min (87 s of CPU, 810 MB; measured once by hand, \
             with other builds running), beyond the suite's time budget; above that \
             only Skiff and the direct connection are measured (no ratios in those groups; \
             `--rules-max 50000` includes the rules at 50k).",
            fmt_n(rules_max)
        ),
        "Between methods the previous one is torn down completely: Skiff's LB object is \
         dropped and its pins removed (which detaches the programs); the client namespace's \
         ruleset is flushed with `nft flush ruleset` (covering the iptables-nft tables too) \
         and checked to be empty. Order per N: skiff, iptables, nftables, direct."
            .into(),
    ];
    let mut params = BTreeMap::new();
    params.insert("rules_max_services".into(), json!(rules_max));
    params.insert("services".into(), json!(sizes));
    params.insert("tcp_crr_per_method".into(), json!(crr));
    params.insert("tcp_rr_per_method".into(), json!(rr));
    params.insert("real_backends".into(), json!(lbnet::REAL_BACKENDS));
    params.insert("client_limit_s".into(), json!(CLIENT_LIMIT.as_secs()));
    details.insert(
        "suite_seconds".into(),
        json!(t_suite.elapsed().as_secs_f64()),
    );
    Ok(SuiteReport::new(
        NAME,
        TITLE,
        started_at,
        env,
        Measured {
            quick,
            params,
            series,
            notes,
            details,
        },
    ))
}

/// Installs `method` for `set`; Skiff's LB is returned (dropping it is part of teardown).
fn install(topo: &Topology, set: &ServiceSet, method: Method) -> Result<Option<ServiceLb>> {
    match method {
        Method::Skiff => {
            let mut lb = ServiceLb::load(&topo.pin_dir, lbnet::lb_config(set))
                .context("loading Skiff's LB")?;
            lb.attach(&topo.cgroup).context("attaching Skiff's LB")?;
            lbnet::program_lb(&mut lb, set)?;
            Ok(Some(lb))
        }
        Method::Iptables => {
            let f = topo.file("iptables.rules", &set.iptables_restore())?;
            lbnet::in_netns(&topo.client_ns, "iptables-restore", &[], Some(&f))?;
            Ok(None)
        }
        Method::Nftables => {
            let f = topo.file("nft.rules", &set.nft_script())?;
            lbnet::in_netns(
                &topo.client_ns,
                "nft",
                &["-f", &f.display().to_string()],
                None,
            )?;
            Ok(None)
        }
        Method::Direct => Ok(None),
    }
}

fn teardown(topo: &Topology, method: Method) -> Result<()> {
    match method {
        Method::Skiff => topo.remove_lb(),
        Method::Iptables | Method::Nftables => topo.flush_rules(),
        Method::Direct => Ok(()),
    }
}

/// The VIP methods must have spread the connections over the real backends (and only
/// those); the direct one reached its one backend.
fn check_backends(method: Method, out: &ClientOutput, real: &[std::net::Ipv4Addr]) -> Result<()> {
    let known: Vec<String> = real.iter().map(ToString::to_string).collect();
    if let Some(b) = out.backends.keys().find(|b| !known.contains(b)) {
        bail!("{}: an answer from {b:?}, not a backend", method.name());
    }
    let want = if method == Method::Direct { 1 } else { 2 };
    if out.crr_ns.len() >= 30 && out.backends.len() < want {
        bail!(
            "{}: answers only from {:?} over {} connections",
            method.name(),
            out.backends,
            out.crr_ns.len()
        );
    }
    Ok(())
}

fn series_of(method: Method, n: usize, out: &ClientOutput) -> Result<(Series, Series)> {
    let ns = |v: &[u64]| {
        v.iter()
            .map(|&x| Duration::from_nanos(x))
            .collect::<Vec<_>>()
    };
    let label = services_label(n);
    let crr = Series::new(
        method.name(),
        method.role(),
        &format!("TCP_CRR at {label}: connect + 32-byte request + response + close, one at a time"),
        &ns(&out.crr_ns),
        Some(Duration::from_nanos(out.crr_wall_ns)),
    )?
    .with_throughput(out.crr_ns.len(), Duration::from_nanos(out.crr_wall_ns))
    .in_group(format!("{label} · TCP_CRR"))
    .at_x("TCP_CRR", "services", n as f64);
    let rr = Series::new(
        method.name(),
        method.role(),
        &format!("TCP_RR at {label}: 32-byte request + response on one kept connection"),
        &ns(&out.rr_ns),
        Some(Duration::from_nanos(out.rr_wall_ns)),
    )?
    .with_throughput(out.rr_ns.len(), Duration::from_nanos(out.rr_wall_ns))
    .in_group(format!("{label} · TCP_RR"))
    .at_x("TCP_RR", "services", n as f64);
    Ok((crr, rr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_based_methods_stop_at_rules_max_skiff_and_direct_never() {
        for m in Method::ALL {
            assert!(m.runs_at(RULES_MAX, RULES_MAX), "{}", m.name());
        }
        assert!(!Method::Iptables.runs_at(50_000, RULES_MAX));
        assert!(!Method::Nftables.runs_at(50_000, RULES_MAX));
        assert!(Method::Iptables.runs_at(50_000, 50_000));
        assert!(Method::Skiff.runs_at(50_000, 1));
        assert!(Method::Direct.runs_at(50_000, 1));
    }

    #[test]
    fn labels() {
        assert_eq!(services_label(1), "1 service");
        assert_eq!(services_label(10_000), "10k services");
        assert_eq!(services_label(100), "100 services");
        assert_eq!(measured_index(1), 0);
        assert_eq!(measured_index(50_000), 25_000);
    }

    #[test]
    fn vip_methods_must_spread_and_direct_must_not_stray() {
        let real = lbnet::real_backends();
        let mut out = ClientOutput {
            crr_ns: vec![1; 100],
            ..Default::default()
        };
        out.backends.insert("10.200.0.11".into(), 100);
        assert!(check_backends(Method::Direct, &out, &real).is_ok());
        assert!(check_backends(Method::Iptables, &out, &real).is_err());
        out.backends.insert("10.200.0.12".into(), 3);
        assert!(check_backends(Method::Skiff, &out, &real).is_ok());
        out.backends.insert("10.128.0.1".into(), 1);
        assert!(check_backends(Method::Skiff, &out, &real).is_err());
    }
}
