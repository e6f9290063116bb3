//! [`LogStore`]: the Raft log and its metadata (vote, committed, last purged)
//! in RocksDB, with group commit for appends.
//!
//! Durability, per operation:
//! - `save_vote`: a synced write; returns only once the vote is on disk.
//! - `append`: an unsynced write (readable at once), then the durability
//!   callback goes to the [`GroupCommit`] flusher, which fires it after the
//!   next WAL sync, on a leader as on a follower ([`crate::durable`] says
//!   why a leader's commit still overlaps its own sync).
//! - `truncate_after`, `purge`: synced writes, durable before they return. A synced
//!   write also syncs every earlier write (one WAL), so once a purge returns,
//!   the state machine applies it depended on are durable too.
//! - `save_committed`: unsynced, and capped at the durable log; losing it
//!   only means re-applying less on restart.
//! - Opening syncs whatever RocksDB recovered (a process crash leaves
//!   unsynced writes in the page cache), so the durable state starts at the
//!   last entry on disk.
//! - Every acknowledgement is recorded in the [`AckMark`] first (votes after
//!   their synced write, flushed appends after their WAL sync, truncations
//!   before they remove anything), and opening refuses a log or a vote
//!   behind it: see [`crate::ack_mark`].

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard};

use latchkey_core::codec;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;
use rocksdb::{ReadOptions, WriteBatch, WriteOptions, DB};
use tokio::sync::watch;

use crate::ack_mark::{AckMark, MarkRecord};
use crate::columns::{self, LAST_PURGED, LOG_END};
use crate::durable::{DurableLog, DurableState};
use crate::error::{msg, raft_io, to_raft, RaftStorageError, StorageError};
use crate::group_commit::{GroupCommit, Pending, Written};
use crate::snapshot_install::Covered;
use crate::types::{Entry, LogId, TypeConfig, Vote};
use crate::{blocking, columns::COMMITTED, columns::VOTE};

/// The Raft log store. Cheap to clone; every clone shares the database and
/// the one group-commit flusher.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    flusher: Arc<GroupCommit>,
    durable: Arc<watch::Sender<DurableState>>,
    mark: Arc<Mutex<AckMark>>,
    incarnation: u64,
    /// A purge waits until what it drops is in a snapshot or applied.
    covered: Covered,
}

/// Lock the mark; a poisoned lock still holds a consistent record (every
/// write either completed or left the previous record in place).
pub(crate) fn lock_mark(mark: &Mutex<AckMark>) -> MutexGuard<'_, AckMark> {
    mark.lock().unwrap_or_else(|p| p.into_inner())
}

/// What [`LogStore::new`] found in the log, for the mark check.
pub(crate) struct Recovered {
    pub(crate) vote: Option<Vote>,
    /// max(last entry, last purged).
    pub(crate) last: Option<LogId>,
}

/// Read the saved vote and the log's end, as a freshly opened database
/// holds them.
pub(crate) fn recovered(db: &DB) -> Result<Recovered, StorageError> {
    let vote: Option<Vote> = read_meta(db, VOTE, "vote").map_err(|e| StorageError::Corrupt {
        what: "saved vote",
        detail: e.to_string(),
    })?;
    let last = last_entry_id(db).map_err(|e| StorageError::Corrupt {
        what: "raft log",
        detail: e.to_string(),
    })?;
    let purged: Option<LogId> =
        read_meta(db, LAST_PURGED, "last purged log id").map_err(|e| StorageError::Corrupt {
            what: "raft log metadata",
            detail: e.to_string(),
        })?;
    Ok(Recovered {
        vote,
        last: last.max(purged),
    })
}

/// A reader of the Raft log, handed to openraft's replication tasks.
#[derive(Clone)]
pub struct LogReader {
    db: Arc<DB>,
}

impl LogStore {
    /// The log store over `db`, whose recovered state was checked against
    /// `mark` (see [`crate::open`]).
    pub(crate) fn new(
        db: Arc<DB>,
        mark: AckMark,
        observed: Arc<crate::observe::Observed>,
        covered: Covered,
    ) -> Result<Self, StorageError> {
        // What RocksDB recovered may sit unsynced in the page cache (after a
        // process crash): make it durable before reporting any of it so.
        db.flush_wal(true)?;
        let last = recovered(&db)?.last;
        let durable = Arc::new(watch::Sender::new(DurableState {
            durable: last,
            ..DurableState::default()
        }));
        let incarnation = mark.incarnation();
        let mark = Arc::new(Mutex::new(mark));
        let flusher = GroupCommit::start(
            Arc::clone(&db),
            Arc::clone(&durable),
            Arc::clone(&mark),
            observed,
        )
        .map_err(StorageError::Flusher)?;
        Ok(LogStore {
            db,
            flusher: Arc::new(flusher),
            durable,
            mark,
            incarnation,
            covered,
        })
    }

    /// This data directory's incarnation: a random identity drawn when the
    /// directory was first created (see [`crate::ack_mark`]).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// What the acknowledgement mark records now.
    pub fn mark(&self) -> MarkRecord {
        lock_mark(&self.mark).record().clone()
    }

    /// The mark file's path: it doubles as the data directory's sentinel
    /// (a replica checks that it is still there).
    pub fn mark_path(&self) -> std::path::PathBuf {
        lock_mark(&self.mark).path().to_path_buf()
    }

    /// How far this log is durable; see [`DurableLog`].
    pub fn durable(&self) -> DurableLog {
        DurableLog::new(self.durable.subscribe())
    }

    /// How many WAL syncs the group-commit flusher has done for appends.
    /// At most one per `append`, and fewer when appends arrive together.
    pub fn fsync_count(&self) -> u64 {
        self.flusher.observed().syncs()
    }

    /// Report this store's WAL syncs, and its state machine's snapshot
    /// builds and installs, to `observer` from now on. Set once: `false`
    /// (and `observer` unused) if an observer was set already. Call it
    /// before handing the store to openraft to miss nothing.
    pub fn observe(&self, observer: Arc<dyn crate::StorageObserver>) -> bool {
        self.flusher.observed().set(observer)
    }

    /// When this replica's next snapshot is due ([`crate::SnapshotPace`]).
    pub fn snapshot_pace(&self) -> crate::SnapshotPace {
        crate::SnapshotPace(Arc::clone(self.flusher.observed()))
    }
}

fn synced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    opts
}

fn unsynced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(false);
    opts
}

fn cf<'a>(db: &'a DB, name: &'static str) -> Result<&'a rocksdb::ColumnFamily, RaftStorageError> {
    columns::handle(db, name).map_err(to_raft)
}

/// Read a `log_meta` record and decode it.
fn read_meta<T: serde::de::DeserializeOwned>(
    db: &DB,
    key: &[u8],
    what: &'static str,
) -> Result<Option<T>, RaftStorageError> {
    let bytes = db
        .get_cf(cf(db, columns::LOG_META)?, key)
        .map_err(|e| raft_io::read_meta(what, e))?;
    bytes
        .map(|b| codec::decode(&b).map_err(|e| raft_io::read_meta(what, e)))
        .transpose()
}

/// Entries with index in `range`, in index order.
fn read_entries<RB: RangeBounds<u64>>(db: &DB, range: &RB) -> Result<Vec<Entry>, RaftStorageError> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => match s.checked_add(1) {
            Some(s) => s,
            None => return Ok(Vec::new()),
        },
        Bound::Unbounded => 0,
    };
    let end: Option<Vec<u8>> = match range.end_bound() {
        Bound::Included(&e) => Some(columns::log_key_after(e)),
        Bound::Excluded(&e) => Some(columns::log_key(e).to_vec()),
        Bound::Unbounded => None,
    };
    let start_key = columns::log_key(start);
    if end.as_deref().is_some_and(|e| e <= start_key.as_slice()) {
        return Ok(Vec::new());
    }
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(start_key.to_vec());
    if let Some(end) = end {
        opts.set_iterate_upper_bound(end);
    }
    let mut it = db.raw_iterator_cf_opt(cf(db, columns::LOG)?, opts);
    it.seek_to_first();
    let mut entries = Vec::new();
    while let Some((key, value)) = it.item() {
        entries.push(decode_entry(key, value)?);
        it.next();
    }
    it.status().map_err(raft_io::read_logs)?;
    Ok(entries)
}

/// Decode one stored entry, checking it sits under its own index.
fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry, RaftStorageError> {
    let index = columns::log_index(key)
        .ok_or_else(|| raft_io::read_logs(msg(format!("malformed log key {key:?}"))))?;
    let entry: Entry = codec::decode(value).map_err(|e| raft_io::read_log_at_index(index, &e))?;
    if entry.log_id.index != index {
        return Err(raft_io::read_log_at_index(
            index,
            msg(format!("entry {} is stored at index {index}", entry.log_id)),
        ));
    }
    Ok(entry)
}

/// The id of the last entry in the log, if any.
fn last_entry_id(db: &DB) -> Result<Option<LogId>, RaftStorageError> {
    let mut it = db.raw_iterator_cf(cf(db, columns::LOG)?);
    it.seek_to_last();
    let last = match it.item() {
        Some((key, value)) => Some(decode_entry(key, value)?.log_id),
        None => None,
    };
    it.status().map_err(raft_io::read_logs)?;
    Ok(last)
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        read_entries(&self.db, &range)
    }

    /// One point read (openraft's replication reads the vote around each
    /// batch of entries it sends, to stop if leadership changed).
    async fn read_vote(&mut self) -> Result<Option<Vote>, RaftStorageError> {
        read_meta(&self.db, VOTE, "vote")
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        read_entries(&self.db, &range)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, RaftStorageError> {
        read_meta(&self.db, VOTE, "vote")
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let last_purged_log_id: Option<LogId> =
            read_meta(&self.db, LAST_PURGED, "last purged log id")?;
        let last_log_id = match last_entry_id(&self.db)? {
            Some(last) => Some(last),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            db: Arc::clone(&self.db),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), RaftStorageError> {
        let bytes = codec::encode(vote).map_err(raft_io::write_vote)?;
        let db = Arc::clone(&self.db);
        let mark = Arc::clone(&self.mark);
        let recorded = *vote;
        blocking::run(move || {
            db.put_cf_opt(cf(&db, columns::LOG_META)?, VOTE, bytes, &synced())
                .map_err(raft_io::write_vote)?;
            // After the synced write: the mark is never ahead of the disk.
            lock_mark(&mark)
                .record_vote(&recorded)
                .map_err(raft_io::write_vote)
        })
        .await?;
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), RaftStorageError> {
        // Never record as committed what this log may still lose.
        let committed = self.durable().clamp_commit(committed);
        let bytes = codec::encode(&committed).map_err(raft_io::write)?;
        self.db
            .put_cf_opt(
                cf(&self.db, columns::LOG_META)?,
                COMMITTED,
                bytes,
                &unsynced(),
            )
            .map_err(raft_io::write)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, RaftStorageError> {
        let committed: Option<Option<LogId>> = read_meta(&self.db, COMMITTED, "committed log id")?;
        Ok(committed.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let log = cf(&self.db, columns::LOG)?;
        let mut batch = WriteBatch::default();
        let mut last = None;
        let mut appended = 0u64;
        for entry in entries {
            let bytes =
                codec::encode(&entry).map_err(|e| raft_io::write_log_entry(entry.log_id, &e))?;
            appended += bytes.len() as u64;
            batch.put_cf(log, columns::log_key(entry.log_id.index), bytes);
            last = Some(entry.log_id);
        }
        let Some(last) = last else {
            // Nothing to write: nothing to wait for.
            callback.io_completed(Ok(()));
            return Ok(());
        };
        if let Some(failure) = &self.durable.borrow().failed {
            return Err(raft_io::write_logs(msg(failure.clone())));
        }
        // Unsynced: readable now, durable at the flusher's next sync.
        self.db
            .write_opt(batch, &unsynced())
            .map_err(raft_io::write_logs)?;
        self.flusher.observed().log_appended(appended);
        let epoch = self.durable.borrow().epoch;
        self.flusher
            .submit(Pending {
                callback,
                written: Written { last, epoch },
            })
            .map_err(raft_io::write_logs)
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), RaftStorageError> {
        tracing::debug!(?last, "truncate log after");
        // The first index removed, and the last one kept (0 when none is).
        let first_removed = last.map_or(0, |l| l.index + 1);
        let kept = last.map_or(0, |l| l.index);
        let db = Arc::clone(&self.db);
        let mark = Arc::clone(&self.mark);
        let durable = Arc::clone(&self.durable);
        blocking::run(move || {
            // The mark is held throughout, so the flusher cannot raise it
            // from a sync of the entries being removed.
            let mut mark = lock_mark(&mark);
            // Lowered first: a crash before the truncation leaves the mark
            // below the log, never above it.
            mark.record_truncation(kept).map_err(raft_io::write_logs)?;
            let mut batch = WriteBatch::default();
            batch.delete_range_cf(
                cf(&db, columns::LOG)?,
                columns::log_key(first_removed).as_slice(),
                LOG_END.as_slice(),
            );
            db.write_opt(batch, &synced())
                .map_err(raft_io::write_logs)?;
            let remaining = last_entry_id(&db)?;
            // The synced write made every entry up to `last` durable;
            // syncs queued before it must not mark the removed indexes
            // durable.
            let purged: Option<LogId> = read_meta(&db, LAST_PURGED, "last purged log id")?;
            durable.send_modify(|d| {
                d.epoch += 1;
                d.durable = remaining.or(purged);
            });
            drop(mark);
            Ok(())
        })
        .await?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        tracing::debug!(%log_id, "purge log");
        // openraft purges behind a snapshot install without waiting for it:
        // see `Covered`.
        self.covered.wait(log_id).await;
        let bytes = codec::encode(&log_id).map_err(raft_io::write_logs)?;
        let db = Arc::clone(&self.db);
        blocking::run(move || {
            let mut batch = WriteBatch::default();
            batch.put_cf(cf(&db, columns::LOG_META)?, LAST_PURGED, bytes);
            batch.delete_range_cf(
                cf(&db, columns::LOG)?,
                columns::log_key(0).to_vec(),
                columns::log_key_after(log_id.index),
            );
            db.write_opt(batch, &synced()).map_err(raft_io::write_logs)
        })
        .await?;
        // Purged entries are in a snapshot: as good as durable.
        self.durable.send_if_modified(|d| d.advance(log_id));
        Ok(())
    }
}
