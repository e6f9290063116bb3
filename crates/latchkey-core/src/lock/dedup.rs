//! Request memory: each session remembers the outcome of its acquires and
//! releases by request id, so a retry (after a timeout or a leader change)
//! returns the first outcome instead of acting twice.
//!
//! Rules (see also the [module docs](crate::lock)):
//!
//! - Only successful outcomes are remembered. A refused request writes
//!   nothing (not even its memory), so its retry is judged afresh; that can
//!   never grant twice because the refusal granted nothing.
//! - A retry must carry the very same command; the same request id with a
//!   different command is [`CommandError::RequestIdReused`].
//! - A queued acquire's memory follows it: once granted, a retry returns the
//!   grant ([`LockOutcome::Granted`], hold count 1); once cancelled, a retry
//!   is refused with [`CommandError::WaitCancelled`].
//! - Each session remembers at most
//!   [`crate::limits::MAX_REMEMBERED_REQUESTS`]
//!   outcomes. Remembering one more forgets the one with the lowest request
//!   id, and every id up to the forgotten one is refused from then on with
//!   [`CommandError::RequestTooOld`] (it may or may not have been applied).
//!   Clients number requests increasingly per session. A queued acquire is
//!   never forgotten while it waits (its memory is how a retry or a cancel
//!   finds its grant); a session with more live waits than the bound
//!   remembers more.
//! - The memory ends with the session.

use serde::{Deserialize, Serialize};

use super::apply::Applied;
use super::session::{self, SessionRecord};
use super::{record, LockCommand, LockOutcome, SessionId};
use crate::keyspace;
use crate::limits::MAX_REMEMBERED_REQUESTS;

/// Request records read per round while looking for the one to forget.
const EVICT_SCAN_CHUNK: usize = 8;
use crate::{CommandError, Store, StoreError};

/// One remembered request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestRecord {
    /// The command exactly as first applied.
    pub request: LockCommand,
    /// What a retry gets.
    pub answer: Answer,
}

/// What a retry of a remembered request gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Answer {
    /// This outcome, again.
    Outcome(LockOutcome),
    /// [`CommandError::WaitCancelled`]: the queued acquire was cancelled.
    WaitCancelled,
}

/// The remembered record of `request_id`, if any.
pub(crate) fn lookup<S: Store>(
    store: &S,
    session: SessionId,
    request_id: u64,
) -> Result<Option<RequestRecord>, StoreError> {
    record::load(store, &keyspace::request_key(session.0, request_id))
}

/// The first outcome of `request` if it was applied before; `None` if it is
/// new; refused if the id was used for another command or is forgotten.
pub(crate) fn recall<S: Store>(
    store: &S,
    session: SessionId,
    rec: &SessionRecord,
    request_id: u64,
    request: &LockCommand,
) -> Applied<Option<LockOutcome>> {
    match lookup(store, session, request_id)? {
        Some(first) if first.request != *request => {
            Err(CommandError::RequestIdReused { request_id }.into())
        }
        Some(first) => match first.answer {
            Answer::Outcome(outcome) => Ok(Some(outcome)),
            Answer::WaitCancelled => {
                let name = match request {
                    LockCommand::Acquire { name, .. } => name.clone(),
                    _ => String::new(),
                };
                Err(CommandError::WaitCancelled { name, request_id }.into())
            }
        },
        None if request_id < rec.forgotten_below => Err(CommandError::RequestTooOld {
            request_id,
            oldest: rec.forgotten_below,
        }
        .into()),
        None => Ok(None),
    }
}

/// Remember the first outcome of a new request, forgetting the oldest one
/// if the session is at its bound. Saves the session record.
pub(crate) fn remember<S: Store>(
    store: &mut S,
    session: SessionId,
    mut rec: SessionRecord,
    request_id: u64,
    request: &LockCommand,
    outcome: &LockOutcome,
) -> Result<(), StoreError> {
    if rec.remembered >= MAX_REMEMBERED_REQUESTS {
        let prefix = keyspace::requests_prefix(session.0);
        let upper = keyspace::prefix_end(&prefix);
        let upper = match &upper {
            Some(u) => std::ops::Bound::Excluded(u.as_slice()),
            None => std::ops::Bound::Unbounded,
        };
        // The oldest remembered request that is not still queued: a queued
        // acquire's memory is how its grant is found by a retry or a
        // cancel, so it is kept until the wait ends (live waits are bounded
        // by the queues' limits).
        // Read the candidates (the first `remembered` records, in key order)
        // a few at a time: the first is nearly always the one evicted, and a
        // session at its limit pays this on every acquire and release.
        let limit = usize::try_from(rec.remembered).unwrap_or(usize::MAX);
        let mut lower = std::ops::Bound::Included(prefix.clone());
        let mut seen = 0usize;
        let mut evict: Option<Vec<u8>> = None;
        while evict.is_none() && seen < limit {
            let want = EVICT_SCAN_CHUNK.min(limit - seen);
            let lower_ref = match &lower {
                std::ops::Bound::Included(k) => std::ops::Bound::Included(k.as_slice()),
                std::ops::Bound::Excluded(k) => std::ops::Bound::Excluded(k.as_slice()),
                std::ops::Bound::Unbounded => std::ops::Bound::Unbounded,
            };
            let chunk = store.scan(lower_ref, upper, false, want)?;
            seen += chunk.len();
            for (key, value) in &chunk {
                let first: RequestRecord =
                    crate::codec::decode(value).map_err(|e| record::corrupt(key, e.to_string()))?;
                if !matches!(first.answer, Answer::Outcome(LockOutcome::Queued { .. })) {
                    evict = Some(key.clone());
                    break;
                }
            }
            match chunk.into_iter().last() {
                Some((last, _)) if seen < limit && evict.is_none() => {
                    lower = std::ops::Bound::Excluded(last);
                }
                _ => break,
            }
        }
        if let Some(key) = evict {
            let id = key
                .get(prefix.len()..)
                .and_then(keyspace::read_u64)
                .ok_or_else(|| record::corrupt(&key, "request key has no request id"))?;
            store.delete(&key)?;
            rec.remembered -= 1;
            rec.forgotten_below = rec.forgotten_below.max(id.saturating_add(1));
        }
    }
    record::save(
        store,
        &keyspace::request_key(session.0, request_id),
        &RequestRecord {
            request: request.clone(),
            answer: Answer::Outcome(outcome.clone()),
        },
    )?;
    rec.remembered += 1;
    session::save(store, session, &rec)
}

/// Replace the answer of a remembered request (a queued acquire that was
/// granted or cancelled). Nothing happens if it was forgotten already.
pub(crate) fn update<S: Store>(
    store: &mut S,
    session: SessionId,
    request_id: u64,
    answer: Answer,
) -> Result<(), StoreError> {
    let key = keyspace::request_key(session.0, request_id);
    if let Some(mut first) = record::load::<RequestRecord, _>(store, &key)? {
        first.answer = answer;
        record::save(store, &key, &first)?;
    }
    Ok(())
}

/// Forget everything `session` remembers (it is ending).
pub(crate) fn forget_all<S: Store>(store: &mut S, session: SessionId) -> Result<(), StoreError> {
    let prefix = keyspace::requests_prefix(session.0);
    for (key, _) in record::scan_prefix(store, &prefix)? {
        store.delete(&key)?;
    }
    Ok(())
}
