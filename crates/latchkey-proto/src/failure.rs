//! Why a replica did not execute a request, shared by the gRPC service, the
//! in-process path and the client's retry loop. Its wire form is the typed
//! `Error` of [`crate::wire`].

/// A replica's refusal to execute a request, before or instead of applying it.
///
/// Deliberately not `#[non_exhaustive]`: the wire form ([`crate::wire`]) and
/// the client's retry loop each match every variant, and a new kind of
/// refusal must be decided in both.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaFailure {
    /// This replica is not the leader. `leader` is the leader's id and
    /// address when known. Nothing was proposed: safe to retry there.
    #[error("not the leader (leader: {})", leader_text(.leader))]
    NotLeader {
        /// The leader's node id and address, if this replica knows them.
        leader: Option<(u64, String)>,
    },
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

impl ReplicaFailure {
    /// A request the core's validation refused, as an invalid argument
    /// whose message says "invalid argument" once.
    ///
    /// ```
    /// use latchkey_proto::ReplicaFailure;
    /// let e = latchkey_core::CommandError::invalid("the key is empty");
    /// assert_eq!(
    ///     ReplicaFailure::invalid(e).to_string(),
    ///     "invalid argument: the key is empty"
    /// );
    /// ```
    pub fn invalid(e: latchkey_core::CommandError) -> ReplicaFailure {
        ReplicaFailure::InvalidArgument(match e {
            latchkey_core::CommandError::InvalidArgument(why) => why,
            other => other.to_string(),
        })
    }
}

fn leader_text(leader: &Option<(u64, String)>) -> String {
    match leader {
        Some((id, addr)) => format!("node {id} at {addr}"),
        None => "unknown".to_string(),
    }
}
