//! The openraft type configuration every latchkey crate shares.

/// A replica's id in the cluster.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// latchkey's openraft types: log entries carry a
    /// [`latchkey_core::Request`], applying one yields a
    /// [`latchkey_core::CommandResult`], and snapshots travel as one
    /// in-memory blob.
    pub TypeConfig:
        D = latchkey_core::Request,
        R = latchkey_core::CommandResult,
        NodeId = u64,
        Node = openraft::BasicNode,
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
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
/// What describes a snapshot: last log id, membership, id.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
