//! A [`Store`] on etcd v3, through [`etcd_client`].
//!
//! Every operation maps onto etcd's own MVCC API, so revisions are etcd's revisions:
//!
//! * `create`: a transaction `if create_revision(key) == 0 then put`.
//! * `update`: `if create_revision(key) > 0 && mod_revision(key) == expected then put
//!   else get`; the `get` tells [`StoreError::NotFound`] from [`StoreError::Conflict`].
//! * `delete`: likewise, with `prev_kv` to return the deleted value.
//! * `list`: ranged, paginated reads all at one revision.
//! * `watch`: an etcd watch with `prev_kv`, from `after_revision + 1`.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KvClient,
    PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchClient, WatchOptions,
};
use tracing::{debug, warn};

use crate::{
    ETCD_SNAPSHOT_FORMAT, KeyValue, Listing, Result, Snapshot, Store, StoreError, WatchEvent,
    WatchStream,
};

/// Bound on every unary request, so an unreachable etcd fails requests instead of hanging them.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on establishing the connection in [`EtcdStore::connect`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Keys per page when listing.
const LIST_PAGE: i64 = 500;
/// Largest gRPC message accepted from etcd (pages of large objects, large watch responses).
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// TLS to etcd: the CA that signed the members' certificates and the client certificate
/// and key presented to them (PEM). The key is never shown by `Debug`.
#[derive(Clone)]
pub struct EtcdTls {
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").finish_non_exhaustive()
    }
}

impl EtcdTls {
    /// Reads the three PEM files.
    pub fn read(
        ca: &std::path::Path,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Self> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| backend("TLS", format!("reading {}: {e}", p.display())))
        };
        Ok(EtcdTls {
            ca_pem: read(ca)?,
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        })
    }
}

/// A [`Store`] backed by an etcd v3 cluster. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    kv: KvClient,
    watch: WatchClient,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").finish_non_exhaustive()
    }
}

fn backend(context: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("etcd {context}: {e}"))
}

/// The kind of a failed etcd request, from its gRPC status message.
enum EtcdFailure {
    Compacted,
    FutureRevision,
    Other(StoreError),
}

fn classify(context: &str, e: etcd_client::Error) -> EtcdFailure {
    if let etcd_client::Error::GRpcStatus(status) = &e {
        let message = status.message();
        if message.contains("required revision has been compacted") {
            return EtcdFailure::Compacted;
        }
        if message.contains("required revision is a future revision") {
            return EtcdFailure::FutureRevision;
        }
    }
    EtcdFailure::Other(backend(context, e))
}

/// Most times a request that never reached a member is sent again.
const NOT_SENT_RETRIES: u32 = 5;

/// Whether a request failed before it reached any etcd member (so sending it again, writes
/// included, cannot apply it twice): etcd-client balances over the members with tonic's
/// balancer, which keeps handing some requests to a member that is down (its failed
/// connection reports ready), and those fail with a connect error.
fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect error")
        }
        _ => false,
    }
}

/// `request()` under the request timeout, sent again (after 20 ms, 40 ms, ...) when it never
/// reached a member, at most [`NOT_SENT_RETRIES`] times.
async fn with_timeout<T, F, Fut>(
    context: &str,
    mut request: F,
) -> std::result::Result<T, EtcdFailure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    let mut retries = 0;
    loop {
        match tokio::time::timeout_at(deadline, request()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) if retries < NOT_SENT_RETRIES && never_sent(&e) => {
                retries += 1;
                debug!(context, retries, error = %e, "etcd request not sent; trying again");
                tokio::time::sleep(Duration::from_millis(20 * u64::from(retries))).await;
            }
            Ok(Err(e)) => return Err(classify(context, e)),
            Err(_) => return Err(EtcdFailure::Other(backend(context, "request timed out"))),
        }
    }
}

fn convert_kv(kv: &etcd_client::KeyValue) -> Result<KeyValue> {
    Ok(KeyValue {
        key: kv
            .key_str()
            .map_err(|e| backend("returned a non-UTF-8 key", e))?
            .to_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
    })
}

fn header_revision(response: &TxnResponse) -> Result<i64> {
    response
        .header()
        .map(|h| h.revision())
        .ok_or_else(|| StoreError::Backend("etcd response without a header".into()))
}

/// The first key after every key that starts with `prefix` (etcd's `range_end` for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Empty or all-0xff prefix: every key from the start key on.
    vec![0]
}

/// The value of the key read by the `else` branch of an update/delete transaction.
fn failed_txn_key(response: &TxnResponse) -> Result<Option<KeyValue>> {
    for op in response.op_responses() {
        if let TxnOpResponse::Get(get) = op {
            return get.kvs().first().map(convert_kv).transpose();
        }
    }
    Err(StoreError::Backend(
        "etcd transaction response without the expected read".into(),
    ))
}

impl EtcdStore {
    /// Connects to etcd at `endpoints` (URLs such as `http://127.0.0.1:2379`) and checks that
    /// it answers.
    pub async fn connect(endpoints: &[String]) -> Result<Self> {
        Self::connect_with(endpoints, None).await
    }

    /// Like [`EtcdStore::connect`], over TLS when `tls` is given (`https://` endpoints): the
    /// server's certificate checked against `tls`'s CA, and its client certificate presented
    /// (kube-apiserver's `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`).
    pub async fn connect_with(endpoints: &[String], tls: Option<&EtcdTls>) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(StoreError::Backend("no etcd endpoints given".into()));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(10));
        if let Some(tls) = tls {
            if let Some(plain) = endpoints.iter().find(|e| !e.starts_with("https://")) {
                return Err(backend(
                    "connect",
                    format!("{plain}: with TLS files, every endpoint must be https://"),
                ));
            }
            options = options.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem))
                    .identity(etcd_client::Identity::from_pem(
                        &tls.cert_pem,
                        tls.key_pem.as_slice(),
                    )),
            );
        }
        let client =
            tokio::time::timeout(CONNECT_TIMEOUT, Client::connect(endpoints, Some(options)))
                .await
                .map_err(|_| backend("connect", "timed out"))?
                .map_err(|e| backend("connect", e))?;
        let store = Self::from_client(client);
        // The channel connects lazily; make one request so a bad endpoint fails here.
        tokio::time::timeout(CONNECT_TIMEOUT, store.kv.clone().get("/", None))
            .await
            .map_err(|_| {
                backend(
                    "connect",
                    format!(
                        "no answer from {} within {CONNECT_TIMEOUT:?}",
                        endpoints.join(",")
                    ),
                )
            })?
            .map_err(|e| backend("connect", e))?;
        debug!(?endpoints, "connected to etcd");
        Ok(store)
    }

    /// Wraps an existing client.
    pub fn from_client(client: Client) -> Self {
        let kv = client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let watch = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
        Self { client, kv, watch }
    }

    /// The underlying etcd client (cheap to clone).
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn txn(&self, context: &str, txn: Txn) -> Result<TxnResponse> {
        with_timeout(context, || {
            let (mut kv, txn) = (self.kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(|f| self.unexpected(f))
    }

    fn unexpected(&self, failure: EtcdFailure) -> StoreError {
        match failure {
            EtcdFailure::Other(e) => e,
            EtcdFailure::Compacted => {
                StoreError::Backend("etcd: unexpected compaction error".into())
            }
            EtcdFailure::FutureRevision => {
                StoreError::Backend("etcd: unexpected future revision error".into())
            }
        }
    }

    async fn current(&self) -> Result<i64> {
        let response = with_timeout("get", || {
            let mut kv = self.kv.clone();
            async move { kv.get("/", Some(GetOptions::new().with_count_only())).await }
        })
        .await
        .map_err(|f| self.unexpected(f))?;
        response
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| StoreError::Backend("etcd response without a header".into()))
    }

    /// etcd's compacted revision. etcd reports it only to watches, so this opens a watch at
    /// revision 1 and reads the answer. 0 if it cannot be found out.
    async fn compacted_revision(&self) -> i64 {
        let probe = async {
            let mut watch = self.watch.clone();
            let mut stream = watch
                .watch("\0", Some(WatchOptions::new().with_start_revision(1)))
                .await
                .ok()?;
            while let Ok(Some(response)) = stream.message().await {
                if response.compact_revision() > 0 {
                    return Some(response.compact_revision());
                }
                if !response.created() {
                    return None;
                }
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(5), probe)
            .await
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    async fn revision_error(&self, failure: EtcdFailure, requested: i64) -> StoreError {
        match failure {
            EtcdFailure::Compacted => StoreError::Compacted {
                requested,
                compacted: self.compacted_revision().await,
            },
            EtcdFailure::FutureRevision => match self.current().await {
                Ok(current) => StoreError::FutureRevision { requested, current },
                Err(e) => e,
            },
            EtcdFailure::Other(e) => e,
        }
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let response = with_timeout("get", || {
            let mut kv = self.kv.clone();
            async move { kv.get(key, None).await }
        })
        .await
        .map_err(|f| self.unexpected(f))?;
        response.kvs().first().map(convert_kv).transpose()
    }

    async fn list(&self, prefix: &str, revision: Option<i64>) -> Result<Listing> {
        let requested = revision.filter(|r| *r != 0);
        if let Some(r) = requested
            && r < 0
        {
            return Err(StoreError::Compacted {
                requested: r,
                compacted: self.compacted_revision().await,
            });
        }
        let end = prefix_end(prefix.as_bytes());
        let kv = self.kv.clone();
        let mut items = Vec::new();
        // etcd rejects an empty key; "\0" is the first possible key.
        let mut start = if prefix.is_empty() {
            vec![0]
        } else {
            prefix.as_bytes().to_vec()
        };
        let mut at = requested.unwrap_or(0);
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LIST_PAGE)
                .with_revision(at);
            let response = match with_timeout("list", || {
                let (mut kv, start, options) = (kv.clone(), start.clone(), options.clone());
                async move { kv.get(start, Some(options)).await }
            })
            .await
            {
                Ok(response) => response,
                Err(failure) => return Err(self.revision_error(failure, at).await),
            };
            if at == 0 {
                // The header carries the current revision; read later pages at the same one.
                at = response
                    .header()
                    .map(|h| h.revision())
                    .ok_or_else(|| StoreError::Backend("etcd response without a header".into()))?;
            }
            for kv in response.kvs() {
                items.push(convert_kv(kv)?);
            }
            match response.kvs().last() {
                Some(last) if response.more() => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => break,
            }
        }
        Ok(Listing {
            items,
            revision: at,
        })
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value.clone(), None)]);
        let response = self.txn("create", txn).await?;
        if !response.succeeded() {
            return Err(StoreError::AlreadyExists {
                key: key.to_owned(),
            });
        }
        let revision = header_revision(&response)?;
        Ok(KeyValue {
            key: key.to_owned(),
            value,
            create_revision: revision,
            mod_revision: revision,
        })
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected_revision: i64) -> Result<KeyValue> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Greater, 0),
                Compare::mod_revision(key, CompareOp::Equal, expected_revision),
            ])
            .and_then([TxnOp::put(
                key,
                value.clone(),
                Some(PutOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(key, None)]);
        let response = self.txn("update", txn).await?;
        if !response.succeeded() {
            return Err(match failed_txn_key(&response)? {
                None => StoreError::NotFound {
                    key: key.to_owned(),
                },
                Some(current) => StoreError::Conflict {
                    key: key.to_owned(),
                    expected: expected_revision,
                    actual: current.mod_revision,
                },
            });
        }
        let revision = header_revision(&response)?;
        let create_revision = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Put(put) => put.prev_key().map(|prev| prev.create_revision()),
                _ => None,
            })
            .ok_or_else(|| StoreError::Backend("etcd put response without prev_kv".into()))?;
        Ok(KeyValue {
            key: key.to_owned(),
            value,
            create_revision,
            mod_revision: revision,
        })
    }

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        let mut compares = vec![Compare::create_revision(key, CompareOp::Greater, 0)];
        if let Some(expected) = expected_revision {
            compares.push(Compare::mod_revision(key, CompareOp::Equal, expected));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::delete(
                key,
                Some(DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(key, None)]);
        let response = self.txn("delete", txn).await?;
        if !response.succeeded() {
            return Err(match failed_txn_key(&response)? {
                None => StoreError::NotFound {
                    key: key.to_owned(),
                },
                Some(current) => StoreError::Conflict {
                    key: key.to_owned(),
                    expected: expected_revision.unwrap_or_default(),
                    actual: current.mod_revision,
                },
            });
        }
        let revision = header_revision(&response)?;
        let prev = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Delete(delete) => delete.prev_kvs().first().map(convert_kv),
                _ => None,
            })
            .ok_or_else(|| StoreError::Backend("etcd delete response without prev_kv".into()))??;
        Ok((prev, revision))
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<WatchStream> {
        if after_revision < 0 {
            return Err(StoreError::Backend(format!(
                "invalid watch revision {after_revision}"
            )));
        }
        let start = after_revision + 1;
        let options = WatchOptions::new()
            .with_range(prefix_end(prefix.as_bytes()))
            .with_start_revision(start)
            .with_prev_key();
        let key = if prefix.is_empty() { "\0" } else { prefix };
        let mut client = self.watch.clone();
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, client.watch(key, Some(options)))
            .await
            .map_err(|_| backend("watch", "request timed out"))?
            .map_err(|e| backend("watch", e))?;
        let state = EtcdWatch {
            stream,
            start,
            buffered: VecDeque::new(),
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            state,
            |mut state| async move { state.next().await.map(|item| (item, state)) },
        )))
    }

    async fn current_revision(&self) -> Result<i64> {
        self.current().await
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        match with_timeout("compact", || {
            let mut kv = self.kv.clone();
            async move { kv.compact(revision, None).await }
        })
        .await
        {
            Ok(_) => Ok(()),
            // Compacting to an already compacted revision is a no-op, as in the embedded store.
            Err(EtcdFailure::Compacted) => Ok(()),
            Err(failure) => Err(self.revision_error(failure, revision).await),
        }
    }

    /// etcd's own snapshot (the Maintenance API's, what `etcdctl snapshot save` gets) of the
    /// member the client is connected to, written to the new file `dest` (mode 0600); its revision is the one the
    /// first response's header names. Restore it with `etcdutl snapshot restore`.
    async fn snapshot(&self, dest: &std::path::Path) -> Result<Snapshot> {
        use tokio::io::AsyncWriteExt;
        let name = dest.display().to_string();
        let io = |e: std::io::Error| StoreError::Backend(format!("writing {name}: {e}"));
        if dest.exists() {
            return Err(StoreError::Backend(format!(
                "{name} exists: a snapshot is written to a new file"
            )));
        }
        // A private temporary beside `dest` (random name, 0600), renamed into place when
        // complete: a failed or partial snapshot never appears at `dest`.
        let tmp = skiff_pki::files::temp_beside(dest).map_err(io)?;
        let mut file = tokio::fs::File::from_std(tmp.as_file().try_clone().map_err(io)?);
        let copy = async {
            let mut maintenance = self.client.maintenance_client();
            let mut stream = maintenance
                .snapshot()
                .await
                .map_err(|e| StoreError::Backend(format!("etcd snapshot: {e}")))?;
            let (mut revision, mut bytes) = (None, 0u64);
            while let Some(message) = stream
                .message()
                .await
                .map_err(|e| StoreError::Backend(format!("etcd snapshot: {e}")))?
            {
                if revision.is_none() {
                    revision = message.header().map(|h| h.revision());
                }
                file.write_all(message.blob()).await.map_err(io)?;
                bytes += message.blob().len() as u64;
            }
            file.sync_all().await.map_err(io)?;
            Ok(Snapshot {
                revision: revision.filter(|r| *r > 0),
                format: ETCD_SNAPSHOT_FORMAT,
                bytes,
            })
        };
        let taken = copy.await?;
        drop(file);
        skiff_pki::files::persist_new(tmp, dest).map_err(io)?;
        Ok(taken)
    }
}

/// State of one etcd watch, turned into a [`WatchStream`].
struct EtcdWatch {
    /// Kept whole: dropping its request half would end the gRPC stream.
    stream: etcd_client::WatchStream,
    start: i64,
    buffered: VecDeque<Result<WatchEvent>>,
    done: bool,
}

impl EtcdWatch {
    async fn next(&mut self) -> Option<Result<WatchEvent>> {
        loop {
            if let Some(item) = self.buffered.pop_front() {
                if item.is_err() {
                    self.done = true;
                    self.buffered.clear();
                }
                return Some(item);
            }
            if self.done {
                return None;
            }
            let response = match self.stream.message().await {
                Ok(Some(response)) => response,
                Ok(None) => {
                    self.done = true;
                    return Some(Err(StoreError::Backend("etcd watch stream closed".into())));
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(backend("watch", e)));
                }
            };
            if response.compact_revision() > 0 {
                self.done = true;
                return Some(Err(StoreError::Compacted {
                    requested: self.start,
                    compacted: response.compact_revision(),
                }));
            }
            if response.canceled() {
                self.done = true;
                let reason = response.cancel_reason();
                warn!(reason, "etcd canceled a watch");
                return Some(Err(StoreError::Backend(format!(
                    "etcd canceled the watch: {reason}"
                ))));
            }
            let header_revision = response.header().map_or(0, |h| h.revision());
            for event in response.events() {
                let item = convert_event(event, header_revision);
                if let Ok(event) = &item {
                    self.start = event.revision() + 1;
                }
                self.buffered.push_back(item);
            }
        }
    }
}

fn convert_event(event: &etcd_client::Event, header_revision: i64) -> Result<WatchEvent> {
    let kv = event
        .kv()
        .ok_or_else(|| StoreError::Backend("etcd watch event without kv".into()))?;
    let prev = event.prev_kv().map(convert_kv).transpose()?;
    // etcd leaves out prev_kv when that revision is compacted already: the history needed is
    // gone, which the caller handles like any compaction (relist).
    let compacted = || StoreError::Compacted {
        requested: kv.mod_revision(),
        compacted: kv.mod_revision(),
    };
    match event.event_type() {
        EventType::Put => {
            if kv.version() > 1 && prev.is_none() {
                return Err(compacted());
            }
            Ok(WatchEvent::Put {
                kv: convert_kv(kv)?,
                prev,
            })
        }
        EventType::Delete => {
            let revision = if kv.mod_revision() > 0 {
                kv.mod_revision()
            } else {
                header_revision
            };
            Ok(WatchEvent::Delete {
                prev: prev.ok_or_else(compacted)?,
                revision,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"/a/b"), b"/a/c".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
