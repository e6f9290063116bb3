//! What a replica reports about itself and the cluster (`Admin.Status`).

use latchkey_proto::{MemberInfo, NodeStatus};
use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;

use crate::health::Condition;

use super::Replica;

impl Replica {
    /// This replica's view of itself and the cluster.
    pub fn status(&self) -> NodeStatus {
        let m = self.view.raft().metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| MemberInfo {
                id: *id,
                peer_addr: node.peer_addr.clone(),
                client_addr: node.client_addr.clone(),
                voter: voters.contains(id),
                incarnation: node.incarnation,
                matched_index: m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).cloned().flatten())
                    .map(|l| l.index),
            })
            .collect();
        // Never itself unless it leads (see `Replica::leader`).
        let leader_id = m
            .current_leader
            .filter(|l| *l != self.view.id() || m.state == ServerState::Leader);
        let leader_addr =
            leader_id.and_then(|l| membership.get_node(&l).map(|n| n.client_addr.clone()));
        let raft_state = match m.state {
            ServerState::Leader => "Leader",
            ServerState::Follower => "Follower",
            ServerState::Candidate => "Candidate",
            ServerState::Learner => "Learner",
            ServerState::Shutdown => "Shutdown",
        };
        let (state, detail) = match self.health.condition() {
            Condition::Serving => (raft_state, None),
            Condition::Waiting(why) => ("Waiting", Some(why)),
            Condition::Failed(cause) => ("Failed", Some(cause)),
        };
        let failed = detail.is_some() && state == "Failed";
        NodeStatus {
            id: self.view.id(),
            // A failed replica names no leader: it may be stale, and must
            // never be listed as one.
            leader_id: leader_id.filter(|_| !failed),
            leader_addr: leader_addr.filter(|_| !failed),
            term: m.current_term,
            last_applied: m.last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            state: state.to_string(),
            members,
            detail,
            incarnation: self.view.incarnation(),
            peer_problems: self.peers.problems(),
        }
    }
}
