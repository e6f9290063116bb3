//! Fenced writes: a write applied only while its sequencer is a current
//! grant ([`Token`](crate::lock::Token) and its counter are `token.rs`).
//!
//! Rules (see also the [module docs](crate::lock)):
//!
//! - Every new grant, exclusive or shared, takes the next token from one
//!   durable counter ([`crate::keyspace::META_LAST_TOKEN`]): tokens strictly
//!   increase in grant order across the whole cluster (so in particular over
//!   exclusive grants), are never reused, never 0, and survive snapshots
//!   because the counter is ordinary state. A re-entrant acquire keeps its
//!   grant's token.
//! - A fenced write ([`crate::lock::LockCommand::Fenced`]) applies only if its
//!   sequencer is a current grant: for an exclusive sequencer, the lock's
//!   exclusive holder; for a shared one, one of the permits of a semaphore
//!   (same name, same token, same session either way). Otherwise it is
//!   refused with [`CommandError::StaleFence`] and writes nothing. A shared
//!   grant of a plain lock (a reader) fences nothing: such a write is
//!   refused as invalid. The check and the writes happen in the same log
//!   entry, so no grant can slip in between.

use super::applied::Applied;
use super::lock_table;
use super::{LockMode, Sequencer};
use crate::command::{BatchOp, Condition};
use crate::{CommandError, CommandResult, Store};

/// Refuse unless `sequencer` is the current exclusive holder of its lock,
/// or a current permit of its semaphore.
pub(crate) fn check_fence<S: Store>(store: &S, sequencer: &Sequencer) -> Applied<()> {
    let lock = lock_table::load(store, &sequencer.name)?;
    if sequencer.mode == LockMode::Shared {
        let held = lock.rec.holders.iter().any(|h| {
            h.mode == LockMode::Shared
                && h.token == sequencer.token
                && h.session == sequencer.session
        });
        return match (held, lock.rec.permits) {
            (true, Some(_)) => Ok(()),
            (true, None) => Err(CommandError::invalid(format!(
                "lock {:?} is held shared, not as a semaphore: only an exclusive grant or a \
                 semaphore permit fences writes",
                sequencer.name
            ))
            .into()),
            (false, _) => Err(CommandError::StaleFence {
                name: sequencer.name.clone(),
                token: sequencer.token,
                current: None,
            }
            .into()),
        };
    }
    let current = match lock.rec.holders.as_slice() {
        [h] if h.mode == LockMode::Exclusive => Some(h),
        _ => None,
    };
    match current {
        Some(h)
            if sequencer.mode == LockMode::Exclusive
                && h.token == sequencer.token
                && h.session == sequencer.session =>
        {
            Ok(())
        }
        _ => Err(CommandError::StaleFence {
            name: sequencer.name.clone(),
            token: sequencer.token,
            current: current.map(|h| h.token),
        }
        .into()),
    }
}

/// [`crate::lock::LockCommand::Fenced`]: the fence check, then the batch,
/// exactly as [`crate::Command::Batch`] would apply it.
pub(crate) fn fenced_write<S: Store>(
    store: &mut S,
    sequencer: &Sequencer,
    conditions: &[Condition],
    ops: &[BatchOp],
) -> Applied<CommandResult> {
    check_fence(store, sequencer)?;
    Ok(crate::kv::batch(store, conditions, ops)?)
}
