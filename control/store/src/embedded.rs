//! An embedded, single-process [`Store`] on [redb](https://docs.rs/redb), for clusters that do
//! not run etcd.
//!
//! # Layout
//!
//! The database file holds three tables:
//!
//! * `kv`: the current value of every live key: `key → (create_revision, mod_revision, value)`.
//!   Deleting a key removes its row, so deleted keys leave no tombstones behind.
//! * `log`: the change log, `revision → (key, new value or None for a delete, previous value)`.
//!   Every successful write adds exactly one entry, so revisions in the log are dense. It serves
//!   watches that start in the past and listings at an older revision (the current state with
//!   the newer entries undone).
//! * `meta`: the current revision and the compacted revision (entries older than it are gone).
//!
//! # Writes
//!
//! All writes go through one dedicated writer thread, which applies each operation inside a
//! redb write transaction (queued operations are grouped into one transaction, each with its
//! own revision, and committed together: "group commit"). After the commit, it publishes the
//! new events, in revision order, to an in-process broadcast channel that feeds live watches.
//! The same thread compacts the log automatically (see [`EmbeddedOptions`]).
//!
//! # Watches
//!
//! A watch subscribes to the broadcast channel first, then replays the log from its start
//! revision, then follows the broadcast channel, skipping what it already delivered. A watcher
//! that falls behind (its consumer is slow) loses broadcast messages, never blocks writers, and
//! resumes from the log; if the log was compacted past it, it ends with
//! [`StoreError::Compacted`]. As with etcd, a watch needs `after_revision` to be at least the
//! compacted revision, and a listing needs its revision to be at least the compacted revision.
//!
//! # Size
//!
//! Automatic compaction keeps the log to about [`EmbeddedOptions::retain_revisions`] entries,
//! and redb reuses the pages freed by compaction and by overwritten values, so the file size
//! follows the live data plus the retained history instead of growing with every write.
//!
//! # Files
//!
//! The database file is mode 0600 in a directory of mode 0700 (both set on open, whatever the
//! umask, as etcd keeps its data directory); snapshots and restores are written to a
//! temporary with a random name beside their destination (never in a shared temporary
//! directory), mode 0600, and renamed into place ([`skiff_pki::files`]).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{
    Database, DatabaseError, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use skiff_pki::files;
use tokio::sync::{broadcast, oneshot};
use tracing::{debug, info, warn};

use crate::{
    EMBEDDED_SNAPSHOT_FORMAT, KeyValue, Listing, Result, Snapshot, Store, StoreError, WatchEvent,
    WatchStream,
};

/// Current keys: key → (create_revision, mod_revision, value).
const KV: TableDefinition<&str, (i64, i64, &[u8])> = TableDefinition::new("kv");
/// Change log: revision → (key, new value (None: deleted), previous (create, mod, value)).
const LOG: TableDefinition<i64, LogValue> = TableDefinition::new("log");
/// Store metadata, see the `META_*` keys.
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");

/// A change-log row: (key, new value or `None` for a delete, previous (create, mod, value)).
type LogRow<'a> = (&'a str, Option<&'a [u8]>, Option<(i64, i64, &'a [u8])>);
type LogValue = LogRow<'static>;

/// Meta key: the store's current revision.
const META_REVISION: &str = "revision";
/// Meta key: the compacted revision; log entries below it are gone.
const META_COMPACTED: &str = "compacted";

/// The revision of an empty store, as in etcd. Revision 0 never names a state, so
/// `resourceVersion=0` can keep its Kubernetes meaning ("any").
const INITIAL_REVISION: i64 = 1;
/// Most operations committed in one write transaction.
const MAX_BATCH: usize = 256;
/// Most log entries removed in one compaction transaction.
const COMPACT_CHUNK: i64 = 10_000;
/// Most log entries a watcher reads in one catch-up step.
const WATCH_READ_BATCH: usize = 2_048;
/// How long [`EmbeddedStore::open`] waits for a previous handle on the same file to close.
const OPEN_RETRY_FOR: Duration = Duration::from_secs(3);

/// Tuning of an [`EmbeddedStore`].
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// How many revisions of history automatic compaction keeps: it compacts to
    /// `current_revision - retain_revisions`. Default 10 000.
    pub retain_revisions: u64,
    /// How often automatic compaction runs. [`Duration::ZERO`] disables it. Default 60 s.
    pub compact_interval: Duration,
    /// How many events the in-process fan-out buffers for live watchers. A watcher further
    /// behind than this catches up from the change log instead. Default 4 096.
    pub watch_buffer: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        Self {
            retain_revisions: 10_000,
            compact_interval: Duration::from_secs(60),
            watch_buffer: 4_096,
        }
    }
}

/// State shared by the store handle, its writer thread and (weakly) its watchers.
struct Shared {
    db: Database,
    /// Events of committed writes, in revision order.
    events: broadcast::Sender<Arc<WatchEvent>>,
}

/// A write operation, applied by the writer thread.
enum Op {
    Create {
        key: String,
        value: Vec<u8>,
    },
    Update {
        key: String,
        value: Vec<u8>,
        expected: i64,
    },
    Delete {
        key: String,
        expected: Option<i64>,
    },
}

/// What a successful [`Op`] returns to its caller.
enum OpOutput {
    Put(KeyValue),
    Deleted(KeyValue, i64),
}

enum Request {
    Op(Op, oneshot::Sender<Result<OpOutput>>),
    Compact(i64, oneshot::Sender<Result<()>>),
}

/// An embedded [`Store`] backed by a redb database file. See the [module docs](self).
///
/// Dropping the store stops its writer thread (and with it automatic compaction), closes the
/// database, and ends its watches with [`StoreError::Backend`].
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    requests: Option<mpsc::Sender<Request>>,
    writer: Option<JoinHandle<()>>,
    /// Cleared when the writer thread exits (checked by tests).
    #[cfg_attr(not(test), allow(dead_code))]
    writer_running: Arc<AtomicBool>,
    path: PathBuf,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn backend(context: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("{context}: {e}"))
}

impl EmbeddedStore {
    /// Opens (or creates) the database at `path` and starts its writer thread.
    ///
    /// This blocks while redb opens the file (which may include recovering it after a crash),
    /// so call it at startup or from `spawn_blocking`. It does not need a tokio runtime, but
    /// the [`Store`] methods do. If another handle on the same file is still closing in this
    /// process, this waits for it for a few seconds.
    pub fn open(path: &Path, opts: EmbeddedOptions) -> Result<Self> {
        let db = open_database(path)?;
        init_tables(&db)?;
        let (events, _) = broadcast::channel(opts.watch_buffer.max(1));
        let shared = Arc::new(Shared { db, events });
        let (tx, rx) = mpsc::channel();
        let writer_running = Arc::new(AtomicBool::new(true));
        let writer = {
            let shared = shared.clone();
            let running = writer_running.clone();
            let opts = opts.clone();
            std::thread::Builder::new()
                .name("skiff-store-writer".into())
                .spawn(move || {
                    writer_loop(&shared, &rx, &opts);
                    running.store(false, Ordering::SeqCst);
                })
                .map_err(|e| backend("spawning the writer thread", e))?
        };
        info!(path = %path.display(), retain_revisions = opts.retain_revisions,
            compact_interval = ?opts.compact_interval, "opened embedded store");
        Ok(Self {
            shared,
            requests: Some(tx),
            writer: Some(writer),
            writer_running,
            path: path.to_path_buf(),
        })
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The revision below which history has been compacted (0 if never compacted).
    pub async fn compacted_revision(&self) -> Result<i64> {
        self.read(|db| {
            let txn = db.begin_read().map_err(|e| backend("begin read", e))?;
            let meta = txn.open_table(META).map_err(|e| backend("open meta", e))?;
            meta_get(&meta, META_COMPACTED)
        })
        .await
    }

    /// Runs a blocking read against the database on tokio's blocking pool.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T> + Send + 'static,
    {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&shared.db))
            .await
            .map_err(|e| backend("read task", e))?
    }

    fn send(&self, request: Request) -> Result<()> {
        self.requests
            .as_ref()
            .ok_or_else(|| StoreError::Backend("store is closed".into()))?
            .send(request)
            .map_err(|_| StoreError::Backend("store writer thread has stopped".into()))
    }

    async fn write(&self, op: Op) -> Result<OpOutput> {
        let (tx, rx) = oneshot::channel();
        self.send(Request::Op(op, tx))?;
        rx.await
            .map_err(|_| StoreError::Backend("store writer thread has stopped".into()))?
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // Closing the request channel makes the writer thread finish its queue and exit; it
        // holds the last long-lived reference to the database besides this handle.
        drop(self.requests.take());
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            warn!("embedded store writer thread panicked");
        }
        debug!(path = %self.path.display(), "closed embedded store");
    }
}

/// Makes the store's directory private (0700) and its file 0600 (created if missing, an
/// existing one's mode corrected), before redb opens it.
fn make_private(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        files::private_dir(dir).map_err(|e| backend(&format!("creating {}", dir.display()), e))?;
    }
    files::open_private(path)
        .map(drop)
        .map_err(|e| backend(&format!("opening {}", path.display()), e))
}

fn open_database(path: &Path) -> Result<Database> {
    make_private(path)?;
    let deadline = Instant::now() + OPEN_RETRY_FOR;
    loop {
        match Database::create(path) {
            Ok(db) => return Ok(db),
            // A handle dropped a moment ago may still be held by a finishing blocking read.
            Err(DatabaseError::DatabaseAlreadyOpen) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(backend(&format!("opening {}", path.display()), e)),
        }
    }
}

fn init_tables(db: &Database) -> Result<()> {
    let txn = db.begin_write().map_err(|e| backend("begin write", e))?;
    {
        txn.open_table(KV).map_err(|e| backend("open kv", e))?;
        txn.open_table(LOG).map_err(|e| backend("open log", e))?;
        let mut meta = txn.open_table(META).map_err(|e| backend("open meta", e))?;
        for (key, initial) in [(META_REVISION, INITIAL_REVISION), (META_COMPACTED, 0)] {
            let present = meta
                .get(key)
                .map_err(|e| backend("read meta", e))?
                .is_some();
            if !present {
                meta.insert(key, initial)
                    .map_err(|e| backend("write meta", e))?;
            }
        }
    }
    txn.commit().map_err(|e| backend("commit", e))
}

fn meta_get(meta: &impl ReadableTable<&'static str, i64>, key: &str) -> Result<i64> {
    Ok(meta
        .get(key)
        .map_err(|e| backend("read meta", e))?
        .ok_or_else(|| StoreError::Backend(format!("corrupt store: meta key {key} is missing")))?
        .value())
}

fn kv_from_row(key: &str, (create_revision, mod_revision, value): (i64, i64, &[u8])) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: value.to_vec(),
        create_revision,
        mod_revision,
    }
}

/// Rebuilds the watch event stored in the log at `revision`.
fn event_from_log(revision: i64, (key, value, prev): LogRow<'_>) -> Result<WatchEvent> {
    let prev = prev.map(|row| kv_from_row(key, row));
    match value {
        Some(value) => Ok(WatchEvent::Put {
            kv: KeyValue {
                key: key.to_owned(),
                value: value.to_vec(),
                create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
                mod_revision: revision,
            },
            prev,
        }),
        None => Ok(WatchEvent::Delete {
            prev: prev.ok_or_else(|| {
                StoreError::Backend(format!(
                    "corrupt store: delete at revision {revision} has no previous value"
                ))
            })?,
            revision,
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Writer thread
// ---------------------------------------------------------------------------------------------

fn writer_loop(shared: &Shared, requests: &mpsc::Receiver<Request>, opts: &EmbeddedOptions) {
    let auto_compact = !opts.compact_interval.is_zero();
    let mut next_compaction = Instant::now() + opts.compact_interval;
    loop {
        let first = if auto_compact {
            let wait = next_compaction.saturating_duration_since(Instant::now());
            match requests.recv_timeout(wait) {
                Ok(request) => Some(request),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match requests.recv() {
                Ok(request) => Some(request),
                Err(_) => break,
            }
        };
        if let Some(first) = first {
            // Group commit: take whatever else is queued right now.
            let mut ops = Vec::new();
            let mut pending = Some(first);
            while let Some(request) = pending.take() {
                match request {
                    Request::Op(op, reply) => ops.push((op, reply)),
                    Request::Compact(revision, reply) => {
                        // Keep request order: commit the operations queued before it first.
                        commit_ops(shared, std::mem::take(&mut ops));
                        let _ = reply.send(compact(&shared.db, revision));
                    }
                }
                if ops.len() < MAX_BATCH {
                    match requests.try_recv() {
                        Ok(request) => pending = Some(request),
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
                    }
                }
            }
            commit_ops(shared, ops);
        }
        if auto_compact && Instant::now() >= next_compaction {
            auto_compaction(&shared.db, opts.retain_revisions);
            next_compaction = Instant::now() + opts.compact_interval;
        }
    }
    debug!("embedded store writer thread exiting");
}

fn auto_compaction(db: &Database, retain: u64) {
    let current = match current_and_compacted(db) {
        Ok((current, _)) => current,
        Err(e) => {
            warn!(error = %e, "automatic compaction: cannot read the current revision");
            return;
        }
    };
    let target = current.saturating_sub(i64::try_from(retain).unwrap_or(i64::MAX));
    if target <= 0 {
        return;
    }
    match compact(db, target) {
        Ok(()) => debug!(revision = target, "automatic compaction done"),
        Err(e) => warn!(error = %e, revision = target, "automatic compaction failed"),
    }
}

fn current_and_compacted(db: &Database) -> Result<(i64, i64)> {
    let txn = db.begin_read().map_err(|e| backend("begin read", e))?;
    let meta = txn.open_table(META).map_err(|e| backend("open meta", e))?;
    Ok((
        meta_get(&meta, META_REVISION)?,
        meta_get(&meta, META_COMPACTED)?,
    ))
}

/// Copies one read transaction's state (every live key and the revision) into a new
/// database at `dest`, its history compacted to that revision: a crash-consistent snapshot
/// taken while the writer goes on (redb's reads see one committed state).
fn write_snapshot(db: &Database, dest: &Path) -> Result<Snapshot> {
    if dest.exists() {
        return Err(StoreError::Backend(format!(
            "{} exists: a snapshot is written to a new file",
            dest.display()
        )));
    }
    let txn = db.begin_read().map_err(|e| backend("begin read", e))?;
    let kv = txn.open_table(KV).map_err(|e| backend("open kv", e))?;
    let meta = txn.open_table(META).map_err(|e| backend("open meta", e))?;
    let revision = meta_get(&meta, META_REVISION)?;
    let tmp = files::temp_beside(dest).map_err(|e| {
        backend(
            &format!("creating a temporary beside {}", dest.display()),
            e,
        )
    })?;
    let out = Database::create(tmp.path())
        .map_err(|e| backend(&format!("creating {}", tmp.path().display()), e))?;
    let w = out.begin_write().map_err(|e| backend("begin write", e))?;
    {
        let mut to = w.open_table(KV).map_err(|e| backend("open kv", e))?;
        for row in kv.iter().map_err(|e| backend("read kv", e))? {
            let (key, value) = row.map_err(|e| backend("read kv", e))?;
            to.insert(key.value(), value.value())
                .map_err(|e| backend("write kv", e))?;
        }
        w.open_table(LOG).map_err(|e| backend("open log", e))?;
        let mut to = w.open_table(META).map_err(|e| backend("open meta", e))?;
        for key in [META_REVISION, META_COMPACTED] {
            to.insert(key, revision)
                .map_err(|e| backend("write meta", e))?;
        }
    }
    w.commit().map_err(|e| backend("commit the snapshot", e))?;
    drop(out);
    let file = files::persist_new(tmp, dest)
        .map_err(|e| backend(&format!("renaming the snapshot to {}", dest.display()), e))?;
    let bytes = file
        .metadata()
        .map_err(|e| backend(&format!("reading {}", dest.display()), e))?
        .len();
    Ok(Snapshot {
        revision: Some(revision),
        format: EMBEDDED_SNAPSHOT_FORMAT,
        bytes,
    })
}

/// Restores the embedded-store snapshot `snapshot` (from [`Store::snapshot`]) as the new
/// database file `dest`, which must not exist (the API server over it is stopped): the
/// snapshot is copied beside `dest`, opened and checked (its tables and revision), synced,
/// then renamed into place, so a failure leaves no half-restored `dest`. Returns what it
/// restored.
pub fn restore_snapshot(snapshot: &Path, dest: &Path) -> Result<Snapshot> {
    if dest.exists() {
        return Err(StoreError::Backend(format!(
            "{} exists: move it away first (restore writes a new store file)",
            dest.display()
        )));
    }
    let tmp = files::temp_beside(dest).map_err(|e| {
        backend(
            &format!("creating a temporary beside {}", dest.display()),
            e,
        )
    })?;
    let copied = std::fs::File::open(snapshot)
        .and_then(|mut from| std::io::copy(&mut from, &mut tmp.as_file()))
        .map_err(|e| backend(&format!("copying {}", snapshot.display()), e));
    let checked = copied.and_then(|bytes| {
        let db = Database::open(tmp.path()).map_err(|e| {
            backend(
                &format!("{} is not an embedded-store snapshot", snapshot.display()),
                e,
            )
        })?;
        let (revision, compacted) = current_and_compacted(&db)?;
        let txn = db.begin_read().map_err(|e| backend("begin read", e))?;
        txn.open_table(KV).map_err(|e| backend("open kv", e))?;
        txn.open_table(LOG).map_err(|e| backend("open log", e))?;
        drop(txn);
        drop(db);
        if compacted > revision {
            return Err(StoreError::Backend(format!(
                "corrupt snapshot: compacted revision {compacted} above revision {revision}"
            )));
        }
        tmp.as_file()
            .sync_all()
            .map_err(|e| backend("syncing the restored store", e))?;
        Ok(Snapshot {
            revision: Some(revision),
            format: EMBEDDED_SNAPSHOT_FORMAT,
            bytes,
        })
    })?;
    files::persist_new(tmp, dest)
        .map_err(|e| backend(&format!("renaming into {}", dest.display()), e))?;
    Ok(checked)
}

/// Removes log entries below `revision`, in chunks so no transaction gets huge.
fn compact(db: &Database, revision: i64) -> Result<()> {
    let (current, mut compacted) = current_and_compacted(db)?;
    if revision > current {
        return Err(StoreError::FutureRevision {
            requested: revision,
            current,
        });
    }
    if revision <= compacted {
        return Ok(());
    }
    while compacted < revision {
        let upto = revision.min(compacted.saturating_add(COMPACT_CHUNK));
        let txn = db.begin_write().map_err(|e| backend("begin write", e))?;
        {
            let mut log = txn.open_table(LOG).map_err(|e| backend("open log", e))?;
            log.retain_in(..upto, |_, _| false)
                .map_err(|e| backend("compacting the log", e))?;
            let mut meta = txn.open_table(META).map_err(|e| backend("open meta", e))?;
            meta.insert(META_COMPACTED, upto)
                .map_err(|e| backend("write meta", e))?;
        }
        txn.commit().map_err(|e| backend("commit", e))?;
        compacted = upto;
    }
    debug!(revision, "compacted embedded store");
    Ok(())
}

/// Applies `ops` in one write transaction, then publishes their events and answers them.
fn commit_ops(shared: &Shared, ops: Vec<(Op, oneshot::Sender<Result<OpOutput>>)>) {
    if ops.is_empty() {
        return;
    }
    match apply_batch(&shared.db, &ops) {
        Ok(results) => {
            for ((_, reply), (result, event)) in ops.into_iter().zip(results) {
                if let Some(event) = event {
                    // No receivers is fine; a lagging receiver catches up from the log.
                    let _ = shared.events.send(Arc::new(event));
                }
                let _ = reply.send(result);
            }
        }
        Err(e) => {
            warn!(error = %e, operations = ops.len(), "embedded store write failed");
            for (_, reply) in ops {
                let _ = reply.send(Err(StoreError::Backend(e.to_string())));
            }
        }
    }
}

type Applied = (Result<OpOutput>, Option<WatchEvent>);

fn apply_batch(
    db: &Database,
    ops: &[(Op, oneshot::Sender<Result<OpOutput>>)],
) -> Result<Vec<Applied>> {
    let txn = db.begin_write().map_err(|e| backend("begin write", e))?;
    let results = apply_in_txn(&txn, ops)?;
    txn.commit().map_err(|e| backend("commit", e))?;
    Ok(results)
}

fn apply_in_txn(
    txn: &WriteTransaction,
    ops: &[(Op, oneshot::Sender<Result<OpOutput>>)],
) -> Result<Vec<Applied>> {
    let mut kv = txn.open_table(KV).map_err(|e| backend("open kv", e))?;
    let mut log = txn.open_table(LOG).map_err(|e| backend("open log", e))?;
    let mut meta = txn.open_table(META).map_err(|e| backend("open meta", e))?;
    let mut revision = meta_get(&meta, META_REVISION)?;
    let mut results = Vec::with_capacity(ops.len());
    for (op, _) in ops {
        let key = match op {
            Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => key,
        };
        if key.is_empty() {
            results.push((Err(StoreError::Backend("empty key".into())), None));
            continue;
        }
        let current = kv
            .get(key.as_str())
            .map_err(|e| backend("read kv", e))?
            .map(|row| kv_from_row(key, row.value()));
        // Check the preconditions; on failure nothing has been written for this op.
        let checked = match (op, &current) {
            (Op::Create { .. }, Some(_)) => Err(StoreError::AlreadyExists { key: key.clone() }),
            (Op::Update { .. } | Op::Delete { .. }, None) => {
                Err(StoreError::NotFound { key: key.clone() })
            }
            (Op::Update { expected, .. }, Some(cur))
            | (
                Op::Delete {
                    expected: Some(expected),
                    ..
                },
                Some(cur),
            ) if cur.mod_revision != *expected => Err(StoreError::Conflict {
                key: key.clone(),
                expected: *expected,
                actual: cur.mod_revision,
            }),
            _ => Ok(()),
        };
        if let Err(e) = checked {
            results.push((Err(e), None));
            continue;
        }
        let next = revision + 1;
        let prev_row = current
            .as_ref()
            .map(|p| (p.create_revision, p.mod_revision, p.value.as_slice()));
        let applied = match op {
            Op::Create { value, .. } | Op::Update { value, .. } => {
                let create_revision = current.as_ref().map_or(next, |p| p.create_revision);
                kv.insert(key.as_str(), (create_revision, next, value.as_slice()))
                    .map_err(|e| backend("write kv", e))?;
                log.insert(next, (key.as_str(), Some(value.as_slice()), prev_row))
                    .map_err(|e| backend("write log", e))?;
                let new = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision,
                    mod_revision: next,
                };
                let event = WatchEvent::Put {
                    kv: new.clone(),
                    prev: current,
                };
                (Ok(OpOutput::Put(new)), Some(event))
            }
            Op::Delete { .. } => {
                kv.remove(key.as_str())
                    .map_err(|e| backend("write kv", e))?;
                log.insert(next, (key.as_str(), None, prev_row))
                    .map_err(|e| backend("write log", e))?;
                let Some(prev) = current else {
                    // Unreachable: a missing key failed the checks above.
                    return Err(StoreError::Backend("delete of a missing key".into()));
                };
                let event = WatchEvent::Delete {
                    prev: prev.clone(),
                    revision: next,
                };
                (Ok(OpOutput::Deleted(prev, next)), Some(event))
            }
        };
        revision = next;
        results.push(applied);
    }
    meta.insert(META_REVISION, revision)
        .map_err(|e| backend("write meta", e))?;
    Ok(results)
}

// ---------------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------------

fn get_key(db: &Database, key: &str) -> Result<Option<KeyValue>> {
    let txn = db.begin_read().map_err(|e| backend("begin read", e))?;
    let kv = txn.open_table(KV).map_err(|e| backend("open kv", e))?;
    Ok(kv
        .get(key)
        .map_err(|e| backend("read kv", e))?
        .map(|row| kv_from_row(key, row.value())))
}

fn list_prefix(db: &Database, prefix: &str, revision: Option<i64>) -> Result<Listing> {
    let txn = db.begin_read().map_err(|e| backend("begin read", e))?;
    let meta = txn.open_table(META).map_err(|e| backend("open meta", e))?;
    let current = meta_get(&meta, META_REVISION)?;
    let compacted = meta_get(&meta, META_COMPACTED)?;
    let at = match revision {
        None | Some(0) => current,
        Some(r) if r > current => {
            return Err(StoreError::FutureRevision {
                requested: r,
                current,
            });
        }
        Some(r) if r < compacted || r < 0 => {
            return Err(StoreError::Compacted {
                requested: r,
                compacted,
            });
        }
        Some(r) => r,
    };

    let kv = txn.open_table(KV).map_err(|e| backend("open kv", e))?;
    let mut items = BTreeMap::new();
    for entry in kv.range(prefix..).map_err(|e| backend("read kv", e))? {
        let (key, row) = entry.map_err(|e| backend("read kv", e))?;
        let key = key.value();
        if !key.starts_with(prefix) {
            break;
        }
        items.insert(key.to_owned(), kv_from_row(key, row.value()));
    }

    if at < current {
        // Undo the newer changes, newest first: each entry restores the previous value.
        let log = txn.open_table(LOG).map_err(|e| backend("open log", e))?;
        for entry in log
            .range((at + 1)..)
            .map_err(|e| backend("read log", e))?
            .rev()
        {
            let (_, row) = entry.map_err(|e| backend("read log", e))?;
            let (key, _, prev) = row.value();
            if !key.starts_with(prefix) {
                continue;
            }
            match prev {
                Some(prev) => items.insert(key.to_owned(), kv_from_row(key, prev)),
                None => items.remove(key),
            };
        }
    }
    Ok(Listing {
        items: items.into_values().collect(),
        revision: at,
    })
}

/// Log entries after `after`, at most [`WATCH_READ_BATCH`] scanned.
struct LogBatch {
    /// Events under the prefix.
    events: Vec<WatchEvent>,
    /// The last revision scanned (`after` if none).
    last: i64,
    /// Whether the end of the log was reached.
    complete: bool,
}

fn read_log(db: &Database, prefix: &str, after: i64) -> Result<LogBatch> {
    let txn = db.begin_read().map_err(|e| backend("begin read", e))?;
    let meta = txn.open_table(META).map_err(|e| backend("open meta", e))?;
    let compacted = meta_get(&meta, META_COMPACTED)?;
    // Like etcd, which cannot give the previous value of a change at the compacted revision
    // itself, serve watches only from the compacted revision on.
    if after < compacted {
        return Err(StoreError::Compacted {
            requested: after + 1,
            compacted,
        });
    }
    let log = txn.open_table(LOG).map_err(|e| backend("open log", e))?;
    let mut batch = LogBatch {
        events: Vec::new(),
        last: after,
        complete: true,
    };
    for (scanned, entry) in log
        .range((after + 1)..)
        .map_err(|e| backend("read log", e))?
        .enumerate()
    {
        if scanned == WATCH_READ_BATCH {
            batch.complete = false;
            break;
        }
        let (revision, row) = entry.map_err(|e| backend("read log", e))?;
        let revision = revision.value();
        let row = row.value();
        batch.last = revision;
        if row.0.starts_with(prefix) {
            batch.events.push(event_from_log(revision, row)?);
        }
    }
    Ok(batch)
}

// ---------------------------------------------------------------------------------------------
// Watches
// ---------------------------------------------------------------------------------------------

struct WatchState {
    shared: Weak<Shared>,
    live: broadcast::Receiver<Arc<WatchEvent>>,
    prefix: String,
    /// Every revision up to this one has been delivered (or skipped as not under the prefix).
    last: i64,
    /// Whether the watcher is replaying the log (true) or following the broadcast (false).
    catching_up: bool,
    buffered: VecDeque<WatchEvent>,
    done: bool,
}

impl WatchState {
    async fn next(&mut self) -> Option<Result<WatchEvent>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(event) = self.buffered.pop_front() {
                return Some(Ok(event));
            }
            if self.catching_up {
                if let Err(e) = self.catch_up().await {
                    self.done = true;
                    return Some(Err(e));
                }
                continue;
            }
            match self.live.recv().await {
                Ok(event) => {
                    let revision = event.revision();
                    if revision <= self.last {
                        continue; // already delivered from the log
                    }
                    if revision != self.last + 1 {
                        // A gap should not happen, but the log can always fill it.
                        self.catching_up = true;
                        continue;
                    }
                    self.last = revision;
                    if event.key().starts_with(&self.prefix) {
                        return Some(Ok(WatchEvent::clone(&event)));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    debug!(
                        missed,
                        after = self.last,
                        "watcher lagged; catching up from the log"
                    );
                    self.catching_up = true;
                }
                Err(broadcast::error::RecvError::Closed) => {
                    self.done = true;
                    return Some(Err(StoreError::Backend("store is closed".into())));
                }
            }
        }
    }

    async fn catch_up(&mut self) -> Result<()> {
        let shared = self
            .shared
            .upgrade()
            .ok_or_else(|| StoreError::Backend("store is closed".into()))?;
        let prefix = self.prefix.clone();
        let after = self.last;
        let batch = tokio::task::spawn_blocking(move || read_log(&shared.db, &prefix, after))
            .await
            .map_err(|e| backend("watch read task", e))??;
        self.last = batch.last;
        self.buffered.extend(batch.events);
        self.catching_up = !batch.complete;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let key = key.to_owned();
        self.read(move |db| get_key(db, &key)).await
    }

    async fn list(&self, prefix: &str, revision: Option<i64>) -> Result<Listing> {
        let prefix = prefix.to_owned();
        self.read(move |db| list_prefix(db, &prefix, revision))
            .await
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        match self
            .write(Op::Create {
                key: key.to_owned(),
                value,
            })
            .await?
        {
            OpOutput::Put(kv) => Ok(kv),
            OpOutput::Deleted(..) => Err(StoreError::Backend("unexpected write result".into())),
        }
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected_revision: i64) -> Result<KeyValue> {
        match self
            .write(Op::Update {
                key: key.to_owned(),
                value,
                expected: expected_revision,
            })
            .await?
        {
            OpOutput::Put(kv) => Ok(kv),
            OpOutput::Deleted(..) => Err(StoreError::Backend("unexpected write result".into())),
        }
    }

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        match self
            .write(Op::Delete {
                key: key.to_owned(),
                expected: expected_revision,
            })
            .await?
        {
            OpOutput::Deleted(prev, revision) => Ok((prev, revision)),
            OpOutput::Put(_) => Err(StoreError::Backend("unexpected write result".into())),
        }
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<WatchStream> {
        if after_revision < 0 {
            return Err(StoreError::Backend(format!(
                "invalid watch revision {after_revision}"
            )));
        }
        // Subscribe before reading the log, so no revision falls between the two.
        let state = WatchState {
            shared: Arc::downgrade(&self.shared),
            live: self.shared.events.subscribe(),
            prefix: prefix.to_owned(),
            last: after_revision,
            catching_up: true,
            buffered: VecDeque::new(),
            done: false,
        };
        let stream = futures::stream::unfold(state, |mut state| async move {
            state.next().await.map(|item| (item, state))
        });
        Ok(Box::pin(stream))
    }

    async fn current_revision(&self) -> Result<i64> {
        self.read(|db| current_and_compacted(db).map(|(current, _)| current))
            .await
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send(Request::Compact(revision, tx))?;
        rx.await
            .map_err(|_| StoreError::Backend("store writer thread has stopped".into()))?
    }

    async fn snapshot(&self, dest: &Path) -> Result<Snapshot> {
        let dest = dest.to_path_buf();
        self.read(move |db| write_snapshot(db, &dest)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use redb::ReadableTableMetadata;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// The store file is 0600 in a 0700 directory and a snapshot or restore is 0600, written
    /// beside its destination (nothing in the shared temporary directory), under a permissive
    /// (022, 000) umask; a store file and directory left open by an older version are closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn store_and_snapshot_files_are_private_whatever_the_umask() {
        use nix::sys::stat::{Mode, umask};
        for m in [0o022, 0o000] {
            let dir = tempfile::tempdir().unwrap();
            let old = umask(Mode::from_bits_truncate(m));
            let data = dir.path().join("state/data");
            let path = data.join("skiff.redb");
            let store = EmbeddedStore::open(&path, opts_no_auto()).unwrap();
            store.create("/k", b"v".to_vec()).await.unwrap();
            let snaps = dir.path().join("snaps");
            std::fs::create_dir(&snaps).unwrap();
            let snap = snaps.join("s.db");
            store.snapshot(&snap).await.unwrap();
            let restored = dir.path().join("state/data/restored.redb");
            restore_snapshot(&snap, &restored).unwrap();
            umask(old);
            assert_eq!(mode(&data), 0o700, "umask {m:o}: the data directory");
            assert_eq!(mode(&path), 0o600, "umask {m:o}: the store file");
            assert_eq!(mode(&snap), 0o600, "umask {m:o}: the snapshot");
            assert_eq!(mode(&restored), 0o600, "umask {m:o}: the restored store");
            let names = |d: &Path| {
                let mut v: Vec<String> = std::fs::read_dir(d)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            };
            assert_eq!(names(&snaps), ["s.db"], "no temporary beside the snapshot");
            assert_eq!(names(&data), ["restored.redb", "skiff.redb"]);
            drop(store);
            // A store left world-readable (an older version, a copied file) is closed.
            std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let store = EmbeddedStore::open(&path, opts_no_auto()).unwrap();
            assert_eq!(mode(&data), 0o700);
            assert_eq!(mode(&path), 0o600);
            assert!(store.get("/k").await.unwrap().is_some());
        }
    }

    fn opts_no_auto() -> EmbeddedOptions {
        EmbeddedOptions {
            compact_interval: Duration::ZERO,
            ..EmbeddedOptions::default()
        }
    }

    #[tokio::test]
    async fn restart_keeps_revision_and_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let store = EmbeddedStore::open(&path, opts_no_auto()).unwrap();
        let a = store.create("/r/a", b"1".to_vec()).await.unwrap();
        let a = store
            .update("/r/a", b"2".to_vec(), a.mod_revision)
            .await
            .unwrap();
        let b = store.create("/r/b", b"x".to_vec()).await.unwrap();
        store.delete("/r/b", Some(b.mod_revision)).await.unwrap();
        let before = store.current_revision().await.unwrap();
        drop(store);

        let store = EmbeddedStore::open(&path, opts_no_auto()).unwrap();
        assert_eq!(store.current_revision().await.unwrap(), before);
        assert_eq!(store.get("/r/a").await.unwrap(), Some(a.clone()));
        assert_eq!(store.get("/r/b").await.unwrap(), None);
        let c = store.create("/r/c", b"y".to_vec()).await.unwrap();
        assert_eq!(c.mod_revision, before + 1);
        // The history survives the restart too.
        let old = store.list("/r/", Some(b.mod_revision)).await.unwrap();
        assert_eq!(old.items.len(), 2);
    }

    #[tokio::test]
    async fn deleted_keys_leave_no_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("s.redb"), opts_no_auto()).unwrap();
        for i in 0..100 {
            let kv = store.create(&format!("/t/{i}"), vec![1; 10]).await.unwrap();
            store.delete(&kv.key, None).await.unwrap();
        }
        let current = store.current_revision().await.unwrap();
        store.compact(current).await.unwrap();
        let (kv_rows, log_rows) = store
            .read(|db| {
                let txn = db.begin_read().unwrap();
                let kv = txn.open_table(KV).unwrap().len().unwrap();
                let log = txn.open_table(LOG).unwrap().len().unwrap();
                Ok((kv, log))
            })
            .await
            .unwrap();
        assert_eq!(kv_rows, 0);
        // Compaction keeps the entry at the compacted revision itself.
        assert_eq!(log_rows, 1);
    }

    /// 50 000 updates of 32 keys (256-byte values) into a store opened with `opts`.
    async fn bloat(path: &std::path::Path, opts: EmbeddedOptions) -> Arc<EmbeddedStore> {
        const KEYS: usize = 32;
        const UPDATES: usize = 50_000;
        let store = Arc::new(EmbeddedStore::open(path, opts).unwrap());
        let value = vec![7u8; 256];
        let mut tasks = Vec::new();
        for k in 0..KEYS {
            let store = store.clone();
            let value = value.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("/bloat/{k}");
                let mut rev = store
                    .create(&key, value.clone())
                    .await
                    .unwrap()
                    .mod_revision;
                for _ in 0..UPDATES / KEYS {
                    rev = store
                        .update(&key, value.clone(), rev)
                        .await
                        .unwrap()
                        .mod_revision;
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert!(store.current_revision().await.unwrap() > UPDATES as i64);
        store
    }

    /// Guards against unbounded growth (kine-style bloat): with automatic compaction the
    /// file stays a fraction of what the same writes leave without it. (Compared with the
    /// uncompacted file of the same run, not a fixed size: how many revisions pile up between
    /// two compactions depends on the machine's write rate.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn auto_compaction_bounds_file_size() {
        let dir = tempfile::tempdir().unwrap();
        let unbounded = dir.path().join("unbounded.redb");
        drop(
            bloat(
                &unbounded,
                EmbeddedOptions {
                    compact_interval: Duration::ZERO,
                    ..EmbeddedOptions::default()
                },
            )
            .await,
        );
        let without = std::fs::metadata(&unbounded).unwrap().len();

        let path = dir.path().join("bounded.redb");
        let store = bloat(
            &path,
            EmbeddedOptions {
                retain_revisions: 1_000,
                compact_interval: Duration::from_millis(100),
                ..EmbeddedOptions::default()
            },
        )
        .await;
        // Let the last automatic compaction run.
        let current = store.current_revision().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.compacted_revision().await.unwrap() < current - 1_000 {
            assert!(
                Instant::now() < deadline,
                "automatic compaction did not run"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let size = std::fs::metadata(&path).unwrap().len();
        eprintln!("file size after the same writes: {size} bytes compacted, {without} not");
        assert!(
            size * 3 < without,
            "database file grew to {size} bytes ({without} without compaction)"
        );
        // Old revisions are gone, recent ones are still there.
        assert!(matches!(
            store.list("/bloat/", Some(2)).await,
            Err(StoreError::Compacted { .. })
        ));
        let recent = store.list("/bloat/", Some(current - 500)).await.unwrap();
        assert_eq!(recent.items.len(), 32);
    }

    #[tokio::test]
    async fn dropping_the_store_stops_the_background_thread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drop.redb");
        let store = EmbeddedStore::open(
            &path,
            EmbeddedOptions {
                compact_interval: Duration::from_millis(10),
                ..EmbeddedOptions::default()
            },
        )
        .unwrap();
        let running = store.writer_running.clone();
        store.create("/d/a", b"1".to_vec()).await.unwrap();
        let mut watch = store.watch("/d/", 0).await.unwrap();
        assert!(matches!(
            watch.next().await,
            Some(Ok(WatchEvent::Put { .. }))
        ));
        assert!(running.load(Ordering::SeqCst));
        drop(store);
        assert!(
            !running.load(Ordering::SeqCst),
            "writer thread still running"
        );
        // Open watches end with an error instead of hanging.
        let end = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap();
        assert!(matches!(end, Some(Err(StoreError::Backend(_)))), "{end:?}");
        assert!(watch.next().await.is_none());
        // The file is closed: it can be opened again at once.
        let store = EmbeddedStore::open(&path, opts_no_auto()).unwrap();
        assert!(store.get("/d/a").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn slow_watcher_does_not_block_writers_and_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(
            &dir.path().join("lag.redb"),
            EmbeddedOptions {
                watch_buffer: 4,
                compact_interval: Duration::ZERO,
                ..EmbeddedOptions::default()
            },
        )
        .unwrap();
        let start = store.current_revision().await.unwrap();
        let mut watch = store.watch("/lag/", start).await.unwrap();
        // Consume one event so the watcher is live, then stop reading while writes go on.
        let first = store.create("/lag/0", vec![0]).await.unwrap();
        assert_eq!(
            watch.next().await.unwrap().unwrap().revision(),
            first.mod_revision
        );
        let mut expected = vec![];
        for i in 1..200 {
            expected.push(
                store
                    .create(&format!("/lag/{i}"), vec![0])
                    .await
                    .unwrap()
                    .mod_revision,
            );
        }
        let mut got = vec![];
        for _ in 1..200 {
            got.push(watch.next().await.unwrap().unwrap().revision());
        }
        assert_eq!(got, expected);

        // A watcher that falls behind compaction ends with Compacted.
        let mut behind = store.watch("/lag/", start).await.unwrap();
        let current = store.current_revision().await.unwrap();
        store.compact(current).await.unwrap();
        assert!(matches!(
            behind.next().await,
            Some(Err(StoreError::Compacted { .. }))
        ));
        assert!(behind.next().await.is_none());
    }
}
