//! # latchkey-server
//!
//! The replica: openraft wired to latchkey's RocksDB stores, the gRPC
//! services (Raft transport, KV, admin), and [`Server`], one replica serving
//! in this process (the facade crate's `Node` adds an in-process client).
//!
//! It depends on the wire contract (`latchkey-proto`), never on the client
//! crate: whatever both sides must agree on lives in the contract.
//!
//! This crate performs I/O and reads clocks so that `latchkey-core` does not:
//! the leader stamps each entry with its clock, proposes it through Raft and
//! answers once it is applied. It must not decide what a command does.
//!
//! Reads are linearizable by default: the leader confirms its leadership with
//! a quorum (openraft's ReadIndex, `ensure_linearizable`) and waits until that
//! index is applied before reading. Writes are answered once applied on the
//! leader, which implies fsynced on a majority.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use latchkey_server::Server;
//! let members = [(1, "127.0.0.1:7101"), (2, "127.0.0.1:7102"), (3, "127.0.0.1:7103")];
//! let server = Server::builder(1)
//!     .data_dir("/tmp/latchkey-1")
//!     .initial_members(members)
//!     .start()
//!     .await?;
//! println!("{:?}", server.status());
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod answer;
mod append_pipeline;
mod append_stream;
pub mod auth;
mod bootstrap;
mod calls;
mod conn_limit;
mod hand_over;
mod health;
mod health_watch;
mod locks;
mod log_limit;
mod membership;
pub mod metrics;
mod network;
mod peer_auth;
mod peer_input;
mod raft_view;
mod read_gate;
mod replica;
mod server;
mod services;
mod settings;
mod snapshot_pace;
pub mod status_page;
mod tls_accept;
mod watch;
mod watch_service;
mod write_queue;

pub use bootstrap::ClusterState;

/// Watches a replica serves at once by default.
pub const DEFAULT_MAX_WATCHES: usize = 10_000;
/// Watches one client connection may hold open at once by default.
pub const DEFAULT_MAX_WATCHES_PER_CONNECTION: usize = 1_000;
pub use conn_limit::{
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    MAX_STREAMS_PER_CONNECTION,
};
pub use hand_over::HandOver;
pub use health::Condition;
pub use latchkey_proto::NodeStatus;
pub use latchkey_storage::StorageOptions;
pub use metrics::MetricsHandle;
pub use peer_auth::{peer_certificate_name, ClusterSecret, ServerTls, PEER_SECRET_HEADER};
pub use replica::Replica;
pub use server::{initial_member_map, Server, ServerBuilder};
pub use settings::RaftSettings;
pub use tls_accept::tls_handshake_failures;

/// How the warning starts that a replica logs when it refuses a peer's
/// Raft message that no leader or candidate of its cluster sends (see
/// `peer_input`): a harness whose replicas are never sent such a message
/// (the nemesis) counts each as a failure, of a member or of a check.
pub const REFUSED_PEER_MESSAGE: &str =
    "refused a Raft message no leader or candidate of this cluster sends";

/// Largest gRPC message a replica accepts or sends.
pub const MAX_MESSAGE_BYTES: usize = latchkey_proto::MAX_MESSAGE_BYTES;

/// How long a replica waits for a TCP connection to a peer.
pub(crate) const PEER_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a [`Server`] could not start or answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The node's configuration is wrong; fix it and start again.
    #[error("configuration: {0}")]
    Config(String),
    /// Opening or using the data directory failed.
    #[error("storage: {0}")]
    Storage(String),
    /// A socket or file operation failed.
    #[error("I/O: {0}")]
    Io(String),
    /// Raft refused or stopped.
    #[error("raft: {0}")]
    Raft(String),
    /// Something did not happen in time.
    #[error("timed out: {0}")]
    Timeout(String),
}
