//! [`Event`]: what one applied log entry did that the shell must act on.

use serde::{Deserialize, Serialize};

use super::{LockMode, SessionId, SessionSecret, Token};

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
    SessionOpened {
        /// The new session.
        session: SessionId,
        /// Its TTL, in milliseconds.
        ttl_ms: u64,
        /// Its secret, which the leader checks keep-alives against.
        secret: SessionSecret,
    },
    /// A session ended; everything it held or waited for is gone (and
    /// reported by the events before this one).
    SessionEnded {
        /// The ended session.
        session: SessionId,
        /// Closed by its client or expired by the leader.
        how: SessionEnd,
    },
    /// A new grant: `waited` says it came from the queue (the waiting client
    /// must be woken) rather than straight from the acquire that this entry
    /// carries. Re-entrant acquires are not new grants and have no event.
    Granted {
        /// The session granted the lock.
        session: SessionId,
        /// The party within the session that holds it.
        owner: u64,
        /// The request id of the acquire granted.
        request_id: u64,
        /// The lock.
        name: String,
        /// The grant's mode.
        mode: LockMode,
        /// The grant's fencing token.
        token: Token,
        /// The grant's lease, in milliseconds from the grant; `None`: no lease.
        lease_ms: Option<u64>,
        /// True if the grant came from the queue.
        waited: bool,
    },
    /// An acquire joined the lock's queue; its wait countdown starts.
    Queued {
        /// The waiting session.
        session: SessionId,
        /// The waiting party within the session.
        owner: u64,
        /// The request id of the queued acquire.
        request_id: u64,
        /// The lock waited for.
        name: String,
        /// The mode asked for.
        mode: LockMode,
        /// How long it may wait, in milliseconds.
        wait_ms: u64,
    },
    /// A queued acquire left the queue without a grant.
    WaitCancelled {
        /// The waiting session.
        session: SessionId,
        /// The waiting party within the session.
        owner: u64,
        /// The request id of the acquire that left the queue.
        request_id: u64,
        /// The lock waited for.
        name: String,
        /// Why the wait ended.
        why: WaitEnd,
    },
    /// A hold ended completely (hold count 0, or forced).
    Released {
        /// The session that held the lock.
        session: SessionId,
        /// The party within the session that held it.
        owner: u64,
        /// The lock.
        name: String,
        /// The fencing token of the grant that ended.
        token: Token,
        /// Why the hold ended.
        why: HoldEnd,
    },
    /// A forced release left the lock in lock-delay: the leader proposes
    /// [`crate::lock::LockCommand::EndLockDelay`] with this `token` after
    /// `delay_ms`.
    LockDelayStarted {
        /// The lock.
        name: String,
        /// The token guarding the delay: the newest of the released grants
        /// acquired with a lock-delay.
        token: Token,
        /// How long the delay lasts, in milliseconds: the longest lock-delay of
        /// the released grants.
        delay_ms: u64,
    },
    /// The lock-delay guarded by `token` is over.
    LockDelayEnded {
        /// The lock.
        name: String,
        /// The token that guarded the delay.
        token: Token,
    },
    /// The lock had holders or a lock-delay before this entry and is now
    /// entirely free (no holder, no delay, nobody waiting).
    LockFreed {
        /// The lock.
        name: String,
    },
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionEnd {
    /// [`crate::lock::LockCommand::CloseSession`]: no lock-delay.
    Closed,
    /// [`crate::lock::LockCommand::ExpireSession`]: lock-delay applies.
    Expired,
    /// [`crate::lock::LockCommand::EndSession`], an operator's: lock-delay
    /// applies, as for an expiry.
    Ended,
}

/// Why a wait ended without a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitEnd {
    /// [`crate::lock::LockCommand::CancelWait`] (the client gave up) or
    /// [`crate::lock::LockCommand::ExpireWait`] (the wait timed out).
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
    /// An operator's [`crate::lock::LockCommand::ForceRelease`]; the
    /// holder's session lives on and hears of it at its next keep-alive.
    Forced,
}
