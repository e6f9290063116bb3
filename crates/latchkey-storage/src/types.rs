//! The openraft type configuration every latchkey crate shares.

use serde::{Deserialize, Serialize};

/// A replica's id in the cluster.
pub type NodeId = u64;

/// What the replicated membership records of each member: where its peers
/// and its clients reach it, and which incarnation of its data directory
/// joined the cluster.
///
/// A replica listens twice: for peers (Raft and membership changes, members
/// only) and for clients. The peer address is the one given in the initial
/// members or to `members add`; the client address is what the replica
/// itself reports when asked who it is (`Raft.Identify`), and what clients
/// are pointed to when they must find the leader.
///
/// A data directory draws a random incarnation when it is created
/// ([`crate::ack_mark`]). Raft messages are addressed to a member's
/// incarnation, and a replica refuses those addressed to another one, so a
/// node whose disk was wiped (a new incarnation) is never taken for the
/// member it replaced: it must be added again, and catches up as a learner
/// before it votes.
///
/// ```
/// let m = latchkey_storage::Member::new("127.0.0.1:7201", "127.0.0.1:7101", 42);
/// assert_eq!(m.to_string(), "127.0.0.1:7201#42 (clients 127.0.0.1:7101)");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `host:port` of the replica's peer listener.
    pub peer_addr: String,
    /// `host:port` of the replica's client listener.
    pub client_addr: String,
    /// The incarnation of its data directory (never 0 for a real member).
    pub incarnation: u64,
}

impl Member {
    /// A member whose peers reach it at `peer_addr` and clients at
    /// `client_addr`, with data directory `incarnation`.
    pub fn new(
        peer_addr: impl Into<String>,
        client_addr: impl Into<String>,
        incarnation: u64,
    ) -> Self {
        Member {
            peer_addr: peer_addr.into(),
            client_addr: client_addr.into(),
            incarnation,
        }
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}#{} (clients {})",
            self.peer_addr, self.incarnation, self.client_addr
        )
    }
}

openraft::declare_raft_types!(
    /// latchkey's openraft types: log entries carry a
    /// [`latchkey_core::Request`], applying one yields a
    /// [`latchkey_core::CommandResult`], and snapshots are files: built
    /// straight to disk, sent in chunks read from the file, received into
    /// a temporary file and installed from it a frame at a time, so no
    /// replica ever holds a whole snapshot in memory.
    pub TypeConfig:
        D = latchkey_core::Request,
        R = latchkey_core::CommandResult,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A log entry of latchkey's Raft log.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log id (term, leader, index).
pub type LogId = openraft::LogId<NodeId>;
/// A vote.
pub type Vote = openraft::Vote<NodeId>;
/// A membership with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
/// What describes a snapshot: last log id, membership, id.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
