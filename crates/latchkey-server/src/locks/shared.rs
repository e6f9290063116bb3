//! What a replica's request handlers share with its lock task: the
//! clients waiting here for a grant ([`Waiters`]) and the queue of
//! keep-alives the leader answers ([`KeepAlive`]).

use std::time::Instant;

use latchkey_core::lock::{SessionId, SessionSecret};
use latchkey_core::CommandResult;
use latchkey_proto::ReplicaFailure;
use tokio::sync::{mpsc, oneshot};

use super::waiters::Waiters;

/// A keep-alive waiting for the lock task.
pub(crate) struct KeepAlive {
    pub(crate) session: SessionId,
    pub(crate) secret: SessionSecret,
    pub(crate) received: Instant,
    pub(crate) reply: oneshot::Sender<Result<CommandResult, ReplicaFailure>>,
}

/// What request handlers share with the lock task.
pub(crate) struct LockShared {
    pub(crate) waiters: Waiters,
    keep_alives: mpsc::UnboundedSender<KeepAlive>,
}

impl LockShared {
    /// The shared half, and the receiver the lock task drains.
    pub(crate) fn new() -> (LockShared, mpsc::UnboundedReceiver<KeepAlive>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            LockShared {
                waiters: Waiters::default(),
                keep_alives: tx,
            },
            rx,
        )
    }

    /// Hand a keep-alive to the lock task; `false` if it has stopped.
    pub(crate) fn keep_alive(&self, ka: KeepAlive) -> bool {
        self.keep_alives.send(ka).is_ok()
    }
}
