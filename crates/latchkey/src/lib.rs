//! # latchkey
//!
//! An embedded, replicated key-value store with a lock service. Each process
//! of a clustered application runs one Raft replica (openraft) whose log and
//! state live in RocksDB; three such processes form a cluster.
//!
//! This crate is the one to depend on: the embedding [`Node`] (a replica
//! from latchkey-server with an in-process client from latchkey-client: the
//! one place the two meet), the remote [`Client`], and the core types; and
//! the `latchkey` command-line tool (`src/main.rs`).
//!
//! Embedding a replica in your application:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use latchkey::Node;
//! let members = [(1, "127.0.0.1:7101"), (2, "127.0.0.1:7102"), (3, "127.0.0.1:7103")];
//! let node = Node::builder(1)                    // this process is replica 1
//!     .data_dir("/var/lib/myapp/latchkey")
//!     .initial_members(members)                  // same list on every replica
//!     .start()
//!     .await?;
//! let kv = node.client();                        // forwards to the leader when needed
//! kv.put("jobs/42", "queued").await?;
//! let seq = kv.next_sequence("job-ids", 100).await?; // a durable block of ids
//! # let _ = seq;
//! node.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Talking to a cluster from another program:
//!
//! ```no_run
//! # async fn demo() -> Result<(), latchkey::Error> {
//! let client = latchkey::Client::connect(["10.0.0.1:7101", "10.0.0.2:7101", "10.0.0.3:7101"])?;
//! if let Some(v) = client.get("jobs/42").await? {
//!     println!("{}", String::from_utf8_lossy(&v));
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

// The client's everyday API, each type by the one path the client crate
// gives it (its crate root); the in-process types (`latchkey_client::local`)
// stay behind `Node`.
pub use latchkey_client::{
    Backup, Batch, Client, ClientOptions, CommandError, Compare, Consistency, EndedSession, Error,
    HeldLock, HolderInfo, Identity, KeyRead, Lock, LockGuard, LockInfo, LockMode, MemberInfo,
    NodeStatus, Permission, RevisionField, ScanPage, ScanRange, Sequencer, Session, SessionId,
    SessionListing, SessionSecret, Swap, Test, TlsError, TlsOptions, Token, TransportStats,
    UserCredentials, UserInfo, Versioned,
};
pub use latchkey_client::{
    Election, KeyChange, Leader, LeaderChange, LeaderStream, Leadership, MultiLock, MultiLockGuard,
    Selection, Semaphore, Watch, WatchMessage,
};
pub use latchkey_core as core;
pub use latchkey_server::{
    initial_member_map, peer_certificate_name, ClusterSecret, ClusterState, Condition, HandOver,
    NodeError, RaftSettings, ServerTls, StorageOptions, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, DEFAULT_MAX_WATCHES, DEFAULT_MAX_WATCHES_PER_CONNECTION,
    REFUSED_PEER_MESSAGE,
};
pub use node::{Node, NodeBuilder};

pub mod certs;
mod node;

/// `n` distinct free loopback addresses (`127.0.0.1:PORT`), for tools that
/// start a local cluster of `latchkey serve` processes (two per replica: a
/// client and a peer listener). The ports are free when this returns; a
/// process of the machine could still take one before the replica binds it.
///
/// ```
/// let addrs = latchkey::free_loopback_addrs(2).expect("free ports");
/// assert_ne!(addrs[0], addrs[1]);
/// ```
pub fn free_loopback_addrs(n: usize) -> std::io::Result<Vec<String>> {
    // All held at once, so they are distinct, then released.
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    held.iter()
        .map(|l| Ok(l.local_addr()?.to_string()))
        .collect()
}

/// The `--initial-members` value of `latchkey serve` for replicas numbered
/// 1, 2, ... in the order of `addrs`, their peer addresses (`ID=HOST:PORT`,
/// comma-separated), as
/// tools that start a local cluster pass it.
///
/// ```
/// let arg = latchkey::initial_members_arg(&["127.0.0.1:7101", "127.0.0.1:7102"]);
/// assert_eq!(arg, "1=127.0.0.1:7101,2=127.0.0.1:7102");
/// ```
pub fn initial_members_arg<S: AsRef<str>>(addrs: &[S]) -> String {
    addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={}", i + 1, a.as_ref()))
        .collect::<Vec<_>>()
        .join(",")
}
