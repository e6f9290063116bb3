//! [`DataView`]: the read side of [`latchkey_core::Store`] over the state
//! machine's data column family, either live or pinned to a RocksDB snapshot.

use std::ops::Bound;

use latchkey_core::store::bounds_empty;
use latchkey_core::{Store, StoreError};
use rocksdb::{ColumnFamily, DBRawIteratorWithThreadMode, ReadOptions, SnapshotWithThreadMode, DB};

use crate::columns;

/// A read-only view of the committed state machine data. Writes are refused:
/// the state machine writes through an [`latchkey_core::overlay::Overlay`] and one
/// write batch.
pub(crate) struct DataView<'a> {
    db: &'a DB,
    cf: &'a ColumnFamily,
    snapshot: Option<&'a SnapshotWithThreadMode<'a, DB>>,
}

impl<'a> DataView<'a> {
    /// A view of the latest committed data.
    pub(crate) fn live(db: &'a DB) -> Result<Self, StoreError> {
        Ok(DataView {
            db,
            cf: data_cf(db)?,
            snapshot: None,
        })
    }

    /// A view of the data as of `snapshot`: every read sees the same state.
    pub(crate) fn at(
        db: &'a DB,
        snapshot: &'a SnapshotWithThreadMode<'a, DB>,
    ) -> Result<Self, StoreError> {
        Ok(DataView {
            db,
            cf: data_cf(db)?,
            snapshot: Some(snapshot),
        })
    }

    fn iterator(&self, opts: ReadOptions) -> DBRawIteratorWithThreadMode<'a, DB> {
        match self.snapshot {
            Some(s) => s.raw_iterator_cf_opt(self.cf, opts),
            None => self.db.raw_iterator_cf_opt(self.cf, opts),
        }
    }
}

fn data_cf(db: &DB) -> Result<&ColumnFamily, StoreError> {
    columns::handle(db, columns::SM_DATA).map_err(|e| StoreError(e.to_string()))
}

fn rocks(e: rocksdb::Error) -> StoreError {
    StoreError(format!("rocksdb: {e}"))
}

/// The smallest key greater than `key` in bytewise order.
fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = Vec::with_capacity(key.len() + 1);
    next.extend_from_slice(key);
    next.push(0);
    next
}

impl Store for DataView<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.snapshot {
            Some(s) => s.get_cf(self.cf, key),
            None => self.db.get_cf(self.cf, key),
        }
        .map_err(rocks)
    }

    fn put(&mut self, _key: &[u8], _value: &[u8]) -> Result<(), StoreError> {
        Err(StoreError("the state reader is read-only".into()))
    }

    fn delete(&mut self, _key: &[u8]) -> Result<(), StoreError> {
        Err(StoreError("the state reader is read-only".into()))
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StoreError> {
        if limit == 0 || bounds_empty(lower, upper) {
            return Ok(Vec::new());
        }
        // RocksDB bounds are [lower, upper); turn the others into those.
        let mut opts = ReadOptions::default();
        match lower {
            Bound::Included(k) => opts.set_iterate_lower_bound(k.to_vec()),
            Bound::Excluded(k) => opts.set_iterate_lower_bound(successor(k)),
            Bound::Unbounded => {}
        }
        match upper {
            Bound::Included(k) => opts.set_iterate_upper_bound(successor(k)),
            Bound::Excluded(k) => opts.set_iterate_upper_bound(k.to_vec()),
            Bound::Unbounded => {}
        }
        let mut it = self.iterator(opts);
        if reverse {
            it.seek_to_last();
        } else {
            it.seek_to_first();
        }
        let mut rows = Vec::new();
        while rows.len() < limit {
            let Some((k, v)) = it.item() else { break };
            rows.push((k.to_vec(), v.to_vec()));
            if reverse {
                it.prev();
            } else {
                it.next();
            }
        }
        it.status().map_err(rocks)?;
        Ok(rows)
    }
}
