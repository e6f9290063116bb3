//! The layout of the one RocksDB instance: its column families and the keys
//! inside them.
//!
//! | column family | key                         | value                                   |
//! |---------------|-----------------------------|-----------------------------------------|
//! | `log`         | log index, u64 big-endian   | codec(`Entry<TypeConfig>`)              |
//! | `log_meta`    | [`VOTE`]                    | codec(`Vote`)                           |
//! |               | [`COMMITTED`]               | codec(`Option<LogId>`)                  |
//! |               | [`LAST_PURGED`]             | codec(`LogId`)                          |
//! | `sm_data`     | the core's keyspace, raw    | raw bytes                               |
//! | `sm_meta`     | [`LAST_APPLIED`]            | codec(`LogId`)                          |
//! |               | [`MEMBERSHIP`]              | codec(`StoredMembership`)               |
//! |               | `restored` (restores only)  | codec(`u64`): the restore seed, see [`crate::backup`] |
//!
//! All families share one write-ahead log, so a write that survived a crash
//! implies every earlier write survived too (RocksDB recovers a prefix of the
//! WAL). The log store and the state machine rely on that ordering.

use rocksdb::{ColumnFamily, DB};

use crate::error::StorageError;

/// Raft log entries, keyed by index.
pub(crate) const LOG: &str = "log";
/// Raft metadata that belongs with the log: vote, committed, last purged.
pub(crate) const LOG_META: &str = "log_meta";
/// The state machine's data: the core's keyspace, byte for byte.
pub(crate) const SM_DATA: &str = "sm_data";
/// State machine metadata: last applied log id and membership.
pub(crate) const SM_META: &str = "sm_meta";

/// Every column family this crate opens, besides RocksDB's `default`.
pub(crate) const ALL: [&str; 4] = [LOG, LOG_META, SM_DATA, SM_META];

/// `log_meta` key of the vote.
pub(crate) const VOTE: &[u8] = b"vote";
/// `log_meta` key of the last committed log id.
pub(crate) const COMMITTED: &[u8] = b"committed";
/// `log_meta` key of the last purged log id.
pub(crate) const LAST_PURGED: &[u8] = b"last_purged";
/// `sm_meta` key of the last applied log id.
pub(crate) const LAST_APPLIED: &[u8] = b"last_applied";
/// `sm_meta` key of the last applied membership.
pub(crate) const MEMBERSHIP: &[u8] = b"membership";

/// The `log` key of `index`: big-endian, so key order is index order.
pub(crate) fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The index stored in a `log` key, or `None` if the key is not 8 bytes.
pub(crate) fn log_index(key: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(key).ok().map(u64::from_be_bytes)
}

/// An exclusive upper bound for `log` keys covering every index `>= index`
/// when used as the start of a range, i.e. the key just past `index`.
///
/// For `u64::MAX` this is a 9-byte key, greater than every 8-byte log key.
pub(crate) fn log_key_after(index: u64) -> Vec<u8> {
    match index.checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => vec![0xff; 9],
    }
}

/// A key greater than every `log` key (they are all 8 bytes).
pub(crate) const LOG_END: [u8; 9] = [0xff; 9];

/// The handle of a column family opened by [`crate::open`].
pub(crate) fn handle<'a>(db: &'a DB, name: &'static str) -> Result<&'a ColumnFamily, StorageError> {
    db.cf_handle(name)
        .ok_or(StorageError::MissingColumnFamily(name))
}

/// The handles of the state machine's two column families, looked up once.
pub(crate) struct Handles<'a> {
    pub(crate) sm_data: &'a ColumnFamily,
    pub(crate) sm_meta: &'a ColumnFamily,
}

impl<'a> Handles<'a> {
    /// Look up both families; fails only if the database was opened without
    /// them, which [`crate::open`] never does.
    pub(crate) fn of(db: &'a DB) -> Result<Self, StorageError> {
        Ok(Handles {
            sm_data: handle(db, SM_DATA)?,
            sm_meta: handle(db, SM_META)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_by_index() {
        let mut keys: Vec<[u8; 8]> = [300u64, 2, 1 << 40, 0, u64::MAX]
            .iter()
            .map(|&i| log_key(i))
            .collect();
        keys.sort();
        let back: Vec<u64> = keys.iter().filter_map(|k| log_index(k)).collect();
        assert_eq!(back, vec![0, 2, 300, 1 << 40, u64::MAX]);
    }

    #[test]
    fn key_after_bounds_every_index() {
        assert_eq!(log_key_after(4), log_key(5).to_vec());
        assert!(log_key_after(u64::MAX).as_slice() > log_key(u64::MAX).as_slice());
        assert!(LOG_END.as_slice() > log_key(u64::MAX).as_slice());
        assert_eq!(log_index(b"short"), None);
    }
}
