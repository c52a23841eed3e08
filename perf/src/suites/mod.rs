//! The benchmark suites. To add one, write a module with a `run` function and append it to
//! [`SUITES`].
//!
//! `skiff-bench` runs the suites of [`SUITES`] in the order of the report's five sections
//! (service load balancing, LB programming, pod networking, pods and images, control plane)
//! and, when all ran, writes `<date>-report.md` linking the suite reports in `perf/results/`.
//! Every process a suite starts is a guard killed by pid on drop; every namespace, cgroup,
//! rule and pin it makes is removed by a guard, also on error; nothing is created in the root
//! network namespace. No test asserts on a benchmark's numbers: `cargo xtask test` runs
//! `bench --quick` only to check that every suite works.

use futures::future::LocalBoxFuture;

use crate::report::SuiteReport;

pub mod admission_webhooks;
pub mod auth;
pub mod control_plane;
pub mod custom_resources;
pub mod ha;
pub mod images;
pub mod lb_programming;
pub mod pod_density;
pub mod pod_net;
pub mod pod_start;
pub mod rest_api;
pub mod scheduler;
pub mod service_lb;

/// Settings shared by the suites; each uses those that apply to it.
#[derive(Debug, Clone)]
pub struct Options {
    /// A smoke check: tiny sizes, results written outside the repository.
    pub quick: bool,
    /// Pods (or processes) per series; `None`: the suite's default (smaller with `quick`).
    pub pods: Option<usize>,
    /// How many starts (create → running) are in flight at once.
    pub concurrency: usize,
    /// Unmeasured starts before each series.
    pub warmup: usize,
    /// Hollow node counts, one comparison group each (scheduler suite); empty: the suite's
    /// default.
    pub nodes: Vec<usize>,
    /// Repetitions of each measurement (scheduler, control-plane and rest-api suites: the
    /// median reported; pod-net: rounds, every round's samples reported); `None`: the suite's
    /// default.
    pub runs: Option<usize>,
    /// Run the API server on a real etcd instead of the embedded store (scheduler suite).
    pub etcd: bool,
    /// Load-balancing suites: kube-proxy's rules are loaded for service counts up to this
    /// many (Skiff and the direct connection run at every count).
    pub rules_max: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            quick: false,
            pods: None,
            concurrency: 10,
            warmup: 1,
            nodes: Vec::new(),
            runs: None,
            etcd: false,
            rules_max: service_lb::RULES_MAX,
        }
    }
}

pub type RunFn = for<'a> fn(&'a Options) -> LocalBoxFuture<'a, anyhow::Result<SuiteReport>>;

#[derive(Debug)]
pub struct Suite {
    pub name: &'static str,
    pub title: &'static str,
    /// The section of the whole report it belongs to ([`crate::report::SECTIONS`]).
    pub section: u8,
    pub run: RunFn,
}

/// Every suite, in the order `skiff-bench` without arguments runs them (the order of the
/// report's sections: packet paths, then pods, then the control plane).
pub static SUITES: &[Suite] = &[
    Suite {
        name: service_lb::NAME,
        title: service_lb::TITLE,
        section: 1,
        run: service_lb::run,
    },
    Suite {
        name: lb_programming::NAME,
        title: lb_programming::TITLE,
        section: 2,
        run: lb_programming::run,
    },
    Suite {
        name: pod_net::NAME,
        title: pod_net::TITLE,
        section: 3,
        run: pod_net::run,
    },
    Suite {
        name: pod_start::NAME,
        title: pod_start::TITLE,
        section: 4,
        run: pod_start::run,
    },
    Suite {
        name: pod_density::NAME,
        title: pod_density::TITLE,
        section: 4,
        run: pod_density::run,
    },
    Suite {
        name: images::NAME,
        title: images::TITLE,
        section: 4,
        run: images::run,
    },
    Suite {
        name: control_plane::NAME,
        title: control_plane::TITLE,
        section: 5,
        run: control_plane::run,
    },
    Suite {
        name: rest_api::NAME,
        title: rest_api::TITLE,
        section: 5,
        run: rest_api::run,
    },
    Suite {
        name: custom_resources::NAME,
        title: custom_resources::TITLE,
        section: 5,
        run: custom_resources::run,
    },
    Suite {
        name: admission_webhooks::NAME,
        title: admission_webhooks::TITLE,
        section: 5,
        run: admission_webhooks::run,
    },
    Suite {
        name: scheduler::NAME,
        title: scheduler::TITLE,
        section: 5,
        run: scheduler::run,
    },
    Suite {
        name: auth::NAME,
        title: auth::TITLE,
        section: 5,
        run: auth::run,
    },
    Suite {
        name: ha::NAME,
        title: ha::TITLE,
        section: 5,
        run: ha::run,
    },
];

pub fn find(name: &str) -> Option<&'static Suite> {
    SUITES.iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_names_are_unique_and_found() {
        for (i, s) in SUITES.iter().enumerate() {
            assert!(SUITES[..i].iter().all(|o| o.name != s.name), "{}", s.name);
            assert!(std::ptr::eq(find(s.name).unwrap(), s));
        }
        assert!(find("pod-start").is_some());
        assert!(find("scheduler").is_some());
        assert!(find("pod-density").is_some());
        assert!(find("control-plane").is_some());
        assert!(find("rest-api").is_some());
        assert!(find("service-lb").is_some());
        assert!(find("lb-programming").is_some());
        assert!(find("pod-net").is_some());
        assert!(find("auth").is_some());
        assert!(find("ha").is_some());
        assert!(find("nope").is_none());
        for s in SUITES {
            assert!(
                crate::report::SECTIONS.iter().any(|(n, _)| *n == s.section),
                "{}: no section {}",
                s.name,
                s.section
            );
        }
        for (n, title) in crate::report::SECTIONS {
            assert!(
                SUITES.iter().any(|s| s.section == *n),
                "section {title}: no suite"
            );
        }
    }
}
