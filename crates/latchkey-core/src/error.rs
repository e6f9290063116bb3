//! Errors of the core: deterministic rejections of commands, and store failures.

use serde::{Deserialize, Serialize};

use crate::lock::{HolderInfo, SessionId, TimerKind, Token};

/// Why a command or query was refused. Deterministic: every replica refuses
/// the same entry with the same error, and nothing of it was applied.
///
/// Each variant names what the caller should do differently. New variants are
/// only ever appended, so the encoded form of existing ones never changes.
///
/// Deliberately not `#[non_exhaustive]`: `latchkey_proto::wire` maps every
/// variant to the typed wire error by an exhaustive match, so a new variant
/// cannot be added without giving it a wire form. (The client's
/// `latchkey_client::Error`, which wraps it, is non-exhaustive.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    /// The request breaks a documented limit or is malformed; fix the request,
    /// retrying it unchanged will fail again.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A sequence would pass `u64::MAX`.
    #[error("sequence {key:?} is exhausted: cannot allocate {step} more")]
    SequenceExhausted {
        /// The sequence's key (lossily decoded as UTF-8).
        key: String,
        /// The number of values the command asked to allocate.
        step: u64,
    },

    // ------------------------------------------------------------ locks
    /// This cluster never issued that session id (0, or above every id issued
    /// so far): the client is talking to the wrong cluster or has a bug.
    #[error("unknown session {session}: this cluster never issued it")]
    UnknownSession {
        /// The session id the command named.
        session: SessionId,
    },
    /// The session was issued but has ended: closed by its client or expired
    /// by the leader. Its locks were released and its waits cancelled; open a
    /// new session. (Closed and expired are not told apart: the state machine
    /// keeps nothing of an ended session.)
    #[error("session {session} has ended (closed or expired): open a new session")]
    SessionEnded {
        /// The ended session.
        session: SessionId,
    },
    /// The command acts for a live session but does not carry its secret
    /// (the one the session's open answered): only the client that opened a
    /// session may close it, keep it alive, acquire or release in it, or
    /// write fenced with its grants. Nothing was done.
    #[error(
        "session {session}: wrong session secret, only the client that opened the session may use it"
    )]
    WrongSessionSecret {
        /// The session the command named.
        session: SessionId,
    },
    /// A lock name must be non-empty UTF-8 of at most `max` bytes.
    #[error("invalid lock name: {len} bytes, it must be 1 to {max}")]
    InvalidLockName {
        /// The name's length in bytes (or the list prefix's, for
        /// [`LockQuery::Locks`](crate::lock::LockQuery::Locks)).
        len: usize,
        /// [`MAX_LOCK_NAME_LEN`](crate::limits::MAX_LOCK_NAME_LEN).
        max: usize,
    },
    /// A session TTL outside `[min, max]` milliseconds.
    #[error("session ttl {ttl_ms} ms is out of range: it must be {min} to {max} ms")]
    TtlOutOfRange {
        /// The TTL asked for, in milliseconds.
        ttl_ms: u64,
        /// [`MIN_SESSION_TTL_MS`](crate::limits::MIN_SESSION_TTL_MS).
        min: u64,
        /// [`MAX_SESSION_TTL_MS`](crate::limits::MAX_SESSION_TTL_MS).
        max: u64,
    },
    /// A wait, lock lease or lock-delay outside `[min, max]` milliseconds.
    /// "None" is spelled `None`, never 0.
    #[error("{what} {value} ms is out of range: it must be {min} to {max} ms")]
    DurationOutOfRange {
        /// Which duration of the acquire is out of range.
        what: TimerKind,
        /// The duration asked for, in milliseconds.
        value: u64,
        /// The shortest duration of that kind allowed, in milliseconds.
        min: u64,
        /// The longest duration of that kind allowed, in milliseconds.
        max: u64,
    },
    /// Release of a lock this (session, owner) does not hold: never acquired,
    /// already released, force-released (lease or session expiry), or still
    /// waiting.
    #[error("lock {name:?} is not held by this session and owner")]
    NotHolder {
        /// The lock.
        name: String,
    },
    /// This (session, owner) holds the lock, but under a newer grant than
    /// `token`: the caller is using an old guard or sequencer.
    #[error("lock {name:?}: token {token} is stale, this holder's current token is {current}")]
    StaleToken {
        /// The lock.
        name: String,
        /// The token the caller gave.
        token: Token,
        /// The token of this (session, owner)'s current grant of the lock.
        current: Token,
    },
    /// A shared holder asked for the same lock exclusively. Release the
    /// shared hold first, then acquire exclusively (and wait like anyone else).
    #[error("lock {name:?} is held shared by this owner: upgrading to exclusive is not allowed")]
    UpgradeNotAllowed {
        /// The lock.
        name: String,
    },
    /// An exclusive holder asked for the same lock shared. Use the exclusive
    /// hold, or release it first.
    #[error("lock {name:?} is held exclusively by this owner: acquiring it shared is not allowed")]
    DowngradeNotAllowed {
        /// The lock.
        name: String,
    },
    /// A try-once acquire found the lock unavailable: held incompatibly, other
    /// requests already queued (no overtaking), or in lock-delay. `holder` is
    /// the oldest current holder, `holders` and `waiters` the counts.
    #[error("lock {name:?} is busy: {}", busy_detail(.holder, *.holders, *.waiters, *.lock_delay))]
    Busy {
        /// The lock.
        name: String,
        /// The oldest current holder; `None` while nobody holds it (in
        /// lock-delay).
        holder: Option<HolderInfo>,
        /// How many grants hold the lock now.
        holders: u32,
        /// How many acquires wait in the lock's queue.
        waiters: u32,
        /// Whether the lock is in lock-delay.
        lock_delay: bool,
    },
    /// This (session, owner) is already waiting for the lock under
    /// `request_id`; one owner waits for one grant at a time. Cancel that
    /// wait or keep waiting for it.
    #[error("this owner is already waiting for lock {name:?} (request {request_id})")]
    AlreadyWaiting {
        /// The lock.
        name: String,
        /// The request id of the acquire already queued.
        request_id: u64,
    },
    /// The lock's wait queue is full. Retry later or without waiting.
    #[error("lock {name:?} has {max} waiters already, the limit")]
    QueueFull {
        /// The lock.
        name: String,
        /// [`MAX_LOCK_WAITERS`](crate::limits::MAX_LOCK_WAITERS).
        max: u32,
    },
    /// A fenced write whose sequencer is not the lock's current exclusive
    /// holder (`current` is the holder's token, if the lock is held
    /// exclusively). Nothing was written: the caller has lost the lock.
    #[error("stale fence on lock {name:?}: token {token} is not the current exclusive holder{}", current_detail(.current))]
    StaleFence {
        /// The sequencer's lock.
        name: String,
        /// The sequencer's token.
        token: Token,
        /// The token of the lock's current exclusive holder; `None` if the
        /// lock is not held exclusively.
        current: Option<Token>,
    },
    /// The session no longer remembers requests this old (it remembers
    /// [`crate::limits::MAX_REMEMBERED_REQUESTS`]); ids below `oldest` cannot
    /// be answered. The client must number requests increasingly and keep
    /// fewer than that many in flight.
    #[error(
        "request {request_id} is too old: this session remembers request ids from {oldest} on"
    )]
    RequestTooOld {
        /// The refused request id.
        request_id: u64,
        /// The lowest request id the session can still answer.
        oldest: u64,
    },
    /// The session already used this request id for a different request.
    #[error("request id {request_id} was already used for a different request in this session")]
    RequestIdReused {
        /// The reused request id.
        request_id: u64,
    },
    /// The wait of this acquire (this request id) was cancelled (timed out)
    /// before a grant: the lock was not acquired. Acquire again with a new
    /// request id.
    #[error("the wait of request {request_id} for lock {name:?} was cancelled: not acquired")]
    WaitCancelled {
        /// The lock the acquire waited for.
        name: String,
        /// The request id of the cancelled acquire.
        request_id: u64,
    },
    /// A counter of the lock service (fencing tokens, session ids, a hold
    /// count) would pass `u64::MAX`.
    #[error("{counter} is exhausted")]
    CounterExhausted {
        /// Which counter, in words (e.g. "fencing tokens").
        counter: String,
    },
    /// Access control is enabled and the caller's roles do not grant what
    /// the command or read needs (see [`crate::auth`]).
    #[error("permission denied: user {user:?} has no {permission} permission on {on}")]
    PermissionDenied {
        /// The caller.
        user: String,
        /// The permission it lacks.
        permission: crate::auth::Permission,
        /// What it was needed on (a key, a range, a lock, a session).
        on: String,
    },
    /// The cluster has [`MAX_LIVE_SESSIONS`](crate::limits::MAX_LIVE_SESSIONS)
    /// live sessions already: no session was opened. Close sessions that
    /// are no longer needed (or let them expire), then open again.
    #[error(
        "the cluster has {max} live sessions, the limit: close sessions that are no longer \
         needed (or let them expire) and open again"
    )]
    TooManySessions {
        /// [`MAX_LIVE_SESSIONS`](crate::limits::MAX_LIVE_SESSIONS).
        max: u64,
    },
    /// Access control is enabled and the command or read named no user.
    #[error(
        "access control is enabled: name a user (the latchkey-user and latchkey-password \
         metadata; --user for the CLI, ClientOptions::with_user)"
    )]
    AuthRequired,

    // ------------------------------------------------------------ appended
    // (KV errors added after the lock errors: variants are only appended)
    /// A revision test (in a compare-and-put or a condition) named a key
    /// that does not exist: an absent key has no revisions. Nothing was
    /// written. Test absence with `Test::Exists(false)` or
    /// `Test::ValueIs(None)`.
    #[error(
        "key {key:?} does not exist: a revision test needs the key; test its existence instead"
    )]
    KeyAbsent {
        /// The key (lossily decoded as UTF-8).
        key: String,
    },
    /// A put bound to `session` would bind more than
    /// [`MAX_KEYS_PER_SESSION`](crate::limits::MAX_KEYS_PER_SESSION) keys to
    /// it. Nothing was written. Delete keys the session no longer needs,
    /// or spread them over more sessions.
    #[error(
        "session {session} already has {max} keys bound to it, the limit: delete keys it no \
         longer needs or bind them to another session"
    )]
    TooManySessionKeys {
        /// The session.
        session: SessionId,
        /// [`MAX_KEYS_PER_SESSION`](crate::limits::MAX_KEYS_PER_SESSION).
        max: u64,
    },
    /// A semaphore's permit count is fixed while it is in use: this acquire
    /// asked for `asked` permits (`None`: as a plain lock) of a lock in use
    /// with `permits` (`None`: as a plain lock). Use the same count as every
    /// other user of the name.
    #[error("lock {name:?}: {}", permits_detail(*.permits, *.asked))]
    PermitsMismatch {
        /// The lock.
        name: String,
        /// What it is in use as: a semaphore of so many permits, or a lock.
        permits: Option<u32>,
        /// What the refused acquire asked for.
        asked: Option<u32>,
    },
}

fn busy_detail(
    holder: &Option<HolderInfo>,
    holders: u32,
    waiters: u32,
    lock_delay: bool,
) -> String {
    let mut out = match holder {
        Some(h) => format!(
            "held {} by session {} owner {} (token {})",
            h.mode, h.session, h.owner, h.token
        ),
        None => "not held".to_string(),
    };
    if holders > 1 {
        out.push_str(&format!(" and {} more holders", holders - 1));
    }
    if lock_delay {
        out.push_str(", in lock-delay");
    }
    if waiters > 0 {
        out.push_str(&format!(", {waiters} waiting"));
    }
    out
}

fn current_detail(current: &Option<Token>) -> String {
    match current {
        Some(t) => format!(" (current token {t})"),
        None => String::new(),
    }
}

impl CommandError {
    /// Shorthand for [`CommandError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        CommandError::InvalidArgument(msg.into())
    }
}

/// The backing store failed (I/O, corruption). Not deterministic: the replica
/// must stop applying rather than diverge, so the shell treats it as fatal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store failure: {0}")]
pub struct StoreError(pub String);

/// The detail of [`CommandError::PermitsMismatch`].
fn permits_detail(permits: Option<u32>, asked: Option<u32>) -> String {
    match (permits, asked) {
        (Some(p), Some(a)) => {
            format!("it is in use as a semaphore of {p} permits, this acquire asked for {a}")
        }
        (Some(p), None) => format!(
            "it is in use as a semaphore of {p} permits: take a permit (with the same count), \
             not the lock"
        ),
        (None, _) => "it is in use as a lock, not as a semaphore".to_string(),
    }
}
