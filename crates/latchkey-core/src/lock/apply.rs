//! Applying a [`LockCommand`]: staging, dispatch, and all-or-nothing commit.

use super::applied::{Applied, ApplyError};
use super::event::{Event, SessionEnd};
use super::{
    checkpoint, election, fence, force, lock_table, multi_lock, session, session_end, LockCommand,
};
use crate::data::Change;
use crate::staged::{self, Staged};
use crate::{CommandError, CommandResult, Outcome, Store, StoreError};

/// Apply a validated lock command to `store`. Every write is staged and
/// reaches `store` only if the command succeeds, and only then are its
/// events appended to `events`.
pub(crate) fn apply<S: Store>(
    store: &mut S,
    command: &LockCommand,
    events: &mut Vec<Event>,
) -> Result<CommandResult, StoreError> {
    let mut staged = Staged::new(&*store);
    let mut new_events = Vec::new();
    match execute(&mut staged, command, &mut new_events) {
        Ok(result) => {
            let writes = staged.into_writes();
            staged::commit(store, writes)?;
            events.append(&mut new_events);
            Ok(Ok(result))
        }
        Err(ApplyError::Refused(e)) => Ok(Err(e)),
        Err(ApplyError::Store(e)) => Err(e),
    }
}

/// Run `command` on the staged `store`: its own changes, then the leader
/// keys of the elections it touched, all user-data changes at one
/// revision.
fn execute<S: Store>(
    store: &mut S,
    command: &LockCommand,
    events: &mut Vec<Event>,
) -> Applied<Outcome> {
    if let LockCommand::Fenced {
        sequencer,
        secret,
        conditions,
        ops,
    } = command
    {
        // A fenced write changes no lock; its batch counts its own revision.
        session::check_secret(store, sequencer.session, secret)?;
        return match fence::fenced_write(store, sequencer, conditions, ops)? {
            Ok(outcome) => Ok(outcome),
            Err(e) => Err(e.into()),
        };
    }
    let mut change = Change::begin(store)?;
    let first_event = events.len();
    let outcome = dispatch(store, command, &mut change, events)?;
    let proclaimed = match command {
        LockCommand::Proclaim { name, .. } => Some(name.as_str()),
        _ => None,
    };
    let touched = election::touched(&events[first_event..], proclaimed);
    election::sync(store, touched, &mut change)?;
    change.finish(store)?;
    Ok(Outcome::Lock(outcome))
}

/// The command's own changes; user-data changes go through `change`.
fn dispatch<S: Store>(
    store: &mut S,
    command: &LockCommand,
    change: &mut Change,
    events: &mut Vec<Event>,
) -> Applied<super::LockOutcome> {
    let outcome = match command {
        LockCommand::OpenSession {
            ttl_ms,
            secret,
            name,
        } => session::open(store, *ttl_ms, *secret, name, events)?,
        LockCommand::CloseSession { session, secret } => {
            session::check_secret(store, *session, secret)?;
            session_end::end(store, *session, SessionEnd::Closed, change, events)?
        }
        LockCommand::ExpireSession { session } => {
            session_end::end(store, *session, SessionEnd::Expired, change, events)?
        }
        LockCommand::EndSession { session } => {
            session_end::end(store, *session, SessionEnd::Ended, change, events)?
        }
        LockCommand::ForceRelease { name, token } => {
            force::force_release(store, name, *token, events)?
        }
        LockCommand::Acquire {
            session, secret, ..
        } => {
            session::check_secret(store, *session, secret)?;
            lock_table::acquire(store, command, events)?
        }
        LockCommand::Release {
            session, secret, ..
        } => {
            session::check_secret(store, *session, secret)?;
            lock_table::release(store, command, events)?
        }
        LockCommand::AcquireAll {
            session, secret, ..
        } => {
            session::check_secret(store, *session, secret)?;
            multi_lock::acquire_all(store, command, events)?
        }
        LockCommand::ReleaseAll {
            session, secret, ..
        } => {
            session::check_secret(store, *session, secret)?;
            multi_lock::release_all(store, command, events)?
        }
        LockCommand::CancelWait {
            session,
            secret,
            owner,
            name,
            request_id,
        } => {
            session::check_secret(store, *session, secret)?;
            lock_table::cancel_wait(store, *session, *owner, name, *request_id, events)?
        }
        LockCommand::ExpireWait {
            session,
            owner,
            name,
            request_id,
        } => lock_table::cancel_wait(store, *session, *owner, name, *request_id, events)?,
        LockCommand::ExpireLockLease { name, token } => {
            lock_table::expire_lease(store, name, *token, events)?
        }
        LockCommand::EndLockDelay { name, token } => {
            lock_table::end_lock_delay(store, name, *token, events)?
        }
        LockCommand::Proclaim {
            session,
            secret,
            owner,
            name,
            token,
            value,
        } => {
            session::check_secret(store, *session, secret)?;
            lock_table::proclaim(store, *session, *owner, name, *token, value, events)?
        }
        LockCommand::Checkpoint { sessions, leases } => {
            checkpoint::apply(store, sessions, leases, events)?
        }
        LockCommand::Fenced { .. } => {
            return Err(CommandError::invalid("a fenced write is not dispatched").into())
        }
    };
    Ok(outcome)
}
