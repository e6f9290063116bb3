//! Sessions: [`SessionId`], the session record, and opening and ending a
//! session.
//!
//! Rules (see also the [module docs](crate::lock)):
//!
//! - Ids come from a durable counter ([`crate::keyspace::META_LAST_SESSION`]):
//!   the first session is 1, ids are never reused, 0 is never issued.
//! - The record keeps only what the state machine needs: the TTL (for the
//!   leader's countdown, see [`crate::lock::TimerState`]) and the bookkeeping
//!   of the session's request memory ([`crate::lock::dedup`]). Keep-alives
//!   never reach the log.
//! - An id at or below the counter without a record has ended:
//!   [`CommandError::SessionEnded`]. Any other id (0, or above the counter)
//!   is [`CommandError::UnknownSession`].
//! - Ending a session (close or expiry) visits exactly the locks in its
//!   [`crate::keyspace::SESSION_LOCKS`] index, in name order, then forgets
//!   its request memory and its record.

use serde::{Deserialize, Serialize};

use super::apply::Applied;
use super::event::{Event, SessionEnd};
use super::{dedup, lock_table, record, LockOutcome};
use crate::keyspace::{self, META_LAST_SESSION};
use crate::kv::read_counter;
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
    /// [`dedup`]). `None` in records written before this field existed: the
    /// set is then unknown and found by scanning (once, see
    /// [`dedup::remember`]).
    pub kept_below: Option<Vec<u64>>,
}

/// The record as written before `kept_below` existed. Read-only: records
/// are always written in the current form.
#[derive(Deserialize)]
struct SessionRecordV1 {
    ttl_ms: u64,
    remembered: u32,
    forgotten_below: u64,
}

impl SessionRecord {
    /// Decode a stored record, current form first, then the earlier one.
    fn decode(key: &[u8], bytes: &[u8]) -> Result<SessionRecord, StoreError> {
        match crate::codec::decode::<SessionRecord>(bytes) {
            Ok(rec) => Ok(rec),
            Err(current) => match crate::codec::decode::<SessionRecordV1>(bytes) {
                Ok(v1) => Ok(SessionRecord {
                    ttl_ms: v1.ttl_ms,
                    remembered: v1.remembered,
                    forgotten_below: v1.forgotten_below,
                    kept_below: None,
                }),
                Err(_) => Err(record::corrupt(key, current)),
            },
        }
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

/// [`crate::lock::LockCommand::OpenSession`]: the TTL was validated already.
pub(crate) fn open<S: Store>(
    store: &mut S,
    ttl_ms: u64,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let last = read_counter(store, META_LAST_SESSION)?;
    let id = last
        .checked_add(1)
        .ok_or_else(|| CommandError::CounterExhausted {
            counter: "session ids".to_string(),
        })?;
    store.put(META_LAST_SESSION, &id.to_be_bytes())?;
    let session = SessionId(id);
    save(
        store,
        session,
        &SessionRecord {
            ttl_ms,
            remembered: 0,
            forgotten_below: 0,
            kept_below: Some(Vec::new()),
        },
    )?;
    events.push(Event::SessionOpened { session, ttl_ms });
    Ok(LockOutcome::SessionOpened { session, ttl_ms })
}

/// Close or expire `session`: every hold ends (with lock-delay on expiry
/// only), every wait is cancelled, and the session is forgotten.
pub(crate) fn end<S: Store>(
    store: &mut S,
    session: SessionId,
    how: SessionEnd,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    load_live(store, session)?;
    let prefix = keyspace::session_locks_prefix(session.0);
    let mut released = 0u32;
    let mut cancelled = 0u32;
    for (key, _) in record::scan_prefix(store, &prefix)? {
        let name = key
            .get(prefix.len()..)
            .and_then(|n| std::str::from_utf8(n).ok())
            .ok_or_else(|| record::corrupt(&key, "lock name is not UTF-8"))?
            .to_string();
        let (r, c) = lock_table::drop_session(store, &name, session, how, events)?;
        released = released.saturating_add(r);
        cancelled = cancelled.saturating_add(c);
    }
    dedup::forget_all(store, session)?;
    store.delete(&keyspace::session_key(session.0))?;
    events.push(Event::SessionEnded { session, how });
    Ok(LockOutcome::SessionEnded {
        session,
        released,
        cancelled,
    })
}
