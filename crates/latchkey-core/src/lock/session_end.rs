//! Ending a session (close, expiry or an operator's end): every hold ends,
//! every wait is cancelled, the keys bound to it are deleted and the
//! session is forgotten, in one entry. The rules are the session's (see
//! `session.rs`); this file is apart because it drives the lock table,
//! which itself reads sessions: it imports `session` and `lock_table`,
//! and neither imports it.

use super::applied::Applied;
use super::event::{Event, SessionEnd};
use super::session::{live_sessions, load_live, SessionId};
use super::{dedup, lock_table, record, LockOutcome};
use crate::keyspace::{self, META_LIVE_SESSIONS};
use crate::Store;

/// Close or expire `session`: every hold ends (with lock-delay on expiry
/// only), every wait is cancelled, and the session is forgotten.
pub(crate) fn end<S: Store>(
    store: &mut S,
    session: SessionId,
    how: SessionEnd,
    change: &mut crate::data::Change,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let record = load_live(store, session)?;
    // Counted while this session's record still exists.
    let live = live_sessions(store)?;
    let prefix = keyspace::session_locks_prefix(session.0);
    let mut released = 0u32;
    let mut cancelled = 0u32;
    let mut names = Vec::new();
    for (key, _) in record::scan_prefix(store, &prefix)? {
        let name = key
            .get(prefix.len()..)
            .and_then(|n| std::str::from_utf8(n).ok())
            .ok_or_else(|| record::corrupt(&key, "lock name is not UTF-8"))?
            .to_string();
        names.push(name);
    }
    // Every hold and wait of the session goes first, and only then do the
    // queues move on: moving one on can grant a multi-lock and so move
    // another lock's queue, whose head may be a wait of this session that
    // must not be granted.
    let mut locks = lock_table::Locks::default();
    for name in &names {
        let (r, c) =
            lock_table::drop_session(store, &mut locks, name, session, how, record.ttl_ms, events)?;
        released = released.saturating_add(r);
        cancelled = cancelled.saturating_add(c);
    }
    for name in &names {
        lock_table::settle(store, &mut locks, name, events)?;
    }
    locks.save(store, events)?;
    // The keys bound to the session go in this same command, at one
    // revision: watchers see them deleted together.
    change.delete_session_keys(store, session.0)?;
    dedup::forget_all(store, session)?;
    crate::auth::forget_owner(store, session)?;
    store.delete(&keyspace::session_key(session.0))?;
    store.put(META_LIVE_SESSIONS, &live.saturating_sub(1).to_be_bytes())?;
    events.push(Event::SessionEnded { session, how });
    Ok(LockOutcome::SessionEnded {
        session,
        released,
        cancelled,
    })
}
