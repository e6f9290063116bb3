//! The watch history: what each revision changed, kept for a bounded window
//! so that a watcher can be told of every change in order, and can resume
//! after any revision it saw, from any replica.
//!
//! Every command that raises the revision (see [`crate::data`]) writes one
//! [`Record`] in the `W` room, at `W` + revision (u64 big-endian), in the
//! same apply as its changes: the record holds every key the command
//! changed, in the order it changed them, with the key's state after the
//! change (`None` for a delete) and before it. So the history is part of
//! the replicated state: every replica holds the same records, they are in
//! snapshots (a new member serves them) and survive restarts.
//!
//! The window is [`crate::limits::HISTORY_MAX_REVISIONS`] revisions and
//! [`crate::limits::HISTORY_MAX_BYTES`] bytes of encoded records, whichever
//! is smaller; the newest record is always kept. When a new record passes
//! either bound, the oldest records are deleted in the same apply, so the
//! window is a function of the log: the same on every replica.
//! `Mhist` ([`META_HISTORY`]) holds the oldest revision kept and the bytes
//! kept; records exist for exactly the revisions from that oldest one to the
//! cluster's revision. Without `Mhist` (a new store, or a restored one: a
//! restore leaves the history out, since the revisions it bumps past were
//! never recorded) the history is empty and starts with the next revision.
//!
//! Previous values can be large (a batch may overwrite 1,024 keys of 1 MiB
//! each, a delete-range may remove millions): when a record's previous
//! values pass [`crate::limits::HISTORY_MAX_PREVIOUS_BYTES`], that record
//! keeps none of them ([`Record::previous_dropped`]), and its changes say
//! only that the keys existed before.
//!
//! ```
//! use latchkey_core::{apply, history, Command, MemStore, Request};
//!
//! let mut store = MemStore::default();
//! for value in ["1", "2"] {
//!     let put = Command::Put { key: b"k".to_vec(), value: value.as_bytes().to_vec() };
//!     apply(&mut store, &Request { now: 1, command: put }).unwrap().unwrap();
//! }
//! assert_eq!(history::window(&store).unwrap(), history::Window { oldest: 1, current: 2 });
//! let records = history::read(&store, 2, 10, usize::MAX).unwrap();
//! assert_eq!(records[0].revision, 2);
//! let change = &records[0].changes[0];
//! assert_eq!(change.current.as_ref().unwrap().value, b"2");
//! assert_eq!(change.previous.as_ref().unwrap().value, b"1");
//! ```

use std::ops::Bound;

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::command::Versioned;
use crate::data;
use crate::keyspace::{self, HISTORY, META_HISTORY};
use crate::limits::{HISTORY_MAX_BYTES, HISTORY_MAX_PREVIOUS_BYTES, HISTORY_MAX_REVISIONS};
use crate::{Store, StoreError};

/// One key changed by a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyChange {
    /// The user key.
    #[serde(with = "crate::codec::bytes")]
    pub key: Vec<u8>,
    /// The key after the change; `None`: deleted.
    pub current: Option<Versioned>,
    /// The key before the change; `None`: it was absent, or the record
    /// dropped its previous values ([`Record::previous_dropped`]).
    pub previous: Option<Versioned>,
}

/// Everything one revision changed, in the order the command changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The revision.
    pub revision: u64,
    /// The keys changed, in order (a key a batch writes twice is here twice).
    pub changes: Vec<KeyChange>,
    /// The previous values passed
    /// [`crate::limits::HISTORY_MAX_PREVIOUS_BYTES`] and were not kept.
    pub previous_dropped: bool,
}

/// The revisions the history holds: `oldest..=current`, empty when
/// `oldest > current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The oldest revision whose record is kept (or the next revision, when
    /// none is).
    pub oldest: u64,
    /// The cluster's revision.
    pub current: u64,
}

/// The `W` row key of `revision`.
pub fn record_key(revision: u64) -> Vec<u8> {
    keyspace::tagged(HISTORY, &revision.to_be_bytes())
}

/// The oldest revision kept and the bytes kept, if `Mhist` is there.
fn read_meta<S: Store>(store: &S) -> Result<Option<(u64, u64)>, StoreError> {
    let Some(cell) = store.get(META_HISTORY)? else {
        return Ok(None);
    };
    let field = |i: usize| cell.get(i * 8..i * 8 + 8).and_then(keyspace::read_u64);
    match (cell.len(), field(0), field(1)) {
        (16, Some(oldest), Some(bytes)) => Ok(Some((oldest, bytes))),
        _ => Err(StoreError(format!(
            "corrupt history cell: {} bytes instead of 16",
            cell.len()
        ))),
    }
}

fn write_meta<S: Store>(store: &mut S, oldest: u64, bytes: u64) -> Result<(), StoreError> {
    let mut cell = Vec::with_capacity(16);
    cell.extend_from_slice(&oldest.to_be_bytes());
    cell.extend_from_slice(&bytes.to_be_bytes());
    store.put(META_HISTORY, &cell)
}

/// The revisions the history of `store` holds.
pub fn window<S: Store>(store: &S) -> Result<Window, StoreError> {
    let current = data::revision(store)?;
    let oldest = match read_meta(store)? {
        Some((oldest, _)) => oldest,
        None => current.saturating_add(1),
    };
    Ok(Window { oldest, current })
}

/// Up to `max_records` records from revision `from` on, in revision order,
/// stopping after the record that takes their encoded size to `max_bytes`
/// or more (so at least one is returned when there is one). Records before
/// the window are not there: check [`window`] first.
pub fn read<S: Store>(
    store: &S,
    from: u64,
    max_records: usize,
    max_bytes: usize,
) -> Result<Vec<Record>, StoreError> {
    let lower = record_key(from);
    let upper = [HISTORY + 1];
    let rows = store.scan(
        Bound::Included(&lower),
        Bound::Excluded(&upper[..]),
        false,
        max_records,
    )?;
    let mut out = Vec::with_capacity(rows.len());
    let mut bytes = 0usize;
    for (key, row) in rows {
        out.push(decode_record(&key, &row)?);
        bytes = bytes.saturating_add(row.len());
        if bytes >= max_bytes {
            break;
        }
    }
    Ok(out)
}

/// The record in the row `key` = `row`. A row that does not decode, or
/// whose revision is not its key's, means the store is damaged.
pub fn decode_record(key: &[u8], row: &[u8]) -> Result<Record, StoreError> {
    let record: Record =
        codec::decode(row).map_err(|e| StoreError(format!("corrupt history row {key:?}: {e}")))?;
    if key.get(1..).and_then(keyspace::read_u64) != Some(record.revision) {
        return Err(StoreError(format!(
            "corrupt history row {key:?}: it holds revision {}",
            record.revision
        )));
    }
    Ok(record)
}

/// The changes one command has made so far, becoming its [`Record`].
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    changes: Vec<KeyChange>,
    previous_bytes: usize,
    previous_dropped: bool,
}

impl Recorder {
    /// Note that `key` went from `previous` to `current`.
    pub(crate) fn note(
        &mut self,
        key: &[u8],
        current: Option<Versioned>,
        previous: Option<Versioned>,
    ) {
        let previous = if self.previous_dropped {
            None
        } else {
            self.previous_bytes = self
                .previous_bytes
                .saturating_add(previous.as_ref().map_or(0, |p| p.value.len()));
            if self.previous_bytes > HISTORY_MAX_PREVIOUS_BYTES {
                self.previous_dropped = true;
                for change in &mut self.changes {
                    change.previous = None;
                }
                None
            } else {
                previous
            }
        };
        self.changes.push(KeyChange {
            key: key.to_vec(),
            current,
            previous,
        });
    }

    /// Write the record of `revision`, then drop the oldest records past
    /// the window.
    pub(crate) fn write<S: Store>(self, store: &mut S, revision: u64) -> Result<(), StoreError> {
        let record = Record {
            revision,
            changes: self.changes,
            previous_dropped: self.previous_dropped,
        };
        let row = codec::encode(&record).map_err(|e| StoreError(e.to_string()))?;
        store.put(&record_key(revision), &row)?;
        let (mut oldest, mut bytes) = read_meta(store)?.unwrap_or((revision, 0));
        bytes = bytes.saturating_add(row.len() as u64);
        while oldest < revision
            && (revision - oldest >= HISTORY_MAX_REVISIONS || bytes > HISTORY_MAX_BYTES)
        {
            let key = record_key(oldest);
            let size = store.get(&key)?.map_or(0, |r| r.len() as u64);
            store.delete(&key)?;
            bytes = bytes.saturating_sub(size);
            oldest += 1;
        }
        write_meta(store, oldest, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Change;
    use crate::MemStore;

    fn put(store: &mut MemStore, key: &[u8], value: &[u8]) -> u64 {
        let mut change = Change::begin(store).unwrap();
        change.put(store, key, value).unwrap();
        change.finish(store).unwrap()
    }

    /// Records exist for exactly the window's revisions, and `Mhist`
    /// counts their bytes.
    fn check_window(store: &MemStore) -> Window {
        let w = window(store).unwrap();
        let rows: Vec<_> = store
            .map
            .range(record_key(0)..)
            .take_while(|(k, _)| k[0] == HISTORY)
            .collect();
        let revisions: Vec<u64> = rows
            .iter()
            .map(|(k, _)| keyspace::read_u64(&k[1..]).unwrap())
            .collect();
        assert_eq!(revisions, (w.oldest..=w.current).collect::<Vec<_>>());
        let bytes: u64 = rows.iter().map(|(_, v)| v.len() as u64).sum();
        assert_eq!(read_meta(store).unwrap().map(|m| m.1), Some(bytes));
        w
    }

    #[test]
    fn the_window_is_bounded_by_revisions() {
        let mut store = MemStore::default();
        let total = HISTORY_MAX_REVISIONS + 10;
        for i in 0..total {
            put(&mut store, b"k", &i.to_be_bytes());
        }
        let w = check_window(&store);
        assert_eq!(w.current, total);
        assert_eq!(w.current - w.oldest + 1, HISTORY_MAX_REVISIONS);
        let first = read(&store, 0, 1, usize::MAX).unwrap();
        assert_eq!(first[0].revision, w.oldest);
    }

    #[test]
    fn the_window_is_bounded_by_bytes_and_keeps_the_newest_record() {
        let mut store = MemStore::default();
        let big = vec![7u8; crate::limits::MAX_VALUE_LEN];
        for _ in 0..40 {
            put(&mut store, b"k", &big);
        }
        let w = check_window(&store);
        assert_eq!(w.current, 40);
        assert!(w.oldest > 1, "{w:?}");
        assert!(read_meta(&store).unwrap().unwrap().1 <= HISTORY_MAX_BYTES);
        // Each record holds the new and the previous value: a little over
        // 2 MiB, so one record fewer than 64 MiB / 2 MiB fits.
        assert_eq!(w.current - w.oldest + 1, HISTORY_MAX_BYTES / (2 << 20) - 1);
    }

    #[test]
    fn large_previous_values_are_dropped_from_the_record() {
        let mut store = MemStore::default();
        let big = vec![1u8; crate::limits::MAX_VALUE_LEN];
        let keys: Vec<Vec<u8>> = (0u8..10).map(|i| vec![b'k', i]).collect();
        for key in &keys {
            put(&mut store, key, &big);
        }
        let mut change = Change::begin(&store).unwrap();
        for key in &keys {
            change.put(&mut store, key, b"small").unwrap();
        }
        let revision = change.finish(&mut store).unwrap();
        let record = read(&store, revision, 1, usize::MAX).unwrap().remove(0);
        assert!(record.previous_dropped);
        assert_eq!(record.changes.len(), keys.len());
        assert!(record.changes.iter().all(|c| c.previous.is_none()));
        assert!(record.changes.iter().all(|c| c.current.is_some()));
        check_window(&store);
    }

    #[test]
    fn a_damaged_record_is_an_error() {
        let mut store = MemStore::default();
        put(&mut store, b"k", b"v");
        store.map.insert(record_key(1), b"\x05junk".to_vec());
        assert!(read(&store, 1, 1, usize::MAX).is_err());
        // A record filed under another revision.
        put(&mut store, b"k", b"w");
        let row = store.map[&record_key(2)].clone();
        assert!(decode_record(&record_key(9), &row).is_err());
        store.map.insert(META_HISTORY.to_vec(), vec![0; 3]);
        assert!(window(&store).is_err());
    }

    #[test]
    fn reads_stop_at_the_byte_budget_after_one_record() {
        let mut store = MemStore::default();
        for v in [b"a", b"b", b"c"] {
            put(&mut store, b"k", v);
        }
        assert_eq!(read(&store, 1, 10, 1).unwrap().len(), 1);
        assert_eq!(read(&store, 2, 10, usize::MAX).unwrap().len(), 2);
        assert!(read(&store, 4, 10, usize::MAX).unwrap().is_empty());
    }
}
