//! The replica side of the lock service: waking waiters, the leader's
//! countdowns, and keep-alives that cost no fsync.
//!
//! One task per replica ([`run`], in `task`) follows the entries the state machine
//! applies (`StateMachine::subscribe`), and:
//!
//! - on **every** replica, wakes the clients waiting here for a queued
//!   acquire when its grant or cancel is applied ([`waiters`]);
//! - on the **leader**, keeps a countdown per session, lock lease,
//!   lock-delay and queued acquire on its monotonic clock ([`timers`]) and
//!   proposes `ExpireSession`, `ExpireLockLease`, `EndLockDelay` and
//!   `ExpireWait` when one runs out;
//! - on the leader, answers keep-alives: the session's deadline becomes
//!   receipt time + TTL, and the answer waits for one leadership
//!   confirmation round (`Raft::is_leader`, a heartbeat to a quorum) begun
//!   *after* the keep-alive arrived. Every keep-alive that arrives while a
//!   round is in flight shares the next round. Nothing is written, so a
//!   keep-alive costs no fsync.
//!
//! Rooms, each importing only those listed before it: `waiters` and
//! `timers` (plain tables), `shared` (what request handlers hand the task),
//! `host` ([`LockHost`], what the task asks of its replica; the replica's
//! request path implements it) and `task`. Nothing here imports the
//! replica.
//!
//! # Why a stale leader cannot shorten a lease
//!
//! A client counts its lease from the *send* time of its last acknowledged
//! keep-alive: valid until `send + ttl - margin`. The leader that
//! acknowledged it counts from the receipt time, which is later. A leader
//! elected afterwards needs a vote from the quorum that confirmed the old
//! leader after the receipt, so it is elected after the send time; it
//! restarts every countdown at full length once it has applied everything
//! committed before it (`Timers::restart` after `ensure_linearizable`). So
//! no leader expires a session before the client's own deadline.
//!
//! # Why no countdown is lost at a leader change
//!
//! A new leader reads the whole `TimerState` after applying every entry
//! committed before its term, then replays, in log order, the events it
//! received while reading. Replaying an event the state already reflects
//! only lengthens a countdown or re-removes a removed one, so the table
//! converges to one countdown per live target. Expiry commands for targets
//! that are gone are refused or no-ops in the state machine, so a spurious
//! countdown is harmless.

mod host;
mod shared;
mod task;
mod timers;
mod waiters;

use latchkey_core::lock::LockQuery;
use latchkey_core::Query;

pub(crate) use host::LockHost;
pub(crate) use shared::{KeepAlive, LockShared};
pub(crate) use task::run;
pub(crate) use waiters::WaitOutcome;

/// The query a new leader reads its countdowns from.
pub(crate) fn timer_query() -> Query {
    Query::Lock(LockQuery::TimerState)
}
