//! [`AppliedState`]: the state machine's metadata records (last applied log
//! id and membership) and how they are read and written.

use latchkey_core::codec::{self, CodecError};
use rocksdb::{ColumnFamily, WriteBatch};

use crate::columns::{LAST_APPLIED, MEMBERSHIP};
use crate::types::{LogId, StoredMembership};

/// How far the state machine has applied the log, and the membership it last
/// applied. Always committed in the same write batch as the data it describes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AppliedState {
    /// The id of the last applied entry.
    pub(crate) last_applied: Option<LogId>,
    /// The last applied membership entry (or the one a snapshot carried).
    pub(crate) membership: StoredMembership,
}

/// The metadata records could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("state machine metadata: {0}")]
    Codec(#[from] CodecError),
}

impl AppliedState {
    /// Read the records through `get` (a point read on the `sm_meta` family,
    /// live or through a RocksDB snapshot). Missing records mean "nothing
    /// applied yet".
    pub(crate) fn read(
        get: impl Fn(&[u8]) -> Result<Option<Vec<u8>>, rocksdb::Error>,
    ) -> Result<Self, ReadError> {
        let last_applied = get(LAST_APPLIED)?
            .map(|b| codec::decode::<LogId>(&b))
            .transpose()?;
        let membership = get(MEMBERSHIP)?
            .map(|b| codec::decode::<StoredMembership>(&b))
            .transpose()?
            .unwrap_or_default();
        Ok(AppliedState {
            last_applied,
            membership,
        })
    }

    /// Add the writes that replace the stored records with `self` to `batch`.
    pub(crate) fn write_into(
        &self,
        batch: &mut WriteBatch,
        sm_meta: &ColumnFamily,
    ) -> Result<(), CodecError> {
        match &self.last_applied {
            Some(id) => batch.put_cf(sm_meta, LAST_APPLIED, codec::encode(id)?),
            None => batch.delete_cf(sm_meta, LAST_APPLIED),
        }
        batch.put_cf(sm_meta, MEMBERSHIP, codec::encode(&self.membership)?);
        Ok(())
    }

    /// The last applied index, if any.
    pub(crate) fn last_index(&self) -> Option<u64> {
        self.last_applied.map(|id| id.index)
    }
}
