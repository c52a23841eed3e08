//! What the API server suites (`control-plane`, `rest-api`, `custom-resources`,
//! `admission-webhooks`) share: REST creates timed with the server's CPU time, the load's shape (creates
//! in flight, watch streams per connection), timed calls with a fixed number in flight (from
//! one caller, or from workers with a connection each), gRPC watchers, and the receipts of many
//! watchers (when each received each item).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use skiff_api::Resource;
use skiff_client::{Client, ListParams, WatchEvent};
use tokio::sync::mpsc;

/// Creates (or puts) in flight at once, on every path the suites compare.
pub const CREATE_CONCURRENCY: usize = 16;
/// gRPC watch streams per client connection (one HTTP/2 connection).
pub const WATCHERS_PER_CONNECTION: usize = 100;

/// Bound for `deliveries` watch deliveries after the writes.
pub fn delivery_timeout(deliveries: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(2) * deliveries as u32
}

/// Calls `call` on every item with `in_flight` calls at once; returns (call start, call end)
/// per item, in item order. Fails with the first failed call.
pub async fn timed_all<I, F, Fut>(
    items: Vec<I>,
    in_flight: usize,
    call: F,
) -> Result<Vec<(Instant, Instant)>>
where
    F: Fn(I) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let call = &call;
    let mut out: Vec<(usize, Instant, Instant)> =
        futures::stream::iter(items.into_iter().enumerate())
            .map(|(i, item)| async move {
                let start = Instant::now();
                call(item).await?;
                Ok::<_, anyhow::Error>((i, start, Instant::now()))
            })
            .buffer_unordered(in_flight.max(1))
            .try_collect()
            .await?;
    out.sort_by_key(|(i, ..)| *i);
    Ok(out.into_iter().map(|(_, s, e)| (s, e)).collect())
}

/// `POST` of `obj` to `path` on the REST API, answered 201 Created; the answer is decoded
/// and must carry a resourceVersion (what a client does with a create's answer).
pub async fn post_created(
    pool: &crate::http1::Pool,
    path: &str,
    obj: &serde_json::Value,
) -> Result<()> {
    let body = serde_json::to_vec(obj).context("encoding the object")?;
    let (status, answer) = pool
        .request(hyper::Method::POST, path, Some(body.into()))
        .await?;
    if status != hyper::StatusCode::CREATED {
        let text = String::from_utf8_lossy(&answer[..answer.len().min(500)]).into_owned();
        bail!("POST {path}: {status}: {text}");
    }
    let created: serde_json::Value =
        serde_json::from_slice(&answer).context("decoding the answer")?;
    if created["metadata"]["resourceVersion"].as_str().is_none() {
        bail!("POST {path}: the answer has no resourceVersion");
    }
    Ok(())
}

/// One series of REST creates: each call's duration, first start → last end, and the API
/// server's CPU time meanwhile.
#[derive(Debug, Clone)]
pub struct RestCreates {
    pub calls: Vec<Duration>,
    pub wall: Duration,
    pub api_cpu: Duration,
}

impl RestCreates {
    pub fn throughput(&self) -> f64 {
        self.calls.len() as f64 / self.wall.as_secs_f64().max(f64::EPSILON)
    }

    pub fn p50(&self) -> Duration {
        let mut secs: Vec<f64> = self.calls.iter().map(Duration::as_secs_f64).collect();
        secs.sort_by(f64::total_cmp);
        Duration::from_secs_f64(crate::stats::percentile(&secs, 50.0))
    }
}

/// [`post_created`] of every object to `path`, `in_flight` at once, timed, with the CPU time
/// of the API server process `api_pid` meanwhile.
pub async fn rest_creates(
    pool: &crate::http1::Pool,
    path: &str,
    objects: Vec<serde_json::Value>,
    in_flight: usize,
    api_pid: u32,
) -> Result<RestCreates> {
    let before = crate::procfs::usage(api_pid)?.cpu;
    let starts = timed_all(objects, in_flight, |o| async move {
        post_created(pool, path, &o).await
    })
    .await?;
    let api_cpu = crate::procfs::usage(api_pid)?.cpu.saturating_sub(before);
    let (calls, wall) = durations(&starts)?;
    Ok(RestCreates {
        calls,
        wall,
        api_cpu,
    })
}

/// Each call's duration, and the wall time from the first start to the last end, of
/// `(start, end)` pairs.
pub fn durations(starts: &[(Instant, Instant)]) -> Result<(Vec<Duration>, Duration)> {
    let first = starts.first().context("no creates")?.0;
    let last = starts.iter().map(|s| s.1).max().context("no creates")?;
    let calls = starts
        .iter()
        .map(|(s, e)| e.saturating_duration_since(*s))
        .collect();
    Ok((calls, last.saturating_duration_since(first)))
}

/// Like [`timed_all`] with one call in flight per worker: `workers` workers each take the next
/// item nobody has taken yet and call `call(worker, item)`, one at a time, until none are left
/// (so a caller can give each worker a connection of its own, e.g. to spread the load over
/// several servers). Returns per item (call start, call end) in item order, and how many calls
/// each worker made. Fails with the first failed call.
pub async fn timed_by_workers<I, F, Fut>(
    items: Vec<I>,
    workers: usize,
    call: F,
) -> Result<(Vec<(Instant, Instant)>, Vec<usize>)>
where
    F: Fn(usize, I) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    if workers == 0 && !items.is_empty() {
        bail!("no workers for {} items", items.len());
    }
    let next = std::cell::RefCell::new(items.into_iter().enumerate());
    let (call, next) = (&call, &next);
    let per_worker = futures::future::try_join_all((0..workers).map(|w| async move {
        let mut done = Vec::new();
        loop {
            // The borrow ends with this statement, before the call is awaited.
            let Some((i, item)) = next.borrow_mut().next() else {
                break;
            };
            let start = Instant::now();
            call(w, item).await?;
            done.push((i, start, Instant::now()));
        }
        Ok::<_, anyhow::Error>(done)
    }))
    .await?;
    let counts = per_worker.iter().map(Vec::len).collect();
    let mut out: Vec<(usize, Instant, Instant)> = per_worker.into_iter().flatten().collect();
    out.sort_by_key(|(i, ..)| *i);
    Ok((out.into_iter().map(|(_, s, e)| (s, e)).collect(), counts))
}

/// The names of the items one watch message carried (empty: nothing the bench waits for).
pub type Names = BoxStream<'static, Result<Vec<String>>>;

/// `count` gRPC watchers (the typed client, objects decoded) of `T` in `namespace` picked by
/// `lp`, [`WATCHERS_PER_CONNECTION`] per connection of their own, all from the revision of
/// one list made first: each yields the name of every ADDED object.
pub async fn api_watchers<T: Resource>(
    config: &skiff_client::ClientConfig,
    namespace: &str,
    lp: &ListParams,
    count: usize,
) -> Result<Vec<Names>> {
    let mut streams = Vec::with_capacity(count);
    let mut api = None;
    let mut rv = String::new();
    for i in 0..count {
        if i % WATCHERS_PER_CONNECTION == 0 {
            let client = Client::connect_with(config)
                .await
                .context("connecting a watcher to the API server")?;
            let objects = client.namespaced::<T>(namespace);
            if i == 0 {
                rv = objects
                    .list(lp)
                    .await
                    .context("listing before the watch")?
                    .resource_version;
            }
            api = Some(objects);
        }
        let objects = api.as_ref().context("no watcher connection")?;
        streams.push(
            objects
                .watch(lp, &rv)
                .map(|ev| match ev {
                    Ok(WatchEvent::Added(o)) => Ok(vec![o.name().to_string()]),
                    Ok(_) => Ok(Vec::new()),
                    Err(e) => Err(anyhow::Error::from(e)),
                })
                .boxed(),
        );
    }
    Ok(streams)
}

/// A message from a watcher task.
enum Msg {
    Got(usize, Vec<String>, Instant),
    Ended(usize, String),
}

/// The watcher tasks of one measurement and when each received each item. Dropping it stops
/// the tasks.
pub struct Receipts {
    rx: mpsc::UnboundedReceiver<Msg>,
    /// Per watcher: when it received each awaited item.
    pub got: Vec<HashMap<String, Instant>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Receipts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receipts")
            .field("watchers", &self.got.len())
            .finish_non_exhaustive()
    }
}

impl Receipts {
    /// One task per stream, timestamping each message as it arrives.
    pub fn spawn(streams: Vec<Names>) -> Receipts {
        let (tx, rx) = mpsc::unbounded_channel();
        let got = vec![HashMap::new(); streams.len()];
        let tasks = streams
            .into_iter()
            .enumerate()
            .map(|(w, mut stream)| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Some(item) = stream.next().await {
                        let now = Instant::now();
                        match item {
                            Ok(names) if names.is_empty() => {}
                            Ok(names) => {
                                if tx.send(Msg::Got(w, names, now)).is_err() {
                                    return;
                                }
                            }
                            Err(e) => {
                                let _ = tx.send(Msg::Ended(w, format!("{e:#}")));
                                return;
                            }
                        }
                    }
                    let _ = tx.send(Msg::Ended(w, "the stream ended".into()));
                })
            })
            .collect();
        Receipts { rx, got, tasks }
    }

    /// Waits until every watcher has received every item of `names`; fails at `deadline` or
    /// when a watch ends.
    pub async fn wait_all(&mut self, names: &[String], deadline: Instant) -> Result<()> {
        let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();
        let mut missing: usize = self
            .got
            .iter()
            .map(|g| wanted.iter().filter(|n| !g.contains_key(**n)).count())
            .sum();
        while missing > 0 {
            let msg = tokio::time::timeout_at(deadline.into(), self.rx.recv())
                .await
                .with_context(|| {
                    format!(
                        "{missing} of {} deliveries missing at the deadline",
                        names.len() * self.got.len()
                    )
                })?
                .context("every watcher task ended")?;
            match msg {
                Msg::Got(w, got, at) => {
                    for name in got {
                        if wanted.contains(name.as_str()) && !self.got[w].contains_key(&name) {
                            self.got[w].insert(name, at);
                            missing -= 1;
                        }
                    }
                }
                Msg::Ended(w, why) => bail!("watcher {w} ended: {why}"),
            }
        }
        Ok(())
    }
}

impl Drop for Receipts {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Latencies from each item's write call start to when watchers got it: per item the
/// latest over the watchers of `got`, every (item, watcher) pair, and the last receipt.
pub fn deliveries(
    names: &[String],
    starts: &[(Instant, Instant)],
    got: &[HashMap<String, Instant>],
) -> Result<(Vec<Duration>, Vec<Duration>, Instant)> {
    let mut last_per_item = Vec::with_capacity(names.len());
    let mut pairs = Vec::with_capacity(names.len() * got.len());
    let mut last = starts.first().map(|s| s.0).context("no items")?;
    for (name, (start, _)) in names.iter().zip(starts) {
        let mut latest = *start;
        for (w, g) in got.iter().enumerate() {
            let at = g
                .get(name)
                .with_context(|| format!("watcher {w} did not receive {name}"))?;
            pairs.push(at.saturating_duration_since(*start));
            latest = latest.max(*at);
        }
        last_per_item.push(latest.saturating_duration_since(*start));
        last = last.max(latest);
    }
    Ok((last_per_item, pairs, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_take_the_last_watcher_per_item() {
        let t0 = Instant::now();
        let ms = |m: u64| t0 + Duration::from_millis(m);
        let names = vec!["a".to_string(), "b".to_string()];
        let starts = vec![(ms(0), ms(1)), (ms(10), ms(11))];
        let got = vec![
            HashMap::from([("a".to_string(), ms(5)), ("b".to_string(), ms(12))]),
            HashMap::from([("a".to_string(), ms(7)), ("b".to_string(), ms(30))]),
        ];
        let (last, pairs, end) = deliveries(&names, &starts, &got).unwrap();
        assert_eq!(last, [Duration::from_millis(7), Duration::from_millis(20)]);
        assert_eq!(pairs.len(), 4);
        assert_eq!(end, ms(30));
        let missing = vec![HashMap::from([("a".to_string(), ms(5))])];
        assert!(deliveries(&names, &starts, &missing).is_err());
    }

    #[tokio::test]
    async fn timed_all_keeps_item_order_and_fails_with_a_call() {
        let out = timed_all(vec![30u64, 0, 10], 3, |ms| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(out.len(), 3);
        assert!(out[0].1 - out[0].0 >= Duration::from_millis(30));
        assert!(out.iter().all(|(s, e)| s <= e));
        let err = timed_all(vec![1, 2], 1, |i| async move {
            if i == 2 { bail!("item {i}") } else { Ok(()) }
        })
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), "item 2");
    }

    #[tokio::test]
    async fn timed_by_workers_gives_every_item_to_one_worker() {
        let seen = std::cell::RefCell::new(Vec::new());
        let (times, counts) = timed_by_workers((0..10u64).collect(), 3, |w, i| {
            seen.borrow_mut().push((w, i));
            async move {
                tokio::time::sleep(Duration::from_millis(i)).await;
                Ok(())
            }
        })
        .await
        .unwrap();
        assert_eq!(times.len(), 10);
        assert!(times[9].1 - times[9].0 >= Duration::from_millis(9));
        assert_eq!(counts.len(), 3);
        assert_eq!(counts.iter().sum::<usize>(), 10);
        assert!(counts.iter().all(|c| *c >= 1), "{counts:?}");
        let mut items: Vec<u64> = seen.borrow().iter().map(|(_, i)| *i).collect();
        items.sort_unstable();
        assert_eq!(items, (0..10).collect::<Vec<_>>());
        // Each worker makes its calls one at a time, so in-flight calls are the workers.
        let err = timed_by_workers(vec![1, 2, 3], 2, |_, i| async move {
            if i == 2 { bail!("item {i}") } else { Ok(()) }
        })
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), "item 2");
        assert!(
            timed_by_workers(vec![1], 0, |_, _| async { Ok(()) })
                .await
                .is_err()
        );
        let (none, counts) = timed_by_workers(Vec::<u8>::new(), 2, |_, _| async { Ok(()) })
            .await
            .unwrap();
        assert!(none.is_empty());
        assert_eq!(counts, [0, 0]);
    }

    #[tokio::test]
    async fn receipts_wait_for_every_watcher() {
        let at = |names: &[&str]| -> Result<Vec<String>> {
            Ok(names.iter().map(|n| n.to_string()).collect())
        };
        let w0: Names = futures::stream::iter(vec![at(&["a"]), at(&[]), at(&["b", "x"])])
            .chain(futures::stream::pending())
            .boxed();
        let w1: Names = futures::stream::iter(vec![at(&["b"]), at(&["a"])])
            .chain(futures::stream::pending())
            .boxed();
        let mut r = Receipts::spawn(vec![w0, w1]);
        let names = vec!["a".to_string(), "b".to_string()];
        r.wait_all(&names, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            r.got
                .iter()
                .all(|g| g.contains_key("a") && g.contains_key("b"))
        );
        assert!(
            !r.got[0].contains_key("x"),
            "only the awaited items are kept"
        );
        // A watcher that ends fails the wait instead of timing out.
        let ended: Names = futures::stream::iter(vec![at(&["a"])]).boxed();
        let mut r = Receipts::spawn(vec![ended]);
        let err = r
            .wait_all(&names, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(format!("{err:#}").contains("ended"), "{err:#}");
    }
}
