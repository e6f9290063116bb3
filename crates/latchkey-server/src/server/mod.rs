//! [`Server`]: one replica serving gRPC in this process (the facade crate's
//! `Node` adds an in-process client on top).
//!
//! A replica listens twice, at two levels of trust:
//!
//! - the **client listener** (`listen`) serves `Kv`, `Lock`, `Pipeline`,
//!   `Admin.Status`, `grpc.health.v1` and reflection: anyone who may use
//!   the store;
//! - the **peer listener** (`peer_listen`, the address in the initial
//!   members and in `members add`) serves `Raft` and `Membership` only:
//!   other members, and operators holding the cluster's credentials. Every
//!   call there needs the cluster secret, and with TLS a client certificate
//!   of the cluster's CA.
//!
//! Nothing on the client listener reaches Raft or membership, so a client
//! port can be opened to an application's whole network while the peer port
//! stays between the replicas (firewall it so).//!
//! Its rooms: `builder` ([`ServerBuilder`], the configuration), `start`
//! (the start as a list of named steps), `grpc` (the two listeners' gRPC
//! routers) and this one, the running [`Server`].

mod builder;
mod grpc;
mod start;

use openraft::async_runtime::WatchReceiver;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_proto::NodeStatus;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::health::Condition;
use crate::replica::Replica;
use crate::NodeError;

pub use builder::{initial_member_map, ServerBuilder};

/// One running replica serving gRPC, embedded in this process.
///
/// Create with [`Server::builder`]; stop with [`Server::shutdown`]. Its
/// [`Server::replica`] is what an in-process client calls directly.
pub struct Server {
    id: u64,
    advertise: String,
    local_addr: SocketAddr,
    peer_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    replica: Arc<Replica>,
    /// Stop the client, peer and metrics listeners.
    stops: Vec<oneshot::Sender<()>>,
    /// Ends the open `AppendEntriesStream`s (see `RaftService::stopping`).
    streams_stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    lock_stop: Option<oneshot::Sender<()>>,
    lock_task: Option<JoinHandle<()>>,
    health_stop: Option<oneshot::Sender<()>>,
    health_task: Option<JoinHandle<()>>,
    bootstrap: Option<JoinHandle<()>>,
    db_closed: latchkey_storage::DbClosed,
}

impl Server {
    /// Start configuring node `id` (a cluster-unique number, 1 or more).
    pub fn builder(id: u64) -> ServerBuilder {
        ServerBuilder::new(id)
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The address clients reach this node at.
    pub fn advertise_addr(&self) -> &str {
        &self.advertise
    }

    /// The socket address the client listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The socket address the peer listener is bound to.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// Where the metrics listener is bound, if there is one
    /// ([`ServerBuilder::metrics_listen`]).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// This replica's metrics, to render in the Prometheus text format
    /// (whether or not it has a metrics listener; see `crate::metrics`).
    pub fn metrics(&self) -> crate::MetricsHandle {
        crate::MetricsHandle {
            replica: Arc::clone(&self.replica),
        }
    }

    /// The replica's request path, which an in-process client calls
    /// directly (it implements `latchkey_proto::LocalReplica`).
    pub fn replica(&self) -> Arc<Replica> {
        Arc::clone(&self.replica)
    }

    /// The client addresses of the other members this replica knows (where
    /// an in-process client looks for the leader besides this replica; it
    /// learns more from the replicas' leader hints).
    pub fn other_members(&self) -> Vec<String> {
        self.status()
            .members
            .into_iter()
            .filter(|m| m.id != self.id)
            .map(|m| m.client_addr)
            .collect()
    }

    /// This replica's view of itself and the cluster: leader, term, last
    /// applied index, members.
    pub fn status(&self) -> NodeStatus {
        self.replica.status()
    }

    /// True while this replica is the leader.
    pub fn is_leader(&self) -> bool {
        self.replica.is_leader()
    }

    /// This replica's data-directory incarnation: a random identity drawn
    /// when the directory was created. The cluster's membership records it;
    /// a wiped directory gets a new one and must be added again.
    pub fn incarnation(&self) -> u64 {
        self.replica.incarnation()
    }

    /// Why this replica has failed, if it has (see [`Server::failed`]).
    pub fn failure(&self) -> Option<String> {
        self.replica.health().failure()
    }

    /// Resolves once this replica has failed for good, with the cause: its
    /// Raft core stopped (a storage error, a panic) or its data directory
    /// vanished. From then on it serves nothing (requests get UNAVAILABLE,
    /// safe to retry elsewhere) and never names itself leader. What to do is
    /// the application's call; `latchkey serve` exits non-zero so that its
    /// supervisor restarts it.
    ///
    /// ```no_run
    /// # async fn demo(node: latchkey_server::Server) {
    /// let cause = node.failed().await;
    /// eprintln!("latchkey replica failed: {cause}");
    /// node.shutdown().await;
    /// std::process::exit(1);
    /// # }
    /// ```
    pub async fn failed(&self) -> String {
        self.replica.health().failed().await
    }

    /// Whether this replica is waiting to be added to an existing cluster
    /// (a new data directory), and what the operator should do.
    pub fn waiting(&self) -> Option<String> {
        match self.replica.health().condition() {
            Condition::Waiting(why) => Some(why),
            _ => None,
        }
    }

    /// Wait until this replica knows a leader; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<u64, NodeError> {
        let deadline = Instant::now() + timeout;
        let mut metrics = self.replica.raft().metrics();
        loop {
            if let Some((l, _)) = self.replica.leader() {
                return Ok(l);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(NodeError::Raft("raft stopped".into())),
                Err(_) => {
                    return Err(NodeError::Timeout(format!(
                        "no leader known after {timeout:?}"
                    )))
                }
            }
        }
    }

    /// Stop serving and stop Raft, and wait until the data directory is
    /// released. Data stays on disk; a node started again on the same data
    /// directory rejoins without re-initialising.
    ///
    /// A leader first hands leadership to the most up-to-date voter (within
    /// about two seconds): writes it already proposed are answered, later
    /// ones are refused as retryable, and clients move to the new leader
    /// without waiting for an election. What happened is returned.
    pub async fn shutdown(mut self) -> crate::HandOver {
        let (handed, paused) = crate::hand_over::hand_over(&*self.replica).await;
        self.stop_now().await;
        drop(paused);
        handed
    }

    async fn stop_now(&mut self) {
        if let Some(task) = self.bootstrap.take() {
            task.abort();
        }
        if let Some(stop) = self.health_stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.health_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        self.streams_stop.send_replace(true);
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        if let Some(stop) = self.lock_stop.take() {
            let _ = stop.send(());
        }
        if let Err(e) = self.replica.raft().shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        if let Some(task) = self.lock_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        self.replica.close();
        for server in self.servers.drain(..) {
            let abort = server.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .is_err()
            {
                // A stream the shutdown waits for is still open: close it.
                tracing::warn!(
                    node = self.id,
                    "gRPC server still busy 5 s after shutdown: aborting it"
                );
                abort.abort();
            }
        }
        // openraft's shutdown joins its core task, but the state machine
        // worker and snapshot tasks end a moment later: wait until RocksDB
        // is really closed, so the data directory can be opened again.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.db_closed.is_closed() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !self.db_closed.is_closed() {
            tracing::warn!(node = self.id, "RocksDB still open 10 s after shutdown");
        }
        tracing::info!(node = self.id, "stopped");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = self.bootstrap.take() {
            task.abort();
        }
        if let Some(stop) = self.health_stop.take() {
            let _ = stop.send(());
        }
        self.streams_stop.send_replace(true);
        if let Some(stop) = self.lock_stop.take() {
            let _ = stop.send(());
        }
        if !self.stops.is_empty() {
            for stop in self.stops.drain(..) {
                let _ = stop.send(());
            }
            let raft = self.replica.raft().clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = raft.shutdown().await;
                });
            }
        }
    }
}
