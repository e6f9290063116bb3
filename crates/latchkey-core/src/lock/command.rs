//! The lock service's commands, queries and outcomes, carried inside
//! [`crate::Command::Lock`], [`crate::Query::Lock`] and
//! [`crate::Outcome::Lock`].
//!
//! Every rule they follow is listed in the [module docs](crate::lock).

use serde::{Deserialize, Serialize};

use super::{
    HolderInfo, LeaseLeft, LockCensus, LockInfo, LockMode, Sequencer, SessionId, SessionInfo,
    SessionLeft, SessionListing, SessionSecret, SessionTimer, TimerState, Token,
};
use crate::command::{BatchOp, Condition};

/// A lock-service write, applied through the log like any [`crate::Command`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockCommand {
    /// Open a session with a TTL in
    /// [`MIN_SESSION_TTL_MS`](crate::limits::MIN_SESSION_TTL_MS)..=
    /// [`MAX_SESSION_TTL_MS`](crate::limits::MAX_SESSION_TTL_MS).
    /// Returns [`LockOutcome::SessionOpened`].
    OpenSession {
        /// How long the session lives without a keep-alive, in milliseconds.
        ttl_ms: u64,
        /// The new session's secret, drawn at random by the replica that
        /// proposes the command (never by the client).
        secret: SessionSecret,
        /// Who opened it, for operators (`latchkey sessions`): free text
        /// of at most
        /// [`MAX_SESSION_NAME_BYTES`](crate::limits::MAX_SESSION_NAME_BYTES)
        /// bytes, no control characters; may be empty. Not unique, never
        /// checked against anything.
        name: String,
    },
    /// End a session by its client's wish: every hold ends at once without
    /// lock-delay and every wait is cancelled. Returns
    /// [`LockOutcome::SessionEnded`].
    CloseSession {
        /// The session to close.
        session: SessionId,
        /// The session's secret.
        secret: SessionSecret,
    },
    /// Leader only: the session's TTL ran out on the leader's clock. Like
    /// `CloseSession`, but holds acquired with a lock-delay leave their lock
    /// in lock-delay. Returns [`LockOutcome::SessionEnded`].
    ExpireSession {
        /// The session whose TTL ran out.
        session: SessionId,
    },
    /// Acquire `name` in `mode` for (`session`, `owner`). `owner` tells apart
    /// the parties sharing one session (threads, tasks). `wait_ms`: `None`
    /// tries once; otherwise the request may queue, and the shell cancels it
    /// after `wait_ms`. `lease_ms`: maximum hold time of this grant.
    /// `lock_delay_ms`: how long the lock stays unavailable after a forced
    /// release of this grant. Returns [`LockOutcome::Granted`] or
    /// [`LockOutcome::Queued`].
    Acquire {
        /// The acquiring session.
        session: SessionId,
        /// The session's secret.
        secret: SessionSecret,
        /// The party within the session that will hold the lock.
        owner: u64,
        /// This request's id within the session; a retry reuses it (see the
        /// module docs' *Retries*).
        request_id: u64,
        /// The lock.
        name: String,
        /// Exclusive or shared.
        mode: LockMode,
        /// How long the request may wait in the queue, in milliseconds; `None`:
        /// try once.
        wait_ms: Option<u64>,
        /// Maximum hold time of the grant, in milliseconds, from the grant;
        /// `None`: no lease.
        lease_ms: Option<u64>,
        /// How long the lock stays unavailable after a forced release of the
        /// grant, in milliseconds; `None`: no lock-delay.
        lock_delay_ms: Option<u64>,
        /// Campaigning in an election (`name` is an election's lock, see
        /// [`crate::lock::election_lock_name`]): the candidate's value,
        /// which the leader key shows while it leads. Must be empty for
        /// any other lock.
        #[serde(with = "crate::codec::bytes")]
        value: Vec<u8>,
        /// Taking a permit of a semaphore of this many permits (1 to
        /// [`MAX_LOCK_HOLDERS`](crate::limits::MAX_LOCK_HOLDERS); the mode
        /// must be shared): at most that many grants hold the lock at once.
        /// The count is fixed while the lock is in use: an acquire with
        /// another count, or without one, is refused with
        /// [`CommandError::PermitsMismatch`](crate::CommandError::PermitsMismatch).
        /// No `lock_delay_ms` with it. `None`: a lock.
        permits: Option<u32>,
    },
    /// Release one hold of `name`, granted under `token`, by (`session`,
    /// `owner`). Returns [`LockOutcome::Released`].
    Release {
        /// The holding session.
        session: SessionId,
        /// The session's secret.
        secret: SessionSecret,
        /// The holding party within the session.
        owner: u64,
        /// This request's id within the session; a retry reuses it.
        request_id: u64,
        /// The lock.
        name: String,
        /// The fencing token of the grant to release.
        token: Token,
    },
    /// Withdraw the queued acquire `request_id` of (`session`, `owner`) from
    /// `name`'s queue: its client gave up. Returns
    /// [`LockOutcome::WaitCancel`].
    CancelWait {
        /// The waiting session.
        session: SessionId,
        /// The session's secret.
        secret: SessionSecret,
        /// The waiting party within the session.
        owner: u64,
        /// The lock waited for.
        name: String,
        /// The request id of the queued acquire.
        request_id: u64,
    },
    /// Leader only: the wait of the queued acquire `request_id` of
    /// (`session`, `owner`) ran out on the leader's clock. Exactly
    /// [`LockCommand::CancelWait`] without the secret (clients cannot
    /// propose it). Returns [`LockOutcome::WaitCancel`].
    ExpireWait {
        /// The waiting session.
        session: SessionId,
        /// The waiting party within the session.
        owner: u64,
        /// The lock waited for.
        name: String,
        /// The request id of the queued acquire.
        request_id: u64,
    },
    /// Leader only: the lease of the grant `token` of `name` ran out. A no-op
    /// if that grant no longer holds or had no lease. Returns
    /// [`LockOutcome::LeaseExpired`].
    ExpireLockLease {
        /// The lock.
        name: String,
        /// The fencing token of the grant whose lease ran out.
        token: Token,
    },
    /// Leader only: the lock-delay of `name` guarded by `token` (from
    /// [`crate::lock::Event::LockDelayStarted`]) is over; the queue moves on.
    /// A no-op if that delay is not the current one. Returns
    /// [`LockOutcome::LockDelayEnded`].
    EndLockDelay {
        /// The lock.
        name: String,
        /// The token guarding the delay.
        token: Token,
    },
    /// A batch (same conditions and ops as [`crate::Command::Batch`]) that
    /// applies only while `sequencer` is the current exclusive holder of its
    /// lock; otherwise [`crate::CommandError::StaleFence`] and nothing is
    /// written. Returns [`crate::Outcome::Batch`], as a batch does.
    Fenced {
        /// The exclusive grant that must still hold its lock.
        sequencer: Sequencer,
        /// The secret of the sequencer's session: only the holder writes.
        secret: SessionSecret,
        /// Checked once the fence holds, as in [`crate::Command::Batch`].
        conditions: Vec<Condition>,
        /// Applied if every condition holds, as in [`crate::Command::Batch`].
        ops: Vec<BatchOp>,
    },
    /// An operator ends someone's session (etcd's `lease revoke`): like
    /// [`LockCommand::ExpireSession`], without waiting for the TTL. Its
    /// waits are cancelled and its keys deleted in this one entry; its
    /// holds end as forced releases whose lock-delay is at least the
    /// session's TTL, because its client, not told yet, may count its
    /// lease valid for up to a TTL after its last keep-alive: nobody else
    /// is granted the lock before that client stops counting itself a
    /// holder. The delay starts even while other shared holders remain
    /// (they keep their grants; nobody new is granted until it ends).
    /// Needs the admin permission while access control is
    /// enabled, and an authenticated caller (a user or the cluster secret)
    /// even while it is not; no secret (the operator does not have it).
    /// Returns [`LockOutcome::SessionEnded`]; a session that is not live
    /// is refused like any other command naming it (`SessionEnded` or
    /// `UnknownSession`).
    EndSession {
        /// The session to end.
        session: SessionId,
    },
    /// The leader of an election (`name`: the election's lock) replaces
    /// the value its leader key shows. Needs the leader's session, owner
    /// and term (its grant's token). Returns [`LockOutcome::Proclaimed`].
    Proclaim {
        /// The leading session.
        session: SessionId,
        /// The session's secret.
        secret: SessionSecret,
        /// The leading party within the session.
        owner: u64,
        /// The election's lock.
        name: String,
        /// The leader's term: the token of its grant.
        token: Token,
        /// The new value.
        #[serde(with = "crate::codec::bytes")]
        value: Vec<u8>,
    },
    /// Acquire every lock of `names` for (`session`, `owner`) in one entry,
    /// or none: a multi-lock (Curator's `InterProcessMultiLock`). While it
    /// waits it holds none of them. `names`: 2 to
    /// [`MAX_MULTI_LOCK_NAMES`](crate::limits::MAX_MULTI_LOCK_NAMES)
    /// distinct locks (no elections). The rest is as in
    /// [`LockCommand::Acquire`], for each lock. Returns
    /// [`LockOutcome::GrantedAll`], or [`LockOutcome::Queued`] under the
    /// first name. The rules are in `multi_lock.rs`.
    AcquireAll {
        /// The acquiring session.
        session: SessionId,
        /// The session's secret.
        secret: SessionSecret,
        /// The party within the session that will hold the locks; it must
        /// hold and wait for none of them.
        owner: u64,
        /// This request's id within the session; a retry reuses it.
        request_id: u64,
        /// The locks, in the order their grants are made and reported.
        names: Vec<String>,
        /// Exclusive or shared, for every lock.
        mode: LockMode,
        /// How long the request may wait, in milliseconds; `None`: try once.
        wait_ms: Option<u64>,
        /// Maximum hold time of each grant, in milliseconds; `None`: no lease.
        lease_ms: Option<u64>,
        /// Lock-delay after a forced release of each grant; `None`: none.
        lock_delay_ms: Option<u64>,
    },
    /// End each of (`session`, `owner`)'s `grants` (lock name, token) in
    /// one entry: a multi-lock given back. A grant ends whole, with any
    /// hold a single acquire by the same owner added to it. A grant that no
    /// longer holds is reported in [`LockOutcome::ReleasedAll`], not
    /// refused. 1 to [`MAX_MULTI_LOCK_NAMES`](crate::limits::MAX_MULTI_LOCK_NAMES)
    /// distinct locks.
    ReleaseAll {
        /// The holding session.
        session: SessionId,
        /// The session's secret.
        secret: SessionSecret,
        /// The holding party within the session.
        owner: u64,
        /// This request's id within the session; a retry reuses it.
        request_id: u64,
        /// The grants: each lock's name and the token it was granted under.
        grants: Vec<(String, Token)>,
    },
    /// Leader only: how long these sessions and leases have left on the
    /// leader's clock, so that the next leader resumes their countdowns
    /// from there instead of restarting them at full length (see
    /// [`crate::lock::TimerState`]). A left at or above the full length
    /// clears the record (the leader's reset after a keep-alive); a
    /// session or grant that is gone is skipped. At most
    /// [`MAX_CHECKPOINT_ITEMS`](crate::limits::MAX_CHECKPOINT_ITEMS) items.
    /// Returns [`LockOutcome::Checkpointed`].
    Checkpoint {
        /// Sessions, with their time left.
        sessions: Vec<SessionLeft>,
        /// Leased grants, with their lease's time left.
        leases: Vec<LeaseLeft>,
    },
    /// An operator's forced release of lock `name` (Hazelcast's
    /// `forceUnlock`, done safely): the grant `token` ends as a forced
    /// release, without the holder's secret. By token only, so that a
    /// resend after a lost answer never releases the next holder; to free
    /// every grant, read the holders and force each. Like [`LockCommand::EndSession`] for one lock: the
    /// lock-delay is at least the holder session's TTL (its client counts
    /// itself a holder until it hears, at its next keep-alive, see
    /// [`SessionInfo::forced`]), the queue moves on after it, and the next
    /// grant takes a higher token like any other, so fenced writes of the
    /// old holder are refused. The lock-delay starts even if other shared
    /// holders or permits remain: nothing new is granted until it ends,
    /// so no more parties than the lock allows ever believe they hold it.
    /// The holder's session lives on. Needs the
    /// admin permission while access control is enabled, and an
    /// authenticated caller even while it is not. Returns
    /// [`LockOutcome::ForceReleased`], empty if no grant matched (the
    /// lock was free, or a resend of this very command released it).
    ForceRelease {
        /// The lock.
        name: String,
        /// The grant to end.
        token: Token,
    },
}

/// Who may propose a [`LockCommand`]. The core applies whatever is in the
/// log; the replica uses this to refuse leader-only commands from clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proposer {
    /// Sent by clients (through the leader).
    Client,
    /// Only the leader's own timers propose it.
    Leader,
}

impl LockCommand {
    /// Who may propose this command.
    pub fn proposer(&self) -> Proposer {
        match self {
            LockCommand::OpenSession { .. }
            | LockCommand::CloseSession { .. }
            | LockCommand::Acquire { .. }
            | LockCommand::AcquireAll { .. }
            | LockCommand::Release { .. }
            | LockCommand::ReleaseAll { .. }
            | LockCommand::CancelWait { .. }
            | LockCommand::Fenced { .. }
            | LockCommand::Proclaim { .. }
            | LockCommand::EndSession { .. }
            | LockCommand::ForceRelease { .. } => Proposer::Client,
            LockCommand::ExpireSession { .. }
            | LockCommand::ExpireWait { .. }
            | LockCommand::ExpireLockLease { .. }
            | LockCommand::EndLockDelay { .. }
            | LockCommand::Checkpoint { .. } => Proposer::Leader,
        }
    }

    /// Bytes of names, keys and values this command carries.
    pub fn payload_len(&self) -> usize {
        match self {
            LockCommand::OpenSession { name, .. } => name.len(),
            LockCommand::CloseSession { .. }
            | LockCommand::ExpireSession { .. }
            | LockCommand::EndSession { .. } => 0,
            LockCommand::Acquire { name, value, .. }
            | LockCommand::Proclaim { name, value, .. } => name.len() + value.len(),
            LockCommand::Release { name, .. }
            | LockCommand::CancelWait { name, .. }
            | LockCommand::ExpireWait { name, .. }
            | LockCommand::ExpireLockLease { name, .. }
            | LockCommand::EndLockDelay { name, .. }
            | LockCommand::ForceRelease { name, .. } => name.len(),
            LockCommand::Fenced {
                sequencer,
                conditions,
                ops,
                ..
            } => sequencer.name.len() + crate::command::batch_payload_len(conditions, ops),
            LockCommand::AcquireAll { names, .. } => names.iter().map(String::len).sum(),
            LockCommand::ReleaseAll { grants, .. } => grants.iter().map(|(n, _)| n.len()).sum(),
            LockCommand::Checkpoint { leases, .. } => leases.iter().map(|l| l.name.len()).sum(),
        }
    }
}

/// A lock-service read, served like any [`crate::Query`] (linearizable after
/// ReadIndex unless the caller opts out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockQuery {
    /// Is this grant still the current holder of its lock (same name, token,
    /// session and mode)? Returns [`LockOutcome::SequencerCheck`]. A
    /// sequencer of an ended session is simply not current (never an error).
    CheckSequencer(Sequencer),
    /// Locks in use whose names start with `prefix`, in name order, after
    /// `start_after` if given, at most `limit` (0 means
    /// [`MAX_LOCK_LIST_LIMIT`](crate::limits::MAX_LOCK_LIST_LIMIT)).
    /// Returns [`LockOutcome::Locks`].
    Locks {
        /// Only names starting with this (empty: every lock).
        prefix: String,
        /// Only names after this one, to page through the list.
        start_after: Option<String>,
        /// At most this many locks; 0 means
        /// [`MAX_LOCK_LIST_LIMIT`](crate::limits::MAX_LOCK_LIST_LIMIT).
        limit: u32,
    },
    /// Whether the session is live, and its TTL. Returns
    /// [`LockOutcome::Session`] (`None` for an unknown or ended session).
    Session {
        /// The session to look up.
        session: SessionId,
    },
    /// Everything a newly elected leader needs to resume every countdown.
    /// Returns [`LockOutcome::Timers`].
    TimerState,
    /// The leader's view of one session, with its secret, to check a
    /// keep-alive for a session it does not count down yet. Returns
    /// [`LockOutcome::SessionTimer`] (`None` for a session that is not
    /// live). Read by the replica itself, never sent anywhere.
    SessionTimer {
        /// The session to look up.
        session: SessionId,
    },
    /// How many sessions, locks, grants and waiters the state holds, for
    /// the replica's metrics. Returns [`LockOutcome::Census`]. Read by the
    /// replica itself (it scans every session and lock), never sent
    /// anywhere.
    Census,
    /// Live sessions in id order, after `start_after` if given, at most
    /// `limit` (0 means
    /// [`MAX_SESSION_LIST_LIMIT`](crate::limits::MAX_SESSION_LIST_LIMIT)),
    /// each with what it holds, waits for and owns: an operator's view
    /// (`latchkey sessions`). Returns [`LockOutcome::Sessions`].
    Sessions {
        /// Only sessions after this one, to page through the list.
        start_after: Option<SessionId>,
        /// At most this many sessions; 0 means
        /// [`MAX_SESSION_LIST_LIMIT`](crate::limits::MAX_SESSION_LIST_LIMIT).
        limit: u32,
    },
}

/// The successful result of a [`LockCommand`] or [`LockQuery`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockOutcome {
    /// A new session.
    SessionOpened {
        /// The new session's id.
        session: SessionId,
        /// Its TTL, in milliseconds.
        ttl_ms: u64,
        /// Its secret: the client needs it for everything it does in the
        /// session's name.
        secret: SessionSecret,
    },
    /// A session was closed or expired: `released` holds ended, `cancelled`
    /// waits were withdrawn.
    SessionEnded {
        /// The ended session.
        session: SessionId,
        /// How many of its grants ended.
        released: u32,
        /// How many of its queued acquires were withdrawn.
        cancelled: u32,
    },
    /// The acquire holds the lock: `hold_count` is 1 for a new grant, more
    /// for a re-entrant one (same token).
    Granted {
        /// The grant: lock name, mode, fencing token and session.
        sequencer: Sequencer,
        /// Holds of this grant, counting this one.
        hold_count: u32,
    },
    /// The acquire waits in the queue at `position` (0 = next in line). The
    /// replica tells the client of its grant by [`crate::lock::Event::Granted`];
    /// a retry of the acquire returns the grant once it happened.
    Queued {
        /// The lock.
        name: String,
        /// The queued acquire's request id.
        request_id: u64,
        /// Place in the queue: how many acquires are ahead of it.
        position: u32,
    },
    /// One hold of the grant `token` was released; `remaining` holds are
    /// left (0: the grant is over and the lock moved on).
    Released {
        /// The lock.
        name: String,
        /// The fencing token of the grant released from.
        token: Token,
        /// Holds of the grant still left.
        remaining: u32,
    },
    /// What a [`LockCommand::CancelWait`] found.
    WaitCancel(WaitCancel),
    /// Whether [`LockCommand::ExpireLockLease`] released a grant.
    LeaseExpired {
        /// True if the grant still held and was released; false if the
        /// command was a no-op.
        released: bool,
    },
    /// Whether [`LockCommand::EndLockDelay`] ended the current lock-delay.
    LockDelayEnded {
        /// True if the delay was the current one and ended; false if the
        /// command was a no-op.
        ended: bool,
    },
    /// Whether a sequencer is the current holder.
    SequencerCheck {
        /// True if the sequencer's grant (same name, token, session and mode)
        /// still holds its lock.
        current: bool,
    },
    /// Locks in use, and whether more matched beyond the limit.
    Locks {
        /// The matching locks, in name order.
        locks: Vec<LockInfo>,
        /// Whether more locks matched beyond the limit.
        more: bool,
    },
    /// A live session, or `None`.
    Session(Option<SessionInfo>),
    /// The countdowns a new leader must restart.
    Timers(TimerState),
    /// A live session with its secret, or `None`.
    SessionTimer(Option<SessionTimer>),
    /// The counts of [`LockQuery::Census`].
    Census(LockCensus),
    /// The leader's new value is in its election's leader key.
    Proclaimed {
        /// The leader's term.
        term: Token,
    },
    /// A multi-lock holds every lock it asked for: one grant each, in the
    /// order of [`LockCommand::AcquireAll`]'s names. Also what a queued
    /// multi-lock's retry returns once granted.
    GrantedAll {
        /// The grants, in the order asked.
        sequencers: Vec<Sequencer>,
    },
    /// What a [`LockCommand::ReleaseAll`] did.
    ReleasedAll {
        /// The locks whose grant ended, in the order given.
        released: Vec<String>,
        /// The locks whose grant no longer held (lease run out, released by
        /// force, released before), in the order given.
        gone: Vec<String>,
    },
    /// What a [`LockCommand::Checkpoint`] recorded.
    Checkpointed {
        /// How many of its sessions and leases were still there to record.
        recorded: u32,
    },
    /// What a [`LockCommand::ForceRelease`] ended: each grant as it was
    /// just before, in grant order. Empty if no grant matched.
    ForceReleased {
        /// The grants ended.
        released: Vec<HolderInfo>,
    },
    /// Live sessions, as [`LockQuery::Sessions`] lists them.
    Sessions {
        /// In id order.
        sessions: Vec<SessionListing>,
        /// Whether more sessions are live beyond the limit.
        more: bool,
    },
}

/// What a [`LockCommand::CancelWait`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitCancel {
    /// The wait was withdrawn (now, or by an earlier cancel of the same wait).
    Cancelled,
    /// The acquire had already been granted, before the cancel was applied:
    /// the client holds (or held) the lock under this sequencer, and must use
    /// or release it. A cancel never releases a grant, because the grant may
    /// already have been reported to the waiting client.
    AlreadyGranted(Sequencer),
    /// As `AlreadyGranted`, for a multi-lock: it holds (or held) all of
    /// these, in the order asked.
    AlreadyGrantedAll(Vec<Sequencer>),
    /// No such wait: wrong ids, or too old to be remembered.
    NotWaiting,
}

/// Which duration of an acquire is out of range, in
/// [`crate::CommandError::DurationOutOfRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimerKind {
    /// `wait_ms`.
    Wait,
    /// `lease_ms`.
    Lease,
    /// `lock_delay_ms`.
    LockDelay,
}

impl std::fmt::Display for TimerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimerKind::Wait => "wait",
            TimerKind::Lease => "lock lease",
            TimerKind::LockDelay => "lock-delay",
        })
    }
}
