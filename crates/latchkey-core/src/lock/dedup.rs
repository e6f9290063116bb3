//! Request memory: each session remembers the outcome of its acquires,
//! releases and retry-safe writes ([`crate::Command::Once`]) by request id,
//! so a retry (after a timeout or a leader change) returns the first outcome
//! instead of acting twice.
//!
//! Rules (see also the [module docs](crate::lock)):
//!
//! - Only successful outcomes are remembered. A refused request writes
//!   nothing (not even its memory), so its retry is judged afresh; that can
//!   never act twice because the refusal did nothing.
//! - A retry must carry the very same command; the same request id with a
//!   different command is [`CommandError::RequestIdReused`]. A write is
//!   remembered by the SHA-256 of its encoding, not whole: a write can carry
//!   megabytes, and the memory holds hundreds of requests per session.
//! - A queued acquire's memory follows it: once granted, a retry returns the
//!   grant ([`LockOutcome::Granted`], hold count 1; a multi-lock's
//!   [`LockOutcome::GrantedAll`]); once cancelled, a retry
//!   is refused with [`CommandError::WaitCancelled`].
//! - Each session remembers at most
//!   [`crate::limits::MAX_REMEMBERED_REQUESTS`]
//!   outcomes, lock requests and writes together (one numbering). Remembering
//!   one more forgets the one with the lowest request id, and every id up to
//!   the forgotten one is refused from then on with
//!   [`CommandError::RequestTooOld`] (it may or may not have been applied).
//!   Clients number requests increasingly per session. A queued acquire is
//!   never forgotten while it waits (its memory is how a retry or a cancel
//!   finds its grant); a session with more live waits than the bound
//!   remembers more.
//! - The memory ends with the session.

use serde::{Deserialize, Serialize};

use super::applied::Applied;
use super::session::{self, SessionRecord};
use super::{record, LockCommand, LockOutcome, SessionId};
use crate::command::{Command, Outcome};
use crate::keyspace;
use crate::limits::MAX_REMEMBERED_REQUESTS;

use crate::{CommandError, Store, StoreError};
use std::ops::Bound;

/// Request records read per round while looking for the one to forget.
const EVICT_SCAN_CHUNK: usize = 8;

/// One remembered request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestRecord {
    /// What was asked, enough to tell a retry from another request.
    pub request: Asked,
    /// What a retry gets.
    pub answer: Answer,
}

/// What a remembered request asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Asked {
    /// An acquire or a release, exactly as first applied.
    Lock(LockCommand),
    /// A retry-safe write: the digest of its command ([`WriteDigest`]).
    Write([u8; 32]),
}

/// What a retry of a remembered request gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Answer {
    /// This outcome, again.
    Outcome(LockOutcome),
    /// [`CommandError::WaitCancelled`]: the queued acquire was cancelled.
    WaitCancelled,
    /// A write's outcome, again.
    Written(Outcome),
}

/// The SHA-256 of a write's encoding: how a retry-safe write is told from
/// another write under the same request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteDigest([u8; 32]);

impl WriteDigest {
    /// The digest of `command`. Refused (on every replica alike) only if
    /// the command cannot be encoded, which a decoded command always can.
    pub(crate) fn of(command: &Command) -> Result<WriteDigest, CommandError> {
        crate::codec::digest(command)
            .map(WriteDigest)
            .map_err(|e| CommandError::invalid(format!("cannot encode the write: {e}")))
    }
}

/// The remembered record of `request_id`, if any.
pub(crate) fn lookup<S: Store>(
    store: &S,
    session: SessionId,
    request_id: u64,
) -> Result<Option<RequestRecord>, StoreError> {
    record::load(store, &keyspace::request_key(session.0, request_id))
}

/// The remembered answer to `request_id` if it is `asked` again; `None`
/// if the id is new; refused if the id was used for another request or is
/// forgotten.
fn recall_answer<S: Store>(
    store: &S,
    session: SessionId,
    rec: &SessionRecord,
    request_id: u64,
    asked: Asking<'_>,
) -> Applied<Option<Answer>> {
    match lookup(store, session, request_id)? {
        Some(first) if !asked.is(&first.request) => {
            Err(CommandError::RequestIdReused { request_id }.into())
        }
        Some(first) => Ok(Some(first.answer)),
        None if request_id < rec.forgotten_below => Err(CommandError::RequestTooOld {
            request_id,
            oldest: rec.forgotten_below,
        }
        .into()),
        None => Ok(None),
    }
}

/// A request as it arrives, to compare with what was remembered.
#[derive(Clone, Copy)]
enum Asking<'a> {
    Lock(&'a LockCommand),
    Write(WriteDigest),
}

impl Asking<'_> {
    fn is(self, first: &Asked) -> bool {
        match (self, first) {
            (Asking::Lock(now), Asked::Lock(then)) => now == then,
            (Asking::Write(now), Asked::Write(then)) => now.0 == *then,
            _ => false,
        }
    }

    fn to_owned(self) -> Asked {
        match self {
            Asking::Lock(command) => Asked::Lock(command.clone()),
            Asking::Write(digest) => Asked::Write(digest.0),
        }
    }
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
    match recall_answer(store, session, rec, request_id, Asking::Lock(request))? {
        None => Ok(None),
        Some(Answer::Outcome(outcome)) => Ok(Some(outcome)),
        Some(Answer::WaitCancelled) => {
            let name = match request {
                LockCommand::Acquire { name, .. } => name.clone(),
                LockCommand::AcquireAll { names, .. } => names.first().cloned().unwrap_or_default(),
                _ => String::new(),
            };
            Err(CommandError::WaitCancelled { name, request_id }.into())
        }
        // A lock request's memory never holds a write's answer.
        Some(Answer::Written(_)) => Err(CommandError::RequestIdReused { request_id }.into()),
    }
}

/// The first outcome of the retry-safe write `digest` of live `session` if
/// it was applied before; `None` if it is new; refused if the session is
/// not live, or the id was used for another request or is forgotten.
pub(crate) fn recall_write<S: Store>(
    store: &S,
    session: SessionId,
    request_id: u64,
    digest: WriteDigest,
) -> Result<Result<Option<Outcome>, CommandError>, StoreError> {
    let recalled = session::load_live(store, session)
        .and_then(|rec| recall_answer(store, session, &rec, request_id, Asking::Write(digest)));
    match recalled {
        Ok(None) => Ok(Ok(None)),
        Ok(Some(Answer::Written(outcome))) => Ok(Ok(Some(outcome))),
        // A write's memory never holds a lock answer.
        Ok(Some(Answer::Outcome(_) | Answer::WaitCancelled)) => {
            Ok(Err(CommandError::RequestIdReused { request_id }))
        }
        Err(super::applied::ApplyError::Refused(e)) => Ok(Err(e)),
        Err(super::applied::ApplyError::Store(e)) => Err(e),
    }
}

/// Remember the first outcome of a new lock request. See [`remember_answer`].
pub(crate) fn remember<S: Store>(
    store: &mut S,
    session: SessionId,
    rec: SessionRecord,
    request_id: u64,
    request: &LockCommand,
    outcome: &LockOutcome,
) -> Result<(), StoreError> {
    let answer = Answer::Outcome(outcome.clone());
    remember_answer(
        store,
        session,
        rec,
        request_id,
        Asking::Lock(request),
        answer,
    )
}

/// Remember the first outcome of the new retry-safe write `digest` of live
/// `session` (checked by [`recall_write`] in the same command).
pub(crate) fn remember_write<S: Store>(
    store: &mut S,
    session: SessionId,
    request_id: u64,
    digest: WriteDigest,
    outcome: &Outcome,
) -> Result<(), StoreError> {
    let Some(rec) = session::load(store, session)? else {
        return Err(record::corrupt(
            &keyspace::session_key(session.0),
            "the session of a write being remembered is gone",
        ));
    };
    let answer = Answer::Written(outcome.clone());
    remember_answer(
        store,
        session,
        rec,
        request_id,
        Asking::Write(digest),
        answer,
    )
}

/// Remember the first answer to a new request, forgetting the oldest one
/// if the session is at its bound. Saves the session record.
fn remember_answer<S: Store>(
    store: &mut S,
    session: SessionId,
    mut rec: SessionRecord,
    request_id: u64,
    asked: Asking<'_>,
    answer: Answer,
) -> Result<(), StoreError> {
    if rec.remembered >= MAX_REMEMBERED_REQUESTS {
        forget_oldest(store, session, &mut rec)?;
    }
    record::save(
        store,
        &keyspace::request_key(session.0, request_id),
        &RequestRecord {
            request: asked.to_owned(),
            answer,
        },
    )?;
    rec.remembered += 1;
    session::save(store, session, &rec)
}

fn is_queued(first: &RequestRecord) -> bool {
    matches!(first.answer, Answer::Outcome(LockOutcome::Queued { .. }))
}

/// Forget the remembered request with the lowest id that is not still
/// queued (a queued acquire's memory is how its grant is found by a retry or
/// a cancel, so it is kept until the wait ends; live waits are bounded by
/// the queues' limits). Forgets nothing if every remembered request is
/// queued.
///
/// A session at its bound pays this on every acquire and release, so it
/// must not read what was forgotten before: the records of forgotten ids are
/// deleted, and a scan from the start of the session's range would step
/// over their tombstones (RocksDB keeps them until compaction) every time.
/// Instead the session record keeps the invariant that
/// [`SessionRecord::kept_below`] lists exactly the remembered ids below
/// `forgotten_below` (new requests are never below it: [`recall`] refuses
/// them). The candidates are then, in id order: those ids, checked one by
/// one, then the records from `forgotten_below` on, read a few at a time
/// (the first is nearly always the one).
fn forget_oldest<S: Store>(
    store: &mut S,
    session: SessionId,
    rec: &mut SessionRecord,
) -> Result<(), StoreError> {
    // 1. Ids below `forgotten_below`: acquires that were queued when a later
    //    request was forgotten. The first one no longer queued goes.
    let mut i = 0;
    while let Some(&id) = rec.kept_below.get(i) {
        match lookup(store, session, id)? {
            // Not remembered any more (cannot happen while the invariant
            // holds; dropping it restores it).
            None => {
                rec.kept_below.remove(i);
            }
            Some(first) if is_queued(&first) => i += 1,
            Some(_) => {
                store.delete(&keyspace::request_key(session.0, id))?;
                rec.kept_below.remove(i);
                rec.remembered = rec.remembered.saturating_sub(1);
                return Ok(());
            }
        }
    }

    // 2. The records from `forgotten_below` on, in id order.
    let prefix = keyspace::requests_prefix(session.0);
    let upper = keyspace::prefix_end(&prefix);
    let upper = match &upper {
        Some(u) => Bound::Excluded(u.as_slice()),
        None => Bound::Unbounded,
    };
    let mut lower = keyspace::request_key(session.0, rec.forgotten_below);
    let mut lower_included = true;
    let limit = usize::try_from(rec.remembered).unwrap_or(usize::MAX);
    let mut seen = 0usize;
    let mut queued: Vec<u64> = Vec::new();
    let mut evict: Option<u64> = None;
    while evict.is_none() && seen < limit {
        let want = EVICT_SCAN_CHUNK.min(limit - seen);
        let from = if lower_included {
            Bound::Included(lower.as_slice())
        } else {
            Bound::Excluded(lower.as_slice())
        };
        let chunk = store.scan(from, upper, false, want)?;
        seen += chunk.len();
        let full = chunk.len() == want;
        for (key, value) in &chunk {
            let id = key
                .get(prefix.len()..)
                .and_then(keyspace::read_u64)
                .ok_or_else(|| record::corrupt(key, "request key has no request id"))?;
            let first: RequestRecord =
                crate::codec::decode(value).map_err(|e| record::corrupt(key, e.to_string()))?;
            if is_queued(&first) {
                queued.push(id);
            } else {
                evict = Some(id);
                break;
            }
        }
        match chunk.into_iter().last() {
            Some((last, _)) if full && evict.is_none() => {
                lower = last;
                lower_included = false;
            }
            _ => break,
        }
    }
    let Some(id) = evict else {
        return Ok(());
    };
    store.delete(&keyspace::request_key(session.0, id))?;
    rec.remembered = rec.remembered.saturating_sub(1);
    rec.forgotten_below = rec.forgotten_below.max(id.saturating_add(1));
    // The scan began at the old `forgotten_below`, so the queued ids it
    // stepped over are exactly the remembered ids that just fell below the
    // new one, and all above the ids kept already.
    rec.kept_below.extend(queued);
    Ok(())
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
