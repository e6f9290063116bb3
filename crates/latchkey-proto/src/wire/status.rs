//! A replica's report about itself ([`NodeStatus`]) to the typed
//! `StatusReply` that `Admin.Status` answers with, and back.
//!
//! A missing leader, leader address or detail travels as 0 or empty, and
//! 0 or empty reads back as missing.

use crate::v1::{Member, StatusReply};
use crate::{MemberInfo, NodeStatus};

impl From<NodeStatus> for StatusReply {
    fn from(s: NodeStatus) -> Self {
        StatusReply {
            id: s.id,
            leader_id: s.leader_id.unwrap_or(0),
            leader_addr: s.leader_addr.unwrap_or_default(),
            term: s.term,
            last_applied: s.last_applied,
            last_log_index: s.last_log_index,
            state: s.state,
            members: s
                .members
                .into_iter()
                .map(|m| Member {
                    id: m.id,
                    peer_addr: m.peer_addr,
                    client_addr: m.client_addr,
                    voter: m.voter,
                    incarnation: m.incarnation,
                    matched_index: m.matched_index,
                })
                .collect(),
            snapshot_index: s.snapshot_index,
            detail: s.detail.unwrap_or_default(),
            incarnation: s.incarnation,
            peer_problems: s.peer_problems,
        }
    }
}

impl From<StatusReply> for NodeStatus {
    fn from(r: StatusReply) -> Self {
        NodeStatus {
            id: r.id,
            leader_id: (r.leader_id != 0).then_some(r.leader_id),
            leader_addr: (!r.leader_addr.is_empty()).then_some(r.leader_addr),
            term: r.term,
            last_applied: r.last_applied,
            last_log_index: r.last_log_index,
            snapshot_index: r.snapshot_index,
            state: r.state,
            members: r
                .members
                .into_iter()
                .map(|m| MemberInfo {
                    id: m.id,
                    peer_addr: m.peer_addr,
                    client_addr: m.client_addr,
                    voter: m.voter,
                    incarnation: m.incarnation,
                    matched_index: m.matched_index,
                })
                .collect(),
            detail: (!r.detail.is_empty()).then_some(r.detail),
            incarnation: r.incarnation,
            peer_problems: r.peer_problems,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(leader: Option<(u64, &str)>, detail: Option<&str>) -> NodeStatus {
        NodeStatus {
            id: 2,
            leader_id: leader.map(|(id, _)| id),
            leader_addr: leader.map(|(_, addr)| addr.to_string()),
            term: 7,
            last_applied: 40,
            last_log_index: 41,
            snapshot_index: 30,
            state: "Follower".into(),
            members: vec![
                MemberInfo {
                    id: 1,
                    peer_addr: "127.0.0.1:7201".into(),
                    client_addr: "127.0.0.1:7101".into(),
                    voter: true,
                    incarnation: 11,
                    matched_index: Some(41),
                },
                MemberInfo {
                    id: 2,
                    peer_addr: "127.0.0.1:7202".into(),
                    client_addr: "127.0.0.1:7102".into(),
                    voter: false,
                    incarnation: 12,
                    matched_index: None,
                },
            ],
            detail: detail.map(str::to_string),
            incarnation: 12,
            peer_problems: vec!["node 3 refuses us".into()],
        }
    }

    #[test]
    fn a_status_round_trips() {
        for s in [
            status(Some((1, "127.0.0.1:7101")), None),
            status(None, Some("waiting to be added")),
        ] {
            assert_eq!(NodeStatus::from(StatusReply::from(s.clone())), s);
        }
    }

    #[test]
    fn a_missing_leader_and_detail_travel_as_zero_and_empty() {
        let reply = StatusReply::from(status(None, None));
        assert_eq!((reply.leader_id, reply.leader_addr.as_str()), (0, ""));
        assert_eq!(reply.detail, "");
    }
}
