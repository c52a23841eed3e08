//! The crate graph as ARCHITECTURE.md draws it, checked against Cargo's: a test reads the
//! `crate-graph` block of ARCHITECTURE.md (`crate -> dep, dep` lines) and the workspace's
//! manifests (`cargo metadata`), and fails when they differ, when the graph has a cycle, or
//! when a layer reaches what it must not (the runtime and host-network crates build without
//! the eBPF toolchain: only `skiff-datapath` builds eBPF, and nothing below the agent
//! depends on it).
//!
//! Edges are normal, non-optional dependencies between workspace crates; dev-dependencies
//! and optional test-fixture features are tests' business and not drawn.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail};

/// Crate → the workspace crates it depends on.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// Parses the lines between the `crate-graph` marker's code fence: `a -> b, c` (or `a ->`).
pub fn parse_diagram(markdown: &str) -> Result<Graph> {
    let start = markdown
        .find("<!-- crate-graph")
        .context("ARCHITECTURE.md has no `<!-- crate-graph ... -->` marker")?;
    let rest = &markdown[start..];
    let fence = rest
        .find("```")
        .context("no code fence after the crate-graph marker")?;
    let body = &rest[fence + 3..];
    let body = &body[body.find('\n').map_or(0, |i| i + 1)..];
    let end = body
        .find("```")
        .context("the crate-graph code fence is not closed")?;
    let mut graph = Graph::new();
    for line in body[..end].lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (name, deps) = line
            .split_once("->")
            .with_context(|| format!("crate-graph line {line:?}: expected `crate -> deps`"))?;
        let deps = deps
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(String::from)
            .collect();
        if graph.insert(name.trim().to_string(), deps).is_some() {
            bail!("crate-graph lists {} twice", name.trim());
        }
    }
    Ok(graph)
}

/// The workspace's graph from `cargo metadata --no-deps` JSON.
pub fn from_metadata(metadata: &serde_json::Value) -> Result<Graph> {
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut graph = Graph::new();
    for p in packages {
        let name = p["name"].as_str().context("a package without a name")?;
        let deps = p["dependencies"]
            .as_array()
            .map(|d| d.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|d| d["kind"].is_null() && d["optional"] != true)
            .filter_map(|d| d["name"].as_str())
            .filter(|d| names.contains(d))
            .map(String::from)
            .collect();
        graph.insert(name.to_string(), deps);
    }
    Ok(graph)
}

/// A cycle, if the graph has one (as the path that closes it).
pub fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        n: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

/// Every crate `from` reaches.
pub fn reaches(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(n) = todo.pop() {
        for d in graph.get(&n).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata() -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO"))
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .current_dir(crate::util::repo_root())
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
    }

    /// The crate graph has no cycle and matches ARCHITECTURE.md.
    #[test]
    fn crate_graph_matches_architecture_md_and_has_no_cycle() {
        let md = std::fs::read_to_string(crate::util::repo_root().join("ARCHITECTURE.md"))
            .expect("ARCHITECTURE.md");
        let drawn = parse_diagram(&md).expect("the crate-graph block parses");
        let real = from_metadata(&metadata()).expect("the workspace graph");
        for (name, deps) in &real {
            match drawn.get(name) {
                None => panic!("ARCHITECTURE.md's crate graph lacks {name} -> {deps:?}"),
                Some(d) => assert_eq!(
                    d, deps,
                    "ARCHITECTURE.md draws {name} -> {d:?}, Cargo.toml says {deps:?}"
                ),
            }
        }
        let extra: Vec<&String> = drawn.keys().filter(|k| !real.contains_key(*k)).collect();
        assert!(
            extra.is_empty(),
            "ARCHITECTURE.md draws crates that do not exist: {extra:?}"
        );
        assert_eq!(cycle(&real), None, "the crate graph has a cycle");
    }

    /// The layers below the agent build without the eBPF toolchain: only skiff-datapath has
    /// the eBPF build, and the runtime and host-network crates do not reach it.
    #[test]
    fn only_the_datapath_builds_ebpf_and_the_lower_layers_do_not_reach_it() {
        let m = metadata();
        let with_aya_build: Vec<&str> = m["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .filter(|p| {
                p["dependencies"].as_array().is_some_and(|d| {
                    d.iter()
                        .any(|d| d["name"] == "aya-build" && d["kind"] == "build")
                })
            })
            .filter_map(|p| p["name"].as_str())
            .collect();
        assert_eq!(with_aya_build, ["skiff-datapath"]);
        let g = from_metadata(&m).expect("graph");
        for lower in ["skiff-runtime", "skiff-hostnet", "skiff-cidr", "skiff-api"] {
            assert!(
                !reaches(&g, lower).contains("skiff-datapath"),
                "{lower} must not depend on skiff-datapath"
            );
        }
        for layer in ["skiff-runtime", "skiff-hostnet", "skiff-datapath"] {
            let r = reaches(&g, layer);
            for upper in ["skiff-node", "skiff-api", "skiff-client"] {
                assert!(!r.contains(upper), "{layer} must not know {upper}");
            }
        }
    }

    /// Test support stays out of the product: only the harness crates (and xtask, for the
    /// test network of `up`) depend on the test kit or the test network, and no product
    /// crate reaches them, not even through an optional dependency.
    #[test]
    fn no_product_crate_depends_on_test_support() {
        let m = metadata();
        let support = ["skiff-testkit", "skiff-testnet"];
        let harness = [
            "skiff-tests",
            "skiff-perf",
            "skiff-testkit",
            "skiff-testnet",
            "xtask",
        ];
        for p in m["packages"].as_array().expect("packages") {
            let name = p["name"].as_str().unwrap_or_default();
            if harness.contains(&name) {
                continue;
            }
            for d in p["dependencies"].as_array().into_iter().flatten() {
                let dep = d["name"].as_str().unwrap_or_default();
                assert!(
                    !(support.contains(&dep) && d["kind"] != "dev"),
                    "{name} depends on {dep} outside its tests"
                );
            }
        }
    }

    /// Every product binary is built by the test tier before any test runs:
    /// `cargo nextest run --workspace` builds a package's binaries only for that package's
    /// integration tests (`tests/`). A binary without them is missing when an end-to-end test
    /// starts it, and `skiff_tests::binary` then builds it in the middle of the run, with its
    /// own feature set, holding the build lock for minutes while timed tests run beside it.
    #[test]
    fn every_binary_is_built_by_the_test_tier() {
        let m = metadata();
        // Run by `cargo xtask` itself (bench tier), never by a test.
        let not_started_by_tests = ["skiff-bench"];
        for p in m["packages"].as_array().expect("packages") {
            let targets = p["targets"].as_array().expect("targets");
            let has = |kind: &str| {
                targets.iter().any(|t| {
                    t["kind"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == kind))
                })
            };
            for bin in targets.iter().filter(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
            }) {
                let name = bin["name"].as_str().unwrap_or_default();
                assert!(
                    has("test") || not_started_by_tests.contains(&name),
                    "{}'s binary {name} is not built by `cargo nextest run --workspace`: give \
                     the package an integration test (tests/)",
                    p["name"].as_str().unwrap_or_default()
                );
            }
        }
    }

    #[test]
    fn diagram_parsing_and_cycles() {
        let md = "x\n<!-- crate-graph -->\n```text\na -> b, c\nb -> c\nc ->\n```\n";
        let g = parse_diagram(md).expect("parses");
        assert_eq!(g["a"], BTreeSet::from(["b".to_string(), "c".to_string()]));
        assert!(g["c"].is_empty());
        assert_eq!(cycle(&g), None);
        assert_eq!(reaches(&g, "a").len(), 2);
        let looped = parse_diagram("<!-- crate-graph -->\n```\na -> b\nb -> a\n```").unwrap();
        assert_eq!(
            cycle(&looped),
            Some(vec!["a".into(), "b".into(), "a".into()])
        );
        assert!(parse_diagram("no marker").is_err());
        assert!(parse_diagram("<!-- crate-graph -->\n```\nbad line\n```").is_err());
    }
}
