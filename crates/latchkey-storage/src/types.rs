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
    /// [`latchkey_core::CommandResult`]. Every other type is openraft's
    /// default: terms and node ids are `u64`, and leader ids are
    /// `leader_id_adv` (a total order on (term, node), the same as openraft
    /// 0.9 built without `single-term-leader`, so data directories and wire
    /// messages keep their bytes). Snapshots are files
    /// ([`crate::StateMachine`]'s `SnapshotData`): built straight to disk,
    /// sent in chunks read from the file, received into a temporary file and
    /// installed from it a frame at a time, so no replica ever holds a whole
    /// snapshot in memory.
    pub TypeConfig:
        D = latchkey_core::Request,
        R = latchkey_core::CommandResult,
        NodeId = u64,
        Node = Member,
);

/// A leader id (term, node): the committed form is the same type.
pub type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, NodeId>;
/// A log entry of latchkey's Raft log.
pub type Entry =
    openraft::Entry<LeaderId, openraft::EntryPayload<latchkey_core::Request, NodeId, Member>>;
/// A log id (term, leader, index).
pub type LogId = openraft::LogId<LeaderId>;
/// A vote.
pub type Vote = openraft::Vote<LeaderId>;
/// A membership: voter sets and the members' addresses.
pub type Membership = openraft::Membership<NodeId, Member>;
/// A membership with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<LeaderId, NodeId, Member>;
/// What describes a snapshot: last log id and membership (its third field,
/// a snapshot id in openraft 0.9, is always empty since 0.10).
pub type SnapshotMeta = openraft::SnapshotMeta<LeaderId, NodeId, Member>;
/// A snapshot: its description and the file that holds it.
pub type Snapshot = openraft::Snapshot<LeaderId, NodeId, Member, tokio::fs::File>;

/// The log id of the entry at `index` proposed by `node`'s leadership in
/// `term`.
///
/// ```
/// let id = latchkey_storage::types::log_id(3, 1, 42);
/// assert_eq!((id.leader_id.term, id.leader_id.node_id, id.index), (3, 1, 42));
/// ```
pub fn log_id(term: u64, node: NodeId, index: u64) -> LogId {
    LogId {
        leader_id: LeaderId {
            term,
            node_id: node,
        },
        index,
    }
}

/// A vote request as replicas send it (the payload of a `Vote` call): the
/// candidate's vote and its last log id, encoded exactly as openraft 0.9's
/// `VoteRequest` was. openraft 0.10's request has a third field,
/// `leadership_transfer`, which travels beside the payload instead (in the
/// peer message), so that the payload keeps its pinned bytes
/// (`docs/FORMATS.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoteWire {
    /// The candidate's vote.
    pub vote: Vote,
    /// The candidate's last log id.
    pub last_log_id: Option<LogId>,
}

impl VoteWire {
    /// The payload of `request`, and its `leadership_transfer` flag.
    pub fn split(request: openraft::raft::VoteRequest<TypeConfig>) -> (VoteWire, bool) {
        (
            VoteWire {
                vote: request.vote,
                last_log_id: request.last_log_id,
            },
            request.leadership_transfer,
        )
    }

    /// The request this payload and flag came from.
    pub fn join(self, leadership_transfer: bool) -> openraft::raft::VoteRequest<TypeConfig> {
        let mut request = openraft::raft::VoteRequest::new(self.vote, self.last_log_id);
        request.leadership_transfer = leadership_transfer;
        request
    }
}

/// A latchkey replica's Raft node: openraft over latchkey's state machine.
pub type Raft = openraft::Raft<TypeConfig, crate::StateMachine>;
