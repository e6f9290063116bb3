//! Multi-locks: [`LockCommand::AcquireAll`] takes several locks in one
//! entry or none, and [`LockCommand::ReleaseAll`] gives them back in one.
//!
//! Rules (see also the [module docs](crate::lock)):
//!
//! - Granted at once only if every lock could be granted at once to a
//!   single acquire (nobody queued, no lock-delay, compatible). Then each
//!   lock gets its own grant and token, in the order asked, in this entry.
//! - Otherwise, if it may wait, one waiter joins the back of every lock's
//!   queue in this entry, and holds nothing while it waits. It is granted
//!   (every lock at once, one entry) when it heads every queue and every
//!   lock is free for it. A waiter at the head of one queue that is not yet
//!   grantable elsewhere holds that queue up: no later acquire overtakes
//!   it, single or multi, even while that lock is free. This is strict
//!   FIFO per lock, so a multi-lock never starves behind a stream of single
//!   acquires, and no multi-lock waits on another forever (see
//!   `lock_table::settle`). The price: a party that holds one of a
//!   multi-lock's locks and waits for another of them, held up by it, waits
//!   in a cycle with it until one of them gives up (nested locking over the
//!   same locks; documented for users). Letting such a request pass a
//!   multi-lock that is free on this lock but blocked elsewhere would break
//!   the cycle; that is the next design step.
//! - Its wait is reported (queued, cancelled, timed out) under its first
//!   lock; cancelling it under any of its locks withdraws it from all.
//! - Locks only, exclusive or all shared: no elections (a campaign carries
//!   a value), no semaphores (a lock of the set in use as a semaphore is
//!   refused with [`CommandError::PermitsMismatch`]), and the asking party
//!   must neither hold nor wait for any of them.
//! - Each grant is an ordinary grant afterwards: a lease or a lock-delay
//!   applies to each lock on its own, a session's end releases all.

use super::applied::Applied;
use super::dedup;
use super::event::Event;
use super::lock_table::{self, LockState, Locks, NewHold, Waiter};
use super::{session, LockCommand, LockOutcome, SessionId};
use crate::limits::MAX_LOCK_WAITERS;
use crate::{CommandError, Store};

/// [`LockCommand::AcquireAll`], validated already.
pub(crate) fn acquire_all<S: Store>(
    store: &mut S,
    command: &LockCommand,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let LockCommand::AcquireAll {
        session,
        secret: _,
        owner,
        request_id,
        names,
        mode,
        wait_ms,
        lease_ms,
        lock_delay_ms,
    } = command
    else {
        return Err(CommandError::invalid("not a multi-lock acquire").into());
    };
    let (session, owner, request_id, mode) = (*session, *owner, *request_id, *mode);
    let session_rec = session::load_live(store, session)?;
    if let Some(first) = dedup::recall(store, session, &session_rec, request_id, command)? {
        return Ok(first);
    }
    let mut locks = Locks::default();
    let mut free_for_it = true;
    let mut first_busy: Option<CommandError> = None;
    for name in names {
        let lock = locks.get(store, name)?;
        check_takeable(lock, session, owner)?;
        if !(lock.rec.queue.is_empty() && lock.rec.compatible(mode)) {
            free_for_it = false;
            first_busy.get_or_insert_with(|| lock_table::busy(lock));
        }
    }
    let hold = || NewHold {
        session,
        owner,
        request_id,
        mode,
        lease_ms: *lease_ms,
        lock_delay_ms: *lock_delay_ms,
        value: Vec::new(),
    };
    let outcome = if free_for_it {
        let mut sequencers = Vec::with_capacity(names.len());
        for name in names {
            let lock = locks.get(store, name)?;
            sequencers.push(lock_table::grant(store, lock, hold(), false, events)?);
        }
        LockOutcome::GrantedAll { sequencers }
    } else if let Some(wait_ms) = *wait_ms {
        let mut position = 0u32;
        for name in names {
            let lock = locks.get(store, name)?;
            if lock.rec.queue.len() >= MAX_LOCK_WAITERS {
                return Err(CommandError::QueueFull {
                    name: name.clone(),
                    max: u32::try_from(MAX_LOCK_WAITERS).unwrap_or(u32::MAX),
                }
                .into());
            }
            position = position.max(u32::try_from(lock.rec.queue.len()).unwrap_or(u32::MAX));
            lock.rec.queue.push(Waiter {
                session,
                owner,
                request_id,
                mode,
                wait_ms,
                lease_ms: *lease_ms,
                lock_delay_ms: *lock_delay_ms,
                value: Vec::new(),
                group: names.clone(),
            });
        }
        let first = names.first().cloned().unwrap_or_default();
        events.push(Event::Queued {
            session,
            owner,
            request_id,
            name: first.clone(),
            mode,
            wait_ms,
        });
        LockOutcome::Queued {
            name: first,
            request_id,
            position,
        }
    } else {
        return Err(first_busy
            .unwrap_or_else(|| CommandError::invalid("a multi-lock of no locks"))
            .into());
    };
    dedup::remember(store, session, session_rec, request_id, command, &outcome)?;
    locks.save(store, events)?;
    Ok(outcome)
}

/// Refuse a lock of a multi-lock that is a semaphore, or that the party
/// already holds or waits for.
fn check_takeable(lock: &LockState, session: SessionId, owner: u64) -> Result<(), CommandError> {
    let name = &lock.name;
    if let Some(permits) = lock.rec.permits {
        return Err(CommandError::PermitsMismatch {
            name: name.clone(),
            permits: Some(permits),
            asked: None,
        });
    }
    if lock
        .rec
        .holders
        .iter()
        .any(|h| h.session == session && h.owner == owner)
    {
        return Err(CommandError::invalid(format!(
            "this owner already holds {name:?}: a multi-lock takes only locks its owner does \
             not hold (take them with a new owner)"
        )));
    }
    if let Some(w) = lock
        .rec
        .queue
        .iter()
        .find(|w| w.session == session && w.owner == owner)
    {
        return Err(CommandError::AlreadyWaiting {
            name: name.clone(),
            request_id: w.request_id,
        });
    }
    Ok(())
}

/// [`LockCommand::ReleaseAll`], validated already: each listed grant that
/// still holds its lock ends, in one entry, whatever its count of holds (a
/// raw client may have re-entered one with a single acquire: that hold
/// ends with it, so `released` never names a lock still held); the grants
/// that no longer hold (their lease ran out, an operator released them)
/// are reported, never refused, so that a set is always given back whole.
pub(crate) fn release_all<S: Store>(
    store: &mut S,
    command: &LockCommand,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let LockCommand::ReleaseAll {
        session,
        secret: _,
        owner,
        request_id,
        grants,
    } = command
    else {
        return Err(CommandError::invalid("not a multi-lock release").into());
    };
    let (session, owner, request_id) = (*session, *owner, *request_id);
    let session_rec = session::load_live(store, session)?;
    if let Some(first) = dedup::recall(store, session, &session_rec, request_id, command)? {
        return Ok(first);
    }
    let mut locks = Locks::default();
    let (mut released, mut gone) = (Vec::new(), Vec::new());
    for (name, token) in grants {
        let lock = locks.get(store, name)?;
        match lock_table::end_grant(lock, session, owner, *token, events) {
            Ok(()) => released.push(name.clone()),
            Err(CommandError::NotHolder { .. } | CommandError::StaleToken { .. }) => {
                gone.push(name.clone())
            }
            Err(e) => return Err(e.into()),
        }
    }
    for (name, _) in grants {
        lock_table::settle(store, &mut locks, name, events)?;
    }
    let outcome = LockOutcome::ReleasedAll { released, gone };
    dedup::remember(store, session, session_rec, request_id, command, &outcome)?;
    locks.save(store, events)?;
    Ok(outcome)
}
