//! Fencing: [`Token`], the cluster-wide token counter, and fenced writes.
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

use serde::{Deserialize, Serialize};

use super::apply::Applied;
use super::lock_table;
use super::{LockMode, Sequencer};
use crate::command::{BatchOp, Condition};
use crate::keyspace::META_LAST_TOKEN;
use crate::store::read_counter;
use crate::{CommandError, CommandResult, Store};

/// A fencing token: identifies one grant of a lock. Never 0; a later grant
/// always has a larger token.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Token(pub u64);

impl From<Token> for u64 {
    /// The number to hand to a storage service or a
    /// `FenceGate::admit(resource, token.into())`.
    fn from(t: Token) -> u64 {
        t.0
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Issue the next fencing token.
pub(crate) fn next_token<S: Store>(store: &mut S) -> Applied<Token> {
    let last = read_counter(store, META_LAST_TOKEN)?;
    let next = last
        .checked_add(1)
        .ok_or_else(|| CommandError::CounterExhausted {
            counter: "fencing tokens".to_string(),
        })?;
    store.put(META_LAST_TOKEN, &next.to_be_bytes())?;
    Ok(Token(next))
}

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
