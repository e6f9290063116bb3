//! Sessions: [`SessionId`], the session record, and opening one (ending
//! one is `session_end.rs`, which sits above this file and the lock
//! table).
//!
//! Rules (see also the [module docs](crate::lock)):
//!
//! - Ids come from a durable counter ([`crate::keyspace::META_LAST_SESSION`]):
//!   the first session is 1, ids are never reused, 0 is never issued.
//! - The record keeps only what the state machine needs: the TTL (for the
//!   leader's countdown, see [`crate::lock::TimerState`]), the bookkeeping
//!   of the session's request memory ([`crate::lock::dedup`]), the name it
//!   was opened under (for operators) and the grants operators
//!   force-released ([`ForcedReleases`]). Keep-alives never reach the log.
//! - An id at or below the counter without a record has ended:
//!   [`CommandError::SessionEnded`]. Any other id (0, or above the counter)
//!   is [`CommandError::UnknownSession`].
//! - Every session has a [`SessionSecret`], drawn by the replica that
//!   proposes [`crate::lock::LockCommand::OpenSession`] and answered to the
//!   client that opened it. Every client command that acts for a live
//!   session (close, acquire, release, cancel a wait, fenced write) carries
//!   it, and one with another secret is refused with
//!   [`CommandError::WrongSessionSecret`] before any other state is read or
//!   changed (only the stateless checks of [`crate::validate_command`] come
//!   first).
//!   The id alone (small, counting up, visible in sequencers and lock lists)
//!   therefore lets nobody end, keep alive or release another client's
//!   session. A command naming a session that is not live is refused as
//!   before ([`CommandError::UnknownSession`], [`CommandError::SessionEnded`],
//!   or "not current" for a fence), whatever secret it carries.
//! - At most [`MAX_LIVE_SESSIONS`] sessions are live at once; an
//!   `OpenSession` beyond that is refused with
//!   [`CommandError::TooManySessions`] and changes nothing (not even the id
//!   counter). The count is kept in [`META_LIVE_SESSIONS`], equal to the
//!   number of session records.
//! - Ending a session (close, expiry or an operator's end) visits exactly
//!   the locks in its [`crate::keyspace::SESSION_LOCKS`] index, in name order, deletes the
//!   keys bound to it ([`crate::keyspace::SESSION_KEYS`], in key order, at
//!   one new revision), then forgets its request memory and its record.

use serde::{Deserialize, Serialize};

use super::applied::{Applied, ApplyError};
use super::event::Event;
use super::{record, LockOutcome, Token};
use crate::keyspace::{self, META_LAST_SESSION, META_LIVE_SESSIONS};
use crate::limits::{MAX_FORCED_REMEMBERED, MAX_LIVE_SESSIONS};
use crate::store::read_counter;
use crate::{CommandError, Store, StoreError};

/// A session, as issued by [`crate::lock::LockCommand::OpenSession`]. Never 0.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct SessionId(pub u64);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The secret of a session: 128 random bits given to the client that opened
/// it, needed for everything done in the session's name. Drawn by the shell
/// (the core has no randomness) and carried in the log, so every replica
/// checks the same secret. `Debug` does not print it.
///
/// ```
/// use latchkey_core::lock::SessionSecret;
///
/// let secret = SessionSecret([7; 16]);
/// assert!(secret.matches(&SessionSecret([7; 16])));
/// assert!(!secret.matches(&SessionSecret([8; 16])));
/// assert_eq!(format!("{secret:?}"), "SessionSecret(..)");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionSecret(pub [u8; 16]);

impl SessionSecret {
    /// Its length in bytes.
    pub const LEN: usize = 16;

    /// Whether `other` is this secret, comparing every byte whatever the
    /// first difference (no early exit to time).
    pub fn matches(&self, other: &SessionSecret) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// The secret in `bytes`, if they are exactly [`SessionSecret::LEN`] long.
    pub fn from_slice(bytes: &[u8]) -> Option<SessionSecret> {
        <[u8; 16]>::try_from(bytes).ok().map(SessionSecret)
    }

    /// The secret as 32 lowercase hex digits, to hand it to another process
    /// (`latchkey lock` puts it in its command's environment). Hand-written:
    /// two short functions do not warrant a dependency of the pure core.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The secret written by [`SessionSecret::to_hex`] (either case), if
    /// `hex` is exactly 32 hex digits.
    ///
    /// ```
    /// use latchkey_core::lock::SessionSecret;
    ///
    /// let s = SessionSecret([0xab; 16]);
    /// assert_eq!(SessionSecret::from_hex(&s.to_hex()), Some(s));
    /// assert_eq!(SessionSecret::from_hex("ab"), None);
    /// assert_eq!(SessionSecret::from_hex(&"+f".repeat(16)), None);
    /// ```
    pub fn from_hex(hex: &str) -> Option<SessionSecret> {
        let digits = hex.as_bytes();
        if digits.len() != 2 * Self::LEN || !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let mut out = [0u8; 16];
        for (byte, pair) in out.iter_mut().zip(digits.chunks(2)) {
            let pair = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(SessionSecret(out))
    }
}

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSecret(..)")
    }
}

/// What the store keeps of a live session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    /// The TTL the session was opened with, in milliseconds.
    pub ttl_ms: u64,
    /// How many request outcomes the session remembers now.
    pub remembered: u32,
    /// Request ids below this were forgotten: a retry of one is refused.
    pub forgotten_below: u64,
    /// The ids below `forgotten_below` that are still remembered, ascending:
    /// acquires that were queued when a later request was forgotten (see
    /// [`dedup`]).
    pub kept_below: Vec<u64>,
    /// The session's secret.
    pub secret: SessionSecret,
    /// What the leader last recorded of the session's countdown
    /// ([`crate::lock::LockCommand::Checkpoint`]): `None`, the whole TTL
    /// from whenever a new leader takes over.
    pub left_ms: Option<u64>,
    /// Who opened it ([`crate::lock::LockCommand::OpenSession`]).
    pub name: String,
    /// Its grants force-released so far
    /// ([`crate::lock::LockCommand::ForceRelease`]).
    pub forced_total: u64,
    /// The tokens of the most recent of them, oldest first, at most
    /// [`MAX_FORCED_REMEMBERED`].
    pub forced: Vec<Token>,
}

impl SessionRecord {
    /// What its keep-alives report of forced releases.
    pub(crate) fn forced_releases(&self) -> ForcedReleases {
        ForcedReleases {
            total: self.forced_total,
            recent: self.forced.clone(),
        }
    }
}

/// The grants of one session that operators force-released
/// ([`crate::lock::LockCommand::ForceRelease`]), as every keep-alive and
/// session read reports them, so that the holder's client learns it lost
/// them: `total` counts them all, `recent` names the last few (at most
/// [`MAX_FORCED_REMEMBERED`], oldest first). A client that last saw
/// `seen` of them learns the tokens of the `total - seen` newest; if that
/// is more than `recent` holds, it cannot tell which grants it lost, and
/// must count every grant of the session lost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForcedReleases {
    /// How many of the session's grants were force-released, ever.
    pub total: u64,
    /// The tokens of the most recent, oldest first.
    pub recent: Vec<Token>,
}

/// Note in `session`'s record that its grant `token` was force-released.
/// A session that is gone is left alone (none of its grants can hold).
pub(crate) fn record_forced<S: Store>(
    store: &mut S,
    session: SessionId,
    token: Token,
) -> Result<(), StoreError> {
    let Some(mut rec) = load(store, session)? else {
        return Ok(());
    };
    rec.forced_total = rec.forced_total.saturating_add(1);
    rec.forced.push(token);
    if rec.forced.len() > MAX_FORCED_REMEMBERED {
        let extra = rec.forced.len() - MAX_FORCED_REMEMBERED;
        rec.forced.drain(..extra);
    }
    save(store, session, &rec)
}

impl SessionRecord {
    /// Decode a stored record.
    fn decode(key: &[u8], bytes: &[u8]) -> Result<SessionRecord, StoreError> {
        crate::codec::decode::<SessionRecord>(bytes).map_err(|e| record::corrupt(key, e))
    }
}

/// The record of a live session, or why there is none.
pub(crate) fn load_live<S: Store>(store: &S, session: SessionId) -> Applied<SessionRecord> {
    if let Some(r) = load(store, session)? {
        return Ok(r);
    }
    let last = read_counter(store, META_LAST_SESSION)?;
    if session.0 == 0 || session.0 > last {
        Err(CommandError::UnknownSession { session }.into())
    } else {
        Err(CommandError::SessionEnded { session }.into())
    }
}

/// Refuse `secret` unless it is the secret of `session`. A session that is
/// not live passes: the command's own checks then refuse it as unknown or
/// ended (or, for a fence, as not current), as they would without a secret.
pub(crate) fn check_secret<S: Store>(
    store: &S,
    session: SessionId,
    secret: &SessionSecret,
) -> Applied<()> {
    match load(store, session)? {
        Some(rec) if !rec.secret.matches(secret) => {
            Err(CommandError::WrongSessionSecret { session }.into())
        }
        _ => Ok(()),
    }
}

/// Whether `session` is live and `secret` is its secret: `Ok(Err(_))`
/// names the refusal (for a key bound to the session, see
/// [`crate::Command::PutBound`]).
pub(crate) fn check_live<S: Store>(
    store: &S,
    session: SessionId,
    secret: &SessionSecret,
) -> Result<Result<(), CommandError>, StoreError> {
    let live = check_secret(store, session, secret).and_then(|()| load_live(store, session));
    match live {
        Ok(_) => Ok(Ok(())),
        Err(ApplyError::Refused(e)) => Ok(Err(e)),
        Err(ApplyError::Store(e)) => Err(e),
    }
}

/// The record of `session`, if it is live.
pub(crate) fn load<S: Store>(
    store: &S,
    session: SessionId,
) -> Result<Option<SessionRecord>, StoreError> {
    let key = keyspace::session_key(session.0);
    match store.get(&key)? {
        None => Ok(None),
        Some(bytes) => SessionRecord::decode(&key, &bytes).map(Some),
    }
}

/// Write the record of a live session.
pub(crate) fn save<S: Store>(
    store: &mut S,
    session: SessionId,
    rec: &SessionRecord,
) -> Result<(), StoreError> {
    record::save(store, &keyspace::session_key(session.0), rec)
}

/// How many sessions are live: [`META_LIVE_SESSIONS`], or, in a state
/// written before that row existed, the number of session records (counted
/// once: the first open or end writes the row). Either way a function of
/// the state alone, so every replica gets the same number whichever build
/// applied the entries before.
pub(super) fn live_sessions<S: Store>(store: &S) -> Result<u64, StoreError> {
    if let Some(bytes) = store.get(META_LIVE_SESSIONS)? {
        return keyspace::read_u64(&bytes)
            .ok_or_else(|| record::corrupt(META_LIVE_SESSIONS, "not a u64"));
    }
    let records = record::scan_prefix(store, &[keyspace::SESSION])?;
    Ok(records.len() as u64)
}

/// [`crate::lock::LockCommand::OpenSession`]: the TTL was validated already.
pub(crate) fn open<S: Store>(
    store: &mut S,
    ttl_ms: u64,
    secret: SessionSecret,
    name: &str,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let live = live_sessions(store)?;
    if live >= MAX_LIVE_SESSIONS {
        return Err(CommandError::TooManySessions {
            max: MAX_LIVE_SESSIONS,
        }
        .into());
    }
    let last = read_counter(store, META_LAST_SESSION)?;
    let id = last
        .checked_add(1)
        .ok_or_else(|| CommandError::CounterExhausted {
            counter: "session ids".to_string(),
        })?;
    store.put(META_LAST_SESSION, &id.to_be_bytes())?;
    store.put(META_LIVE_SESSIONS, &(live + 1).to_be_bytes())?;
    let session = SessionId(id);
    save(
        store,
        session,
        &SessionRecord {
            ttl_ms,
            remembered: 0,
            forgotten_below: 0,
            kept_below: Vec::new(),
            secret,
            left_ms: None,
            name: name.to_string(),
            forced_total: 0,
            forced: Vec::new(),
        },
    )?;
    events.push(Event::SessionOpened {
        session,
        ttl_ms,
        secret,
    });
    Ok(LockOutcome::SessionOpened {
        session,
        ttl_ms,
        secret,
    })
}
