//! `lb-programming`: how long it takes to program ClusterIP services, Skiff's eBPF maps
//! against kube-proxy's iptables and nftables rule loads, on the private network of
//! [`crate::lbnet::Topology`] (rules only in its client namespace, the LB's pins in its own
//! directory).
//!
//! - Install N services (1k, 10k, 50k; `--quick`: 100) from nothing: every service through
//!   `ServiceLb::sync_service` (map updates, after the object is loaded and attached), one
//!   `iptables-restore` of kube-proxy's full ruleset, one `nft -f` of its full table.
//! - One change at 10k services (`--quick`: 100): one backend added to one service, repeated
//!   for different services: `ServiceLb::set_backends`; kube-proxy's iptables partial sync
//!   (`iptables-restore --noflush` of the whole `KUBE-SERVICES` chain plus the changed
//!   service's chains); `nft -f` of the new endpoint chain and the rewritten service chain.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use serde_json::json;
use skiff_datapath::lb::ServiceLb;
use tracing::info;

use super::Options;
use super::service_lb::{Method, fmt_n, measured_index, services_label};
use crate::host;
use crate::kproxy::ServiceSet;
use crate::lbnet::{self, Topology};
use crate::report::{Measured, Series, SuiteReport};

pub const NAME: &str = "lb-programming";
pub const TITLE: &str = "time to program ClusterIP services";

const SIZES: &[usize] = &[1_000, 10_000, 50_000];
const QUICK_SIZES: &[usize] = &[100];
/// Installs per method and size up to [`FEW_RUNS_ABOVE`] services, fewer above.
const INSTALL_RUNS: usize = 3;
const FEW_RUNS_ABOVE: usize = 1_000;
const FEW_INSTALL_RUNS: usize = 1;
const CHANGE_AT: usize = 10_000;
const QUICK_CHANGE_AT: usize = 100;
const CHANGES: usize = 20;
/// Installs of up to this many services are checked by listing the rules back.
const CHECK_MAX: usize = 10_000;
const QUICK_CHANGES: usize = 5;

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(async move {
        let (quick, rules_max) = (opts.quick, opts.rules_max);
        lbnet::blocking(move |cancel| measure(quick, rules_max, &cancel)).await
    })
}

const PROGRAMMED: [Method; 3] = [Method::Skiff, Method::Iptables, Method::Nftables];

fn measure(quick: bool, rules_max: usize, cancel: &lbnet::Cancel) -> Result<SuiteReport> {
    host::require_root()?;
    let started_at = chrono::Utc::now();
    let env = host::environment();
    let (sizes, change_at, changes) = if quick {
        (QUICK_SIZES, QUICK_CHANGE_AT, QUICK_CHANGES)
    } else {
        (SIZES, CHANGE_AT, CHANGES)
    };
    let topo = Topology::new(NAME)?;
    let real = lbnet::real_backends();
    let mut series = Vec::new();
    let mut details = BTreeMap::new();
    let t_suite = Instant::now();

    for &n in sizes {
        let set = ServiceSet::new(n, measured_index(n), &real);
        let runs = if n > FEW_RUNS_ABOVE {
            FEW_INSTALL_RUNS
        } else {
            INSTALL_RUNS
        };
        let label = services_label(n);
        for method in PROGRAMMED {
            if !method.runs_at(n, rules_max) {
                continue;
            }
            let mut samples = Vec::new();
            for run in 0..runs {
                cancel.check()?;
                // Listing a large ruleset takes longer than loading it: check the first
                // install up to CHECK_MAX services (the service-lb suite checks every size
                // through the data path).
                let check = run == 0 && n <= CHECK_MAX;
                samples.push(install_once(&topo, &set, method, check)?);
            }
            info!(services = n, method = method.name(), ?samples, "installed");
            let what = match method {
                Method::Skiff => format!(
                    "{label} ({} endpoints) from empty maps: one ServiceLb::sync_service per \
                     service (plan + map updates), the object already loaded and attached",
                    set.endpoint_count()
                ),
                Method::Iptables => format!(
                    "{label} ({} endpoints): one `iptables-restore` (nf_tables backend) of \
                     kube-proxy's full filter + nat ruleset into empty tables, exec to exit",
                    set.endpoint_count()
                ),
                _ => format!(
                    "{label} ({} endpoints): one `nft -f` of kube-proxy's full `ip kube-proxy` \
                     table into an empty ruleset, exec to exit",
                    set.endpoint_count()
                ),
            };
            series.push(
                Series::new(method.name(), method.role(), &what, &samples, None)?
                    .in_group(format!("{label} · install"))
                    .at_x("install", "services", n as f64),
            );
        }
    }

    // One change, repeated on different services.
    let mut set = ServiceSet::new(change_at, measured_index(change_at), &real);
    let label = services_label(change_at);
    for method in PROGRAMMED {
        cancel.check()?;
        let samples = change_series(&topo, &mut set, method, changes)?;
        let what = match method {
            Method::Skiff => format!(
                "one backend added to one service at {label}: ServiceLb::set_backends \
                 (plan + the map writes for the new backend and slot and the service's count)"
            ),
            Method::Iptables => format!(
                "one backend added to one service at {label}: kube-proxy's partial sync, one \
                 `iptables-restore --noflush` of KUBE-SERVICES (all {change_at} jumps), \
                 KUBE-NODEPORTS, KUBE-POSTROUTING, KUBE-MARK-MASQ, the changed KUBE-SVC chain \
                 and its KUBE-SEP chains (plus the filter-table chains), exec to exit"
            ),
            _ => format!(
                "one backend added to one service at {label}: one `nft -f` adding the new \
                 endpoint chain and flushing and rewriting the service chain, exec to exit"
            ),
        };
        series.push(
            Series::new(method.name(), method.role(), &what, &samples, None)?
                .in_group(format!("one backend added at {label}")),
        );
    }
    details.insert(
        "suite_seconds".into(),
        json!(t_suite.elapsed().as_secs_f64()),
    );
    info!(secs = t_suite.elapsed().as_secs(), "lb-programming done");

    let notes = vec![
        "Every method programs the same synthetic services (VIP 10.96.0.1 + i, port 80/TCP, \
         2–10 endpoints each by a fixed pattern, mean 3.6) in the client namespace of a \
         private two-namespace network (rules) or in maps pinned under \
         /sys/fs/bpf/skiff-bench-<pid>/ (Skiff); nothing outside the run's namespaces is \
         touched. Rule texts are generated before the clock starts; times are exec to exit \
         of the tool (kube-proxy also execs iptables-restore / nft on every sync)."
            .into(),
        "iptables is Debian's default `iptables` (nf_tables backend, iptables-nft 1.8); the \
         layouts are kube-proxy's (see the service-lb report and perf/src/kproxy.rs)."
            .into(),
        "Between installs everything is removed untimed (LB object dropped and pins removed; \
         `nft flush ruleset`, checked empty), so each install starts from nothing."
            .into(),
        format!(
            "Installs per method: {INSTALL_RUNS} up to {FEW_RUNS_ABOVE} services, \
             {FEW_INSTALL_RUNS} above (time budget); each sample is one whole install. Installs \
             up to {CHECK_MAX} services are checked by listing the rules back \
             (iptables-save / nft list chain); the single changes are checked after the last \
             one."
        ),
        format!(
            "kube-proxy's rules are installed up to {} services: on this 2-core machine one \
             iptables-restore of the 50k-service ruleset (≈180k endpoints, 63 MB of rules) \
             took 7.2 min (87 s of CPU, 810 MB; measured once by hand, \
             with other builds running), beyond the time budget of the suite; above that only \
             Skiff is measured (`--rules-max 50000` includes the rules at 50k).",
            fmt_n(rules_max)
        ),
    ];
    let mut params = BTreeMap::new();
    params.insert("services".into(), json!(sizes));
    params.insert("change_at_services".into(), json!(change_at));
    params.insert("changes".into(), json!(changes));
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

/// One install of `set` from nothing, timed; then checked and removed (untimed).
fn install_once(
    topo: &Topology,
    set: &ServiceSet,
    method: Method,
    check: bool,
) -> Result<Duration> {
    match method {
        Method::Skiff => {
            let mut lb = ServiceLb::load(&topo.pin_dir, lbnet::lb_config(set))
                .context("loading Skiff's LB")?;
            lb.attach(&topo.cgroup).context("attaching Skiff's LB")?;
            let t0 = Instant::now();
            lbnet::program_lb(&mut lb, set)?;
            let took = t0.elapsed();
            let programmed = lb.state().service_count();
            drop(lb);
            topo.remove_lb()?;
            if programmed != set.services.len() {
                bail!(
                    "{programmed} services programmed, not {}",
                    set.services.len()
                );
            }
            Ok(took)
        }
        Method::Iptables => {
            let f = topo.file("iptables.rules", &set.iptables_restore())?;
            let took = lbnet::in_netns(&topo.client_ns, "iptables-restore", &[], Some(&f))?;
            if check {
                check_iptables(topo, set, &set.services[set.measured])?;
            }
            topo.flush_rules()?;
            Ok(took)
        }
        Method::Nftables => {
            let f = topo.file("nft.rules", &set.nft_script())?;
            let took = lbnet::in_netns(
                &topo.client_ns,
                "nft",
                &["-f", &f.display().to_string()],
                None,
            )?;
            if check {
                check_nft(topo, &set.services[set.measured])?;
            }
            topo.flush_rules()?;
            Ok(took)
        }
        Method::Direct => bail!("nothing to program for the direct method"),
    }
}

/// The installed nat table has every service's jump and `svc`'s DNATs.
fn check_iptables(topo: &Topology, set: &ServiceSet, svc: &crate::kproxy::Service) -> Result<()> {
    let (nat, _) = lbnet::in_netns_output(&topo.client_ns, "iptables-save", &["-t", "nat"], None)?;
    let jumps = nat
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SERVICES -d "))
        .count();
    if jumps != set.services.len() {
        bail!(
            "iptables: {jumps} service jumps installed, not {}",
            set.services.len()
        );
    }
    for b in &svc.backends {
        if !nat.contains(&format!("--to-destination {b}:")) {
            bail!("iptables: no DNAT to {b}");
        }
    }
    Ok(())
}

/// `svc`'s chain is installed with one vmap entry per backend.
fn check_nft(topo: &Topology, svc: &crate::kproxy::Service) -> Result<()> {
    let (chain, _) = lbnet::in_netns_output(
        &topo.client_ns,
        "nft",
        &[
            "list",
            "chain",
            "ip",
            "kube-proxy",
            &svc.nft_service_chain(),
        ],
        None,
    )?;
    let want = format!("numgen random mod {} vmap", svc.backends.len());
    if !chain.contains(&want) {
        bail!(
            "nftables: {} lacks {want:?}:\n{chain}",
            svc.nft_service_chain()
        );
    }
    Ok(())
}

/// Which service the `k`-th change touches: spread over the set, never the same twice.
pub(crate) fn changed_index(n: usize, k: usize) -> usize {
    (k * 7919 + 1) % n
}

/// Installs `set` (untimed), then `changes` times adds one backend to one service and times
/// that; checks the last change landed, removes everything. `set` keeps the changes.
fn change_series(
    topo: &Topology,
    set: &mut ServiceSet,
    method: Method,
    changes: usize,
) -> Result<Vec<Duration>> {
    // Every method starts from the same services.
    let base = set.clone();
    let mut samples = Vec::with_capacity(changes);
    let mut lb = None;
    match method {
        Method::Skiff => {
            let mut l = ServiceLb::load(&topo.pin_dir, lbnet::lb_config(set))
                .context("loading Skiff's LB")?;
            l.attach(&topo.cgroup).context("attaching Skiff's LB")?;
            lbnet::program_lb(&mut l, set)?;
            lb = Some(l);
        }
        Method::Iptables => {
            let f = topo.file("iptables.rules", &set.iptables_restore())?;
            lbnet::in_netns(&topo.client_ns, "iptables-restore", &[], Some(&f))?;
        }
        Method::Nftables => {
            let f = topo.file("nft.rules", &set.nft_script())?;
            lbnet::in_netns(
                &topo.client_ns,
                "nft",
                &["-f", &f.display().to_string()],
                None,
            )?;
        }
        Method::Direct => bail!("nothing to program for the direct method"),
    }
    let result = (|| -> Result<()> {
        let n = set.services.len();
        for k in 0..changes {
            let i = changed_index(n, k);
            let extra = set.extra_backend(k as u32);
            set.services[i].backends.push(extra);
            let svc = set.services[i].clone();
            let took = match (method, lb.as_mut()) {
                (Method::Skiff, Some(l)) => {
                    let addrs = lbnet::backend_addrs(&svc.backends);
                    let t0 = Instant::now();
                    let writes = l.set_backends(&lbnet::frontend(svc.vip), &addrs)?;
                    let took = t0.elapsed();
                    if writes == 0 || l.backends_of(&lbnet::frontend(svc.vip)) != addrs {
                        bail!("skiff: the backend was not added to {}", svc.vip);
                    }
                    took
                }
                (Method::Iptables, _) => {
                    let f = topo.file("iptables.partial", &set.iptables_partial(&svc))?;
                    lbnet::in_netns(
                        &topo.client_ns,
                        "iptables-restore",
                        &["--noflush"],
                        Some(&f),
                    )?
                }
                _ => {
                    let f = topo.file("nft.partial", &set.nft_partial(&svc, &[extra]))?;
                    lbnet::in_netns(
                        &topo.client_ns,
                        "nft",
                        &["-f", &f.display().to_string()],
                        None,
                    )?
                }
            };
            samples.push(took);
            if k + 1 == changes {
                match method {
                    Method::Iptables => check_iptables(topo, set, &svc)?,
                    Method::Nftables => check_nft(topo, &svc)?,
                    _ => {}
                }
            }
        }
        Ok(())
    })();
    drop(lb);
    match method {
        Method::Skiff => topo.remove_lb()?,
        _ => topo.flush_rules()?,
    }
    result?;
    *set = base;
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_touch_distinct_services() {
        let n = 10_000;
        let mut seen: Vec<usize> = (0..CHANGES).map(|k| changed_index(n, k)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), CHANGES);
        assert!(seen.iter().all(|&i| i < n));
        let mut q: Vec<usize> = (0..QUICK_CHANGES)
            .map(|k| changed_index(QUICK_CHANGE_AT, k))
            .collect();
        q.sort();
        q.dedup();
        assert_eq!(q.len(), QUICK_CHANGES);
    }
}
