//! How a conversion says what is wrong with its input: a request that
//! breaks a rule the schema cannot state, or a reply that breaks the schema.

use crate::ReplicaFailure;

/// A request refused as an invalid argument, naming what is wrong.
pub(super) fn invalid(msg: impl Into<String>) -> ReplicaFailure {
    ReplicaFailure::InvalidArgument(msg.into())
}

/// A reply that breaks the schema: the call may have been executed.
pub(super) fn malformed(what: &str) -> ReplicaFailure {
    ReplicaFailure::UnknownOutcome(format!("the replica answered {what}"))
}
