//! Errors of the core: deterministic rejections of commands, and store failures.

use serde::{Deserialize, Serialize};

/// Why a command or query was refused. Deterministic: every replica refuses
/// the same entry with the same error, and nothing of it was applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    /// The request breaks a documented limit or is malformed; fix the request,
    /// retrying it unchanged will fail again.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A sequence would pass `u64::MAX`.
    #[error("sequence {key:?} is exhausted: cannot allocate {step} more")]
    SequenceExhausted { key: String, step: u64 },
}

impl CommandError {
    /// Shorthand for [`CommandError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        CommandError::InvalidArgument(msg.into())
    }
}

/// The backing store failed (I/O, corruption). Not deterministic: the replica
/// must stop applying rather than diverge, so the shell treats it as fatal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store failure: {0}")]
pub struct StoreError(pub String);
