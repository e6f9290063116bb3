//! The first API room: [`Client`] itself (how one is made, the router it
//! sends through) and its key-value calls. Every other room (`lock`,
//! `admin`, `auth`) adds calls to the `Client` defined here, so they import
//! this room; it imports none of them, only the router, the retry-safe
//! `writer` and the transport's [`TransportStats`] below.

use std::ops::Range;
use std::sync::Arc;

use latchkey_core::{
    BatchOp, Command, CommandResult, Condition, Outcome, Query, ScanRange, Test, Versioned,
};
use latchkey_proto::{LocalReplica, Operation};

use crate::error::Error;
use crate::options::ClientOptions;
use crate::router::Router;
use crate::transport::TransportStats;
use crate::writer::Writer;

/// How fresh a read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    /// Linearizable: served by the leader after confirming its leadership
    /// with a quorum (ReadIndex). Sees every write acknowledged before it.
    #[default]
    Linearizable,
    /// Served from whichever replica answers, from its local applied state:
    /// cheap, but may miss recent writes.
    Stale,
}

/// A client of a latchkey cluster, remote (gRPC) or in-process.
///
/// Cheap to clone; clones share connections and the leader hint.
///
/// ```no_run
/// # async fn demo() -> Result<(), latchkey_client::Error> {
/// use latchkey_client::Client;
/// let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
/// client.put("greeting", "hello").await?;
/// assert_eq!(client.get("greeting").await?, Some(b"hello".to_vec()));
/// let ids = client.next_sequence("ids", 10).await?; // e.g. 0..10
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    router: Arc<Router>,
    /// The session of this client's retry-safe writes; `None` when
    /// [`ClientOptions::retry_safe_writes`] is off.
    writer: Option<Arc<Writer>>,
}

/// Entries returned by [`Client::scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage {
    /// Keys with their values and revisions, in scan order.
    pub entries: Vec<(Vec<u8>, Versioned)>,
    /// More keys matched beyond the limit.
    pub more: bool,
    /// The cluster's revision the page was read at: every entry is as of
    /// this revision.
    pub revision: u64,
}

/// A key read with [`Client::get_versioned`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRead {
    /// The key's value and revisions (`None`: absent).
    pub value: Option<Versioned>,
    /// The cluster's revision the read saw.
    pub revision: u64,
}

/// What [`Client::put_if`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swap {
    /// Whether the test held and the value was written.
    pub succeeded: bool,
    /// The key now: the value written if `succeeded`, else what the test
    /// saw (`None`: absent).
    pub current: Option<Versioned>,
    /// The cluster's revision after the call: the one the write made if it
    /// succeeded.
    pub revision: u64,
}

/// An atomic multi-key write: every condition is checked, then every
/// operation applied, all or nothing.
///
/// ```
/// use latchkey_client::Batch;
/// let batch = Batch::new()
///     .when_value("config/version", Some("7"))
///     .put("config/version", "8")
///     .put("config/body", "...")
///     .delete("config/draft");
/// assert_eq!(batch.len(), 3);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    conditions: Vec<Condition>,
    ops: Vec<BatchOp>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }
    /// Add a put.
    pub fn put(mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.ops.push(BatchOp::Put {
            key: key.as_ref().to_vec(),
            value: value.as_ref().to_vec(),
        });
        self
    }
    /// Add a delete.
    pub fn delete(mut self, key: impl AsRef<[u8]>) -> Self {
        self.ops.push(BatchOp::Delete {
            key: key.as_ref().to_vec(),
        });
        self
    }
    /// Only apply if `key` currently holds `expected` (`None`: is absent).
    pub fn when_value(self, key: impl AsRef<[u8]>, expected: Option<impl AsRef<[u8]>>) -> Self {
        self.when(key, Test::ValueIs(expected.map(|v| v.as_ref().to_vec())))
    }
    /// Only apply if `test` holds for `key`: its value, its existence or a
    /// revision (`Test::mod_revision_is(r)`: unchanged since `r`). A
    /// revision test on an absent key refuses the whole batch with
    /// [`CommandError::KeyAbsent`](crate::CommandError::KeyAbsent).
    pub fn when(mut self, key: impl AsRef<[u8]>, test: Test) -> Self {
        self.conditions.push(Condition::new(key.as_ref(), test));
        self
    }
    /// Number of operations (conditions not counted).
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// True when the batch has no operations.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// The command this batch proposes.
    pub fn into_command(self) -> Command {
        Command::Batch {
            conditions: self.conditions,
            ops: self.ops,
        }
    }
}

pub(crate) fn unexpected(what: &str, outcome: &Outcome) -> Error {
    Error::Protocol(format!("expected {what}, server answered {outcome:?}"))
}

fn bytes(b: impl AsRef<[u8]>) -> Vec<u8> {
    b.as_ref().to_vec()
}

impl Client {
    /// A client for the cluster reachable at `endpoints` (`host:port`). No
    /// connection is made until the first call; connections are then kept.
    pub fn connect<I, S>(endpoints: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::with_options(endpoints, ClientOptions::default())
    }

    /// Like [`Client::connect`], with explicit timeouts.
    pub fn with_options<I, S>(endpoints: I, options: ClientOptions) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Client::over(Router::new(endpoints, None, options)?))
    }

    /// A client that calls `local` directly while it leads, and the other
    /// `endpoints` over gRPC otherwise. Used by the embedding `Node`; the
    /// in-process types are in [`local`](crate::local).
    pub fn with_local<I, S>(
        local: Arc<dyn LocalReplica>,
        endpoints: I,
        options: ClientOptions,
    ) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Client::over(Router::new(endpoints, Some(local), options)?))
    }

    fn over(router: Router) -> Client {
        let router = Arc::new(router);
        let writer = router
            .options()
            .retry_safe_writes
            .then(|| Arc::new(Writer::new(Arc::clone(&router))));
        Client { router, writer }
    }

    pub(crate) fn router(&self) -> &Router {
        &self.router
    }

    /// The router, for what outlives a call (a watch's stream).
    pub(crate) fn shared_router(&self) -> Arc<Router> {
        Arc::clone(&self.router)
    }

    /// Requests this client sent over gRPC and what carried them: requests
    /// go on each replica's call stream, those at hand together in one frame
    /// ([`ClientOptions::call_stream`]), so under load `stream_frames` is
    /// well below `stream_calls`. Requests served by an in-process replica
    /// are not counted.
    pub fn transport_stats(&self) -> TransportStats {
        self.router.transport_stats()
    }

    /// Propose any write command and return its outcome.
    ///
    /// A key-value write (put, put-if-absent, compare-and-put, get-and-put,
    /// delete, delete-range, batch, next-sequence, a session's bound put)
    /// is retry-safe unless [`ClientOptions::retry_safe_writes`] is off: it
    /// is sent under this client's own session and a request id, and
    /// resent across replicas and leader changes until it is answered, so
    /// it is applied once and a lost answer does not end the call. The
    /// session is opened on the first write (one extra round trip), kept
    /// alive in the background, and closed when the last clone of the
    /// client is dropped inside a Tokio runtime (else it expires after its
    /// TTL, 30 s). At most 128 writes of one client are in flight at once.
    /// [`Error::UnknownOutcome`] remains possible, each time after an
    /// attempt that may have been applied, when no replica answers within
    /// [`ClientOptions::request_timeout`], when the client was cut off for
    /// about its session's TTL before the retry arrived, when a retry lags
    /// 256 later writes of the same client, or when the retry is refused
    /// (a refusal is not remembered, so it says nothing of the earlier
    /// attempt). If the cluster will not open a session for the client
    /// (the user may not write, or the cluster is at its session limit),
    /// writes are sent plain. Other commands (lock commands carry their
    /// own request ids) are sent as they are.
    pub async fn execute(&self, command: Command) -> Result<Outcome, Error> {
        match &self.writer {
            Some(writer) if command.is_key_value_write() => {
                latchkey_core::validate_command(&command)?;
                writer.execute(command).await
            }
            _ => self.execute_with(command, false).await,
        }
    }

    /// Close the session this client's retry-safe writes go under (see
    /// [`Client::execute`]) now, once the writes in flight are answered,
    /// rather than when the last clone is dropped. A short-lived process
    /// calls it before it exits, so the session does not linger for its
    /// TTL. The client stays usable: its next write opens a new session.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), latchkey_client::Error> {
    /// let client = latchkey_client::Client::connect(["127.0.0.1:7001"])?;
    /// client.put("jobs/last-run", "2026-11-27").await?;
    /// client.close().await?;
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) -> Result<(), Error> {
        match &self.writer {
            Some(writer) => writer.close().await,
            None => Ok(()),
        }
    }

    /// Propose `command`; `idempotent` commands (lock commands deduplicated
    /// by request id, or harmless to repeat) are retried even after an
    /// attempt that may have reached a leader.
    pub(crate) async fn execute_with(
        &self,
        command: Command,
        idempotent: bool,
    ) -> Result<Outcome, Error> {
        self.execute_noting_sends(command, idempotent, || {}).await
    }

    /// [`Client::execute_with`], calling `on_send` just before each attempt
    /// is sent: the command was applied after the last such call (the
    /// attempt that succeeded). A session notes its lease clock there, on
    /// which every lease deadline is judged.
    pub(crate) async fn execute_noting_sends(
        &self,
        command: Command,
        idempotent: bool,
        mut on_send: impl FnMut(),
    ) -> Result<Outcome, Error> {
        latchkey_core::validate_command(&command)?;
        let op = Operation::Write(command);
        let result: CommandResult = self
            .router
            .call(!idempotent, |target, budget| {
                on_send();
                let op = op.clone();
                async move { target.send(op, budget).await }
            })
            .await?;
        Ok(result?)
    }

    /// Serve any query with the given consistency.
    pub async fn query(&self, query: Query, consistency: Consistency) -> Result<Outcome, Error> {
        latchkey_core::validate_query(&query)?;
        let op = Operation::Read {
            query,
            stale: consistency == Consistency::Stale,
        };
        Ok(self.router.send(false, op).await??)
    }

    /// Set `key` to `value`. Returns the revision the put made.
    pub async fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<u64, Error> {
        match self
            .execute(Command::Put {
                key: bytes(key),
                value: bytes(value),
            })
            .await?
        {
            Outcome::Written { revision } => Ok(revision),
            other => Err(unexpected("Written", &other)),
        }
    }

    /// Set `key` only if absent. Returns `None` if written, else the existing value.
    pub async fn put_if_absent(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.previous(Command::PutIfAbsent {
            key: bytes(key),
            value: bytes(value),
        })
        .await
    }

    /// Set `key` to `value` and return its previous value.
    pub async fn get_and_put(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.previous(Command::GetAndPut {
            key: bytes(key),
            value: bytes(value),
        })
        .await
    }

    async fn previous(&self, command: Command) -> Result<Option<Vec<u8>>, Error> {
        match self.execute(command).await? {
            Outcome::Previous { previous, .. } => Ok(previous),
            other => Err(unexpected("Previous", &other)),
        }
    }

    /// Set `key` to `value` if it currently holds `expected` (`None`: absent).
    /// Returns whether it wrote, and the key's value now.
    pub async fn compare_and_put(
        &self,
        key: impl AsRef<[u8]>,
        expected: Option<impl AsRef<[u8]>>,
        value: impl AsRef<[u8]>,
    ) -> Result<(bool, Option<Vec<u8>>), Error> {
        let swap = self
            .put_if(key, Test::ValueIs(expected.map(bytes)), value)
            .await?;
        Ok((swap.succeeded, swap.current.map(|v| v.value)))
    }

    /// Set `key` to `value` if `test` holds for it: compare-and-swap by
    /// value, existence or revision.
    ///
    /// ```no_run
    /// # async fn demo(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
    /// use latchkey_client::{Consistency, Test};
    /// let read = client.get_versioned("config", Consistency::Linearizable).await?;
    /// let seen = read.value.map_or(0, |v| v.mod_revision);
    /// // Written only if nobody changed "config" since it was read.
    /// let swap = client.put_if("config", Test::mod_revision_is(seen), "v2").await?;
    /// # let _ = swap;
    /// # Ok(()) }
    /// ```
    ///
    /// A revision test on an absent key is refused with
    /// [`CommandError::KeyAbsent`](crate::CommandError::KeyAbsent) (as
    /// [`Error::Refused`]); test `Test::Exists(false)` to create a key.
    pub async fn put_if(
        &self,
        key: impl AsRef<[u8]>,
        test: Test,
        value: impl AsRef<[u8]>,
    ) -> Result<Swap, Error> {
        match self
            .execute(Command::CompareAndPut {
                key: bytes(key),
                test,
                value: bytes(value),
            })
            .await?
        {
            Outcome::Swapped {
                succeeded,
                current,
                revision,
            } => Ok(Swap {
                succeeded,
                current,
                revision,
            }),
            other => Err(unexpected("Swapped", &other)),
        }
    }

    /// Remove `key`. Returns whether it existed.
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        match self.execute(Command::Delete { key: bytes(key) }).await? {
            Outcome::Deleted { count, .. } => Ok(count > 0),
            other => Err(unexpected("Deleted", &other)),
        }
    }

    /// Remove every key in `[start, end)`. Returns how many were removed.
    pub async fn delete_range(
        &self,
        start: impl AsRef<[u8]>,
        end: impl AsRef<[u8]>,
    ) -> Result<u64, Error> {
        match self
            .execute(Command::DeleteRange {
                start: bytes(start),
                end: bytes(end),
            })
            .await?
        {
            Outcome::Deleted { count, .. } => Ok(count),
            other => Err(unexpected("Deleted", &other)),
        }
    }

    /// Apply a [`Batch`]. Returns `Err(index)` of the first condition that did
    /// not hold (nothing written), or `Ok(revision)` when everything was
    /// applied: the revision the batch made (the cluster's current one if
    /// its ops changed nothing).
    pub async fn batch(&self, batch: Batch) -> Result<Result<u64, u32>, Error> {
        match self.execute(batch.into_command()).await? {
            Outcome::Batch {
                failed_condition,
                revision,
            } => Ok(match failed_condition {
                None => Ok(revision),
                Some(i) => Err(i),
            }),
            other => Err(unexpected("Batch", &other)),
        }
    }

    /// Allocate `step` numbers from the sequence at `key`: a durable, strictly
    /// increasing range `[start, start + step)`.
    pub async fn next_sequence(
        &self,
        key: impl AsRef<[u8]>,
        step: u64,
    ) -> Result<Range<u64>, Error> {
        match self
            .execute(Command::NextSequence {
                key: bytes(key),
                step,
            })
            .await?
        {
            Outcome::Sequence { start, end } => Ok(start..end),
            other => Err(unexpected("Sequence", &other)),
        }
    }

    /// Linearizable read of `key`.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, Error> {
        self.get_with(key, Consistency::Linearizable).await
    }

    /// Read of `key` with the given consistency.
    pub async fn get_with(
        &self,
        key: impl AsRef<[u8]>,
        consistency: Consistency,
    ) -> Result<Option<Vec<u8>>, Error> {
        let read = self.get_versioned(key, consistency).await?;
        Ok(read.value.map(|v| v.value))
    }

    /// Read of `key` with its revisions, and the cluster's revision the
    /// read saw.
    pub async fn get_versioned(
        &self,
        key: impl AsRef<[u8]>,
        consistency: Consistency,
    ) -> Result<KeyRead, Error> {
        match self
            .query(Query::Get { key: bytes(key) }, consistency)
            .await?
        {
            Outcome::Value { value, revision } => Ok(KeyRead { value, revision }),
            other => Err(unexpected("Value", &other)),
        }
    }

    /// Linearizable read of several keys; values in request order.
    pub async fn multi_get<I, K>(&self, keys: I) -> Result<Vec<Option<Vec<u8>>>, Error>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<[u8]>,
    {
        let keys = keys.into_iter().map(bytes).collect();
        match self
            .query(Query::MultiGet { keys }, Consistency::Linearizable)
            .await?
        {
            Outcome::Values { values, .. } => {
                Ok(values.into_iter().map(|v| v.map(|v| v.value)).collect())
            }
            other => Err(unexpected("Values", &other)),
        }
    }

    /// Linearizable scan of a key range (see [`ScanRange`]).
    pub async fn scan(&self, range: ScanRange) -> Result<ScanPage, Error> {
        self.scan_with(range, Consistency::Linearizable).await
    }

    /// Scan with the given consistency.
    pub async fn scan_with(
        &self,
        range: ScanRange,
        consistency: Consistency,
    ) -> Result<ScanPage, Error> {
        match self.query(Query::Scan(range), consistency).await? {
            Outcome::Entries {
                entries,
                more,
                revision,
            } => Ok(ScanPage {
                entries,
                more,
                revision,
            }),
            other => Err(unexpected("Entries", &other)),
        }
    }
}
