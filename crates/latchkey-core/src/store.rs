//! The storage the core applies commands to: an ordered byte map.
//!
//! The core owns the layout of the keyspace (see [`crate::keyspace`]); a
//! store only has to get, put, delete and scan bytes in order. The RocksDB
//! store lives in `latchkey-storage`; [`MemStore`] serves tests.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::keyspace;
use crate::StoreError;

/// One key and its value, as a scan returns them.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// An ordered map of bytes to bytes.
///
/// Reads must see the writes made earlier through the same store, even before
/// they are persisted: the shell buffers one apply batch and commits it in one
/// atomic write.
pub trait Store {
    /// The value at `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Set `key` to `value`.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    /// Remove `key` (no error if absent).
    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError>;
    /// Up to `limit` entries with keys in `(lower, upper)`, ascending, or
    /// descending if `reverse`.
    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<KeyValue>, StoreError>;
}

/// A [`Store`] in memory, for tests and simulation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemStore {
    /// Everything stored, in key order.
    pub map: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Store for MemStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.map.get(key).cloned())
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.map.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        self.map.remove(key);
        Ok(())
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<KeyValue>, StoreError> {
        if bounds_empty(lower, upper) {
            return Ok(Vec::new());
        }
        let range = self.map.range::<[u8], _>((lower, upper));
        let pick = |(k, v): (&Vec<u8>, &Vec<u8>)| (k.clone(), v.clone());
        Ok(if reverse {
            range.rev().take(limit).map(pick).collect()
        } else {
            range.take(limit).map(pick).collect()
        })
    }
}

/// True when no key can lie between the bounds (BTreeMap panics on such ranges).
pub fn bounds_empty(lower: Bound<&[u8]>, upper: Bound<&[u8]>) -> bool {
    match (lower, upper) {
        (Bound::Included(l), Bound::Included(u)) => l > u,
        (Bound::Included(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u))
        | (Bound::Excluded(l), Bound::Excluded(u)) => l >= u,
        _ => false,
    }
}

/// A big-endian u64 cell, 0 when absent. A cell of the wrong length means
/// the store is corrupt: stop rather than restart a counter at 0.
pub(crate) fn read_counter<S: Store>(store: &S, key: &[u8]) -> Result<u64, StoreError> {
    match store.get(key)? {
        None => Ok(0),
        Some(b) => keyspace::read_u64(&b).ok_or_else(|| {
            StoreError(format!(
                "corrupt counter cell {:?}: {} bytes instead of 8",
                String::from_utf8_lossy(key),
                b.len()
            ))
        }),
    }
}
