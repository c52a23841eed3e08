//! Skiff's storage interface.
//!
//! A [`Store`] is a flat, ordered key/value space with a single monotonically increasing
//! revision counter, the shape of etcd's MVCC API: every successful write gets the next
//! revision, writes to existing keys are compare-and-swap on the key's `mod_revision`, and a
//! watch replays every change after a revision, in order, until the history is compacted.
//!
//! Only the API server uses this crate. Values are opaque bytes (the API server stores
//! protobuf-encoded objects under `/registry/<resource>/<namespace>/<name>`).
//!
//! Backends: [`EtcdStore`] (etcd-client) and [`EmbeddedStore`] (redb, with a change log for
//! watches and historical lists, compacted automatically so the file stays bounded). A write
//! is acknowledged only once it is durable: after redb's durable commit, or etcd's quorum.
//! [`Store::snapshot`] writes one revision's whole state to a new file while writes go on: the
//! embedded store copies a read transaction into a new redb file, which [`restore_snapshot`]
//! checks and renames into place; etcd streams its Maintenance snapshot (restored with etcd's
//! own tools).
//!
//! `conformance` (feature `conformance`) is one suite run against both backends, snapshots
//! taken mid-write included; `testutil` (feature `testutil`) starts real etcd servers on
//! loopback (`EtcdServer`, and `EtcdCluster` with members that can be killed and restarted).
//!
//! This crate knows nothing of resources or protobuf; its only Skiff dependency is
//! `skiff_pki::files`, for private files.

use std::pin::Pin;

use futures::Stream;

pub mod embedded;
pub mod etcd;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

#[cfg(any(test, feature = "testutil"))]
pub mod testutil;

pub use embedded::{EmbeddedOptions, EmbeddedStore, restore_snapshot};
pub use etcd::{EtcdStore, EtcdTls};

/// A key with its value and the revisions that describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value, opaque bytes.
    pub value: Vec<u8>,
    /// Revision of the write that created the key (in its current incarnation).
    pub create_revision: i64,
    /// Revision of the last write to the key. The API server exposes it as `resourceVersion`.
    pub mod_revision: i64,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was created or updated. `prev` is the value before the write, if the key existed.
    Put {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// A key was deleted at `revision`. `prev` is the last value the key held.
    Delete { prev: KeyValue, revision: i64 },
}

impl WatchEvent {
    /// The revision at which this change happened.
    pub fn revision(&self) -> i64 {
        match self {
            WatchEvent::Put { kv, .. } => kv.mod_revision,
            WatchEvent::Delete { revision, .. } => *revision,
        }
    }

    /// The key that changed.
    pub fn key(&self) -> &str {
        match self {
            WatchEvent::Put { kv, .. } => &kv.key,
            WatchEvent::Delete { prev, .. } => &prev.key,
        }
    }
}

/// A stream of watch events. It yields events in revision order, without gaps, and ends with
/// an error if the backend fails; a compacted start revision yields [`StoreError::Compacted`].
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, StoreError>> + Send>>;

/// A consistent listing of a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The keys under the prefix, in key order.
    pub items: Vec<KeyValue>,
    /// The store revision this listing reflects. Watching from it misses nothing.
    pub revision: i64,
}

/// A snapshot [`Store::snapshot`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The store revision the snapshot holds (every write up to it and none after), when the
    /// backend says (etcd before 3.5 does not: restored, the store is at it).
    pub revision: Option<i64>,
    /// Its file format: [`EMBEDDED_SNAPSHOT_FORMAT`] (a redb file the embedded store opens)
    /// or [`ETCD_SNAPSHOT_FORMAT`] (etcd's, for `etcdutl snapshot restore`).
    pub format: &'static str,
    /// Its size in bytes.
    pub bytes: u64,
}

/// [`Snapshot::format`] of the embedded store.
pub const EMBEDDED_SNAPSHOT_FORMAT: &str = "skiff-embedded";
/// [`Snapshot::format`] of etcd.
pub const ETCD_SNAPSHOT_FORMAT: &str = "etcd";

/// Errors returned by a [`Store`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The key does not exist.
    #[error("key {key} not found")]
    NotFound { key: String },
    /// The key already exists (returned by [`Store::create`]).
    #[error("key {key} already exists")]
    AlreadyExists { key: String },
    /// Compare-and-swap failed: the key's mod_revision is not the expected one.
    #[error("conflict on {key}: expected revision {expected}, found {actual}")]
    Conflict {
        key: String,
        expected: i64,
        actual: i64,
    },
    /// The requested revision was compacted away.
    #[error("revision {requested} has been compacted (oldest available is {compacted})")]
    Compacted { requested: i64, compacted: i64 },
    /// The requested revision is newer than the store's current revision.
    #[error("revision {requested} is in the future (current is {current})")]
    FutureRevision { requested: i64, current: i64 },
    /// The backend failed (I/O, connection, corrupt data, closed store, ...).
    #[error("store backend error: {0}")]
    Backend(String),
}

/// The result type of [`Store`] operations.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The storage interface. Implementations must be safe to share between tasks.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads one key at the current revision.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Lists every key that starts with `prefix`, in key order. `revision` `None` or `0` means
    /// the current revision; an older revision returns the state as it was then, or
    /// [`StoreError::Compacted`].
    async fn list(&self, prefix: &str, revision: Option<i64>) -> Result<Listing>;

    /// Creates `key` if it does not exist. Returns the new key's revisions.
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue>;

    /// Replaces the value of `key` if its mod_revision equals `expected_revision`.
    /// [`StoreError::NotFound`] if the key is absent, [`StoreError::Conflict`] if stale.
    async fn update(&self, key: &str, value: Vec<u8>, expected_revision: i64) -> Result<KeyValue>;

    /// Deletes `key` if its mod_revision equals `expected_revision` (or unconditionally when
    /// `None`). Returns the deleted value and the revision of the delete.
    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)>;

    /// Watches every key under `prefix`, delivering every change with revision greater than
    /// `after_revision`, in order. Use the revision of a [`Listing`] to continue it.
    ///
    /// If `after_revision` is older than the compacted revision, the stream yields
    /// [`StoreError::Compacted`] and ends (callers should also accept it as the error of this
    /// call). A watcher that falls too far behind ends the same way later on.
    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<WatchStream>;

    /// The current revision of the store.
    async fn current_revision(&self) -> Result<i64>;

    /// Discards history older than `revision`. Later reads and watches at older revisions fail
    /// with [`StoreError::Compacted`]. Compacting at or below the already compacted revision
    /// is a no-op; a revision above the current one fails with [`StoreError::FutureRevision`].
    async fn compact(&self, revision: i64) -> Result<()>;

    /// Writes a consistent snapshot of the whole store (one revision's state) to the new
    /// file `dest` while writes go on. Stores that cannot fail with
    /// [`StoreError::Backend`].
    async fn snapshot(&self, dest: &std::path::Path) -> Result<Snapshot> {
        let _ = dest;
        Err(StoreError::Backend(
            "this store cannot take snapshots".into(),
        ))
    }
}
