//! Countdown checkpoints ([`LockCommand::Checkpoint`]): the leader's record,
//! in the log, of how long a session or a lease has left, so that the next
//! leader resumes that countdown instead of restarting it at full length.
//!
//! The core has no clock: it only keeps the numbers the leader measured.
//! What they mean, and why they are safe, is the leader's business (see the
//! server's `locks` module, *Why failovers stretch a countdown only a
//! little*). The rules here:
//!
//! - A session record keeps `left_ms`: `None` means "the full TTL from
//!   whenever a new leader takes over"; `Some(ms)` means "`ms` from then".
//!   A leased holder keeps `lease_left_ms` in the same way.
//! - A checkpoint sets the number; one at or above the full length clears
//!   it (the leader's reset after a keep-alive). A number is never raised
//!   above the full length, and never changed for a session or grant that
//!   is gone: such an item is skipped, because the leader's table raced
//!   with an end that is already in the log. Nothing is refused for it.
//! - Nothing else changes: no event, no revision, no lock moves.

use serde::{Deserialize, Serialize};

use super::applied::Applied;
use super::event::Event;
use super::{lock_table, session, LockOutcome, SessionId, Token};
use crate::Store;

/// How long a session has left on the leader's clock, in a
/// [`crate::lock::LockCommand::Checkpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLeft {
    /// The session.
    pub session: SessionId,
    /// Milliseconds left before its expiry (its TTL or more: a reset).
    pub left_ms: u64,
}

/// How long a grant's lease has left on the leader's clock, in a
/// [`crate::lock::LockCommand::Checkpoint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseLeft {
    /// The lock.
    pub name: String,
    /// The grant.
    pub token: Token,
    /// Milliseconds left before its lease runs out.
    pub left_ms: u64,
}

/// The stored number for `left` of a countdown `full` long: `None` for
/// the full length.
fn stored(left: u64, full: u64) -> Option<u64> {
    (left < full).then_some(left)
}

/// Apply a validated [`crate::lock::LockCommand::Checkpoint`].
pub(crate) fn apply<S: Store>(
    store: &mut S,
    sessions: &[SessionLeft],
    leases: &[LeaseLeft],
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let mut recorded = 0u32;
    for s in sessions {
        let Some(mut rec) = session::load(store, s.session)? else {
            continue;
        };
        let left = stored(s.left_ms, rec.ttl_ms);
        if rec.left_ms != left {
            rec.left_ms = left;
            session::save(store, s.session, &rec)?;
        }
        recorded = recorded.saturating_add(1);
    }
    for l in leases {
        let mut lock = lock_table::load(store, &l.name)?;
        let Some(holder) = lock.rec.holders.iter_mut().find(|h| h.token == l.token) else {
            continue;
        };
        let Some(full) = holder.lease_ms else {
            continue;
        };
        let left = stored(l.left_ms, full);
        if holder.lease_left_ms != left {
            holder.lease_left_ms = left;
            lock_table::save(store, lock, events)?;
        }
        recorded = recorded.saturating_add(1);
    }
    Ok(LockOutcome::Checkpointed { recorded })
}
