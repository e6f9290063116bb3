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
//!   `ExpireWait` when one runs out, and `Checkpoint` to record how long
//!   lagging sessions and leases have left;
//! - on the leader, answers keep-alives: the session's deadline becomes
//!   receipt time + TTL, and the answer waits for one leadership
//!   confirmation round (`Raft::is_leader`, a heartbeat to a quorum) begun
//!   *after* the keep-alive arrived. Every keep-alive that arrives while a
//!   round is in flight shares the next round. Nothing is written, so a
//!   keep-alive costs no fsync (except the first after its session was
//!   recorded, below).
//!
//! Rooms, each importing only those listed before it: `checkpoints` (when
//! to record countdowns), `waiters` and `timers` (plain tables), `shared` (what request handlers hand the task),
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
//! leader after the receipt, so it is elected after the send time. Once it
//! has applied everything committed before it (`ensure_linearizable`), it
//! resumes every countdown (`Timers::restart`) from what the log says is
//! left, counted from the moment its lock task saw it lead. Every record
//! it reads was taken before that moment: a record reaches this replica's
//! log only before it starts its own election (a replica that has moved to
//! a newer term accepts no entry of an older one), or it is this leader's
//! own. And a record never holds less than what the leader that took it
//! counted (next section). So no leader expires a session before the
//! client's own deadline.
//!
//! # Why failovers stretch a countdown only a little
//!
//! A new leader cannot know how long ago the old one last heard from a
//! client, so restarting every countdown at full length at each failover
//! would let a run of leader changes keep a dead holder's locks forever.
//! Instead the leader *records* in the log how long a countdown has left
//! ([`LockCommand::Checkpoint`](latchkey_core::lock::LockCommand::Checkpoint),
//! one entry for many countdowns, see [`checkpoints`]):
//!
//! - a session that has gone half its TTL without a keep-alive, then every
//!   250 ms until it expires or a keep-alive comes (a healthy client renews
//!   every third of its TTL, so its session is never recorded while the
//!   leader stays: keep-alives still write nothing);
//! - every lease, every eighth of its length (at least 250 ms);
//! - after taking over, every session 250 ms later and every lease an
//!   eighth of its length later, unless a keep-alive comes first (the new
//!   leader does not know which clients are alive);
//! - in one entry for every countdown due in the same 250 ms slot, so at
//!   most four entries a second however many sessions and leases there are.
//!
//! A new leader resumes each session and lease from its last record (the
//! full length if none), counted from when it saw itself lead. Each leader
//! change therefore lengthens a countdown by at most the time since its
//! last record (half the TTL for the first change after a keep-alive, 250
//! ms for a session's next ones, an eighth of a lease) plus up to 250 ms
//! waiting for a record slot, plus the time the cluster had no ready
//! leader. Leaders that fail one after another make progress only while
//! they lead: the time between a leader's death and its successor's first
//! record is lost each time, and nothing can count it without synchronized
//! clocks.
//!
//! A record must never let a new leader expire a session before its
//! client's deadline. So once a session is recorded with less than its
//! TTL, a keep-alive for it is answered only after a record taken after it
//! arrived commits (a *reset* to the whole TTL, batched with the other
//! waiting keep-alives), and only one checkpoint is in flight at a time,
//! so records reach the log in the order they were taken. That costs one
//! write for the first keep-alive of a client that fell behind, or of each
//! client after a failover, and none in steady state. Lock-delays and
//! queued waits still restart at full length: stretching them delays a
//! grant but never lets a dead holder keep a lock.
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

mod checkpoints;
#[cfg(test)]
mod failover_sim;
mod host;
mod shared;
mod task;
mod timers;
mod waiters;

use latchkey_core::lock::LockQuery;
use latchkey_core::Query;

pub(crate) use host::LockHost;
pub(crate) use shared::{KeepAlive, LockInbox, LockShared};
pub(crate) use task::run;
pub(crate) use waiters::WaitOutcome;

/// The query a new leader reads its countdowns from.
pub(crate) fn timer_query() -> Query {
    Query::Lock(LockQuery::TimerState)
}
