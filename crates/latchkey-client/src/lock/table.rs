//! The cluster's lock table as any client reads it, without a session:
//! [`Client::locks`] and [`Client::check_sequencer`].

use latchkey_core::limits::MAX_LOCK_LIST_LIMIT;
use latchkey_core::lock::{LockInfo, LockOutcome, LockQuery, Sequencer};
use latchkey_core::{Outcome, Query};

use crate::error::Error;
use crate::kv::{unexpected, Client, Consistency};

impl Client {
    /// Is `sequencer` still the current holder of its lock (linearizable)?
    /// A storage service can call this before accepting work, Chubby-style.
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<bool, Error> {
        match self
            .query(
                Query::Lock(LockQuery::CheckSequencer(sequencer.clone())),
                Consistency::Linearizable,
            )
            .await?
        {
            Outcome::Lock(LockOutcome::SequencerCheck { current }) => Ok(current),
            other => Err(unexpected("SequencerCheck", &other)),
        }
    }

    /// Locks in use whose names start with `prefix`, in name order: holders
    /// with their tokens, queue lengths, lock-delays. Pages through every
    /// match.
    pub async fn locks(&self, prefix: &str) -> Result<Vec<LockInfo>, Error> {
        let mut all = Vec::new();
        let mut start_after = None;
        loop {
            let outcome = self
                .query(
                    Query::Lock(LockQuery::Locks {
                        prefix: prefix.to_string(),
                        start_after: start_after.clone(),
                        limit: MAX_LOCK_LIST_LIMIT,
                    }),
                    Consistency::Linearizable,
                )
                .await?;
            let Outcome::Lock(LockOutcome::Locks { locks, more }) = outcome else {
                return Err(unexpected("Locks", &outcome));
            };
            start_after = locks.last().map(|l| l.name.clone());
            all.extend(locks);
            if !more || start_after.is_none() {
                return Ok(all);
            }
        }
    }
}
