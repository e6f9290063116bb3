//! Helpers shared by the in-process cluster tests: loopback listeners and
//! node start-up with test Raft settings (small snapshot interval, so
//! snapshots happen during the tests).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;

use latchkey::{ClusterSecret, Node, RaftSettings};

/// A node's two loopback listeners, bound before it starts.
pub struct Ports {
    pub client: TcpListener,
    pub peer: TcpListener,
}

impl Ports {
    pub fn bind() -> std::io::Result<Ports> {
        Ok(Ports {
            client: TcpListener::bind("127.0.0.1:0")?,
            peer: TcpListener::bind("127.0.0.1:0")?,
        })
    }

    /// The peer listener's address (what the initial members name).
    pub fn peer_addr(&self) -> std::io::Result<String> {
        Ok(self.peer.local_addr()?.to_string())
    }
}

pub fn reserve(n: u64) -> std::io::Result<BTreeMap<u64, Ports>> {
    (1..=n).map(|id| Ok((id, Ports::bind()?))).collect()
}

/// The initial members: each node's peer address.
pub fn addrs(listeners: &BTreeMap<u64, Ports>) -> std::io::Result<Vec<(u64, String)>> {
    listeners
        .iter()
        .map(|(id, p)| Ok((*id, p.peer_addr()?)))
        .collect()
}

/// Every node's client address, in id order.
pub fn client_addrs(nodes: &BTreeMap<u64, Node>) -> Vec<String> {
    nodes
        .values()
        .map(|n| n.advertise_addr().to_string())
        .collect()
}

/// The cluster secret every in-process test cluster runs with, so every
/// test also exercises peer authentication.
pub const SECRET: &str = "latchkey-test-cluster-secret-0001";

pub fn secret() -> ClusterSecret {
    match ClusterSecret::new(SECRET) {
        Ok(s) => s,
        Err(e) => panic!("the test secret is invalid: {e}"),
    }
}

pub fn settings() -> RaftSettings {
    RaftSettings::default()
        .with_snapshot_every(50)
        .with_keep_after_snapshot(5)
}

pub async fn start(
    id: u64,
    ports: Ports,
    dir: &Path,
    members: &[(u64, String)],
) -> Result<Node, Box<dyn std::error::Error>> {
    start_with(id, ports, dir, members, settings()).await
}

/// [`start`] with other Raft settings (timers a test needs).
pub async fn start_with(
    id: u64,
    ports: Ports,
    dir: &Path,
    members: &[(u64, String)],
    raft: RaftSettings,
) -> Result<Node, Box<dyn std::error::Error>> {
    Ok(Node::builder(id)
        .listener(ports.client)
        .peer_listener(ports.peer)
        .data_dir(dir.join(format!("node-{id}")))
        .initial_members(members.iter().cloned())
        .raft_settings(raft)
        .cluster_secret(secret())
        .start()
        .await?)
}

/// Start `n` nodes (ids 1..=n) forming one cluster in `dir`; returns them
/// and the initial members `(id, peer address)` (clients reach a node at
/// its `advertise_addr()`, see [`client_addrs`]).
pub async fn start_cluster(
    dir: &Path,
    n: u64,
) -> Result<(BTreeMap<u64, Node>, Vec<(u64, String)>), Box<dyn std::error::Error>> {
    let listeners = reserve(n)?;
    let members = addrs(&listeners)?;
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        nodes.insert(id, start(id, l, dir, &members).await?);
    }
    Ok((nodes, members))
}

/// Puts a cluster secret (or none) on every call: a test's stand-in for a
/// peer, or for a stranger.
#[derive(Clone)]
pub struct SecretHeader(pub Option<&'static str>);

impl tonic::service::Interceptor for SecretHeader {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(secret) = self.0 {
            let value = secret
                .parse()
                .map_err(|_| tonic::Status::internal("a test secret that is not a header value"))?;
            request
                .metadata_mut()
                .insert(latchkey_server::PEER_SECRET_HEADER, value);
        }
        Ok(request)
    }
}

/// A Raft client calling the peer listener at `addr` with `secret`
/// (`Some(SECRET)`: as a peer).
pub type RaftCaller = latchkey_proto::v1::raft_client::RaftClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, SecretHeader>,
>;

pub async fn raft_client(
    addr: &str,
    secret: Option<&'static str>,
) -> Result<RaftCaller, Box<dyn std::error::Error>> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(
        latchkey_proto::v1::raft_client::RaftClient::with_interceptor(
            channel,
            SecretHeader(secret),
        ),
    )
}
