//! Fenced writes to latchkey's own KV: applied only while a sequencer is
//! a current grant (its lock's exclusive holder, or a held permit of a
//! semaphore), atomically with that check. A
//! [`LockGuard`](crate::LockGuard) makes them for its own grant; any
//! client holding a sequencer and its session's secret can.

use latchkey_core::lock::{LockCommand, Sequencer, SessionSecret};
use latchkey_core::{Command, Outcome};

use crate::error::Error;
use crate::kv::{unexpected, Batch, Client};

impl Client {
    /// Set `key` to `value` only while `sequencer` is a current grant (the
    /// exclusive holder of its lock, or a held semaphore permit); otherwise
    /// nothing is written and the error
    /// answers [`Error::is_stale_fence`]. `secret` is the secret of the
    /// sequencer's session ([`crate::Session::secret`]): only the holder
    /// writes, not whoever read its sequencer. A [`crate::LockGuard`] does
    /// this for its own grant ([`crate::LockGuard::put`]). Returns the
    /// revision the put made.
    pub async fn put_fenced(
        &self,
        sequencer: &Sequencer,
        secret: &SessionSecret,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<u64, Error> {
        self.batch_fenced(sequencer, secret, Batch::new().put(key, value))
            .await?
            .map_err(|i| Error::Protocol(format!("condition {i} failed in a batch without one")))
    }

    /// Delete `key` only while `sequencer` is the current exclusive holder
    /// (`secret` as in [`Client::put_fenced`]). Returns the cluster's
    /// revision after it (the one it made if the key existed).
    pub async fn delete_fenced(
        &self,
        sequencer: &Sequencer,
        secret: &SessionSecret,
        key: impl AsRef<[u8]>,
    ) -> Result<u64, Error> {
        self.batch_fenced(sequencer, secret, Batch::new().delete(key))
            .await?
            .map_err(|i| Error::Protocol(format!("condition {i} failed in a batch without one")))
    }

    /// Apply `batch` only while `sequencer` is the current exclusive holder,
    /// atomically with that check. `Err(index)` of the first failed
    /// condition, or `Ok(revision)`, as [`Client::batch`]. `secret` as in
    /// [`Client::put_fenced`].
    pub async fn batch_fenced(
        &self,
        sequencer: &Sequencer,
        secret: &SessionSecret,
        batch: Batch,
    ) -> Result<Result<u64, u32>, Error> {
        let Command::Batch { conditions, ops } = batch.into_command() else {
            return Err(Error::Protocol("a batch is always a batch command".into()));
        };
        let command = Command::Lock(LockCommand::Fenced {
            sequencer: sequencer.clone(),
            secret: *secret,
            conditions,
            ops,
        });
        match self.execute(command).await? {
            Outcome::Batch {
                failed_condition,
                revision,
            } => Ok(match failed_condition {
                None => Ok(revision),
                Some(i) => Err(i),
            }),
            other => Err(unexpected("Batch", &other)),
        }
    }
}
