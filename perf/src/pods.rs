//! What the suites share about the pods they create: one watch that timestamps when each pod
//! first reaches the state a suite measures (Running, bound, ...) and when it is deleted, and
//! deleting a batch of pods.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use skiff_api::Resource;
use skiff_api::api::Pod;
use skiff_client::reflector::{Event, reflector};
use skiff_client::{Api, DeleteParams, ListParams};
use tokio::sync::watch;

const WATCH_START_TIMEOUT: Duration = Duration::from_secs(30);

/// What the pod watch has seen.
#[derive(Debug, Default)]
pub struct Seen {
    /// Completed (re)lists; more than 1: the watch was re-established.
    pub lists: usize,
    /// When each pod was first seen in the measured state.
    pub reached: HashMap<String, Instant>,
    pub deleted: HashSet<String>,
}

/// One reflector on the pods a label selector picks, in a task that timestamps events as they
/// arrive. Dropping it stops the task.
#[derive(Debug)]
pub struct PodWatch {
    task: tokio::task::JoinHandle<()>,
    seen: watch::Receiver<Seen>,
}

impl PodWatch {
    /// Starts the watch of the pods `label_selector` selects, recording when each first
    /// satisfies `reached`, and waits until its initial list is done, so no pod created after
    /// this returns can be missed.
    pub async fn start(
        pods: Api<Pod>,
        label_selector: &str,
        reached: fn(&Pod) -> bool,
    ) -> Result<PodWatch> {
        let lp = ListParams::default().labels(label_selector);
        let (tx, seen) = watch::channel(Seen::default());
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(reflector(pods, lp));
            while let Some(ev) = stream.next().await {
                let now = Instant::now();
                let first_reached = |s: &mut Seen, p: &Pod| {
                    if reached(p) {
                        s.reached.entry(p.name().to_string()).or_insert(now);
                    }
                };
                tx.send_modify(|s| match &ev {
                    Event::Restarted(items) => {
                        s.lists += 1;
                        items.iter().for_each(|p| first_reached(s, p));
                    }
                    Event::Applied(p) => first_reached(s, p),
                    Event::Deleted(p) => {
                        s.deleted.insert(p.name().to_string());
                    }
                });
            }
        });
        let watch = PodWatch { task, seen };
        watch
            .wait(Instant::now() + WATCH_START_TIMEOUT, |s| s.lists > 0)
            .await
            .context("starting the pod watch")?;
        Ok(watch)
    }

    /// Waits until `done` holds for what the watch has seen; fails at `deadline`.
    pub async fn wait(&self, deadline: Instant, done: impl FnMut(&Seen) -> bool) -> Result<()> {
        let mut rx = self.seen.clone();
        tokio::time::timeout_at(deadline.into(), rx.wait_for(done))
            .await
            .context("timed out")?
            .context("the watch task ended")?;
        Ok(())
    }

    /// When the watch first saw pod `name` in the measured state; waits for it until
    /// `deadline`.
    pub async fn reached(&self, name: &str, deadline: Instant) -> Result<Instant> {
        self.wait(deadline, |s| s.reached.contains_key(name))
            .await
            .with_context(|| format!("pod {name} not seen in the measured state"))?;
        Ok(self.seen.borrow().reached[name])
    }

    /// When each pod was first seen in the measured state (so far).
    pub fn reached_all(&self) -> HashMap<String, Instant> {
        self.seen.borrow().reached.clone()
    }

    /// Waits until every pod in `names` has been seen deleted.
    pub async fn wait_deleted(&self, names: &[String], timeout: Duration) -> Result<()> {
        self.wait(Instant::now() + timeout, |s| {
            names.iter().all(|n| s.deleted.contains(n))
        })
        .await
        .with_context(|| {
            let seen = self.seen.borrow();
            let missing = names.iter().filter(|n| !seen.deleted.contains(*n)).count();
            format!(
                "{missing} of {} pods not seen deleted within {timeout:?}",
                names.len()
            )
        })
    }

    /// How many times the reflector listed (1: the watch never had to be re-established).
    pub fn lists(&self) -> usize {
        self.seen.borrow().lists
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Deletes the pods `names` (missing ones are fine), `concurrency` calls at a time.
pub async fn delete_all(
    pods: &Api<Pod>,
    names: &[String],
    params: &DeleteParams,
    concurrency: usize,
) -> Result<()> {
    futures::stream::iter(names)
        .map(|name| async move {
            match pods.delete(name, params).await {
                Err(e) if !e.is_not_found() => {
                    Err(e).with_context(|| format!("deleting pod {name}"))
                }
                _ => Ok(()),
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await
}
