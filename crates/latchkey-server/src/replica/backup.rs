//! A backup of the whole state, taken on the leader after a linearizable
//! barrier (see `latchkey_storage::backup`).

use latchkey_core::auth::AuthQuery;
use latchkey_core::{CommandError, Query};
use latchkey_proto::ReplicaFailure;
use latchkey_storage::backup::BackupMeta;

use crate::auth::Caller;

use super::Replica;

impl Replica {
    /// A backup of the whole state (`latchkey_storage::backup`), as of an
    /// index at or after every write acknowledged before the call: the
    /// leader only, after a linearizable read's barrier; `caller` needs the
    /// admin permission while access control is on (a backup holds every
    /// session's secret and every user's password hash).
    pub(crate) async fn backup(
        &self,
        caller: &Caller,
    ) -> Result<Result<(BackupMeta, Vec<u8>), CommandError>, ReplicaFailure> {
        if matches!(caller, Caller::Anonymous) {
            return Err(ReplicaFailure::InvalidArgument(
                "a backup holds every session's secret and every user's password hash: it needs \
                 the cluster secret (--cluster-secret-file) or, with access control on, an admin \
                 user"
                    .into(),
            ));
        }
        // One at a time: each holds a copy of the whole state in memory.
        let _one = self.backups.try_lock().map_err(|_| {
            ReplicaFailure::Unavailable(
                "another backup is being taken on this replica; try again when it is done".into(),
            )
        })?;
        if let Err(refused) = self
            .read(Query::Auth(AuthQuery::List), false, caller)
            .await?
        {
            return Ok(Err(refused));
        }
        let reader = self
            .reader
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ReplicaFailure::Unavailable("this replica has shut down".into()))?;
        tokio::task::spawn_blocking(move || reader.backup())
            .await
            .map_err(|e| ReplicaFailure::Unavailable(format!("the backup task failed: {e}")))?
            .map(Ok)
            .map_err(|e| ReplicaFailure::Unavailable(format!("cannot take a backup: {e}")))
    }
}
