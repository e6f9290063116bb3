//! Installing a snapshot received from the leader, in bounded memory, and
//! finishing an install that a crash cut short.
//!
//! An install takes two passes over the received blob:
//!
//! 1. [`receive`] checks it whole (magic, frames, key order, row count,
//!    checksum) while copying it into the snapshot directory, and makes the
//!    copy the current snapshot (fsync, rename, directory fsync). Nothing of
//!    the state machine has changed yet, so a damaged blob is refused with
//!    the old state intact.
//! 2. [`replace_state`] then replaces every state-machine row with the
//!    snapshot's: a range delete of the old rows, the new ones read from
//!    the current snapshot file a frame at a time into SST files that
//!    RocksDB ingests, and last a synced batch recording the snapshot's
//!    applied log id and membership.
//!
//! Between the first batch and the last the state machine holds a mix of
//! old and new rows, so:
//! - readers are refused meanwhile ([`AppliedIndex::begin_install`]): a
//!   read sees the old state or the new one, never a mix;
//! - a crash in between leaves the current snapshot newer than the applied
//!   state, which can happen no other way (a build only saves what is
//!   already applied and synced). [`crate::open`] checks for exactly that
//!   and runs [`replace_state`] again before anything is served.
//!
//! The whole state was one write batch before: memory for every row at
//! once, twice (the received blob and the batch); 472 MiB at its peak for
//! 1M keys and 10k sessions. See docs/performance-log.md, change 19.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::sync::Arc;

use latchkey_core::codec::CodecError;
use rocksdb::{
    DBCompressionType, IngestExternalFileOptions, Options, SstFileWriter, WriteBatch, WriteOptions,
    DB,
};

use crate::applied_state::AppliedState;
use crate::columns::Handles;
use crate::error::StorageError;
use crate::snapshot_file::SnapshotFile;
use crate::snapshot_format::{self, BlobError, Tee};
use crate::state_reader::AppliedIndex;
use crate::types::{LogId, SnapshotMeta};

/// An install's SST files are closed at about this size.
const SST_BYTES: u64 = 32 * 1024 * 1024;

/// A snapshot could not be installed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InstallError {
    #[error("{0}")]
    Blob(#[from] BlobError),
    #[error("the snapshot describes {found}, but {expected} was being installed")]
    Mismatch {
        found: Box<SnapshotMeta>,
        expected: Box<SnapshotMeta>,
    },
    #[error("snapshot file: {0}")]
    Io(#[from] io::Error),
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("state machine metadata: {0}")]
    Meta(#[from] CodecError),
    #[error("{0}")]
    Store(#[from] StorageError),
}

/// Check the blob received in `incoming` whole while copying it into the
/// snapshot directory, make the copy the current snapshot, then replace
/// the state with it ([`replace_state`]). `meta` is what the leader said
/// it sent; the blob must describe exactly that.
pub(crate) fn receive(
    db: &DB,
    file: &SnapshotFile,
    meta: &SnapshotMeta,
    mut incoming: File,
    gate: &AppliedIndex,
) -> Result<AppliedState, InstallError> {
    incoming.seek(SeekFrom::Start(0))?;
    let staged = file.stage("installing-")?;
    let found = {
        let mut tee = Tee {
            input: BufReader::new(&incoming),
            copy: BufWriter::new(staged.as_file()),
        };
        let found = snapshot_format::verify(&mut tee)?;
        tee.copy.flush()?;
        found
    };
    drop(incoming);
    if found != *meta {
        return Err(InstallError::Mismatch {
            found: Box::new(found),
            expected: Box::new(meta.clone()),
        });
    }
    let (_, current) = file.commit(staged, meta, false)?;
    replace_state(db, file, meta, current, gate)
}

/// Replace every state-machine row with the rows of `blob` (a snapshot file
/// already checked whole, described by `meta`) and record its applied
/// state in a last, synced, batch. Readers are refused from the first write
/// to the last; if this fails, they stay refused (the replica stops, and
/// [`crate::open`] finishes the install when it starts again).
///
/// The old rows go in one range delete; the new ones are written to SST
/// files beside the snapshot ([`SST_BYTES`] each at most) and ingested
/// (RocksDB links them into the tree above the range delete), so they
/// never pass through the memtables or the write-ahead log: memory stays at
/// one frame and one SST block, however large the state.
pub(crate) fn replace_state(
    db: &DB,
    file: &SnapshotFile,
    meta: &SnapshotMeta,
    blob: File,
    gate: &AppliedIndex,
) -> Result<AppliedState, InstallError> {
    let cfs = Handles::of(db)?;
    let mut clear = WriteBatch::default();
    // Clear the old data: one range delete covers every key below 0xff (all
    // of the core's keyspace); anything at or above it is deleted one by one.
    let high: &[u8] = &[0xff];
    clear.delete_range_cf(cfs.sm_data, &[][..], high);
    let mut it = db.raw_iterator_cf(cfs.sm_data);
    it.seek(high);
    while let Some(key) = it.key() {
        clear.delete_cf(cfs.sm_data, key);
        it.next();
    }
    it.status()?;
    drop(it);
    gate.begin_install();
    db.write_opt(clear, &WriteOptions::default())?;

    // LZ4 whatever `StorageOptions::compression` says (the state machine
    // does not know it): RocksDB reads either, and compactions rewrite the
    // rows with the column family's own setting.
    let mut sst_opts = Options::default();
    sst_opts.set_compression_type(DBCompressionType::Lz4);
    let mut files = Vec::new();
    let mut open: Option<SstFileWriter<'_>> = None;
    let found = snapshot_format::read_blob(BufReader::new(blob), |key, value| {
        let writer = match open.as_mut() {
            Some(w) => w,
            None => {
                let path = file.sst_path(files.len());
                let w = SstFileWriter::create(&sst_opts);
                w.open(&path).map_err(io::Error::other)?;
                files.push(path);
                open.insert(w)
            }
        };
        writer.put(&key, &value).map_err(io::Error::other)?;
        if writer.file_size() >= SST_BYTES {
            if let Some(mut full) = open.take() {
                full.finish().map_err(io::Error::other)?;
            }
        }
        Ok(())
    })?;
    if let Some(mut last) = open.take() {
        last.finish()?;
    }
    if found != *meta {
        // The file changed under us after it was checked: the disk lies.
        return Err(InstallError::Mismatch {
            found: Box::new(found),
            expected: Box::new(meta.clone()),
        });
    }
    if !files.is_empty() {
        let mut ingest = IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        db.ingest_external_file_cf_opts(cfs.sm_data, &ingest, files.clone())?;
    }
    for path in &files {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    let state = AppliedState {
        last_applied: meta.last_log_id,
        membership: meta.last_membership.clone(),
    };
    let mut batch = WriteBatch::default();
    state.write_into(&mut batch, cfs.sm_meta)?;
    let mut synced = WriteOptions::default();
    synced.set_sync(true);
    db.write_opt(batch, &synced)?;
    gate.end_install();
    Ok(state)
}

/// At open: if the current snapshot is newer than the applied state, an
/// install was cut short (see the module docs); finish it. Returns the
/// applied state to start from.
pub(crate) fn finish_interrupted(
    db: &DB,
    file: &SnapshotFile,
    state: AppliedState,
) -> Result<AppliedState, StorageError> {
    let corrupt = |e: &dyn std::fmt::Display| StorageError::Corrupt {
        what: "current snapshot",
        detail: e.to_string(),
    };
    let Some(snapshot) = file.current().map_err(|e| corrupt(&e))? else {
        return Ok(state);
    };
    if snapshot.last_log_id <= state.last_applied {
        return Ok(state);
    }
    tracing::warn!(
        snapshot = %snapshot,
        last_applied = ?state.last_applied,
        "a snapshot install was cut short; installing the current snapshot again"
    );
    let (meta, blob) = file
        .load()
        .map_err(|e| corrupt(&e))?
        .ok_or_else(|| corrupt(&"the current snapshot vanished"))?;
    replace_state(db, file, &meta, blob, &AppliedIndex::default()).map_err(|e| match e {
        // A full or failing disk is not a damaged one: say which it is.
        InstallError::Io(source) => StorageError::Io {
            what: "finish the interrupted install of the current snapshot in",
            path: file.dir().to_path_buf(),
            source,
        },
        InstallError::Rocks(e) => StorageError::RocksDb(e),
        InstallError::Store(e) => e,
        other => StorageError::Corrupt {
            what: "interrupted snapshot install",
            detail: format!("could not finish it: {other}"),
        },
    })
}

/// What the log store checks before it purges entries up to a log id: that
/// they are kept elsewhere, in the current snapshot or in the applied
/// state.
///
/// openraft 0.9 purged the log a snapshot covers as soon as it had queued
/// the snapshot's install, without waiting for it. openraft 0.10's
/// `PurgeLog` waits for a snapshot covering it to be flushed, which makes
/// this check redundant there; it is kept (it costs nothing when the
/// snapshot is already in place) until the snapshot tests show it can go. A crash after such a purge but before the snapshot
/// file is saved would leave a replica whose log starts past its applied
/// state, with nothing to rebuild the gap from. So while a snapshot is
/// being received, a purge past what the current snapshot and the applied
/// state hold waits: the install saves the checked snapshot as current (its
/// first step) and the purge goes on from there; from then on a crash is
/// repaired at open ([`finish_interrupted`]). Other purges (behind a
/// snapshot this replica built, or openraft's conformance suite purging
/// bare logs) do not wait.
#[derive(Clone)]
pub(crate) struct Covered {
    pub(crate) file: Arc<SnapshotFile>,
    pub(crate) applied: Arc<AppliedIndex>,
    /// Set when a snapshot starts arriving, cleared once one is saved.
    pub(crate) receiving: Arc<std::sync::atomic::AtomicBool>,
}

impl Covered {
    /// Whether a purge up to `upto` may go ahead: no snapshot is being
    /// received, or every entry up to `upto` is in the current snapshot or
    /// applied (the purge's synced write makes the applies durable too).
    pub(crate) fn covers(&self, upto: &LogId) -> bool {
        !self.receiving.load(std::sync::atomic::Ordering::SeqCst)
            || self.file.current_log_id() >= Some(*upto)
            || self.applied.get() >= Some(upto.index)
    }

    /// Wait until [`Covered::covers`] holds for `upto`, saying so every
    /// 10 s while it does not.
    pub(crate) async fn wait(&self, upto: LogId) {
        let started = std::time::Instant::now();
        let mut warned = std::time::Duration::ZERO;
        while !self.covers(&upto) {
            let waited = started.elapsed();
            if waited >= warned + std::time::Duration::from_secs(10) {
                warned = waited;
                tracing::warn!(%upto, ?waited, "the log purge waits for the snapshot that covers it");
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}
