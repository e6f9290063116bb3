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
//! stays between the replicas (firewall it so).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_proto::v1::{
    admin_server::AdminServer, auth_server::AuthServer, kv_server::KvServer,
    lock_server::LockServer, membership_server::MembershipServer, pipeline_server::PipelineServer,
    raft_server::RaftServer,
};
use latchkey_proto::NodeStatus;
use latchkey_storage::StorageOptions;
use openraft::Raft;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;

use crate::bootstrap::ClusterState;
use crate::health::Condition;
use crate::locks::LockShared;
use crate::network::PeerNetwork;
use crate::peer_auth::PeerCredentials;
use crate::replica::Replica;
use crate::services::{
    AdminService, AuthService, KvService, LockService, MembershipService, PipelineService,
    RaftService,
};
use crate::{ClusterSecret, NodeError, RaftSettings, ServerTls, MAX_MESSAGE_BYTES};
use latchkey_proto::MAX_REQUEST_BYTES;
use tonic::service::interceptor::InterceptedService;

/// Configures and starts a [`Server`].
///
/// ```no_run
/// # async fn demo() -> Result<(), latchkey_server::NodeError> {
/// use latchkey_server::Server;
/// let server = Server::builder(1)
///     .listen("127.0.0.1:7101".parse().expect("literal address"))
///     .data_dir("/var/lib/myapp/latchkey")
///     // Peers: this node listens on its own entry, 127.0.0.1:7201.
///     .initial_members([(1, "127.0.0.1:7201"), (2, "127.0.0.1:7202"), (3, "127.0.0.1:7203")])
///     .start()
///     .await?;
/// server.shutdown().await;
/// # Ok(()) }
/// ```
pub struct ServerBuilder {
    id: u64,
    listen: Option<SocketAddr>,
    listener: Option<std::net::TcpListener>,
    peer_listen: Option<SocketAddr>,
    peer_listener: Option<std::net::TcpListener>,
    metrics_listen: Option<SocketAddr>,
    metrics_listener: Option<std::net::TcpListener>,
    advertise: Option<String>,
    data_dir: Option<PathBuf>,
    initial_members: BTreeMap<u64, String>,
    /// Why the initial members cannot be used (an id or address twice).
    member_conflict: Option<String>,
    cluster_state: ClusterState,
    raft: RaftSettings,
    storage: StorageOptions,
    secret: Option<ClusterSecret>,
    tls: Option<ServerTls>,
    max_connections: usize,
    max_connections_per_address: usize,
    handshake_timeout: Duration,
}

/// The initial members `(id, "host:port")` as a map, or why they cannot
/// be: an id listed twice, or an address listed for two ids.
///
/// ```
/// let ok = latchkey_server::initial_member_map([(1, "a:1"), (2, "b:1")]).unwrap();
/// assert_eq!(ok.len(), 2);
/// assert!(latchkey_server::initial_member_map([(1, "a:1"), (1, "b:1")]).is_err());
/// assert!(latchkey_server::initial_member_map([(1, "a:1"), (2, "a:1")]).is_err());
/// ```
pub fn initial_member_map<I, S>(members: I) -> Result<BTreeMap<u64, String>, String>
where
    I: IntoIterator<Item = (u64, S)>,
    S: Into<String>,
{
    let mut map: BTreeMap<u64, String> = BTreeMap::new();
    for (id, addr) in members {
        let addr = addr.into();
        if let Some(first) = map.get(&id) {
            return Err(format!(
                "node {id} is listed twice in the initial members ({first} and {addr})"
            ));
        }
        if let Some((other, _)) = map.iter().find(|(_, a)| **a == addr) {
            return Err(format!(
                "{addr} is listed for both node {other} and node {id} in the initial members"
            ));
        }
        map.insert(id, addr);
    }
    Ok(map)
}

impl ServerBuilder {
    /// The secret every replica of the cluster shares: peer calls carry it,
    /// and calls without it are refused (see [`ClusterSecret`]). Without
    /// one, peer calls are not authenticated (a warning says so at start).
    pub fn cluster_secret(mut self, secret: ClusterSecret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Serve TLS, and call peers over mutual TLS (see [`ServerTls`]).
    /// Without it everything is plaintext, and a replica listening on an
    /// address other than loopback says so in a warning at start.
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Most connections held open at once on each listener (clients, peers);
    /// more are closed on accept and logged (default
    /// [`crate::DEFAULT_MAX_CONNECTIONS`]).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max;
        self
    }

    /// Most connections held open at once from one IP address on each
    /// listener; more from it are closed on accept and logged (default
    /// [`crate::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS`]).
    pub fn max_connections_per_address(mut self, max: usize) -> Self {
        self.max_connections_per_address = max;
        self
    }

    /// How long a new connection has to send its first bytes, and with TLS
    /// to finish its TLS handshake, before it is closed (default
    /// [`crate::DEFAULT_HANDSHAKE_TIMEOUT`]).
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Listen for clients on `addr`. Required (or [`ServerBuilder::listener`]).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// Serve clients on an already bound listener (handy with port 0 in
    /// tests).
    pub fn listener(mut self, listener: std::net::TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Listen for peers (Raft, membership changes) on `addr` (default: this
    /// node's entry in the initial members).
    pub fn peer_listen(mut self, addr: SocketAddr) -> Self {
        self.peer_listen = Some(addr);
        self
    }

    /// Serve peers on an already bound listener (handy with port 0 in tests).
    pub fn peer_listener(mut self, listener: std::net::TcpListener) -> Self {
        self.peer_listener = Some(listener);
        self
    }

    /// Serve `/metrics` (Prometheus), `/healthz` and `/readyz` over HTTP
    /// on `addr` (default: no such listener; see `crate::metrics`). It
    /// has no authentication, like etcd's: keep it on a network only the
    /// monitoring can reach.
    pub fn metrics_listen(mut self, addr: SocketAddr) -> Self {
        self.metrics_listen = Some(addr);
        self
    }

    /// Serve metrics on an already bound listener (see
    /// [`ServerBuilder::metrics_listen`]).
    pub fn metrics_listener(mut self, listener: std::net::TcpListener) -> Self {
        self.metrics_listener = Some(listener);
        self
    }

    /// The address clients use to reach this node, if it differs from the
    /// client listener's address (needed when that is a wildcard such as
    /// `0.0.0.0`). The membership records it, and clients that must find
    /// the leader are sent there. Peers reach a node at the address given
    /// for it in the initial members or in `members add`.
    pub fn advertise(mut self, addr: impl Into<String>) -> Self {
        self.advertise = Some(addr.into());
        self
    }

    /// Where this replica keeps its RocksDB data. Required.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// The cluster's first voters, `(id, "host:port")` of each one's peer
    /// listener. Every initial member must be started with the same list; a
    /// node that already has data ignores it. Leave empty for a node that
    /// will be added later. An id listed twice, or an address listed for two
    /// ids, is a configuration error at [`ServerBuilder::start`].
    pub fn initial_members<I, S>(mut self, members: I) -> Self
    where
        I: IntoIterator<Item = (u64, S)>,
        S: Into<String>,
    {
        match initial_member_map(members) {
            Ok(map) => {
                self.initial_members = map;
                self.member_conflict = None;
            }
            Err(conflict) => {
                self.initial_members.clear();
                self.member_conflict = Some(conflict);
            }
        }
        self
    }

    /// Whether this node, when its data directory is empty, may form a new
    /// cluster with the other initial members ([`ClusterState::New`], the
    /// default: it does so only once every initial member answers and none
    /// belongs to a cluster yet), or must wait to be added to an existing
    /// one ([`ClusterState::Existing`], for a node whose disk was replaced).
    /// A node with data ignores it. See `crate::bootstrap`.
    pub fn initial_cluster_state(mut self, state: ClusterState) -> Self {
        self.cluster_state = state;
        self
    }

    /// Raft timing and log retention.
    pub fn raft_settings(mut self, settings: RaftSettings) -> Self {
        self.raft = settings;
        self
    }

    /// RocksDB tuning.
    pub fn storage_options(mut self, options: StorageOptions) -> Self {
        self.storage = options;
        self
    }

    /// Open the data, start Raft and the gRPC server, and join (or form) the
    /// cluster.
    pub async fn start(self) -> Result<Server, NodeError> {
        let id = self.id;
        if id == 0 {
            return Err(NodeError::Config(
                "node id 0 is reserved; use 1 or more".into(),
            ));
        }
        if let Some(conflict) = self.member_conflict {
            return Err(NodeError::Config(conflict));
        }
        let data_dir = self
            .data_dir
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
        let listener = match (self.listener, self.listen) {
            (Some(l), _) => l,
            (None, Some(addr)) => bind("clients", &addr.to_string())?,
            (None, None) => {
                return Err(NodeError::Config(
                    "a client listen address is required (--listen)".into(),
                ))
            }
        };
        let peer_listener = match (self.peer_listener, self.peer_listen) {
            (Some(l), _) => l,
            (None, Some(addr)) => bind("peers", &addr.to_string())?,
            (None, None) => match self.initial_members.get(&id) {
                Some(a) => bind("peers", a)?,
                None => {
                    return Err(NodeError::Config(
                        "a peer listen address is required (--peer-listen)".into(),
                    ))
                }
            },
        };
        let metrics_listener = match (self.metrics_listener, self.metrics_listen) {
            (Some(l), _) => Some(l),
            (None, Some(addr)) => Some(bind("metrics", &addr.to_string())?),
            (None, None) => None,
        };
        let local_addr = nonblocking_addr(&listener)?;
        let peer_addr = nonblocking_addr(&peer_listener)?;
        if local_addr == peer_addr {
            return Err(NodeError::Config(format!(
                "the client and peer listeners are both {local_addr}: give them different ports"
            )));
        }
        let advertise = match self.advertise {
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

        let overlap = self.storage.overlap_leader_fsync;
        let (log_store, mut state_machine) = latchkey_storage::open(&data_dir, self.storage)
            .map_err(|e| NodeError::Storage(e.to_string()))?;
        if overlap {
            log_store
                .overlap_leader_fsync(id)
                .map_err(|e| NodeError::Storage(e.to_string()))?;
        }
        let incarnation = log_store.incarnation();
        let metrics = crate::metrics::Metrics::new();
        log_store.observe(metrics.storage_observer());
        let sentinel = log_store.mark_path();
        // Always capped: the cap is a no-op unless the leader acknowledged
        // its own appends before syncing them.
        if self.secret.is_none() {
            tracing::warn!(
                "no cluster secret: Raft calls from anyone who can reach this port are \
                 accepted; give every replica the same --cluster-secret-file"
            );
        }
        if self.tls.is_none() && !(local_addr.ip().is_loopback() && peer_addr.ip().is_loopback()) {
            tracing::warn!(
                listen = %local_addr,
                peer_listen = %peer_addr,
                "no TLS on an address other than loopback: calls, keys, values, session \
                 secrets and the cluster secret travel in the clear; give every replica \
                 --cert, --key and --cacert (see `latchkey certs`)"
            );
        }
        let network = PeerNetwork::new(id, incarnation, log_store.durable(), credentials);
        let reader = state_machine.reader();
        let restore_seed = reader
            .restored_seed()
            .map_err(|e| NodeError::Storage(e.to_string()))?
            .unwrap_or(0);
        let changes = state_machine.subscribe();
        let db_closed = state_machine.closed_signal();
        let pace = log_store.snapshot_pace();
        let (locks, keep_alives) = LockShared::new();
        let config = self.raft.to_config()?;
        let raft = Raft::new(id, config, network.clone(), log_store, state_machine)
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        let replica = Arc::new(Replica::new(
            id,
            incarnation,
            advertise.clone(),
            raft.clone(),
            network,
            reader,
            self.raft.write_timeout,
            self.raft.read_timeout,
            locks,
            self.tls
                .as_ref()
                .is_some_and(ServerTls::names_certificate_users),
            restore_seed,
            metrics,
        ));
        let (lock_stop, lock_stop_rx) = oneshot::channel::<()>();
        let lock_task = tokio::spawn(crate::locks::run(
            replica.clone(),
            changes,
            keep_alives,
            lock_stop_rx,
        ));

        // grpc.health.v1: NOT_SERVING until the health watch says otherwise.
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        crate::health::report(&health_reporter, false).await;
        // Reflection in both protocol versions: grpc.reflection.v1 (grpcurl,
        // current tools) and v1alpha (what grpcio-reflection's Python
        // client and older tools speak).
        // Only the services of the client listener are advertised (the
        // descriptor set holds the peer ones too).
        let reflection_builder = || {
            [
                "latchkey.v1.Kv",
                "latchkey.v1.Lock",
                "latchkey.v1.Pipeline",
                "latchkey.v1.Admin",
                "latchkey.v1.Auth",
                "grpc.health.v1.Health",
            ]
            .into_iter()
            .fold(
                tonic_reflection::server::Builder::configure()
                    .register_encoded_file_descriptor_set(latchkey_proto::FILE_DESCRIPTOR_SET)
                    .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
                |builder, name| builder.with_service_name(name),
            )
        };
        let reflection = reflection_builder()
            .build_v1()
            .map_err(|e| NodeError::Config(format!("gRPC reflection: {e}")))?;
        let reflection_v1alpha = reflection_builder()
            .build_v1alpha()
            .map_err(|e| NodeError::Config(format!("gRPC reflection: {e}")))?;
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
        let check = crate::peer_auth::Check {
            secret: self.secret.clone(),
            tls: self.tls.is_some(),
        };
        let clients = base_server()
            .add_service(
                KvServer::new(KvService {
                    replica: replica.clone(),
                })
                .max_decoding_message_size(MAX_REQUEST_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                PipelineServer::new(PipelineService {
                    replica: replica.clone(),
                    stopping: streams_stopped.clone(),
                })
                .max_decoding_message_size(MAX_REQUEST_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                LockServer::new(LockService {
                    replica: replica.clone(),
                })
                .max_decoding_message_size(MAX_REQUEST_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(AdminServer::new(AdminService {
                replica: replica.clone(),
            }))
            .add_service(
                AuthServer::new(AuthService {
                    replica: replica.clone(),
                })
                .max_decoding_message_size(MAX_REQUEST_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha);
        let peers = base_server()
            .add_service(InterceptedService::new(
                RaftServer::new(RaftService {
                    replica: replica.clone(),
                    stopping: streams_stopped.clone(),
                    tls: self.tls.is_some(),
                })
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
                check.clone(),
            ))
            .add_service(InterceptedService::new(
                MembershipServer::new(MembershipService {
                    replica: replica.clone(),
                })
                .max_decoding_message_size(MAX_REQUEST_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
                check,
            ));
        let (stop, server) = spawn_serving("clients", clients, listener, &limits)?;
        let (peer_stop, peer_server) = spawn_serving("peers", peers, peer_listener, &limits)?;
        let mut stops = vec![stop, peer_stop];
        let mut servers = vec![
            server,
            peer_server,
            crate::metrics::watch_leader(replica.clone()),
            tokio::spawn(crate::snapshot_pace::run(
                raft.clone(),
                pace,
                self.raft.snapshot_every,
            )),
        ];
        let metrics_addr = match metrics_listener {
            Some(listener) => {
                let (metrics_stop, metrics_stop_rx) = oneshot::channel::<()>();
                let (addr, task) =
                    crate::metrics::serve(replica.clone(), listener, metrics_stop_rx)?;
                stops.push(metrics_stop);
                servers.push(task);
                Some(addr)
            }
            None => None,
        };

        let (health_stop, health_stop_rx) = oneshot::channel::<()>();
        let health_task = tokio::spawn(crate::health::watch(
            replica.clone(),
            sentinel,
            health_reporter,
            health_stop_rx,
        ));

        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        let bootstrap = if initialized {
            tracing::info!(
                node = id,
                incarnation,
                "restarted with existing data; not initialising"
            );
            None
        } else if !self.initial_members.is_empty() {
            Some(tokio::spawn(crate::bootstrap::run(
                replica.clone(),
                self.initial_members.clone(),
                self.cluster_state,
                self.raft.election_max,
            )))
        } else {
            tracing::info!(
                node = id,
                incarnation,
                "no initial members: waiting to be added to a cluster (`latchkey members add`)"
            );
            None
        };

        Ok(Server {
            id,
            advertise,
            local_addr,
            peer_addr,
            replica,
            metrics_addr,
            stops,
            streams_stop,
            servers,
            lock_stop: Some(lock_stop),
            lock_task: Some(lock_task),
            health_stop: Some(health_stop),
            health_task: Some(health_task),
            bootstrap,
            db_closed,
        })
    }
}

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
        ServerBuilder {
            id,
            listen: None,
            listener: None,
            peer_listen: None,
            peer_listener: None,
            metrics_listen: None,
            metrics_listener: None,
            advertise: None,
            data_dir: None,
            initial_members: BTreeMap::new(),
            member_conflict: None,
            cluster_state: ClusterState::New,
            raft: RaftSettings::default(),
            storage: StorageOptions::default(),
            secret: None,
            tls: None,
            max_connections: crate::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: crate::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            handshake_timeout: crate::DEFAULT_HANDSHAKE_TIMEOUT,
        }
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
    pub async fn shutdown(mut self) {
        self.stop_now().await;
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

/// The connection limits each listener enforces (see `crate::conn_limit`),
/// and its TLS (see `crate::tls_accept`).
struct Limits {
    max_connections: usize,
    max_connections_per_address: usize,
    handshake_timeout: Duration,
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// The HTTP/2 settings both listeners share. (TLS is accepted before
/// tonic sees a connection, `crate::tls_accept`; on the peer listener,
/// calls without a client certificate are refused by `peer_auth::Check`.)
fn base_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        // A connection whose peer stopped answering pings is closed.
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(crate::MAX_STREAMS_PER_CONNECTION)
}

/// Serve `router` on `listener` (within `limits`) in a task, until the
/// returned sender fires.
fn spawn_serving(
    what: &'static str,
    router: tonic::transport::server::Router,
    listener: std::net::TcpListener,
    limits: &Limits,
) -> Result<(oneshot::Sender<()>, JoinHandle<()>), NodeError> {
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|e| NodeError::Io(e.to_string()))?;
    // With an incoming stream, tonic ignores the builder's tcp_nodelay:
    // set it on the stream, or Nagle + delayed ACKs add ~40 ms stalls to
    // replies (reads, lock hand-offs).
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let incoming = crate::conn_limit::limit(
        incoming,
        limits.max_connections,
        limits.max_connections_per_address,
        limits.handshake_timeout,
    );
    let (stop, stop_rx) = oneshot::channel::<()>();
    let stopped = async {
        let _ = stop_rx.await;
    };
    let report = move |result: Result<(), tonic::transport::Error>| {
        if let Err(e) = result {
            tracing::error!(listener = what, error = %e, "gRPC server stopped");
        }
    };
    let task = match &limits.tls {
        None => {
            let serving = router.serve_with_incoming_shutdown(incoming, stopped);
            tokio::spawn(async move { report(serving.await) })
        }
        Some(config) => {
            let incoming = crate::tls_accept::accept(
                incoming,
                Arc::clone(config),
                limits.handshake_timeout,
                limits.max_connections,
            );
            let serving = router.serve_with_incoming_shutdown(incoming, stopped);
            tokio::spawn(async move { report(serving.await) })
        }
    };
    Ok((stop, task))
}
