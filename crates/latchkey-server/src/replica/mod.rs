//! One replica's request path: propose writes, serve reads, report status.
//!
//! Both the gRPC services and the in-process client path call [`Replica`],
//! so a request behaves the same whichever way it arrives. Its rooms:
//! `call` (the one entry point, [`Replica::call`]), `write`, `read`,
//! `authenticate`, `backup`, `status`, `watch` (opening a watch), and `lock_host` (what the lock task
//! may ask of it, [`crate::locks::LockHost`]). Everything it builds on lies
//! below it (the write queue, the read gate, the lock tables, the metric
//! registry, health, [`RaftView`]); nothing below imports it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use latchkey_proto::ReplicaFailure;
use latchkey_storage::types::Raft;
use latchkey_storage::StateReader;

use crate::auth::Verified;
use crate::health::Health;
use crate::locks::LockShared;
use crate::metrics::Metrics;
use crate::network::PeerNetwork;
use crate::raft_view::RaftView;
use crate::read_gate::ReadGate;
use crate::watch::{SharedReader, WatchHub, WatchLimits};
use crate::write_queue::WriteQueue;

mod authenticate;
mod backup;
mod call;
mod lock_host;
mod membership_host;
mod read;
mod status;
mod watch;
mod write;

/// A running replica's request path.
pub struct Replica {
    /// Its Raft core and who it is.
    view: RaftView,
    /// The seed of the backup its data directory was restored from, 0 if
    /// none (see `latchkey_storage::backup`).
    restore_seed: u64,
    /// Held while a backup is taken (one at a time).
    backups: tokio::sync::Mutex<()>,
    /// Held while the membership changes (one change at a time).
    membership_changes: tokio::sync::Mutex<()>,
    /// The last lock census and when it was taken (see
    /// [`Replica::lock_census`]).
    census: std::sync::Mutex<Option<(std::time::Instant, latchkey_core::lock::LockCensus)>>,
    /// Where this replica serves clients (see [`Replica::client_addr`]).
    client_addr: String,
    /// Passwords this replica has checked (see `crate::auth`).
    verified: Arc<Verified>,
    /// Whether a client certificate's common name names the caller (see
    /// `crate::auth`; [`crate::ServerTls::certificate_users`]).
    certificate_users: bool,
    /// What this replica measures (see `crate::metrics`).
    metrics: Metrics,
    health: Arc<Health>,
    /// The Raft transport, for the peer problems it reports.
    peers: PeerNetwork,
    /// Taken away at shutdown so the RocksDB instance closes even while
    /// clients of this replica are still alive. Shared with its watches.
    reader: SharedReader,
    /// Its open watches (see `crate::watch`).
    watches: Arc<WatchHub>,
    write_timeout: Duration,
    read_timeout: Duration,
    locks: LockShared,
    writes: WriteQueue,
    reads: ReadGate,
}

/// What a replica is made of (see [`Replica::new`]).
pub(crate) struct Parts {
    pub(crate) view: RaftView,
    pub(crate) client_addr: String,
    pub(crate) peers: PeerNetwork,
    pub(crate) reader: StateReader,
    pub(crate) write_timeout: Duration,
    pub(crate) read_timeout: Duration,
    pub(crate) locks: LockShared,
    pub(crate) certificate_users: bool,
    pub(crate) restore_seed: u64,
    pub(crate) metrics: Metrics,
    pub(crate) watch_limits: WatchLimits,
}

impl Replica {
    /// The request path of a replica made of `parts`; starts its write
    /// queue and read gate.
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            view,
            client_addr,
            peers,
            reader,
            write_timeout,
            read_timeout,
            locks,
            certificate_users,
            restore_seed,
            metrics,
            watch_limits,
        } = parts;
        let reader: SharedReader = Arc::new(RwLock::new(Some(reader)));
        let watches = WatchHub::new(Arc::clone(&reader), view.clone(), watch_limits);
        let writes = WriteQueue::start(view.raft().clone(), write_timeout);
        let reads = ReadGate::start(view.raft().clone());
        Replica {
            view,
            restore_seed,
            backups: tokio::sync::Mutex::new(()),
            membership_changes: tokio::sync::Mutex::new(()),
            census: std::sync::Mutex::new(None),
            client_addr,
            verified: Arc::default(),
            certificate_users,
            metrics,
            health: Arc::new(Health::new()),
            peers,
            writes,
            reads,
            reader,
            watches,
            write_timeout,
            read_timeout,
            locks,
        }
    }

    /// Its Raft core and who it is (a handle for the rooms that need no
    /// more of the replica).
    pub(crate) fn view(&self) -> &RaftView {
        &self.view
    }

    /// Its open watches.
    pub(crate) fn watches(&self) -> &Arc<WatchHub> {
        &self.watches
    }

    /// What its request handlers share with its lock task.
    pub(crate) fn locks(&self) -> &LockShared {
        &self.locks
    }

    /// A storage figure read through the state reader (0 once shut down).
    fn storage_figure(&self, figure: fn(&StateReader) -> u64) -> u64 {
        self.reader
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(0, figure)
    }

    /// Bytes of the live SST files (0 once shut down).
    pub(crate) fn disk_bytes(&self) -> u64 {
        self.storage_figure(StateReader::disk_bytes)
    }

    /// Bytes the state machine holds in memory for the lock rooms
    /// ([`StateReader::lock_rooms_bytes`]; 0 once shut down).
    pub(crate) fn lock_rooms_bytes(&self) -> u64 {
        self.storage_figure(StateReader::lock_rooms_bytes)
    }

    /// RocksDB flushes and compactions running or pending
    /// ([`StateReader::background_jobs`]; 0 once shut down).
    pub(crate) fn storage_background_jobs(&self) -> u64 {
        self.storage_figure(StateReader::background_jobs)
    }

    /// The seed of the backup this data directory was restored from while
    /// it holds no membership yet (what `Raft.Identify` reports; the
    /// bootstrap forms a cluster only from members with equal seeds), else 0.
    pub(crate) fn restore_seed(&self) -> u64 {
        if self.has_membership() {
            0
        } else {
            self.restore_seed
        }
    }

    /// The address this replica serves clients at, as it reports it to
    /// peers (`Raft.Identify`) for the membership to record.
    pub fn client_addr(&self) -> &str {
        &self.client_addr
    }

    /// What this replica measures.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// This replica's condition.
    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// This replica's condition, shared (for its health watch).
    pub(crate) fn shared_health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// Whether this replica's membership lists it, as this incarnation.
    pub(crate) fn is_member(&self) -> bool {
        self.view.is_member()
    }

    /// Whether this replica holds a membership (it belongs to a cluster).
    pub(crate) fn has_membership(&self) -> bool {
        self.view.has_membership()
    }

    /// Refuse every request once this replica has failed: nothing is
    /// proposed, so the caller may retry on another replica.
    fn check_serving(&self) -> Result<(), ReplicaFailure> {
        match self.health.failure() {
            Some(cause) => Err(ReplicaFailure::Unavailable(format!(
                "this replica has failed and serves nothing ({cause}); ask another replica"
            ))),
            None => Ok(()),
        }
    }

    /// A Raft client to the peer at `addr`, over TLS if this replica has
    /// it, its calls carrying the cluster secret.
    pub(crate) fn peer_client(
        &self,
        addr: &str,
    ) -> Result<crate::peer_auth::PeerClient, latchkey_proto::ChannelError> {
        let credentials = self.peers.credentials();
        Ok(credentials.client(credentials.channel(addr)?))
    }

    /// The openraft handle.
    pub(crate) fn raft(&self) -> &Raft {
        self.view.raft()
    }

    /// This replica's node id.
    pub fn id(&self) -> u64 {
        self.view.id()
    }

    /// This replica's data-directory incarnation.
    pub fn incarnation(&self) -> u64 {
        self.view.incarnation()
    }

    /// The leader as this replica knows it: id and client address. Never
    /// itself unless it leads: a leader that removed itself keeps its vote
    /// (and openraft's `current_leader`) but leads no longer.
    pub fn leader(&self) -> Option<(u64, String)> {
        self.view.leader()
    }

    /// Whether this replica leads and has not failed.
    pub(crate) fn is_leader(&self) -> bool {
        self.health.failure().is_none() && self.view.leads()
    }

    fn not_leader(&self) -> ReplicaFailure {
        ReplicaFailure::NotLeader {
            leader: self.leader(),
        }
    }

    /// Drop this replica's handle on the state (called at shutdown, after
    /// Raft has stopped), so its data directory can be opened again.
    pub(crate) fn close(&self) {
        self.reader
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}
