//! The lock service's semantics: sessions, locks, fencing tokens,
//! sequencers, fenced writes, and retries. Pure: no clock, no timers, no
//! I/O. The leader's timers live in the shell and reach the core only as
//! explicit commands ([`LockCommand::ExpireSession`],
//! [`LockCommand::ExpireLockLease`], [`LockCommand::EndLockDelay`],
//! [`LockCommand::ExpireWait`]), and record how long their countdowns
//! have left as numbers the core keeps but never reads a clock for
//! ([`LockCommand::Checkpoint`]).
//!
//! This page is the lock contract (`LOCKS.md` of the design notes) made
//! precise: every rule the contract leaves open is settled here, and the
//! tests (`tests/lock_semantics.rs`, `tests/lock_properties.rs`) assert each
//! one.
//!
//! # Rooms
//!
//! | file | holds | imports (siblings) |
//! |------|-------|---------|
//! | `command.rs` | [`LockCommand`], [`LockQuery`], [`LockOutcome`] | none |
//! | `applied.rs` | the result of one step of applying a command | none |
//! | `event.rs` | [`Event`]: what the shell must act on | none |
//! | `record.rs` | reading and scanning stored rows | none |
//! | `sequencer.rs` | [`Sequencer`] and its printable form | none |
//! | `token.rs` | [`Token`] and the token counter | `applied` |
//! | `session.rs` | [`SessionId`], the session record, opening a session | `applied`, `event`, `record` |
//! | `dedup.rs` | per-session memory of request outcomes | `applied`, `record`, `session` |
//! | `lock_table.rs` | holders, FIFO queue, lock-delay; acquire, release, cancel, expiry | `applied`, `dedup`, `event`, `record`, `session`, `token` |
//! | `session_end.rs` | ending a session: its holds, waits and bound keys | `lock_table`, `session` and below |
//! | `election.rs` | elections: the leader key kept in step with an election's lock | `event`, `lock_table` |
//! | `multi_lock.rs` | multi-locks: several locks acquired in one entry or none, released together | `lock_table`, `session` and below |
//! | `checkpoint.rs` | the leader's record of how long sessions and leases have left | `lock_table`, `session` and below |
//! | `force.rs` | an operator's forced release of a lock | `lock_table`, `session` and below |
//! | `fence.rs` | fenced writes | `applied`, `lock_table` |
//! | `query.rs` | answers to [`LockQuery`], [`TimerState`] | `lock_table`, `record`, `session` |
//! | `apply.rs` | staging, dispatch, all-or-nothing commit | every file that applies a command |
//!
//! Imports point down this table (with `mode.rs`, lock modes, beside
//! `command.rs`): no two files import each other.
//!
//! State lives in the store under the tags of [`crate::keyspace`] (`S`,
//! `L`, `H`, `R`, and two counters in `M`), encoded with [`crate::codec`],
//! so it travels in snapshots like everything else.
//!
//! # Rules
//!
//! ## Commands are all or nothing
//!
//! - Every stateless check (names, durations, tokens, batch limits) runs in
//!   [`crate::validate_command`] before the store is touched; every stateful
//!   one runs against a staged view. A refused command writes nothing, not
//!   even the clock, and reports no events.
//! - A lock command that succeeds may still be a no-op:
//!   [`LockCommand::ExpireLockLease`] for a grant that no longer holds (or has
//!   no lease), [`LockCommand::EndLockDelay`] for a delay that is not the
//!   current one, [`LockCommand::ExpireWait`] or [`LockCommand::CancelWait`]
//!   for a wait that is gone. They
//!   answer which, so a late timer is harmless.
//!
//! ## Sessions
//!
//! - Every session has a secret; a client command for a live session with
//!   another secret is [`WrongSessionSecret`](crate::CommandError::WrongSessionSecret)
//!   (see `session.rs`).
//! - [`LockCommand::OpenSession`] takes a TTL in
//!   [`MIN_SESSION_TTL_MS`](crate::limits::MIN_SESSION_TTL_MS)`..=`[`MAX_SESSION_TTL_MS`](crate::limits::MAX_SESSION_TTL_MS),
//!   else [`CommandError::TtlOutOfRange`](crate::CommandError::TtlOutOfRange).
//!   Ids count up from 1 and are never reused.
//! - Every command naming a session that is not live is refused:
//!   [`UnknownSession`](crate::CommandError::UnknownSession) if the id was
//!   never issued, [`SessionEnded`](crate::CommandError::SessionEnded) if it
//!   was closed or expired (the two are not told apart; nothing of an ended
//!   session is kept). This includes `CloseSession`, `ExpireSession` and
//!   `EndSession` of an ended session. Queries are not refused: `Session` answers `None` and
//!   `CheckSequencer` answers "not current".
//! - `CloseSession` ends every hold at once without lock-delay;
//!   `ExpireSession` and an operator's `EndSession` end them as forced
//!   releases (lock-delay applies; for `EndSession` at least the session's
//!   TTL, since its client may still count itself a holder that long). All
//!   three cancel every wait of the session, delete the keys bound to it
//!   and forget its request memory. Locks are visited in
//!   name order; within a lock holds end before waits are cancelled, then
//!   the queue moves on.
//! - A session carries the name its opener gave (at most
//!   [`MAX_SESSION_NAME_BYTES`](crate::limits::MAX_SESSION_NAME_BYTES),
//!   no control characters), shown to operators by
//!   [`LockQuery::Sessions`] and never checked.
//!
//! ## An operator's forced release
//!
//! - [`LockCommand::ForceRelease`] ends one grant of a lock, by token,
//!   without the holder's secret (never "every grant": a resend after a
//!   lost answer must not release the next holder). It ends as a forced
//!   release ([`HoldEnd::Forced`]) with a lock-delay of at least its
//!   session's TTL (and its own lock-delay if longer), started even while
//!   other holders remain (they keep their grants; nobody new is granted
//!   meanwhile), then the queue moves on and the next grant takes the next
//!   token like any other: the old holder's fenced writes are refused from
//!   then on. An operator's `EndSession` starts its delays the same way.
//! - The holder's session lives on and records the release
//!   ([`ForcedReleases`]): its total count and its last
//!   [`MAX_FORCED_REMEMBERED`](crate::limits::MAX_FORCED_REMEMBERED)
//!   tokens, which every keep-alive and session read reports
//!   ([`SessionInfo::forced`]), so its client learns which grants it lost.
//! - Nothing matching (a free lock, an unknown token, a resend that finds
//!   its work done) is not an error: the answer lists no grant.
//! - A lock-delay may therefore run while the lock has holders (only an
//!   operator's act starts one so); it blocks new grants, never the
//!   holders' own releases or re-entrant acquires.
//!
//! ## Acquire
//!
//! In this order:
//!
//! 1. The session must be live; a retried request id answers from the
//!    request memory (see *Retries*).
//! 2. Re-entrant: if (session, owner) holds the lock in the same mode, the
//!    hold count goes up, the token stays, and the grant's lease and
//!    lock-delay stay those of the first acquire (a re-entrant acquire never
//!    waits, even behind a queue). Holding shared and asking exclusive is
//!    [`UpgradeNotAllowed`](crate::CommandError::UpgradeNotAllowed); holding
//!    exclusive and asking shared is
//!    [`DowngradeNotAllowed`](crate::CommandError::DowngradeNotAllowed).
//! 3. If (session, owner) is already queued for this lock:
//!    [`AlreadyWaiting`](crate::CommandError::AlreadyWaiting). An owner waits
//!    for one grant of a lock at a time.
//! 4. Granted at once only if nobody is queued, there is no lock-delay, and
//!    the lock is free or held shared with a shared request and fewer than
//!    [`MAX_LOCK_HOLDERS`](crate::limits::MAX_LOCK_HOLDERS) holders.
//! 5. Otherwise, with `wait_ms`: queued at the tail (strict FIFO, an
//!    exclusive waiter blocks every later shared request), unless the queue
//!    has [`MAX_LOCK_WAITERS`](crate::limits::MAX_LOCK_WAITERS) already
//!    ([`QueueFull`](crate::CommandError::QueueFull)). Without `wait_ms`:
//!    [`Busy`](crate::CommandError::Busy), with the oldest holder, the
//!    counts, and whether the lock is in lock-delay.
//!
//! `wait_ms`, `lease_ms` and `lock_delay_ms` must be within their bounds in
//! [`crate::limits`] when given; "none" is `None`, never 0
//! ([`DurationOutOfRange`](crate::CommandError::DurationOutOfRange)). A
//! lease starts at the grant, not at the acquire.
//!
//! ## Fencing tokens
//!
//! - Every new grant, shared or exclusive, takes the next token of one
//!   cluster-wide counter. Tokens therefore strictly increase in grant
//!   order, over exclusive grants in particular, are never 0 and never
//!   reused; and each shared holder has its own token, so a shared sequencer
//!   names exactly one grant. A token is a `u64`; running out is
//!   [`CounterExhausted`](crate::CommandError::CounterExhausted).
//!
//! ## Release
//!
//! - By (session, owner) with the token of its grant: the hold count goes
//!   down; at 0 the grant ends and the queue moves on in the same entry.
//!   No lock-delay: a voluntary release is not a failure.
//! - If (session, owner) does not hold the lock (never did, released, lost
//!   it to a lease or still waiting):
//!   [`NotHolder`](crate::CommandError::NotHolder). If it holds it under a
//!   different token: [`StaleToken`](crate::CommandError::StaleToken), with
//!   the current one.
//!
//! ## The queue moves on
//!
//! - Whenever a lock loses a holder or a waiter or its lock-delay ends, the
//!   head of its queue is granted while it is compatible: one exclusive
//!   waiter, or the run of shared waiters at the head (up to the holder
//!   limit). Each such grant is reported as [`Event::Granted`] with
//!   `waited: true`, so the replica wakes the waiter with no polling.
//! - A multi-lock's waiter at the head is granted only with all its locks,
//!   once it heads each of their queues and each is free for it; until
//!   then it holds this queue up (strict FIFO). Granting it moves its other
//!   queues on in the same entry (`lock_table::settle`, `multi_lock.rs`).
//! - A session's end drops every hold and wait of the session from all its
//!   locks before any queue moves on, so it is never granted its own waits.
//!
//! ## Waits
//!
//! - A queued acquire answers [`LockOutcome::Queued`]; the shell cancels it
//!   after `wait_ms` with [`LockCommand::ExpireWait`] (its client may give
//!   up sooner with [`LockCommand::CancelWait`]), which removes it from
//!   the queue (and may let the waiters behind it through). A cancel that
//!   finds the acquire already granted answers
//!   [`WaitCancel::AlreadyGranted`] and never releases the grant: the client
//!   may already have been told of it; it must use or release it.
//!
//! ## Lock-delay and leases
//!
//! - A forced release (session expiry, lease expiry) that leaves the lock
//!   with no holder puts it in lock-delay if a released grant was acquired
//!   with `lock_delay_ms`: the longest such delay, guarded by the newest such
//!   token ([`Event::LockDelayStarted`]). Nothing is granted during the delay
//!   (acquires queue or get `Busy`); `EndLockDelay` with that token ends it
//!   and the queue moves on. A forced release that leaves other (shared)
//!   holders starts no delay.
//! - [`LockCommand::ExpireLockLease`] ends the whole grant (every re-entrant
//!   hold) if that token still holds and was granted with a lease.
//!
//! ## Fenced writes
//!
//! - [`LockCommand::Fenced`] applies its batch only if the sequencer is a
//!   current grant, in the same entry as the check: an exclusive sequencer
//!   must be the lock's exclusive holder, a shared one a held permit of a
//!   semaphore (name, token and session either way); else
//!   [`StaleFence`](crate::CommandError::StaleFence) with the current
//!   exclusive token if any (none for a permit), and nothing is written. A shared hold of a
//!   plain lock (a reader) fences nothing: refused as invalid. A sequencer
//!   of an ended session is stale, not an unknown session. Once the fence
//!   holds, the batch behaves exactly like [`crate::Command::Batch`]
//!   (conditions, then ops) and answers [`crate::Outcome::Batch`].
//!
//! ## Semaphores
//!
//! - An acquire with `permits: Some(n)` (shared, 1 ≤ n ≤
//!   [`MAX_LOCK_HOLDERS`](crate::limits::MAX_LOCK_HOLDERS), no lock-delay:
//!   a delay could only hold up every permit or none) takes a permit
//!   of the semaphore `name`: a shared grant like any other (own token,
//!   FIFO queue, session-bound, re-entrant for the same owner), but at most
//!   `n` grants hold the name at once.
//! - The first acquire of a name not in use sets what it is: a lock
//!   (`permits: None`) or a semaphore of `n` permits, kept in its record
//!   while it has holders, waiters or a lock-delay. Every later acquire must
//!   say the same, else
//!   [`PermitsMismatch`](crate::CommandError::PermitsMismatch). A free name
//!   keeps nothing, so the next user may pick another count.
//!
//! ## Elections
//!
//! - See `election.rs`: an election is an exclusive lock with a leader key
//!   that the core keeps in step with its holder.
//!
//! ## Multi-locks
//!
//! - See `multi_lock.rs`: [`LockCommand::AcquireAll`] grants 2 to 32 locks
//!   in one entry (one token each) or queues one waiter in every queue,
//!   holding none; [`LockCommand::ReleaseAll`] gives them back in one entry.
//!
//! ## Retries
//!
//! - Acquire and release carry a request id; each session remembers the
//!   first successful outcome of each (see `dedup.rs`): a retry returns it,
//!   with no new effect, so nothing is ever granted or released twice. A
//!   queued acquire's memory follows it: a retry after its grant returns the
//!   grant; after its cancel,
//!   [`WaitCancelled`](crate::CommandError::WaitCancelled). The same id with
//!   a different command is
//!   [`RequestIdReused`](crate::CommandError::RequestIdReused). A session
//!   remembers [`MAX_REMEMBERED_REQUESTS`](crate::limits::MAX_REMEMBERED_REQUESTS)
//!   outcomes; beyond that the lowest ids are forgotten and refused as
//!   [`RequestTooOld`](crate::CommandError::RequestTooOld).
//! - Key-value writes share this memory when they are sent retry-safe
//!   ([`crate::Command::Once`]): a retry returns the write's first outcome,
//!   its revision included, and writes nothing.
//! - Refusals are not remembered (a refused command writes nothing): a
//!   retried refused request is judged afresh, which is safe because the
//!   refusal granted nothing.
//!
//! ## Names
//!
//! - Non-empty UTF-8 of at most
//!   [`MAX_LOCK_NAME_LEN`](crate::limits::MAX_LOCK_NAME_LEN) bytes, else
//!   [`InvalidLockName`](crate::CommandError::InvalidLockName). Any
//!   characters; names are compared byte for byte and listed in byte order.
//!
//! # Example
//!
//! ```
//! use latchkey_core::lock::{LockCommand, LockMode, LockOutcome, SessionId, SessionSecret, Token};
//! use latchkey_core::{apply_with_events, Command, MemStore, Outcome, Request};
//!
//! let mut store = MemStore::default();
//! let mut run = |command| {
//!     let request = Request { now: 1, command: Command::Lock(command) };
//!     apply_with_events(&mut store, &request).unwrap()
//! };
//! // The replica draws the secret at random; the core only keeps it.
//! let secret = SessionSecret([42; 16]);
//! let (opened, _) = run(LockCommand::OpenSession {
//!     ttl_ms: 10_000,
//!     secret,
//!     name: "reports".to_string(),
//! });
//! assert_eq!(
//!     opened,
//!     Ok(Outcome::Lock(LockOutcome::SessionOpened {
//!         session: SessionId(1),
//!         ttl_ms: 10_000,
//!         secret,
//!     }))
//! );
//! let acquire = |request_id| LockCommand::Acquire {
//!     session: SessionId(1),
//!     secret,
//!     owner: 7,
//!     request_id,
//!     name: "jobs".to_string(),
//!     mode: LockMode::Exclusive,
//!     wait_ms: None,
//!     lease_ms: None,
//!     lock_delay_ms: None,
//!     value: Vec::new(),
//!     permits: None,
//! };
//! let (granted, events) = run(acquire(1));
//! let Ok(Outcome::Lock(LockOutcome::Granted { sequencer, hold_count: 1 })) = granted else {
//!     panic!("{granted:?}")
//! };
//! assert_eq!(sequencer.token, Token(1));
//! assert_eq!(sequencer.to_string(), "lk1.1.1.x.jobs");
//! assert_eq!(events.len(), 1);
//! // A retry of the same request returns the first outcome and grants nothing.
//! let (again, events) = run(acquire(1));
//! assert_eq!(again, Ok(Outcome::Lock(LockOutcome::Granted { sequencer, hold_count: 1 })));
//! assert!(events.is_empty());
//! ```

mod applied;
mod apply;
mod checkpoint;
mod command;
mod dedup;
mod election;
mod event;
mod fence;
mod force;
pub(crate) mod lock_table;
mod mode;
mod multi_lock;
mod query;
pub(crate) mod record;
mod sequencer;
mod session;
mod session_end;
mod token;

pub use checkpoint::{LeaseLeft, SessionLeft};
pub use command::{LockCommand, LockOutcome, LockQuery, Proposer, TimerKind, WaitCancel};
pub(crate) use dedup::{recall_write, remember_write, WriteDigest};
pub use election::{
    election_lock_name, election_of, is_election_key, Leader, ELECTION_PREFIX,
    MAX_ELECTION_VALUE_LEN,
};
pub use event::{Event, HoldEnd, SessionEnd, WaitEnd};
pub use mode::LockMode;
pub use query::{
    HeldLock, HolderInfo, LeaseTimer, LockCensus, LockDelayTimer, LockInfo, SessionInfo,
    SessionListing, SessionTimer, TimerState, WaitTimer,
};
pub use sequencer::{Sequencer, SequencerParseError};
pub(crate) use session::check_live;
pub use session::{ForcedReleases, SessionId, SessionSecret};
pub use token::Token;

pub(crate) use apply::apply;
pub(crate) use query::query;
