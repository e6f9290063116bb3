//! [`StateReader`]: serves reads of the applied state, concurrently with the
//! state machine applying new entries.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use latchkey_core::{CommandResult, Query, Store, StoreError};
use rocksdb::DB;

use crate::data_view::DataView;

/// The last applied log index, published after each committed apply batch.
#[derive(Debug, Default)]
pub(crate) struct AppliedIndex(AtomicU64);

impl AppliedIndex {
    /// Publish `index` as applied (after its batch is committed).
    pub(crate) fn set(&self, index: Option<u64>) {
        // 0 is "nothing applied"; index i is stored as i + 1.
        let raw = index.map_or(0, |i| i.saturating_add(1));
        self.0.store(raw, Ordering::Release);
    }

    pub(crate) fn get(&self) -> Option<u64> {
        self.0.load(Ordering::Acquire).checked_sub(1)
    }
}

/// A cheap, cloneable handle for reading the applied state machine data.
///
/// Every read sees whole apply batches only: a batch is committed in one
/// RocksDB write, and [`StateReader::query`] runs against one RocksDB
/// snapshot. It never writes: the [`Store`] write methods return an error.
#[derive(Clone)]
pub struct StateReader {
    pub(crate) db: Arc<DB>,
    pub(crate) applied: Arc<AppliedIndex>,
}

impl StateReader {
    /// Serve `q` from the applied state, through one consistent snapshot.
    ///
    /// For a linearizable read, first make sure (openraft's
    /// `ensure_linearizable`) that [`Self::last_applied_index`] has reached the
    /// read index.
    pub fn query(&self, q: &Query) -> Result<CommandResult, StoreError> {
        let snapshot = self.db.snapshot();
        let view = DataView::at(&self.db, &snapshot)?;
        latchkey_core::query(&view, q)
    }

    /// Bytes of the live SST files of every column family (the log and the
    /// state machine), as RocksDB reports them; memtables and the
    /// write-ahead log are not counted.
    pub fn disk_bytes(&self) -> u64 {
        crate::columns::ALL
            .iter()
            .filter_map(|name| self.db.cf_handle(name))
            .filter_map(|cf| {
                self.db
                    .property_int_value_cf(cf, "rocksdb.live-sst-files-size")
                    .ok()
                    .flatten()
            })
            .sum()
    }

    /// The index of the last log entry whose effects are visible to reads,
    /// or `None` if nothing was applied yet.
    pub fn last_applied_index(&self) -> Option<u64> {
        self.applied.get()
    }
}

impl std::fmt::Debug for StateReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateReader")
            .field("last_applied_index", &self.last_applied_index())
            .finish_non_exhaustive()
    }
}

/// The read side of the core's store over the latest applied data (each call
/// on its own; use [`StateReader::query`] for multi-read consistency).
impl Store for StateReader {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        DataView::live(&self.db)?.get(key)
    }

    fn put(&mut self, _key: &[u8], _value: &[u8]) -> Result<(), StoreError> {
        Err(StoreError("a StateReader is read-only".into()))
    }

    fn delete(&mut self, _key: &[u8]) -> Result<(), StoreError> {
        Err(StoreError("a StateReader is read-only".into()))
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StoreError> {
        DataView::live(&self.db)?.scan(lower, upper, reverse, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::AppliedIndex;

    #[test]
    fn applied_index_round_trips() {
        let a = AppliedIndex::default();
        assert_eq!(a.get(), None);
        a.set(Some(0));
        assert_eq!(a.get(), Some(0));
        a.set(Some(41));
        assert_eq!(a.get(), Some(41));
        a.set(None);
        assert_eq!(a.get(), None);
    }
}
