//! Why a command failed: the one failure type every subcommand returns,
//! and the exit code each kind ends the tool with.

use latchkey::Error;

/// Why a command failed, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Unknown(String),
    #[error("{0}")]
    Other(String),
    #[error("{0}")]
    NotAcquired(String),
    #[error("{0}")]
    LockLost(String),
    #[error("{0}")]
    StaleFence(String),
    /// `serve`: the replica could not start or failed while running.
    #[error("{0}")]
    ReplicaFailed(String),
    /// `serve`: its configuration (flags, files) cannot be used.
    #[error("{0}")]
    Config(String),
    /// `lock -- CMD`: the command could not be started (the lock was
    /// released).
    #[error("{message}")]
    CannotRun { not_found: bool, message: String },
    /// `lock -- CMD`: latchkey's own failure, in the range that cannot be
    /// mistaken for the command's exit code (200 + the usual code).
    #[error("{0}")]
    AroundCommand(Box<Failure>),
}

impl Failure {
    /// The exit code the tool ends with (see `main.rs` for their meaning).
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::NotFound(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unavailable(_) => 3,
            Failure::Unknown(_) => 4,
            Failure::Other(_) => 3,
            Failure::NotAcquired(_) => 5,
            Failure::LockLost(_) => 6,
            Failure::StaleFence(_) => 7,
            Failure::ReplicaFailed(_) => 8,
            Failure::Config(_) => 9,
            Failure::CannotRun {
                not_found: true, ..
            } => 127,
            Failure::CannotRun { .. } => 126,
            Failure::AroundCommand(inner) => match **inner {
                Failure::CannotRun { .. } => inner.exit_code(),
                _ => 200 + inner.exit_code(),
            },
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        if e.is_stale_fence() {
            return Failure::StaleFence(e.to_string());
        }
        match e {
            Error::SessionLost { .. } | Error::LockLost { .. } => Failure::LockLost(e.to_string()),
            // A capacity refusal: it may succeed later, not bad input.
            Error::Refused(latchkey_client::CommandError::TooManySessions { .. }) => {
                Failure::Unavailable(e.to_string())
            }
            Error::InvalidArgument(_)
            | Error::BadEndpoint { .. }
            | Error::Refused(_)
            | Error::Compacted { .. }
            | Error::FutureRevision { .. } => Failure::Usage(e.to_string()),
            Error::Unavailable { .. } => Failure::Unavailable(e.to_string()),
            Error::UnknownOutcome(_) => Failure::Unknown(e.to_string()),
            // `Error` is non-exhaustive: a kind this CLI does not know yet
            // is reported as a generic failure.
            _ => Failure::Other(e.to_string()),
        }
    }
}
