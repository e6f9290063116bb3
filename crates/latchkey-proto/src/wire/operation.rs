//! [`Operation`]: one client operation, as the in-process path and the wire
//! both carry it.

use std::time::Duration;

use latchkey_core::lock::{SessionId, SessionSecret};
use latchkey_core::{Command, Query};

/// One client operation, as the in-process path and the wire both carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// Propose a write command.
    Write(Command),
    /// Serve a query: linearizable (confirmed by the leader) unless `stale`.
    Read {
        /// What to read.
        query: Query,
        /// Serve from the answering replica's state without confirming the
        /// leadership.
        stale: bool,
    },
    /// Propose an acquire and, if it queues, hold the call up to `hold`
    /// for the grant.
    Acquire {
        /// A [`LockCommand::Acquire`](latchkey_core::lock::LockCommand::Acquire).
        command: Command,
        /// Longest time the replica holds the call.
        hold: Duration,
    },
    /// Extend a session's lease (writes nothing).
    KeepAlive {
        /// The session.
        session: SessionId,
        /// Its secret, from its open.
        secret: SessionSecret,
    },
}
