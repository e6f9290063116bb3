//! [`open`]: the one RocksDB instance of a replica, and its [`StorageOptions`].

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DBCompressionType, DBRecoveryMode, Options, DB};

use crate::ack_mark::{self, AckMark};
use crate::applied_state::AppliedState;
use crate::columns::{self, Handles};
use crate::error::StorageError;
use crate::log_store::{recovered, LogStore};
use crate::snapshot_file::SnapshotFile;
use crate::snapshot_install::Covered;
use crate::state_machine::StateMachine;
use crate::state_reader::AppliedIndex;

/// Subdirectory of the data directory holding the RocksDB instance.
const DB_DIR: &str = "db";
/// Subdirectory of the data directory holding the current snapshot.
const SNAPSHOT_DIR: &str = "snapshots";

/// How to open the store. `Default` is what a replica should use.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StorageOptions {
    /// Sync every state machine apply batch. Not needed for safety (see
    /// [`crate::StateMachine`]); costs one fsync per apply call. Default: off.
    pub sync_apply: bool,
    /// Compress the log and the state machine data with LZ4. Default: on.
    pub compression: bool,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            sync_apply: false,
            compression: true,
        }
    }
}

/// Setters, for callers outside this crate (the struct is
/// `#[non_exhaustive]`, so new options can be added without breaking
/// them): `StorageOptions::default().with_...(..)`.
impl StorageOptions {
    /// Set [`StorageOptions::sync_apply`].
    pub fn with_sync_apply(mut self, sync_apply: bool) -> Self {
        self.sync_apply = sync_apply;
        self
    }

    /// Set [`StorageOptions::compression`].
    pub fn with_compression(mut self, compression: bool) -> Self {
        self.compression = compression;
        self
    }
}

/// Bytes of the log entries after `index` (all of them for `None`): read
/// once at open, at most about one snapshot's worth plus `snapshot_every`
/// entries when snapshots keep their pace.
fn log_bytes_after(db: &DB, index: Option<u64>) -> Result<u64, StorageError> {
    let log = columns::handle(db, columns::LOG)?;
    let mut it = db.raw_iterator_cf(log);
    match index {
        Some(i) => it.seek(columns::log_key_after(i)),
        None => it.seek_to_first(),
    }
    let mut bytes = 0u64;
    while let Some(value) = it.value() {
        bytes = bytes.saturating_add(value.len() as u64);
        it.next();
    }
    it.status()?;
    Ok(bytes)
}

/// Open (creating if missing) the store in `dir`: one RocksDB instance with
/// column families for the log, the raft metadata, the state machine data
/// and the state machine metadata, plus the current snapshot file.
///
/// Returns the log store and the state machine to hand to `openraft::Raft::new`.
///
/// A new directory gets an acknowledgement mark with a fresh incarnation
/// ([`crate::ack_mark`]). An existing one is checked against its mark: a
/// saved vote or a log end behind what the mark says was acknowledged, or
/// Raft state without a mark, is refused with
/// [`StorageError::LostAcknowledged`] (the disk lost state this replica
/// promised to keep). RocksDB recovers its write-ahead log in its default
/// *point-in-time* mode, deliberately: a torn tail left by a crash (writes
/// never synced, so never acknowledged) is dropped as it should be, and any
/// loss beyond that shows up as a log behind the mark. The stricter
/// *absolute consistency* mode would refuse every replica whose machine
/// lost power mid-write, and the laxer modes skip damaged records in the
/// middle of the log.
///
/// Opening is synchronous; the stores' trait methods must run inside a tokio
/// runtime (they use its blocking pool for fsyncs). Only one process may open
/// a directory at a time (RocksDB's lock file enforces it).
pub fn open(dir: &Path, options: StorageOptions) -> Result<(LogStore, StateMachine), StorageError> {
    let db_dir = dir.join(DB_DIR);
    std::fs::create_dir_all(&db_dir).map_err(|source| StorageError::Io {
        what: "create data directory",
        path: db_dir.clone(),
        source,
    })?;
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    // Chosen on purpose; see this function's docs and `crate::ack_mark`.
    db_opts.set_wal_recovery_mode(DBRecoveryMode::PointInTime);
    let descriptors = columns::ALL.iter().map(|&name| {
        let mut cf_opts = Options::default();
        cf_opts.set_compression_type(if options.compression {
            DBCompressionType::Lz4
        } else {
            DBCompressionType::None
        });
        ColumnFamilyDescriptor::new(name, cf_opts)
    });
    let mark = AckMark::open(dir)?;
    let db = DB::open_cf_descriptors(&db_opts, &db_dir, descriptors)?;
    let found = recovered(&db)?;
    let mark = match mark {
        Some(mark) => {
            ack_mark::check(
                mark.record(),
                found.vote.as_ref(),
                found.last.map(|l| l.index),
            )
            .map_err(|detail| StorageError::LostAcknowledged {
                dir: dir.to_path_buf(),
                detail,
            })?;
            mark
        }
        None if found.vote.is_some() || found.last.is_some() => {
            return Err(StorageError::LostAcknowledged {
                dir: dir.to_path_buf(),
                detail: format!(
                    "the Raft log or vote is there but the acknowledgement mark ({}) is gone",
                    ack_mark::MARK_FILE
                ),
            })
        }
        None => AckMark::create(dir)?,
    };
    let state = {
        let cfs = Handles::of(&db)?;
        AppliedState::read(|k| db.get_cf(cfs.sm_meta, k)).map_err(|e| StorageError::Corrupt {
            what: "state machine metadata",
            detail: e.to_string(),
        })?
    };
    let file = SnapshotFile::open(&dir.join(SNAPSHOT_DIR))?;
    let state = crate::snapshot_install::finish_interrupted(&db, &file, state)?;
    let rooms = crate::rooms::Rooms::load(&db)?;
    tracing::info!(
        dir = %dir.display(),
        last_applied = ?state.last_applied,
        lock_rooms_bytes = rooms.bytes(),
        "opened latchkey storage"
    );
    let db = Arc::new(db);
    let observed = Arc::new(crate::observe::Observed::default());
    observed.snapshot_current(file.current_bytes());
    // The log already past the snapshot counts toward the next one, so
    // restarts cannot keep postponing it (see `crate::SnapshotPace`).
    observed.log_appended(log_bytes_after(
        &db,
        file.current_log_id().map(|l| l.index),
    )?);
    let covered = Covered {
        file: Arc::new(file),
        applied: Arc::new(AppliedIndex::default()),
        receiving: Arc::default(),
    };
    let log = LogStore::new(
        Arc::clone(&db),
        mark,
        Arc::clone(&observed),
        covered.clone(),
    )?;
    let sm = StateMachine::new(db, &covered, state, rooms, options.sync_apply, observed);
    sm.publish_revision().map_err(|e| StorageError::Corrupt {
        what: "cluster revision",
        detail: e.to_string(),
    })?;
    Ok((log, sm))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log already past the current snapshot counts toward the next
    /// one after a restart, so restarts cannot keep postponing it.
    #[test]
    fn the_log_past_the_snapshot_counts_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let closed = {
            let (_log, sm) = open(dir.path(), StorageOptions::default()).unwrap();
            let db = &sm.reader().db;
            let log_cf = columns::handle(db, columns::LOG).unwrap();
            let mut sizes = Vec::new();
            for i in 1..=10u64 {
                let entry = crate::types::Entry {
                    log_id: crate::types::log_id(1, 1, i),
                    payload: openraft::EntryPayload::Blank,
                };
                let bytes = latchkey_core::codec::encode(&entry).unwrap();
                sizes.push(bytes.len() as u64);
                db.put_cf(log_cf, columns::log_key(i), bytes).unwrap();
            }
            assert_eq!(
                log_bytes_after(db, Some(4)).unwrap(),
                sizes[4..].iter().sum::<u64>()
            );
            assert_eq!(log_bytes_after(db, Some(10)).unwrap(), 0);
            assert_eq!(
                log_bytes_after(db, None).unwrap(),
                sizes.iter().sum::<u64>()
            );
            (sm.closed_signal(), sizes.iter().sum::<u64>())
        };
        let (closed, total) = closed;
        while !closed.is_closed() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let pace = log.snapshot_pace();
        assert_eq!(pace.snapshot_bytes(), 0);
        assert_eq!(pace.log_bytes_since_snapshot(), total);
    }
}
