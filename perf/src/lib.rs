//! Skiff's benchmarks. Each suite runs one or more baselines and Skiff side by side in one
//! run and reports percentiles and the Skiff/baseline ratios (absolute times on a small shared
//! machine are noise; ratios taken in the same run are not). Run them with
//! `cargo xtask bench [SUITE…] [--quick]`, which builds the binaries in release first.
//!
//! - [`suites`]: the list of suites ([`suites::SUITES`]) and their shared [`suites::Options`].
//! - [`baseline`]: starting the same command without Skiff (fork+exec; cgroup + namespaces).
//! - [`apiload`]: what the API server suites share: creates with C in flight, timed; gRPC
//!   watchers; when each of many watchers received each item.
//! - [`http1`]: the REST suite's HTTP/1.1 keep-alive client (requests, streamed lines).
//! - [`pods`]: the watch that timestamps the bench's pods reaching a state, deleting them.
//! - [`stats`], [`report`]: percentiles, the printed table, the markdown and JSON reports.
//! - [`plot`]: PNG charts of a report (bars per group, lines against a numeric axis).
//! - [`kproxy`], [`lbnet`]: kube-proxy's iptables/nftables rules for a synthetic service set;
//!   the private two-namespace network, client and server of the load-balancing suites.
//! - [`topology`]: network baselines in the suite's own namespaces (bridge + iptables, veth).
//! - [`iperf`], [`rr`]: the stream throughput tool's JSON, and the bench's own TCP
//!   request/response client and server (`skiff-bench __rr …`).
//! - [`host`]: which binaries the harness starts, machine facts for the report.
//! - [`procfs`]: a process's RSS and CPU time, a cgroup's memory, as the kernel reports them.
//!
//! Skiff's side uses the end-to-end harness of `skiff-tests` (real `skiff-apiserver` and
//! `skiff-node` processes in namespaces and cgroups of their own, removed on drop).

pub mod apiload;
pub mod baseline;
pub mod host;
pub mod http1;
pub mod iperf;
pub mod kproxy;
pub mod lbnet;
pub mod plot;
pub mod pods;
pub mod procfs;
pub mod report;
pub mod rr;
pub mod stats;
pub mod suites;
pub mod topology;
