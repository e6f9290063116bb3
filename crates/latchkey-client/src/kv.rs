//! The first API room: [`Client`] itself (how one is made, the router it
//! sends through) and its key-value calls. Every other room (`lock`,
//! `admin`, `auth`) adds calls to the `Client` defined here, so they import
//! this room; it imports none of them, only the router and the transport's
//! [`TransportStats`] below.

use std::ops::Range;
use std::sync::Arc;

use latchkey_core::{BatchOp, Command, CommandResult, Condition, Outcome, Query, ScanRange};
use latchkey_proto::{LocalReplica, Operation};

use crate::error::Error;
use crate::options::ClientOptions;
use crate::router::Router;
use crate::transport::TransportStats;

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
}

/// Entries returned by [`Client::scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage {
    /// Key/value pairs, in scan order.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// More keys matched beyond the limit.
    pub more: bool,
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
    pub fn when_value(mut self, key: impl AsRef<[u8]>, expected: Option<impl AsRef<[u8]>>) -> Self {
        self.conditions.push(Condition::ValueIs {
            key: key.as_ref().to_vec(),
            expected: expected.map(|v| v.as_ref().to_vec()),
        });
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
        Ok(Client {
            router: Arc::new(Router::new(endpoints, None, options)?),
        })
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
        Ok(Client {
            router: Arc::new(Router::new(endpoints, Some(local), options)?),
        })
    }

    pub(crate) fn router(&self) -> &Router {
        &self.router
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
    pub async fn execute(&self, command: Command) -> Result<Outcome, Error> {
        self.execute_with(command, false).await
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
        let result: CommandResult = self
            .router
            .call(false, |target, budget| {
                let op = op.clone();
                async move { target.send(op, budget).await }
            })
            .await?;
        Ok(result?)
    }

    /// Set `key` to `value`.
    pub async fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), Error> {
        match self
            .execute(Command::Put {
                key: bytes(key),
                value: bytes(value),
            })
            .await?
        {
            Outcome::Done => Ok(()),
            other => Err(unexpected("Done", &other)),
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
            Outcome::Previous(v) => Ok(v),
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
        match self
            .execute(Command::CompareAndPut {
                key: bytes(key),
                expected: expected.map(bytes),
                value: bytes(value),
            })
            .await?
        {
            Outcome::Swapped { succeeded, current } => Ok((succeeded, current)),
            other => Err(unexpected("Swapped", &other)),
        }
    }

    /// Remove `key`. Returns whether it existed.
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        match self.execute(Command::Delete { key: bytes(key) }).await? {
            Outcome::Deleted(n) => Ok(n > 0),
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
            Outcome::Deleted(n) => Ok(n),
            other => Err(unexpected("Deleted", &other)),
        }
    }

    /// Apply a [`Batch`]. Returns `Err(index)` of the first condition that did
    /// not hold (nothing written), or `Ok(())` when everything was applied.
    pub async fn batch(&self, batch: Batch) -> Result<Result<(), u32>, Error> {
        match self.execute(batch.into_command()).await? {
            Outcome::Batch { failed_condition } => Ok(match failed_condition {
                None => Ok(()),
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
        match self
            .query(Query::Get { key: bytes(key) }, consistency)
            .await?
        {
            Outcome::Value(v) => Ok(v),
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
            Outcome::Values(v) => Ok(v),
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
            Outcome::Entries { entries, more } => Ok(ScanPage { entries, more }),
            other => Err(unexpected("Entries", &other)),
        }
    }
}
