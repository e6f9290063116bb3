//! [`ServerBuilder`]: what a [`super::Server`] is configured with before
//! it starts (`super::start` carries the start out).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use latchkey_storage::StorageOptions;

use crate::bootstrap::ClusterState;
use crate::{ClusterSecret, RaftSettings, ServerTls};

/// Configures and starts a [`Server`](super::Server).
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
    pub(super) id: u64,
    pub(super) listen: Option<SocketAddr>,
    pub(super) listener: Option<std::net::TcpListener>,
    pub(super) peer_listen: Option<SocketAddr>,
    pub(super) peer_listener: Option<std::net::TcpListener>,
    pub(super) metrics_listen: Option<SocketAddr>,
    pub(super) metrics_listener: Option<std::net::TcpListener>,
    pub(super) advertise: Option<String>,
    pub(super) data_dir: Option<PathBuf>,
    pub(super) initial_members: BTreeMap<u64, String>,
    /// Why the initial members cannot be used (an id or address twice).
    pub(super) member_conflict: Option<String>,
    pub(super) cluster_state: ClusterState,
    pub(super) raft: RaftSettings,
    pub(super) storage: StorageOptions,
    pub(super) secret: Option<ClusterSecret>,
    pub(super) tls: Option<ServerTls>,
    pub(super) max_connections: usize,
    pub(super) max_connections_per_address: usize,
    pub(super) handshake_timeout: Duration,
    pub(super) max_watches: usize,
    pub(super) max_watches_per_connection: usize,
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
    /// A builder for node `id` with every default (see [`super::Server::builder`]).
    pub(super) fn new(id: u64) -> ServerBuilder {
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
            max_watches: crate::DEFAULT_MAX_WATCHES,
            max_watches_per_connection: crate::DEFAULT_MAX_WATCHES_PER_CONNECTION,
        }
    }

    /// Most watches open at once on this replica; more are refused with
    /// `TOO_MANY_WATCHES` (default [`crate::DEFAULT_MAX_WATCHES`]). Each
    /// costs a task and at most 64 queued messages.
    pub fn max_watches(mut self, max: usize) -> Self {
        self.max_watches = max;
        self
    }

    /// Most watches open at once on one client connection (default
    /// [`crate::DEFAULT_MAX_WATCHES_PER_CONNECTION`], below the connection's
    /// 1,024 concurrent HTTP/2 streams so that calls still get through).
    pub fn max_watches_per_connection(mut self, max: usize) -> Self {
        self.max_watches_per_connection = max;
        self
    }

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
}
