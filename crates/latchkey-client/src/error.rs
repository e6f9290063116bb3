//! The client's error type: one variant per thing a caller should do differently.

use std::time::Duration;

use latchkey_core::CommandError;

/// What went wrong with a client call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request is malformed or breaks a limit (empty or oversized key,
    /// oversized value, ...). Fix the request; retrying will not help.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The state machine refused the command deterministically (for example
    /// an exhausted sequence). Nothing was written.
    #[error("refused: {0}")]
    Refused(CommandError),
    /// No replica answered successfully before the request deadline. Nothing
    /// is known to have been written (for writes: nothing was sent to a
    /// leader, or every attempt was refused before proposing).
    #[error("cluster unavailable after {attempts} attempts in {elapsed:?}: {last}")]
    Unavailable {
        /// How many attempts were made.
        attempts: u32,
        /// Time from the start of the call to giving up.
        elapsed: Duration,
        /// Why the last attempt failed ("no attempt made" if none was).
        last: String,
    },
    /// A write reached a leader but its fate is unknown: it may or may not
    /// have been applied. Read the key to find out before retrying a
    /// non-idempotent write.
    #[error("outcome unknown: {0}")]
    UnknownOutcome(String),
    /// An endpoint string could not be parsed.
    #[error("bad endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint given (empty when none was).
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The session has ended or its lease can no longer be vouched for: its
    /// keep-alives were not acknowledged in time, or the cluster expired or
    /// closed it. Its locks must be treated as lost; open a new session.
    #[error("session {session} is lost: {reason}")]
    SessionLost {
        /// The lost session's id.
        session: u64,
        /// How it was lost.
        reason: String,
    },
    /// A lock can no longer be relied on: its session is lost, its lease
    /// ran out, or it was released. Stop acting as its holder; work that
    /// was running under it ([`LockGuard::while_held`](crate::LockGuard::while_held))
    /// was cancelled.
    #[error("lock {lock:?} (token {token}) is lost: {reason}")]
    LockLost {
        /// The lock's name.
        lock: String,
        /// The fencing token of the lost grant.
        token: u64,
        /// How it was lost.
        reason: String,
    },
    /// A client was created outside a Tokio runtime: its connections need
    /// one. Create clients inside the runtime that will use them.
    #[error("no Tokio runtime: create the client inside a Tokio runtime (e.g. in #[tokio::main] or after Runtime::enter)")]
    NoRuntime,
    /// The server answered with something this client cannot decode: client
    /// and server versions probably differ.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A watch's start revision is older than the history the cluster
    /// keeps: changes since then are gone. Read the keys again (a scan
    /// answers the revision it read at) and watch from that revision plus
    /// one.
    #[error(
        "revision {requested} is compacted: the history starts at {oldest_revision}; read again \
         and watch from the revision the read saw plus one"
    )]
    Compacted {
        /// The start revision asked for.
        requested: u64,
        /// The oldest revision the history keeps.
        oldest_revision: u64,
    },
    /// A watch's start revision has not happened yet.
    #[error("revision {requested} is in the future: the next revision is {next}")]
    FutureRevision {
        /// The start revision asked for.
        requested: u64,
        /// The cluster's next revision, as the replica knew it.
        next: u64,
    },
}

impl Error {
    /// True when a fenced write was refused because its sequencer is no
    /// longer the lock's current exclusive holder (nothing was written).
    pub fn is_stale_fence(&self) -> bool {
        matches!(self, Error::Refused(CommandError::StaleFence { .. }))
    }
}

impl From<CommandError> for Error {
    fn from(e: CommandError) -> Self {
        match e {
            CommandError::InvalidArgument(msg) => Error::InvalidArgument(msg),
            other => Error::Refused(other),
        }
    }
}
