//! The answers to [`LockQuery`]: sequencer checks, lock listings, session
//! lookups and the timer state a new leader restarts its countdowns from.

use std::ops::Bound;

use serde::{Deserialize, Serialize};

use super::lock_table::{self, LockRecord};
use super::session::{self, ForcedReleases, SessionRecord};
use super::{record, LockMode, LockOutcome, LockQuery, Sequencer, SessionId, SessionSecret, Token};
use crate::keyspace::{self, LOCK, SESSION};
use crate::limits::{MAX_LOCK_LIST_LIMIT, MAX_SESSION_LISTED_LOCKS, MAX_SESSION_LIST_LIMIT};
use crate::{CommandResult, Store, StoreError};

/// One current holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    /// The session the grant belongs to.
    pub session: SessionId,
    /// The owner within that session.
    pub owner: u64,
    /// The grant's mode.
    pub mode: LockMode,
    /// The grant's fencing token.
    pub token: Token,
    /// Re-entrant holds of this grant.
    pub hold_count: u32,
    /// The grant's maximum hold time, if it has one.
    pub lease_ms: Option<u64>,
}

/// A lock in use, as [`LockQuery::Locks`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// The holders' mode; `None` while nobody holds it (in lock-delay).
    pub mode: Option<LockMode>,
    /// In grant order.
    pub holders: Vec<HolderInfo>,
    /// How many requests wait in the queue.
    pub waiters: u32,
    /// The lock-delay in force, if any.
    pub lock_delay: Option<LockDelayTimer>,
    /// A semaphore's permit count; `None` for a lock.
    pub permits: Option<u32>,
}

/// A live session, as a keep-alive or a session read answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// The session.
    pub session: SessionId,
    /// Its TTL, in milliseconds.
    pub ttl_ms: u64,
    /// Its grants operators force-released: the client must count those
    /// lost ([`LockCommand::ForceRelease`](crate::lock::LockCommand::ForceRelease)).
    pub forced: ForcedReleases,
}

/// A live session, as [`LockQuery::Sessions`](crate::lock::LockQuery::Sessions)
/// lists it for operators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionListing {
    /// The session.
    pub session: SessionId,
    /// The name its opener gave.
    pub name: String,
    /// Its TTL, in milliseconds.
    pub ttl_ms: u64,
    /// The grants it holds, in lock name order, at most
    /// [`MAX_SESSION_LISTED_LOCKS`] (with `waits`); `holds` counts them all.
    pub held: Vec<HeldLock>,
    /// How many grants it holds.
    pub holds: u32,
    /// The locks it waits for, in name order, at most
    /// [`MAX_SESSION_LISTED_LOCKS`] (with `held`); `waits` counts them all
    /// (a multi-lock's wait is counted in each of its locks).
    pub waiting: Vec<String>,
    /// How many waits it has queued.
    pub waits: u32,
    /// How many keys are bound to it (deleted when it ends).
    pub keys: u64,
    /// How many of its grants operators force-released.
    pub forced: u64,
    /// How long it has left before it expires, in milliseconds: never set
    /// by the core (it has no clock); the replica that answers sets it from
    /// its countdowns if it leads and has resumed them (a new leader does
    /// once it has read the state after its election: a quorum round and
    /// the apply of what was committed before; until then, `None`).
    pub left_ms: Option<u64>,
}

/// One grant a listed session holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLock {
    /// The lock (an election's lock for a leadership, see
    /// [`election_of`](crate::lock::election_of)).
    pub name: String,
    /// The owner within the session.
    pub owner: u64,
    /// The grant's mode.
    pub mode: LockMode,
    /// The grant's fencing token.
    pub token: Token,
    /// The semaphore's permit count if the lock is a semaphore.
    pub permits: Option<u32>,
}

/// Everything a newly elected leader needs to restart every countdown:
/// sessions and leases from what the last leader recorded of them
/// ([`LockCommand::Checkpoint`](crate::lock::LockCommand::Checkpoint)),
/// lock-delays and waits at full length. Every list is in a deterministic
/// order: sessions by id, the rest by lock name, then grant or queue order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerState {
    /// Every live session: expire it after `ttl_ms` without a keep-alive.
    pub sessions: Vec<SessionTimer>,
    /// Every grant with a lease: propose `ExpireLockLease` after `lease_ms`.
    pub leases: Vec<LeaseTimer>,
    /// Every lock in lock-delay: propose `EndLockDelay` after `delay_ms`.
    pub lock_delays: Vec<LockDelayTimer>,
    /// Every queued acquire: propose `ExpireWait` after `wait_ms`.
    pub waits: Vec<WaitTimer>,
}

/// A live session, as the leader counts it down: with its secret, which
/// keep-alives must carry. Only in [`TimerState`], which the leader reads
/// from its own state and never sends anywhere.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionTimer {
    /// The session.
    pub session: SessionId,
    /// Its TTL, in milliseconds.
    pub ttl_ms: u64,
    /// Its secret.
    pub secret: SessionSecret,
    /// What a leader last recorded of its countdown, in milliseconds;
    /// `ttl_ms` when nothing is recorded (a new leader then counts the
    /// whole TTL).
    pub left_ms: u64,
    /// Its grants operators force-released, which keep-alives report.
    pub forced: ForcedReleases,
}

impl SessionTimer {
    /// Whether a leader recorded less than the whole TTL.
    pub fn is_recorded(&self) -> bool {
        self.left_ms < self.ttl_ms
    }
}

impl std::fmt::Debug for SessionTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTimer")
            .field("session", &self.session)
            .field("ttl_ms", &self.ttl_ms)
            .field("left_ms", &self.left_ms)
            .field("forced", &self.forced)
            .finish_non_exhaustive()
    }
}

/// A grant with a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTimer {
    /// The lock.
    pub name: String,
    /// The grant, for `ExpireLockLease`.
    pub token: Token,
    /// The lease, in milliseconds.
    pub lease_ms: u64,
    /// What a leader last recorded of the lease's countdown, in
    /// milliseconds; `lease_ms` when nothing is recorded.
    pub left_ms: u64,
}

/// A lock-delay in force, guarded by `token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockDelayTimer {
    /// The lock.
    pub name: String,
    /// The delay's guard, for `EndLockDelay`.
    pub token: Token,
    /// The delay, in milliseconds.
    pub delay_ms: u64,
}

/// A queued acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitTimer {
    /// The waiting session.
    pub session: SessionId,
    /// The waiting owner.
    pub owner: u64,
    /// The lock waited for.
    pub name: String,
    /// The queued acquire, for `ExpireWait`.
    pub request_id: u64,
    /// The wait, in milliseconds.
    pub wait_ms: u64,
}

/// Serve a validated lock query.
pub(crate) fn query<S: Store>(store: &S, q: &LockQuery) -> Result<CommandResult, StoreError> {
    let outcome = match q {
        LockQuery::CheckSequencer(sequencer) => LockOutcome::SequencerCheck {
            current: is_current(store, sequencer)?,
        },
        LockQuery::Locks {
            prefix,
            start_after,
            limit,
        } => locks(store, prefix, start_after.as_deref(), *limit)?,
        LockQuery::Session { session } => {
            LockOutcome::Session(session::load(store, *session)?.map(|r| SessionInfo {
                session: *session,
                ttl_ms: r.ttl_ms,
                forced: r.forced_releases(),
            }))
        }
        LockQuery::Sessions { start_after, limit } => sessions(store, *start_after, *limit)?,
        LockQuery::TimerState => LockOutcome::Timers(timer_state(store)?),
        LockQuery::Census => LockOutcome::Census(census(store)?),
        LockQuery::SessionTimer { session } => LockOutcome::SessionTimer(
            session::load(store, *session)?.map(|r| session_timer(*session, &r)),
        ),
    };
    Ok(Ok(crate::Outcome::Lock(outcome)))
}

/// Is `sequencer` a current holder of its lock?
fn is_current<S: Store>(store: &S, sequencer: &Sequencer) -> Result<bool, StoreError> {
    let lock = lock_table::load(store, &sequencer.name)?;
    Ok(lock.rec.holders.iter().any(|h| {
        h.token == sequencer.token && h.session == sequencer.session && h.mode == sequencer.mode
    }))
}

/// The lock name in a `L` key.
fn lock_name(key: &[u8]) -> Result<String, StoreError> {
    key.get(1..)
        .and_then(|n| std::str::from_utf8(n).ok())
        .map(str::to_string)
        .ok_or_else(|| record::corrupt(key, "lock name is not UTF-8"))
}

fn decode_lock(key: &[u8], value: &[u8]) -> Result<LockRecord, StoreError> {
    crate::codec::decode(value).map_err(|e| record::corrupt(key, e))
}

fn lock_info(name: String, rec: &LockRecord) -> LockInfo {
    LockInfo {
        mode: rec.mode(),
        holders: rec.holders.iter().map(|h| h.info()).collect(),
        waiters: u32::try_from(rec.queue.len()).unwrap_or(u32::MAX),
        lock_delay: rec.delay.map(|d| LockDelayTimer {
            name: name.clone(),
            token: d.token,
            delay_ms: d.delay_ms,
        }),
        permits: rec.permits,
        name,
    }
}

fn locks<S: Store>(
    store: &S,
    prefix: &str,
    start_after: Option<&str>,
    limit: u32,
) -> Result<LockOutcome, StoreError> {
    let limit = if limit == 0 {
        MAX_LOCK_LIST_LIMIT
    } else {
        limit
    } as usize;
    let from = keyspace::lock_key(prefix);
    let after = start_after.map(keyspace::lock_key);
    let lower = match &after {
        Some(a) if *a >= from => Bound::Excluded(a.as_slice()),
        _ => Bound::Included(from.as_slice()),
    };
    // `L` + prefix always has an end: the tag byte is below 0xff.
    let upper = keyspace::prefix_end(&from).unwrap_or_else(|| vec![LOCK + 1]);
    let mut rows = store.scan(lower, Bound::Excluded(&upper), false, limit + 1)?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let mut out = Vec::with_capacity(rows.len());
    for (key, value) in rows {
        let rec = decode_lock(&key, &value)?;
        out.push(lock_info(lock_name(&key)?, &rec));
    }
    Ok(LockOutcome::Locks { locks: out, more })
}

/// What a replica's state holds, counted (see [`LockQuery::Census`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockCensus {
    /// Live sessions.
    pub sessions: u64,
    /// Locks in use: held, waited for, or in lock-delay.
    pub locks: u64,
    /// Locks with at least one holder.
    pub held: u64,
    /// Grants held (a shared lock may have several).
    pub holds: u64,
    /// Acquires waiting in a queue.
    pub waiters: u64,
    /// Locks in lock-delay.
    pub delayed: u64,
}

/// Count in chunks, holding one chunk of rows at a time.
fn census<S: Store>(store: &S) -> Result<LockCensus, StoreError> {
    let mut c = LockCensus::default();
    record::for_each_in_prefix(store, &[SESSION], |_, _| {
        c.sessions += 1;
        Ok(())
    })?;
    record::for_each_in_prefix(store, &[LOCK], |key, value| {
        let rec = decode_lock(key, value)?;
        c.locks += 1;
        c.held += u64::from(!rec.holders.is_empty());
        c.holds += rec.holders.len() as u64;
        c.waiters += rec.waits_counted(&lock_name(key)?);
        c.delayed += u64::from(rec.delay.is_some());
        Ok(())
    })?;
    Ok(c)
}

/// A live session's countdown, as the leader resumes it.
fn session_timer(session: SessionId, rec: &SessionRecord) -> SessionTimer {
    SessionTimer {
        session,
        ttl_ms: rec.ttl_ms,
        secret: rec.secret,
        left_ms: rec.left_ms.unwrap_or(rec.ttl_ms).min(rec.ttl_ms),
        forced: rec.forced_releases(),
    }
}

/// [`LockQuery::Sessions`]: live sessions after `start_after`, at most
/// `limit` (0: the maximum), each with its grants and waits read from the
/// locks in its index.
fn sessions<S: Store>(
    store: &S,
    start_after: Option<SessionId>,
    limit: u32,
) -> Result<LockOutcome, StoreError> {
    let limit = if limit == 0 {
        MAX_SESSION_LIST_LIMIT
    } else {
        limit
    } as usize;
    let lower = match start_after {
        Some(s) => Bound::Excluded(keyspace::session_key(s.0)),
        None => Bound::Included(vec![SESSION]),
    };
    let upper = [SESSION + 1];
    let lower_ref = match &lower {
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    };
    let mut rows = store.scan(lower_ref, Bound::Excluded(&upper[..]), false, limit + 1)?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let mut out = Vec::with_capacity(rows.len());
    for (key, value) in rows {
        let id = key
            .get(1..)
            .and_then(keyspace::read_u64)
            .ok_or_else(|| record::corrupt(&key, "session key has no id"))?;
        let rec: SessionRecord =
            crate::codec::decode(&value).map_err(|e| record::corrupt(&key, e))?;
        out.push(listing(store, SessionId(id), &rec)?);
    }
    Ok(LockOutcome::Sessions {
        sessions: out,
        more,
    })
}

/// One session's listing: the locks in its index, read one by one.
fn listing<S: Store>(
    store: &S,
    session: SessionId,
    rec: &SessionRecord,
) -> Result<SessionListing, StoreError> {
    let mut l = SessionListing {
        session,
        name: rec.name.clone(),
        ttl_ms: rec.ttl_ms,
        held: Vec::new(),
        holds: 0,
        waiting: Vec::new(),
        waits: 0,
        keys: 0,
        forced: rec.forced_total,
        left_ms: None,
    };
    let prefix = keyspace::session_locks_prefix(session.0);
    record::for_each_in_prefix(store, &prefix, |key, _| {
        let name = key
            .get(prefix.len()..)
            .and_then(|n| std::str::from_utf8(n).ok())
            .ok_or_else(|| record::corrupt(key, "lock name is not UTF-8"))?;
        let lock = lock_table::load(store, name)?;
        for h in lock.rec.holders.iter().filter(|h| h.session == session) {
            l.holds = l.holds.saturating_add(1);
            if l.held.len() + l.waiting.len() < MAX_SESSION_LISTED_LOCKS {
                l.held.push(HeldLock {
                    name: name.to_string(),
                    owner: h.owner,
                    mode: h.mode,
                    token: h.token,
                    permits: lock.rec.permits,
                });
            }
        }
        let waits = lock
            .rec
            .queue
            .iter()
            .filter(|w| w.session == session)
            .count();
        if waits > 0 {
            l.waits = l
                .waits
                .saturating_add(u32::try_from(waits).unwrap_or(u32::MAX));
            if l.held.len() + l.waiting.len() < MAX_SESSION_LISTED_LOCKS {
                l.waiting.push(name.to_string());
            }
        }
        Ok(())
    })?;
    record::for_each_in_prefix(store, &keyspace::session_keys_prefix(session.0), |_, _| {
        l.keys = l.keys.saturating_add(1);
        Ok(())
    })?;
    Ok(l)
}

fn timer_state<S: Store>(store: &S) -> Result<TimerState, StoreError> {
    let mut state = TimerState::default();
    for (key, value) in record::scan_prefix(store, &[SESSION])? {
        let session = key
            .get(1..)
            .and_then(keyspace::read_u64)
            .ok_or_else(|| record::corrupt(&key, "session key has no id"))?;
        let rec: SessionRecord =
            crate::codec::decode(&value).map_err(|e| record::corrupt(&key, e))?;
        state.sessions.push(session_timer(SessionId(session), &rec));
    }
    for (key, value) in record::scan_prefix(store, &[LOCK])? {
        let name = lock_name(&key)?;
        let rec = decode_lock(&key, &value)?;
        for h in &rec.holders {
            if let Some(lease_ms) = h.lease_ms {
                state.leases.push(LeaseTimer {
                    name: name.clone(),
                    token: h.token,
                    lease_ms,
                    left_ms: h.lease_left_ms.unwrap_or(lease_ms).min(lease_ms),
                });
            }
        }
        if let Some(d) = rec.delay {
            state.lock_delays.push(LockDelayTimer {
                name: name.clone(),
                token: d.token,
                delay_ms: d.delay_ms,
            });
        }
        // A multi-lock's wait is in every one of its queues but timed
        // once, under its first lock, like its `Queued` event.
        for w in rec.queue.iter().filter(|w| w.reported_name(&name) == name) {
            state.waits.push(WaitTimer {
                session: w.session,
                owner: w.owner,
                name: name.clone(),
                request_id: w.request_id,
                wait_ms: w.wait_ms,
            });
        }
    }
    Ok(state)
}
