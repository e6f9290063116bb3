//! An operator's forced release of a lock ([`LockCommand::ForceRelease`]):
//! the grant ends as if its lease ran out, with a lock-delay of at least
//! its session's TTL, and the holder's session records it so that its
//! client hears of it at its next keep-alive.
//!
//! Imports `lock_table` and `session`; neither imports it.

use super::applied::Applied;
use super::event::{Event, HoldEnd};
use super::lock_table::{settle, start_operator_delay, Holder, Locks};
use super::{session, LockOutcome, Token};
use crate::Store;

/// [`super::LockCommand::ForceRelease`], validated already: end the grant
/// `token` of `name` (every grant with `None`) as a forced release, note it
/// in its session's record for the holder's client to hear, and start the
/// lock-delay, at least the longest TTL of the released grants' sessions.
pub(crate) fn force_release<S: Store>(
    store: &mut S,
    name: &str,
    token: Token,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let mut locks = Locks::default();
    let lock = locks.get(store, name)?;
    let (gone, kept): (Vec<Holder>, Vec<Holder>) = std::mem::take(&mut lock.rec.holders)
        .into_iter()
        .partition(|h| h.token == token);
    lock.rec.holders = kept;
    if gone.is_empty() {
        return Ok(LockOutcome::ForceReleased {
            released: Vec::new(),
        });
    }
    let mut min_delay_ms = 0u64;
    for h in &gone {
        events.push(Event::Released {
            session: h.session,
            owner: h.owner,
            name: name.to_string(),
            token: h.token,
            why: HoldEnd::Forced,
        });
        if let Some(rec) = session::load(store, h.session)? {
            min_delay_ms = min_delay_ms.max(rec.ttl_ms);
        }
    }
    let lock = locks.get(store, name)?;
    start_operator_delay(lock, &gone, min_delay_ms, events);
    settle(store, &mut locks, name, events)?;
    locks.save(store, events)?;
    for h in &gone {
        session::record_forced(store, h.session, h.token)?;
    }
    Ok(LockOutcome::ForceReleased {
        released: gone.iter().map(Holder::info).collect(),
    })
}
