//! What a replica reports about itself and the cluster (`Admin.Status`).
//! Its typed `StatusReply` form, both ways, is in [`crate::wire`].

use serde::Serialize;

/// One member of the cluster as a replica sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberInfo {
    /// The member's node id.
    pub id: u64,
    /// `host:port` of the member's peer listener (Raft, membership changes).
    pub peer_addr: String,
    /// `host:port` of the member's client listener.
    pub client_addr: String,
    /// A voter (counts toward quorums) or a learner (receives the log only).
    pub voter: bool,
    /// The incarnation of the member's data directory the cluster knows:
    /// a replica whose directory was wiped has another one and is not this
    /// member until it is added again.
    pub incarnation: u64,
    /// On the leader only: the last log index replicated to this member
    /// (the leader's own last log index for itself); `None` elsewhere, and
    /// for a member nothing was replicated to yet. How far a new member has
    /// caught up, and how far behind a slow one is.
    pub matched_index: Option<u64>,
}

/// What one replica reports about itself and the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    /// This replica's node id.
    pub id: u64,
    /// The leader's node id, if this replica knows one (never set while it
    /// is Failed).
    pub leader_id: Option<u64>,
    /// The leader's client address, if this replica knows it (never set
    /// while it is Failed).
    pub leader_addr: Option<String>,
    /// This replica's current Raft term.
    pub term: u64,
    /// Index of the last log entry applied to the state machine.
    pub last_applied: u64,
    /// Index of the last entry in this replica's log.
    pub last_log_index: u64,
    /// Index of the last log entry covered by this replica's snapshot.
    pub snapshot_index: u64,
    /// Leader, Follower, Candidate, Learner, Shutdown, Waiting (a new data
    /// directory waiting to be added to an existing cluster) or Failed (the
    /// replica stopped; `detail` says why).
    pub state: String,
    /// Every member (voters and learners) of the membership this replica
    /// knows.
    pub members: Vec<MemberInfo>,
    /// Why the replica is Waiting or Failed.
    pub detail: Option<String>,
    /// This replica's data-directory incarnation.
    pub incarnation: u64,
    /// Peers this replica refuses or that refuse it (a follower whose log
    /// went backwards, a peer addressed with a stale incarnation).
    pub peer_problems: Vec<String>,
}
