//! Reading and writing the lock service's records through the crate codec.
//!
//! A record that does not decode means the store is corrupt: that is a
//! [`StoreError`] (the replica stops), never a client-visible answer.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec;
use crate::store::KeyValue;
use crate::{Store, StoreError};

/// The record at `key`, if any.
pub(crate) fn load<T: DeserializeOwned, S: Store>(
    store: &S,
    key: &[u8],
) -> Result<Option<T>, StoreError> {
    match store.get(key)? {
        None => Ok(None),
        Some(bytes) => codec::decode(&bytes).map(Some).map_err(|e| corrupt(key, e)),
    }
}

/// Write `value` at `key`.
pub(crate) fn save<T: Serialize, S: Store>(
    store: &mut S,
    key: &[u8],
    value: &T,
) -> Result<(), StoreError> {
    let bytes = codec::encode(value).map_err(|e| corrupt(key, e))?;
    store.put(key, &bytes)
}

/// A store failure naming the key whose record could not be read or written.
pub(crate) fn corrupt(key: &[u8], why: impl std::fmt::Display) -> StoreError {
    StoreError(format!(
        "corrupt lock-service record {:?}: {why}",
        String::from_utf8_lossy(key)
    ))
}

/// Every row whose key starts with `prefix`, in key order, read in chunks.
pub(crate) fn scan_prefix<S: Store>(store: &S, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
    let mut out: Vec<KeyValue> = Vec::new();
    for_each_in_prefix(store, prefix, |k, v| {
        out.push((k.to_vec(), v.to_vec()));
        Ok(())
    })?;
    Ok(out)
}

/// Call `each` with every row whose key starts with `prefix`, in key
/// order, reading (and holding) one chunk of rows at a time.
pub(crate) fn for_each_in_prefix<S: Store>(
    store: &S,
    prefix: &[u8],
    mut each: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    use std::ops::Bound;
    const CHUNK: usize = 1024;
    let upper = crate::keyspace::prefix_end(prefix);
    let upper_bound = match &upper {
        Some(u) => Bound::Excluded(u.as_slice()),
        None => Bound::Unbounded,
    };
    let mut last: Option<Vec<u8>> = None;
    loop {
        let lower = match &last {
            Some(k) => Bound::Excluded(k.as_slice()),
            None => Bound::Included(prefix),
        };
        let chunk = store.scan(lower, upper_bound, false, CHUNK)?;
        let done = chunk.len() < CHUNK;
        for (k, v) in &chunk {
            each(k, v)?;
        }
        last = chunk.into_iter().next_back().map(|(k, _)| k);
        if done {
            return Ok(());
        }
    }
}
