//! [`Node`]: one replica embedded in an application process, with a client
//! that calls it directly.
//!
//! This is where the replica (latchkey-server) and the client
//! (latchkey-client) meet; neither of those crates depends on the other.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use latchkey_client::{Client, ClientOptions, NodeStatus};
use latchkey_server::{
    ClusterSecret, ClusterState, NodeError, RaftSettings, Server, ServerBuilder, ServerTls,
    StorageOptions,
};

/// Configures and starts a [`Node`].
///
/// ```no_run
/// # async fn demo() -> Result<(), latchkey::NodeError> {
/// use latchkey::Node;
/// let node = Node::builder(1)
///     .listen("127.0.0.1:7101".parse().expect("literal address"))
///     .data_dir("/var/lib/myapp/latchkey")
///     // Peers: this node listens on its own entry, 127.0.0.1:7201.
///     .initial_members([(1, "127.0.0.1:7201"), (2, "127.0.0.1:7202"), (3, "127.0.0.1:7203")])
///     .start()
///     .await?;
/// let kv = node.client();
/// kv.put("hello", "world").await.map_err(|e| latchkey::NodeError::Config(e.to_string()))?;
/// node.shutdown().await;
/// # Ok(()) }
/// ```
pub struct NodeBuilder {
    server: ServerBuilder,
    client: ClientOptions,
    secret: Option<ClusterSecret>,
    tls: Option<ServerTls>,
}

impl NodeBuilder {
    /// Listen for clients on `addr` (see [`ServerBuilder::listen`]).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.server = self.server.listen(addr);
        self
    }

    /// Serve clients on an already bound listener (handy with port 0 in
    /// tests).
    pub fn listener(mut self, listener: std::net::TcpListener) -> Self {
        self.server = self.server.listener(listener);
        self
    }

    /// Listen for peers on `addr` (see [`ServerBuilder::peer_listen`];
    /// default: this node's entry in the initial members).
    pub fn peer_listen(mut self, addr: SocketAddr) -> Self {
        self.server = self.server.peer_listen(addr);
        self
    }

    /// Serve peers on an already bound listener.
    pub fn peer_listener(mut self, listener: std::net::TcpListener) -> Self {
        self.server = self.server.peer_listener(listener);
        self
    }

    /// Serve `/metrics`, `/healthz` and `/readyz` over HTTP on `addr` (see
    /// [`latchkey_server::ServerBuilder::metrics_listen`]).
    pub fn metrics_listen(mut self, addr: SocketAddr) -> Self {
        self.server = self.server.metrics_listen(addr);
        self
    }

    /// Serve metrics on an already bound listener.
    pub fn metrics_listener(mut self, listener: std::net::TcpListener) -> Self {
        self.server = self.server.metrics_listener(listener);
        self
    }

    /// The address clients use to reach this node, if it differs from the
    /// client listener's address (see [`ServerBuilder::advertise`]).
    pub fn advertise(mut self, addr: impl Into<String>) -> Self {
        self.server = self.server.advertise(addr);
        self
    }

    /// Where this replica keeps its RocksDB data. Required.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.server = self.server.data_dir(dir);
        self
    }

    /// The cluster's first voters, `(id, "host:port")` of each one's peer
    /// listener. Every initial member must be started with the same list; a
    /// node that already has data ignores it. Leave empty for a node that
    /// will be added later.
    pub fn initial_members<I, S>(mut self, members: I) -> Self
    where
        I: IntoIterator<Item = (u64, S)>,
        S: Into<String>,
    {
        let members: Vec<(u64, String)> = members.into_iter().map(|(i, a)| (i, a.into())).collect();
        self.server = self.server.initial_members(members);
        self
    }

    /// Whether this node, when its data directory is empty, may form a new
    /// cluster with the other initial members (see
    /// [`ServerBuilder::initial_cluster_state`]).
    pub fn initial_cluster_state(mut self, state: ClusterState) -> Self {
        self.server = self.server.initial_cluster_state(state);
        self
    }

    /// The secret every replica of the cluster shares (see
    /// [`ClusterSecret`]): peer calls without it are refused.
    /// The node's own client sends it with membership changes too (while
    /// access control is enabled those also need an admin user:
    /// [`NodeBuilder::client_options`] with `with_user`).
    pub fn cluster_secret(mut self, secret: ClusterSecret) -> Self {
        self.server = self.server.cluster_secret(secret.clone());
        self.secret = Some(secret);
        self
    }

    /// Serve TLS and call peers over mutual TLS (see [`ServerTls`]). The
    /// node's own client reaches the other replicas over TLS too, with the
    /// node's certificate.
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.server = self.server.tls(tls.clone());
        self.tls = Some(tls);
        self
    }

    /// Most connections held open at once (see
    /// [`latchkey_server::ServerBuilder::max_connections`]).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.server = self.server.max_connections(max);
        self
    }

    /// Most connections held open at once from one IP address (see
    /// [`latchkey_server::ServerBuilder::max_connections_per_address`]).
    pub fn max_connections_per_address(mut self, max: usize) -> Self {
        self.server = self.server.max_connections_per_address(max);
        self
    }

    /// How long a new connection has to send its first bytes and finish
    /// its TLS handshake (see
    /// [`latchkey_server::ServerBuilder::handshake_timeout`]).
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.server = self.server.handshake_timeout(timeout);
        self
    }

    /// Raft timing and log retention.
    pub fn raft_settings(mut self, settings: RaftSettings) -> Self {
        self.server = self.server.raft_settings(settings);
        self
    }

    /// RocksDB tuning.
    pub fn storage_options(mut self, options: StorageOptions) -> Self {
        self.server = self.server.storage_options(options);
        self
    }

    /// Timeouts of the in-process client returned by [`Node::client`].
    pub fn client_options(mut self, options: ClientOptions) -> Self {
        self.client = options;
        self
    }

    /// Open the data, start Raft and the gRPC server, join (or form) the
    /// cluster, and make the in-process client.
    pub async fn start(self) -> Result<Node, NodeError> {
        let server = self.server.start().await?;
        let mut options = self.client;
        if let (None, Some(secret)) = (&options.cluster_secret, &self.secret) {
            options = options.with_cluster_secret(secret.as_str());
        }
        if let (None, Some(tls)) = (&options.tls, &self.tls) {
            options = options.with_tls(tls.client_options());
        }
        let client = match Client::with_local(server.replica(), server.other_members(), options) {
            Ok(client) => client,
            Err(e) => {
                server.shutdown().await;
                return Err(NodeError::Config(e.to_string()));
            }
        };
        Ok(Node { server, client })
    }
}

/// One running replica, embedded in this process.
///
/// Create with [`Node::builder`]; talk to the cluster with [`Node::client`];
/// stop with [`Node::shutdown`].
pub struct Node {
    server: Server,
    client: Client,
}

impl Node {
    /// Start configuring node `id` (a cluster-unique number, 1 or more).
    pub fn builder(id: u64) -> NodeBuilder {
        NodeBuilder {
            server: Server::builder(id),
            client: ClientOptions::default(),
            secret: None,
            tls: None,
        }
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.server.id()
    }

    /// The address clients reach this node at.
    pub fn advertise_addr(&self) -> &str {
        self.server.advertise_addr()
    }

    /// The socket address the client listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The socket address the peer listener is bound to.
    pub fn peer_addr(&self) -> SocketAddr {
        self.server.peer_addr()
    }

    /// Where the metrics listener is bound, if there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.server.metrics_addr()
    }

    /// This replica's metrics in the Prometheus text format, for an
    /// application that serves them itself:
    /// `node.metrics().render()` (the table is in `latchkey_server::metrics`).
    pub fn metrics(&self) -> latchkey_server::MetricsHandle {
        self.server.metrics()
    }

    /// A client that uses this replica directly while it leads and forwards
    /// to the leader otherwise. Cheap to clone.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// This replica's view of itself and the cluster: leader, term, last
    /// applied index, members, and why it waits or failed.
    pub fn status(&self) -> NodeStatus {
        self.server.status()
    }

    /// True while this replica is the leader (and has not failed).
    pub fn is_leader(&self) -> bool {
        self.server.is_leader()
    }

    /// This replica's data-directory incarnation: a random identity drawn
    /// when the directory was created. The cluster's membership records it;
    /// a wiped directory gets a new one and must be added again.
    pub fn incarnation(&self) -> u64 {
        self.server.incarnation()
    }

    /// Why this replica has failed, if it has (see [`Node::failed`]).
    pub fn failure(&self) -> Option<String> {
        self.server.failure()
    }

    /// Resolves once this replica has failed for good, with the cause: its
    /// Raft core stopped (a storage error, a panic) or its data directory
    /// vanished. From then on it serves nothing (requests get UNAVAILABLE,
    /// safe to retry elsewhere) and never names itself leader. What to do is
    /// the application's call; `latchkey serve` exits non-zero so that its
    /// supervisor restarts it.
    ///
    /// ```no_run
    /// # async fn demo(node: latchkey::Node) {
    /// let cause = node.failed().await;
    /// eprintln!("latchkey replica failed: {cause}");
    /// node.shutdown().await;
    /// std::process::exit(1);
    /// # }
    /// ```
    pub async fn failed(&self) -> String {
        self.server.failed().await
    }

    /// Whether this replica is waiting to be added to an existing cluster
    /// (a new data directory), and what the operator should do.
    pub fn waiting(&self) -> Option<String> {
        self.server.waiting()
    }

    /// Wait until this replica knows a leader; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<u64, NodeError> {
        self.server.wait_for_leader(timeout).await
    }

    /// Stop serving and stop Raft, and wait until the data directory is
    /// released. Data stays on disk; a node started again on the same data
    /// directory rejoins without re-initialising. A leader first hands
    /// leadership to another voter; the result says whether it did.
    pub async fn shutdown(self) -> latchkey_server::HandOver {
        self.server.shutdown().await
    }
}
