//! [`Event`]: what one applied log entry did that the shell must act on.

use serde::{Deserialize, Serialize};

use super::{LockMode, SessionId, Token};

/// One effect of an applied log entry that the shell must act on.
///
/// [`crate::apply_with_events`] returns the events of an entry in the order
/// they happened, identically on every replica. A refused command has none.
///
/// What the shell does with them:
///
/// - every replica wakes the clients it has waiting on [`Event::Granted`]
///   (`waited: true`) and [`Event::WaitCancelled`], without polling;
/// - the leader starts countdowns: a session TTL on [`Event::SessionOpened`],
///   a lease on [`Event::Granted`] with a `lease_ms`, a wait timeout on
///   [`Event::Queued`], a lock-delay on [`Event::LockDelayStarted`]; and
///   drops the ones that no longer matter ([`Event::SessionEnded`],
///   [`Event::Released`], [`Event::WaitCancelled`], [`Event::Granted`] for a
///   waiter, [`Event::LockDelayEnded`]). Dropping is only an optimisation:
///   the expiry commands are no-ops or refused once their target is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A session was opened; its TTL countdown starts.
    SessionOpened { session: SessionId, ttl_ms: u64 },
    /// A session ended; everything it held or waited for is gone (and
    /// reported by the events before this one).
    SessionEnded { session: SessionId, how: SessionEnd },
    /// A new grant: `waited` says it came from the queue (the waiting client
    /// must be woken) rather than straight from the acquire that this entry
    /// carries. Re-entrant acquires are not new grants and have no event.
    Granted {
        session: SessionId,
        owner: u64,
        request_id: u64,
        name: String,
        mode: LockMode,
        token: Token,
        lease_ms: Option<u64>,
        waited: bool,
    },
    /// An acquire joined the lock's queue; its wait countdown starts.
    Queued {
        session: SessionId,
        owner: u64,
        request_id: u64,
        name: String,
        mode: LockMode,
        wait_ms: u64,
    },
    /// A queued acquire left the queue without a grant.
    WaitCancelled {
        session: SessionId,
        owner: u64,
        request_id: u64,
        name: String,
        why: WaitEnd,
    },
    /// A hold ended completely (hold count 0, or forced).
    Released {
        session: SessionId,
        owner: u64,
        name: String,
        token: Token,
        why: HoldEnd,
    },
    /// A forced release left the lock in lock-delay: the leader proposes
    /// [`crate::lock::LockCommand::EndLockDelay`] with this `token` after
    /// `delay_ms`.
    LockDelayStarted {
        name: String,
        token: Token,
        delay_ms: u64,
    },
    /// The lock-delay guarded by `token` is over.
    LockDelayEnded { name: String, token: Token },
    /// The lock had holders or a lock-delay before this entry and is now
    /// entirely free (no holder, no delay, nobody waiting).
    LockFreed { name: String },
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionEnd {
    /// [`crate::lock::LockCommand::CloseSession`]: no lock-delay.
    Closed,
    /// [`crate::lock::LockCommand::ExpireSession`]: lock-delay applies.
    Expired,
}

/// Why a wait ended without a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitEnd {
    /// [`crate::lock::LockCommand::CancelWait`] (the wait timed out, or the
    /// client gave up).
    Cancelled,
    /// The waiting session ended.
    SessionEnded(SessionEnd),
}

/// Why a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HoldEnd {
    /// Released by its holder (the hold count reached 0).
    Released,
    /// Its session ended.
    SessionEnded(SessionEnd),
    /// Its lock lease (maximum hold time) ran out.
    LeaseExpired,
}
