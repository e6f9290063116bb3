//! Why a replica did not execute a request, shared by the gRPC service, the
//! in-process path and the client's retry loop.

use crate::v1::{Failure, FailureKind};

/// A replica's refusal to execute a request, before or instead of applying it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaFailure {
    /// This replica is not the leader. `leader` is the leader's id and
    /// address when known. Nothing was proposed: safe to retry there.
    #[error("not the leader (leader: {})", leader_text(.leader))]
    NotLeader { leader: Option<(u64, String)> },
    /// The request could not be decoded or breaks a limit. Do not retry.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The replica cannot serve now (no quorum, starting, shutting down).
    /// Nothing was proposed: safe to retry, here or elsewhere.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A write was proposed but its fate is unknown (leadership was lost or
    /// the replica stopped before it committed). It may still be applied.
    #[error("outcome unknown: {0}")]
    UnknownOutcome(String),
}

fn leader_text(leader: &Option<(u64, String)>) -> String {
    match leader {
        Some((id, addr)) => format!("node {id} at {addr}"),
        None => "unknown".to_string(),
    }
}

impl From<ReplicaFailure> for Failure {
    fn from(f: ReplicaFailure) -> Self {
        let message = f.to_string();
        match f {
            ReplicaFailure::NotLeader { leader } => {
                let (leader_id, leader_addr) = leader.unwrap_or((0, String::new()));
                Failure {
                    kind: FailureKind::NotLeader as i32,
                    message,
                    leader_id,
                    leader_addr,
                }
            }
            ReplicaFailure::InvalidArgument(_) => failure(FailureKind::InvalidArgument, message),
            ReplicaFailure::Unavailable(_) => failure(FailureKind::Unavailable, message),
            ReplicaFailure::UnknownOutcome(_) => failure(FailureKind::UnknownOutcome, message),
        }
    }
}

fn failure(kind: FailureKind, message: String) -> Failure {
    Failure {
        kind: kind as i32,
        message,
        leader_id: 0,
        leader_addr: String::new(),
    }
}

impl From<Failure> for ReplicaFailure {
    fn from(f: Failure) -> Self {
        match FailureKind::try_from(f.kind) {
            Ok(FailureKind::NotLeader) => ReplicaFailure::NotLeader {
                leader: (f.leader_id != 0 && !f.leader_addr.is_empty())
                    .then_some((f.leader_id, f.leader_addr)),
            },
            Ok(FailureKind::InvalidArgument) => ReplicaFailure::InvalidArgument(f.message),
            Ok(FailureKind::Unavailable) => ReplicaFailure::Unavailable(f.message),
            Ok(FailureKind::UnknownOutcome) => ReplicaFailure::UnknownOutcome(f.message),
            // A newer server's failure kind: treat as "may have happened".
            _ => ReplicaFailure::UnknownOutcome(format!(
                "unrecognised failure kind {}: {}",
                f.kind, f.message
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_round_trip_through_proto() {
        let cases = [
            ReplicaFailure::NotLeader {
                leader: Some((2, "127.0.0.1:7102".into())),
            },
            ReplicaFailure::NotLeader { leader: None },
            ReplicaFailure::InvalidArgument("key must not be empty".into()),
            ReplicaFailure::Unavailable("no quorum".into()),
            ReplicaFailure::UnknownOutcome("leader changed".into()),
        ];
        for case in cases {
            let wire: Failure = case.clone().into();
            let back: ReplicaFailure = wire.into();
            match (&case, &back) {
                (ReplicaFailure::NotLeader { .. }, _) => assert_eq!(case, back),
                _ => assert_eq!(std::mem::discriminant(&case), std::mem::discriminant(&back)),
            }
        }
    }

    #[test]
    fn unknown_kind_is_treated_as_unknown_outcome() {
        let f = Failure {
            kind: 99,
            message: "x".into(),
            leader_id: 0,
            leader_addr: String::new(),
        };
        assert!(matches!(
            ReplicaFailure::from(f),
            ReplicaFailure::UnknownOutcome(_)
        ));
    }
}
