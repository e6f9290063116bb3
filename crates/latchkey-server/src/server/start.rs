//! [`ServerBuilder::start`]: a replica's start, as a list of named steps.
//!
//! 1. [`ServerBuilder::check`] the configuration (nothing opened yet);
//! 2. [`ServerBuilder::bind_listeners`]: the client, peer and metrics
//!    listeners, and the address clients are told;
//! 3. [`ServerBuilder::open_replica`]: the data directory, Raft, and the
//!    replica's request path;
//! 4. [`start_lock_task`]: waiters, countdowns, keep-alives;
//! 5. [`ServerBuilder::serve_grpc`]: the client and peer listeners;
//! 6. [`serve_metrics`]: the optional metrics listener;
//! 7. [`watch_health`]: the watch that fails the replica when it must stop;
//! 8. [`ServerBuilder::join_cluster`]: form the cluster, rejoin it, or wait
//!    to be added.
//!
//! A step that fails ends the start with a [`NodeError`]; what earlier
//! steps started stops when its handles drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use latchkey_storage::{DbClosed, StateChange};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tonic_health::server::HealthReporter;

use crate::locks::{LockInbox, LockShared};
use crate::network::PeerNetwork;
use crate::peer_auth::PeerCredentials;
use crate::raft_view::RaftView;
use crate::replica::{Parts, Replica};
use crate::{NodeError, ServerTls};

use super::builder::ServerBuilder;
use super::grpc::{client_router, peer_router, spawn_serving, Limits};
use super::Server;

/// The listeners a replica serves on, bound.
struct Listeners {
    clients: std::net::TcpListener,
    peers: std::net::TcpListener,
    metrics: Option<std::net::TcpListener>,
    local_addr: SocketAddr,
    peer_addr: SocketAddr,
    /// The address clients reach this node at.
    advertise: String,
}

/// A replica whose Raft core runs, not yet serving.
struct Opened {
    replica: Arc<Replica>,
    /// The data directory's sentinel file (the acknowledgement mark).
    sentinel: PathBuf,
    /// Every entry the state machine applies, for the lock task.
    changes: mpsc::UnboundedReceiver<StateChange>,
    inbox: LockInbox,
    db_closed: DbClosed,
    pace: latchkey_storage::SnapshotPace,
}

/// A task and what stops it.
struct Task {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The gRPC listeners, serving.
struct Serving {
    stops: Vec<oneshot::Sender<()>>,
    servers: Vec<JoinHandle<()>>,
    /// Ends the open `AppendEntriesStream`s and call streams.
    streams_stop: watch::Sender<bool>,
    health_reporter: HealthReporter,
}

impl ServerBuilder {
    /// Open the data, start Raft and the gRPC server, and join (or form) the
    /// cluster (the steps are listed in this room's docs).
    pub async fn start(mut self) -> Result<Server, NodeError> {
        let (data_dir, credentials) = self.check()?;
        let listeners = self.bind_listeners(&credentials)?;
        let opened = self.open_replica(data_dir, credentials, &listeners).await?;
        let replica = Arc::clone(&opened.replica);
        let locks = start_lock_task(&replica, opened.changes, opened.inbox);
        let mut serving = self
            .serve_grpc(&replica, listeners.clients, listeners.peers)
            .await?;
        serving
            .servers
            .push(crate::metrics::watch_leader(replica.clone()));
        serving.servers.push(tokio::spawn(crate::snapshot_pace::run(
            replica.raft().clone(),
            opened.pace,
            self.raft.snapshot_every,
        )));
        let metrics_addr = match listeners.metrics {
            Some(listener) => {
                let (addr, metrics) = serve_metrics(&replica, listener)?;
                serving.stops.push(metrics.stop);
                serving.servers.push(metrics.task);
                Some(addr)
            }
            None => None,
        };
        let health = watch_health(&replica, opened.sentinel, serving.health_reporter);
        let bootstrap = self.join_cluster(&replica).await?;
        Ok(Server {
            id: self.id,
            advertise: listeners.advertise,
            local_addr: listeners.local_addr,
            peer_addr: listeners.peer_addr,
            replica,
            metrics_addr,
            stops: serving.stops,
            streams_stop: serving.streams_stop,
            servers: serving.servers,
            lock_stop: Some(locks.stop),
            lock_task: Some(locks.task),
            health_stop: Some(health.stop),
            health_task: Some(health.task),
            bootstrap,
            db_closed: opened.db_closed,
        })
    }

    /// Step 1: the node id, the initial members and the data directory are
    /// usable, and so is every peer address with these credentials.
    fn check(&self) -> Result<(PathBuf, PeerCredentials), NodeError> {
        let id = self.id;
        if id == 0 {
            return Err(NodeError::Config(
                "node id 0 is reserved; use 1 or more".into(),
            ));
        }
        if let Some(conflict) = &self.member_conflict {
            return Err(NodeError::Config(conflict.clone()));
        }
        let data_dir = self
            .data_dir
            .clone()
            .ok_or_else(|| NodeError::Config("a data directory is required".into()))?;
        if !self.initial_members.is_empty() && !self.initial_members.contains_key(&id) {
            return Err(NodeError::Config(format!(
                "node {id} is not in the initial members {:?}",
                self.initial_members.keys().collect::<Vec<_>>()
            )));
        }
        let credentials = PeerCredentials {
            secret: self.secret.clone(),
            tls: self.tls.as_ref().map(ServerTls::client_options),
        };
        for addr in self.initial_members.values() {
            credentials
                .channel(addr)
                .map_err(|e| NodeError::Config(e.to_string()))?;
        }
        Ok((data_dir, credentials))
    }

    /// Step 2: bind (or take) the listeners and settle the address clients
    /// are told; warn when the cluster is open to strangers.
    fn bind_listeners(&mut self, credentials: &PeerCredentials) -> Result<Listeners, NodeError> {
        let clients = match (self.listener.take(), self.listen) {
            (Some(l), _) => l,
            (None, Some(addr)) => bind("clients", &addr.to_string())?,
            (None, None) => {
                return Err(NodeError::Config(
                    "a client listen address is required (--listen)".into(),
                ))
            }
        };
        let peers = match (self.peer_listener.take(), self.peer_listen) {
            (Some(l), _) => l,
            (None, Some(addr)) => bind("peers", &addr.to_string())?,
            (None, None) => match self.initial_members.get(&self.id) {
                Some(a) => bind("peers", a)?,
                None => {
                    return Err(NodeError::Config(
                        "a peer listen address is required (--peer-listen)".into(),
                    ))
                }
            },
        };
        let metrics = match (self.metrics_listener.take(), self.metrics_listen) {
            (Some(l), _) => Some(l),
            (None, Some(addr)) => Some(bind("metrics", &addr.to_string())?),
            (None, None) => None,
        };
        let local_addr = nonblocking_addr(&clients)?;
        let peer_addr = nonblocking_addr(&peers)?;
        if local_addr == peer_addr {
            return Err(NodeError::Config(format!(
                "the client and peer listeners are both {local_addr}: give them different ports"
            )));
        }
        let advertise = match self.advertise.clone() {
            Some(a) => a,
            None if local_addr.ip().is_unspecified() => {
                return Err(NodeError::Config(format!(
                    "clients are served on the wildcard address {local_addr}: give the address \
                     clients reach this node at (--advertise)"
                )))
            }
            None => local_addr.to_string(),
        };
        credentials
            .channel(&advertise)
            .map_err(|e| NodeError::Config(format!("the advertised client address: {e}")))?;
        Ok(Listeners {
            clients,
            peers,
            metrics,
            local_addr,
            peer_addr,
            advertise,
        })
    }

    /// Step 3: open the data directory, start Raft on it and build the
    /// replica's request path.
    async fn open_replica(
        &self,
        data_dir: PathBuf,
        credentials: PeerCredentials,
        listeners: &Listeners,
    ) -> Result<Opened, NodeError> {
        let id = self.id;
        let (log_store, mut state_machine) =
            latchkey_storage::open(&data_dir, self.storage.clone())
                .map_err(|e| NodeError::Storage(e.to_string()))?;
        let incarnation = log_store.incarnation();
        let metrics = crate::metrics::Metrics::new(crate::metrics::process_counts());
        log_store.observe(metrics.storage_observer());
        let sentinel = log_store.mark_path();
        self.warn_if_open(listeners);
        let network = PeerNetwork::new(id, incarnation, credentials);
        let reader = state_machine.reader();
        let restore_seed = reader
            .restored_seed()
            .map_err(|e| NodeError::Storage(e.to_string()))?
            .unwrap_or(0);
        let changes = state_machine.subscribe();
        let revisions = state_machine.revisions();
        let db_closed = state_machine.closed_signal();
        let pace = log_store.snapshot_pace();
        let (locks, inbox) = LockShared::new();
        let config = self.raft.to_config()?;
        let raft = openraft::Raft::new(id, config, network.clone(), log_store, state_machine)
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        let replica = Arc::new(Replica::new(Parts {
            view: RaftView::new(id, incarnation, raft),
            client_addr: listeners.advertise.clone(),
            peers: network,
            reader,
            write_timeout: self.raft.write_timeout,
            read_timeout: self.raft.read_timeout,
            locks,
            certificate_users: self
                .tls
                .as_ref()
                .is_some_and(ServerTls::names_certificate_users),
            restore_seed,
            metrics,
            watch_limits: crate::watch::WatchLimits {
                per_replica: self.max_watches,
                per_connection: self.max_watches_per_connection,
            },
        }));
        replica.watches().start_at(*revisions.borrow());
        tokio::spawn(crate::watch::run_feed(
            Arc::clone(replica.watches()),
            revisions,
        ));
        Ok(Opened {
            replica,
            sentinel,
            changes,
            inbox,
            db_closed,
            pace,
        })
    }

    /// Warn when Raft calls are accepted from anyone, or calls travel in
    /// the clear beyond loopback.
    fn warn_if_open(&self, listeners: &Listeners) {
        if self.secret.is_none() {
            tracing::warn!(
                "no cluster secret: Raft calls from anyone who can reach this port are \
                 accepted; give every replica the same --cluster-secret-file"
            );
        }
        let (local_addr, peer_addr) = (listeners.local_addr, listeners.peer_addr);
        if self.tls.is_none() && !(local_addr.ip().is_loopback() && peer_addr.ip().is_loopback()) {
            tracing::warn!(
                listen = %local_addr,
                peer_listen = %peer_addr,
                "no TLS on an address other than loopback: calls, keys, values, session \
                 secrets and the cluster secret travel in the clear; give every replica \
                 --cert, --key and --cacert (see `latchkey certs`)"
            );
        }
    }

    /// Step 5: serve the client and peer listeners, within the connection
    /// limits and with TLS if configured.
    async fn serve_grpc(
        &self,
        replica: &Arc<Replica>,
        clients: std::net::TcpListener,
        peers: std::net::TcpListener,
    ) -> Result<Serving, NodeError> {
        let (streams_stop, streams_stopped) = watch::channel(false);
        let mut trimmer_stop = streams_stopped.clone();
        tokio::spawn(crate::conn_limit::trim_after_floods(async move {
            let _ = trimmer_stop.wait_for(|stop| *stop).await;
        }));
        let limits = Limits {
            max_connections: self.max_connections,
            max_connections_per_address: self.max_connections_per_address,
            handshake_timeout: self.handshake_timeout,
            tls: match &self.tls {
                Some(tls) => Some(crate::tls_accept::server_config(tls)?),
                None => None,
            },
        };
        let (client_router, health_reporter) = client_router(replica, &streams_stopped).await?;
        let peer_router = peer_router(
            replica,
            &streams_stopped,
            self.secret.clone(),
            self.tls.is_some(),
        );
        let (stop, server) = spawn_serving("clients", client_router, clients, &limits)?;
        let (peer_stop, peer_server) = spawn_serving("peers", peer_router, peers, &limits)?;
        Ok(Serving {
            stops: vec![stop, peer_stop],
            servers: vec![server, peer_server],
            streams_stop,
            health_reporter,
        })
    }

    /// Step 8: a replica with data rejoins as it is; a new one forms the
    /// cluster with the initial members, or waits to be added.
    async fn join_cluster(
        &self,
        replica: &Arc<Replica>,
    ) -> Result<Option<JoinHandle<()>>, NodeError> {
        let (id, incarnation) = (self.id, replica.incarnation());
        let initialized = replica
            .raft()
            .is_initialized()
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        if initialized {
            tracing::info!(
                node = id,
                incarnation,
                "restarted with existing data; not initialising"
            );
            Ok(None)
        } else if !self.initial_members.is_empty() {
            Ok(Some(tokio::spawn(crate::bootstrap::run(
                replica.clone(),
                self.initial_members.clone(),
                self.cluster_state,
                self.raft.election_max,
            ))))
        } else {
            tracing::info!(
                node = id,
                incarnation,
                "no initial members: waiting to be added to a cluster (`latchkey members add`)"
            );
            Ok(None)
        }
    }
}

/// Step 4: the lock task (see `crate::locks`).
fn start_lock_task(
    replica: &Arc<Replica>,
    changes: mpsc::UnboundedReceiver<StateChange>,
    inbox: LockInbox,
) -> Task {
    let (stop, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(crate::locks::run(replica.clone(), changes, inbox, stop_rx));
    Task { stop, task }
}

/// Step 6: `/metrics`, `/healthz`, `/readyz` and the status page.
fn serve_metrics(
    replica: &Arc<Replica>,
    listener: std::net::TcpListener,
) -> Result<(SocketAddr, Task), NodeError> {
    let (stop, stop_rx) = oneshot::channel::<()>();
    let (addr, task) = crate::metrics::serve(replica.clone(), listener, stop_rx)?;
    Ok((addr, Task { stop, task }))
}

/// Step 7: the health watch (see `crate::health_watch`).
fn watch_health(replica: &Arc<Replica>, sentinel: PathBuf, reporter: HealthReporter) -> Task {
    let (stop, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(crate::health_watch::watch(
        replica.view().clone(),
        replica.shared_health(),
        sentinel,
        reporter,
        stop_rx,
    ));
    Task { stop, task }
}

/// Bind `addr` for `what` ("clients", "peers").
fn bind(what: &str, addr: &str) -> Result<std::net::TcpListener, NodeError> {
    std::net::TcpListener::bind(addr)
        .map_err(|e| NodeError::Io(format!("cannot listen for {what} on {addr}: {e}")))
}

/// Make `listener` non-blocking (tokio needs it) and return its address.
fn nonblocking_addr(listener: &std::net::TcpListener) -> Result<SocketAddr, NodeError> {
    listener
        .set_nonblocking(true)
        .map_err(|e| NodeError::Io(e.to_string()))?;
    listener
        .local_addr()
        .map_err(|e| NodeError::Io(e.to_string()))
}
