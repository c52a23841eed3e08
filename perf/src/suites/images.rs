//! `images`: containers from OCI images, in three parts of one run, each against its baseline
//! in the same run:
//!
//! 1. **Cold pull + unpack** of a multi-layer image (five layers of incompressible data plus
//!    busybox, ~50 MB; ~5 MB with `--quick`) from a real registry (docker-registry on
//!    loopback) into an empty store: `skiff-node image pull` (pull, verify, unpack every
//!    layer) against `skopeo copy docker://… oci:…` followed by `umoci unpack` of the same
//!    image from the same registry, alternating, fresh directories every time.
//! 2. **Pod start from a cached image**: create → Running (the pod watch) of a pod whose
//!    registry image is already on the node (`IfNotPresent`: no pull; a fresh overlay root,
//!    /etc files, the confinement of an unprivileged container), against today's `host` pod
//!    start (the same `sleep`, the node's root), one pod at a time, alternating.
//! 3. **Layer sharing**: N pods (100; 5 with `--quick`) of the big image on one node; the
//!    disk used by the layer store and the pods' writable layers, against N copies of the
//!    unpacked image (what a runtime without shared layers would write).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::LocalBoxFuture;
use serde_json::json;
use skiff_api::api::Pod;
use skiff_client::{DeleteParams, ListParams};
use skiff_testkit::registry::{Registry, gz_layer_bytes};
use tracing::info;

use super::Options;
use super::pod_start::{NAMESPACE, OneNode, RUN_LABEL, is_running, start_pods, with_agent_log};
use crate::host;
use crate::pods::{PodWatch, delete_all};
use crate::report::{Measured, Role, Series, SuiteReport};

pub const NAME: &str = "images";
pub const TITLE: &str = "containers from images";

const POD_CIDR: &str = "10.244.12.0/22";
const LAYERS: usize = 5;
const DELETE_TIMEOUT: Duration = Duration::from_secs(180);

/// Sizes of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImageSizes {
    /// MB of data per layer of the big image.
    layer_mb: usize,
    /// Cold pulls per tool.
    pulls: usize,
    /// Pod starts per series.
    starts: usize,
    /// Pods of the big image at once.
    share_pods: usize,
}

fn sizes(opts: &Options) -> ImageSizes {
    if opts.quick {
        ImageSizes {
            layer_mb: 1,
            pulls: 1,
            starts: 3,
            share_pods: opts.pods.unwrap_or(5),
        }
    } else {
        ImageSizes {
            layer_mb: 10,
            pulls: opts.runs.unwrap_or(5),
            starts: 20,
            share_pods: opts.pods.unwrap_or(100),
        }
    }
}

pub fn run(opts: &Options) -> LocalBoxFuture<'_, Result<SuiteReport>> {
    Box::pin(measure(opts))
}

/// `n` bytes that do not compress (xorshift), different per `seed`.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Disk use (allocated blocks) of everything under `path`.
fn disk_use(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|rd| rd.flatten().map(|e| disk_use(&e.path())).sum::<u64>())
            .unwrap_or(0)
            .saturating_add(m.blocks() * 512),
        Ok(m) => m.blocks() * 512,
        Err(_) => 0,
    }
}

fn run_tool(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn image_config(entrypoint: &[&str], layers: usize) -> serde_json::Value {
    json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": vec![
            "sha256:0000000000000000000000000000000000000000000000000000000000000000"; layers]},
    })
}

fn pod(name: &str, node: &str, run_id: &str, image: &str) -> Result<Pod> {
    let mut c = json!({"name": "main", "image": image, "imagePullPolicy": "IfNotPresent"});
    if image == "host" {
        c["command"] = json!(super::pod_start::COMMAND);
    }
    skiff_api::manifest::decode(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 5, "containers": [c]},
    }))
    .context("building a benchmark pod")
}

async fn measure(opts: &Options) -> Result<SuiteReport> {
    host::require_root()?;
    let bin_dir = host::check_binaries(&["skiff-apiserver", "skiff-node"])?;
    for tool in ["skopeo", "umoci", "docker-registry"] {
        if Command::new(tool).arg("--version").output().is_err() {
            bail!("{tool} is missing: run `cargo xtask setup`");
        }
    }
    let sz = sizes(opts);
    let started_at = chrono::Utc::now();
    let run_id = skiff_tests::unique();
    let mut env = host::environment();

    info!(suite = NAME, ?sz, "building the images in a local registry");
    let registry = Registry::start();
    let busybox = std::fs::read("/bin/busybox").context("busybox-static (cargo xtask setup)")?;
    let base = gz_layer_bytes(&[("bin/", b""), ("bin/busybox", &busybox), ("tmp/", b"")]);
    registry
        .push(
            "bench/small:1",
            std::slice::from_ref(&base),
            &image_config(&["/bin/busybox", "sleep", "3600"], 1),
            None,
        )
        .await;
    let mut big_layers = vec![base];
    for i in 0..LAYERS {
        let data = noise(sz.layer_mb * 1024 * 1024, i as u64 + 1);
        big_layers.push(gz_layer_bytes(&[
            ("data/", b""),
            (&format!("data/blob-{i}"), &data),
        ]));
    }
    let big_bytes: usize = big_layers.iter().map(Vec::len).sum();
    registry
        .push(
            "bench/big:1",
            &big_layers,
            &image_config(&["/bin/busybox", "sleep", "3600"], LAYERS + 1),
            None,
        )
        .await;
    let host_port = registry.host();
    let big = format!("{host_port}/bench/big:1");
    let small = format!("{host_port}/bench/small:1");
    let mut series = Vec::new();
    let mut details = BTreeMap::new();

    // 1. Cold pull + unpack, alternating.
    let pull_group = format!(
        "cold pull + unpack ({:.1} MB, {} layers)",
        big_bytes as f64 / 1e6,
        LAYERS + 1
    );
    let node_bin = bin_dir.join("skiff-node");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..sz.pulls {
        let dir = tempfile::tempdir().context("a scratch directory")?;
        let t = Instant::now();
        run_tool(
            Command::new(&node_bin)
                .args(["image", "pull", "--state-dir"])
                .arg(dir.path().join("skiff"))
                .args(["--plain-http", &host_port, &big]),
        )?;
        ours.push(t.elapsed());
        let layout = dir.path().join("oci");
        let t = Instant::now();
        run_tool(Command::new("skopeo").args([
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            &format!("docker://{big}"),
            &format!("oci:{}:1", layout.display()),
        ]))?;
        run_tool(
            Command::new("umoci")
                .args(["unpack", "--image", &format!("{}:1", layout.display())])
                .arg(dir.path().join("bundle")),
        )?;
        theirs.push(t.elapsed());
        info!(run = i, skiff = ?ours[i], skopeo_umoci = ?theirs[i], "cold pull");
    }
    let mb = big_bytes as f64 / 1e6;
    let p50 = |v: &[Duration]| {
        let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        Duration::from_secs_f64(crate::stats::percentile(&ms, 50.0) / 1e3)
    };
    details.insert(
        "cold_pull_mb_per_s".into(),
        json!({
            "skiff": mb / p50(&ours).as_secs_f64(),
            "skopeo+umoci": mb / p50(&theirs).as_secs_f64(),
        }),
    );
    series.push(
        Series::new(
            "skiff-node image pull",
            Role::Skiff,
            "`skiff-node image pull` into an empty store: resolve, fetch and verify every blob, \
             unpack every layer (process start → exit)",
            &ours,
            None,
        )?
        .in_group(&pull_group),
    );
    series.push(
        Series::new(
            "skopeo copy + umoci unpack",
            Role::Baseline,
            "`skopeo copy docker://… oci:…` then `umoci unpack` of the same image into empty \
             directories (start of skopeo → exit of umoci)",
            &theirs,
            None,
        )?
        .in_group(&pull_group),
    );

    // 2. and 3. on a node.
    info!("starting the API server and a node agent");
    let node_name = format!("perf-img-{run_id}");
    let one = OneNode::start(&node_name, POD_CIDR, &bin_dir, &mut env).await?;
    let pods = one.client.namespaced::<Pod>(NAMESPACE);
    let watch = PodWatch::start(pods.clone(), &format!("{RUN_LABEL}={run_id}"), is_running).await?;
    let agent = |e: anyhow::Error| with_agent_log(e, &one.node);
    // The small image pulled once, by a warm-up pod.
    let warm = vec![format!("warm-{run_id}")];
    start_pods(&pods, &watch, &warm, 1, |n| {
        pod(n, &node_name, &run_id, &small)
    })
    .await
    .map_err(agent)?;
    let (mut host_starts, mut image_starts) = (Vec::new(), Vec::new());
    let mut names = warm.clone();
    for i in 0..sz.starts {
        for (image, out) in [
            ("host", &mut host_starts),
            (small.as_str(), &mut image_starts),
        ] {
            let kind = if image == "host" { "host" } else { "img" };
            let name = format!("{kind}-{run_id}-{i}");
            let s = start_pods(&pods, &watch, std::slice::from_ref(&name), 1, |n| {
                pod(n, &node_name, &run_id, image)
            })
            .await
            .map_err(agent)?;
            out.push(s[&name].running.saturating_duration_since(s[&name].create));
            names.push(name);
        }
    }
    let start_group = "pod start (cached image)".to_string();
    let measures = "Pod create call → the first watch event with the pod Running (one pod at a \
                    time, alternating with the other series)";
    series.push(
        Series::new(
            "registry image (cached)",
            Role::Skiff,
            measures,
            &image_starts,
            None,
        )?
        .in_group(&start_group),
    );
    series.push(
        Series::new("image host", Role::Baseline, measures, &host_starts, None)?
            .in_group(&start_group),
    );
    delete_all(&pods, &names, &DeleteParams::default(), 10).await?;
    watch
        .wait_deleted(&names, DELETE_TIMEOUT)
        .await
        .map_err(agent)?;

    // 3. N pods of the big image.
    let share: Vec<String> = (0..sz.share_pods)
        .map(|i| format!("share-{run_id}-{i}"))
        .collect();
    let t0 = Instant::now();
    let starts = start_pods(&pods, &watch, &share, opts.concurrency.max(1), |n| {
        pod(n, &node_name, &run_id, &big)
    })
    .await
    .map_err(agent)?;
    let wall = t0.elapsed();
    let share_samples: Vec<Duration> = share
        .iter()
        .map(|n| {
            starts[n]
                .running
                .saturating_duration_since(starts[n].create)
        })
        .collect();
    let state = one.node.state_dir.path().join("state");
    let layers_dir = state.join("images/layers/sha256");
    let layer_bytes = disk_use(&layers_dir);
    let upper_bytes: u64 = std::fs::read_dir(state.join("rootfs"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|pod_dir| {
            std::fs::read_dir(pod_dir.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|c| disk_use(&c.path().join("upper")))
        .sum();
    // The unpacked big image: its layer directories (the small image's one layer is the
    // big image's first).
    let image_bytes = layer_bytes;
    let copies = image_bytes.saturating_mul(sz.share_pods as u64);
    details.insert(
        "layer_sharing".into(),
        json!({
            "pods": sz.share_pods,
            "layer_store_bytes": layer_bytes,
            "writable_layers_bytes": upper_bytes,
            "per_pod_copies_bytes": copies,
        }),
    );
    series.push(
        Series::new(
            &format!("{} pods of the big image", sz.share_pods),
            Role::Detail,
            "Pod create call → Running, all created at once (at most `concurrency` in flight)",
            &share_samples,
            Some(wall),
        )?
        .in_group("layer sharing"),
    );
    delete_all(&pods, &share, &DeleteParams::default(), 10).await?;
    watch
        .wait_deleted(&share, DELETE_TIMEOUT)
        .await
        .map_err(agent)?;
    let left = pods
        .list(&ListParams::default().labels(&format!("{RUN_LABEL}={run_id}")))
        .await?;
    if !left.items.is_empty() {
        bail!("{} pods left after the delete", left.items.len());
    }
    drop(watch);
    drop(one);
    drop(registry);

    let notes = vec![
        format!(
            "Cold pull: {} runs of each tool, alternating, into fresh directories, from the same \
             docker-registry on loopback; p50 throughput {:.1} MB/s (Skiff) and {:.1} MB/s \
             (skopeo + umoci) for {mb:.1} MB of compressed layers.",
            sz.pulls,
            mb / p50(&ours).as_secs_f64(),
            mb / p50(&theirs).as_secs_f64()
        ),
        format!(
            "Pod start: {} pods of each kind, one at a time, alternating; the image pod's image \
             was pulled by a warm-up pod before (IfNotPresent), so a start mounts a fresh \
             overlay root (one upper directory over the shared layers), writes /etc/hosts, \
             /etc/hostname and /etc/resolv.conf and confines the process (mount and PID \
             namespaces, capabilities); the host pod runs the node's `sleep`.",
            sz.starts
        ),
        format!(
            "Layer sharing: {} pods of the {}-layer image running at once use {:.1} MB of \
             unpacked layers (one copy, shared) and {:.1} MB of writable layers in total; {} \
             copies of the unpacked image would be {:.1} MB ({:.0}x).",
            sz.share_pods,
            LAYERS + 1,
            layer_bytes as f64 / 1e6,
            upper_bytes as f64 / 1e6,
            sz.share_pods,
            copies as f64 / 1e6,
            copies as f64 / (layer_bytes + upper_bytes).max(1) as f64
        ),
    ];
    let params = BTreeMap::from([
        ("layers".to_string(), json!(LAYERS + 1)),
        ("layer_mb".to_string(), json!(sz.layer_mb)),
        ("pulls".to_string(), json!(sz.pulls)),
        ("starts".to_string(), json!(sz.starts)),
        ("share_pods".to_string(), json!(sz.share_pods)),
        ("concurrency".to_string(), json!(opts.concurrency)),
    ]);
    Ok(SuiteReport::new(
        NAME,
        TITLE,
        started_at,
        env,
        Measured {
            quick: opts.quick,
            params,
            series,
            notes,
            details,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_does_not_compress_and_differs_by_seed() {
        let a = noise(1 << 16, 1);
        assert_eq!(a.len(), 1 << 16);
        assert_ne!(a, noise(1 << 16, 2));
        let gz = gz_layer_bytes(&[("x", &a)]);
        assert!(gz.len() > a.len(), "{} <= {}", gz.len(), a.len());
    }

    #[test]
    fn quick_runs_are_small() {
        let quick = sizes(&Options {
            quick: true,
            ..Default::default()
        });
        assert!(quick.layer_mb * LAYERS <= 5 && quick.share_pods <= 5);
        assert_eq!(sizes(&Options::default()).share_pods, 100);
    }
}
