//! [`StateReader`]: serves reads of the applied state, concurrently with the
//! state machine applying new entries.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use latchkey_core::history::{self, Record, Window};
use latchkey_core::{CommandResult, Query, Store, StoreError};
use rocksdb::DB;

use crate::data_view::DataView;

/// The last applied log index, published after each committed apply batch,
/// and the snapshot-install gate readers pass.
#[derive(Debug, Default)]
pub(crate) struct AppliedIndex {
    index: AtomicU64,
    /// Counts install starts and ends: odd while a snapshot install is
    /// replacing the rows (a sequence lock: a read is good if the count was
    /// even before it and unchanged after it).
    installs: AtomicU64,
}

impl AppliedIndex {
    /// Publish `index` as applied (after its batch is committed).
    pub(crate) fn set(&self, index: Option<u64>) {
        // 0 is "nothing applied"; index i is stored as i + 1.
        let raw = index.map_or(0, |i| i.saturating_add(1));
        self.index.store(raw, Ordering::Release);
    }

    pub(crate) fn get(&self) -> Option<u64> {
        self.index.load(Ordering::Acquire).checked_sub(1)
    }

    /// A snapshot install starts replacing the rows: refuse reads.
    pub(crate) fn begin_install(&self) {
        self.installs.fetch_add(1, Ordering::SeqCst);
    }

    /// The install's last batch is committed: serve reads again.
    pub(crate) fn end_install(&self) {
        self.installs.fetch_add(1, Ordering::SeqCst);
    }

    /// Run the read `f`, refusing it if a snapshot install was replacing
    /// the rows at any moment while it ran.
    pub(crate) fn gated<T, E: From<StoreError>>(
        &self,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let installing = || {
            StoreError(
                "this replica is installing a snapshot from the leader (or failed to: \
                 see its log); read from another replica or retry"
                    .into(),
            )
        };
        let before = self.installs.load(Ordering::SeqCst);
        if before % 2 == 1 {
            return Err(installing().into());
        }
        // An error is checked too: a read that failed on a half-replaced
        // state is the install's doing, not the store's.
        let result = f();
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.installs.load(Ordering::SeqCst) != before {
            return Err(installing().into());
        }
        result
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
    /// Bytes of keys and values in the state machine's in-memory lock
    /// rooms (`crate::rooms`), as of its last apply.
    pub(crate) rooms_bytes: Arc<std::sync::atomic::AtomicU64>,
}

/// RocksDB's database-wide counts of running background jobs.
const RUNNING_JOBS: [&str; 2] = [
    "rocksdb.num-running-flushes",
    "rocksdb.num-running-compactions",
];
/// RocksDB's per-column-family flags of pending background jobs.
const PENDING_JOBS: [&str; 2] = [
    "rocksdb.mem-table-flush-pending",
    "rocksdb.compaction-pending",
];

impl StateReader {
    /// Bytes of keys and values the state machine holds in memory for the
    /// lock rooms (sessions, locks, request memory, access control; see
    /// the crate docs), not counting the map's own overhead (about 80
    /// bytes a row). It grows with live sessions and the outcomes each
    /// remembers (up to `MAX_REMEMBERED_REQUESTS` per session).
    pub fn lock_rooms_bytes(&self) -> u64 {
        self.rooms_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Serve `q` from the applied state, through one consistent snapshot.
    ///
    /// For a linearizable read, first make sure (openraft's
    /// `ensure_linearizable`) that [`Self::last_applied_index`] has reached the
    /// read index.
    ///
    /// While a snapshot from the leader is being installed, reads are
    /// refused with an error saying so (they would see a mix of the old
    /// and the new state).
    pub fn query(&self, q: &Query) -> Result<CommandResult, StoreError> {
        self.applied.gated(|| {
            let snapshot = self.db.snapshot();
            let view = DataView::at(&self.db, &snapshot)?;
            latchkey_core::query(&view, q)
        })
    }

    /// The watch history's window and up to `max_records` of its records
    /// from revision `from` on (stopping once they reach `max_bytes`), read
    /// through one snapshot, so the window and the records agree. See
    /// [`latchkey_core::history`].
    pub fn history(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<(Window, Vec<Record>), StoreError> {
        self.applied.gated(|| {
            let snapshot = self.db.snapshot();
            let view = DataView::at(&self.db, &snapshot)?;
            let window = history::window(&view)?;
            let records = if from > window.current {
                Vec::new()
            } else {
                history::read(&view, from.max(window.oldest), max_records, max_bytes)?
            };
            Ok((window, records))
        })
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

    /// RocksDB background jobs running or waiting: flushes and compactions
    /// running, plus column families with a flush or a compaction pending.
    /// Zero once the store has settled after a burst of writes (a benchmark
    /// waits for it; an operator sees a store that never settles).
    pub fn background_jobs(&self) -> u64 {
        let db_wide = RUNNING_JOBS
            .iter()
            .filter_map(|p| self.db.property_int_value(*p).ok().flatten())
            .sum::<u64>();
        let pending = crate::columns::ALL
            .iter()
            .filter_map(|name| self.db.cf_handle(name))
            .flat_map(|cf| {
                PENDING_JOBS.map(|p| self.db.property_int_value_cf(cf, p).ok().flatten())
            })
            .flatten()
            .sum::<u64>();
        db_wide + pending
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
        self.applied.gated(|| DataView::live(&self.db)?.get(key))
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
        self.applied
            .gated(|| DataView::live(&self.db)?.scan(lower, upper, reverse, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::AppliedIndex;

    /// Every property `background_jobs` sums is one RocksDB knows (a
    /// misspelt one would read as 0, "settled", for ever).
    #[test]
    fn the_background_job_properties_exist() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, sm) = crate::open(dir.path(), crate::StorageOptions::default()).unwrap();
        let reader = sm.reader();
        for p in super::RUNNING_JOBS {
            assert!(reader.db.property_int_value(p).unwrap().is_some(), "{p}");
        }
        for name in crate::columns::ALL {
            let cf = reader.db.cf_handle(name).unwrap();
            for p in super::PENDING_JOBS {
                assert!(
                    reader.db.property_int_value_cf(cf, p).unwrap().is_some(),
                    "{name}: {p}"
                );
            }
        }
        assert_eq!(reader.background_jobs(), 0, "a new, empty store is settled");
    }
    use latchkey_core::StoreError;

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

    /// A read is refused if an install was running when it began, or
    /// started or ended while it ran.
    #[test]
    fn reads_are_refused_across_an_install() {
        let a = AppliedIndex::default();
        let ok = || Ok::<_, StoreError>(7);
        assert_eq!(a.gated(ok).unwrap(), 7);
        a.begin_install();
        assert!(a.gated(ok).is_err(), "read during an install");
        a.end_install();
        assert_eq!(a.gated(ok).unwrap(), 7);
        assert!(
            a.gated(|| {
                a.begin_install();
                Ok::<_, StoreError>(7)
            })
            .is_err(),
            "an install began during the read"
        );
        assert!(a.gated(ok).is_err(), "read during the second install");
        a.end_install();
        assert_eq!(a.gated(ok).unwrap(), 7);
    }
}
