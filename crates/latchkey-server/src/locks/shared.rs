//! What a replica's request handlers share with its lock task: the
//! clients waiting here for a grant ([`Waiters`]), the queue of
//! keep-alives the leader answers ([`KeepAlive`]) and operators' questions
//! about how long sessions have left ([`CountdownAsk`]).

use std::time::{Duration, Instant};

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

/// How long each of `sessions` has left on the leader's countdowns, in
/// order; `None` for one it does not count down (or every one, if this
/// replica does not lead).
pub(crate) struct CountdownAsk {
    pub(crate) sessions: Vec<SessionId>,
    pub(crate) reply: oneshot::Sender<Vec<Option<Duration>>>,
}

/// What request handlers share with the lock task.
pub(crate) struct LockShared {
    pub(crate) waiters: Waiters,
    keep_alives: mpsc::UnboundedSender<KeepAlive>,
    countdowns: mpsc::UnboundedSender<CountdownAsk>,
}

/// The receivers the lock task drains.
pub(crate) struct LockInbox {
    pub(crate) keep_alives: mpsc::UnboundedReceiver<KeepAlive>,
    pub(crate) countdowns: mpsc::UnboundedReceiver<CountdownAsk>,
}

impl LockShared {
    /// The shared half, and the receivers the lock task drains.
    pub(crate) fn new() -> (LockShared, LockInbox) {
        let (keep_alives, keep_alives_rx) = mpsc::unbounded_channel();
        let (countdowns, countdowns_rx) = mpsc::unbounded_channel();
        (
            LockShared {
                waiters: Waiters::default(),
                keep_alives,
                countdowns,
            },
            LockInbox {
                keep_alives: keep_alives_rx,
                countdowns: countdowns_rx,
            },
        )
    }

    /// Hand a keep-alive to the lock task; `false` if it has stopped.
    pub(crate) fn keep_alive(&self, ka: KeepAlive) -> bool {
        self.keep_alives.send(ka).is_ok()
    }

    /// How long each of `sessions` has left, if this replica leads (see
    /// [`CountdownAsk`]); every one `None` if the lock task is gone.
    pub(crate) async fn countdowns(&self, sessions: Vec<SessionId>) -> Vec<Option<Duration>> {
        let n = sessions.len();
        let (reply, rx) = oneshot::channel();
        if self
            .countdowns
            .send(CountdownAsk { sessions, reply })
            .is_err()
        {
            return vec![None; n];
        }
        rx.await.unwrap_or_else(|_| vec![None; n])
    }
}
