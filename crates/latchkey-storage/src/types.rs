//! The openraft type configuration every latchkey crate shares.

use serde::{Deserialize, Serialize};

/// A replica's id in the cluster.
pub type NodeId = u64;

/// What the replicated membership records of each member: where to reach
/// it, and which incarnation of its data directory joined the cluster.
///
/// A data directory draws a random incarnation when it is created
/// ([`crate::ack_mark`]). Raft messages are addressed to a member's
/// incarnation, and a replica refuses those addressed to another one, so a
/// node whose disk was wiped (a new incarnation) is never taken for the
/// member it replaced: it must be added again, and catches up as a learner
/// before it votes.
///
/// ```
/// let m = latchkey_storage::Member::new("127.0.0.1:7101", 42);
/// assert_eq!(m.to_string(), "127.0.0.1:7101#42");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `host:port` of the replica's peer listener.
    pub addr: String,
    /// The incarnation of its data directory (never 0 for a real member).
    pub incarnation: u64,
}

impl Member {
    /// A member at `addr` with data directory `incarnation`.
    pub fn new(addr: impl Into<String>, incarnation: u64) -> Self {
        Member {
            addr: addr.into(),
            incarnation,
        }
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.addr, self.incarnation)
    }
}

openraft::declare_raft_types!(
    /// latchkey's openraft types: log entries carry a
    /// [`latchkey_core::Request`], applying one yields a
    /// [`latchkey_core::CommandResult`], and snapshots travel as one
    /// in-memory blob.
    pub TypeConfig:
        D = latchkey_core::Request,
        R = latchkey_core::CommandResult,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
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
