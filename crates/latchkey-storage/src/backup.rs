//! Backups of the applied state, and restoring one into a new data
//! directory.
//!
//! A backup is a snapshot blob (the format a snapshot file and a snapshot
//! install use, see `snapshot_format`: magic, framed rows in key order, a
//! row count and a trailing FNV-1a 64 checksum of everything before it) of
//! every state-machine row as of one RocksDB snapshot, so it holds whole
//! apply batches only: the data, sessions, locks, sequences, counters and
//! access control at one log index ([`BackupMeta::last_index`]).
//!
//! [`restore`] seeds a **new** data directory with a backup's rows (through
//! a caller's transform, which moves counters on: see
//! `latchkey_core::backup`) and nothing else: no log, no vote, no
//! membership. The directory is then an ordinary new one except for those
//! rows and a restore seed recorded beside them
//! ([`StateReader::restored_seed`]): the
//! replica forms a new cluster from its initial members as any new one
//! does, and its bootstrap insists that every initial member carries the
//! same seed, so a cluster never forms from members restored differently
//! (or not at all), whose states would differ.

use std::path::Path;

use latchkey_core::codec;
use rocksdb::WriteBatch;

use crate::columns::Handles;
use crate::error::StorageError;
use crate::snapshot_format::{self, BlobError, BlobWriter};
use crate::state_reader::StateReader;
use crate::types::{LogId, SnapshotMeta, StoredMembership};

/// `sm_meta` key of the restore seed (codec `u64`), present only in a data
/// directory made by [`restore`].
const RESTORED: &[u8] = b"restored";
/// A restore writes rows in batches of about this many bytes.
const BATCH_BYTES: usize = 4 * 1024 * 1024;

/// What a backup describes besides its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupMeta {
    /// The last log entry whose effects it holds.
    pub last_log_id: Option<LogId>,
    /// The membership of the cluster it was taken from.
    pub membership: StoredMembership,
    /// The blob's checksum (its last 8 bytes).
    pub checksum: u64,
}

impl BackupMeta {
    /// The index of the last log entry it holds (0 when none).
    pub fn last_index(&self) -> u64 {
        self.last_log_id.map_or(0, |id| id.index)
    }
}

/// A backup could not be made, read or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// The bytes are not an intact backup (wrong format, damaged or cut
    /// short: the checksum, the frames and the row count are all checked).
    #[error("not an intact latchkey backup: {0}")]
    Damaged(String),
    /// A restore goes into a new data directory only.
    #[error(
        "the data directory {0:?} is not empty: a restore seeds a new directory only (move the \
         old one away first)"
    )]
    NotEmpty(std::path::PathBuf),
    /// The caller's transform refused a row.
    #[error("cannot restore: {0}")]
    Refused(String),
    /// The store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The replica cannot read its state now (it is installing a snapshot
    /// from the leader); ask another replica or retry.
    #[error("cannot back up this replica now: {0}")]
    Unavailable(String),
}

impl From<latchkey_core::StoreError> for BackupError {
    fn from(e: latchkey_core::StoreError) -> Self {
        BackupError::Unavailable(e.0)
    }
}

impl From<BlobError> for BackupError {
    fn from(e: BlobError) -> Self {
        BackupError::Damaged(e.to_string())
    }
}

impl From<rocksdb::Error> for BackupError {
    fn from(e: rocksdb::Error) -> Self {
        BackupError::Storage(StorageError::RocksDb(e))
    }
}

impl StateReader {
    /// A backup of everything applied, as of one RocksDB snapshot (whole
    /// apply batches only). Blocking: run it off the async runtime. For a
    /// backup that holds every write acknowledged before it was asked for,
    /// first make sure (a linearizable read's barrier) that the applied
    /// index has reached the read index.
    ///
    /// Refused ([`BackupError::Unavailable`]) while a snapshot install is
    /// replacing the state.
    pub fn backup(&self) -> Result<(BackupMeta, Vec<u8>), BackupError> {
        self.applied.gated(|| self.backup_now())
    }

    fn backup_now(&self) -> Result<(BackupMeta, Vec<u8>), BackupError> {
        let cfs = Handles::of(&self.db)?;
        let view = self.db.snapshot();
        let state = crate::applied_state::AppliedState::read(|k| view.get_cf(cfs.sm_meta, k))
            .map_err(|e| StorageError::Corrupt {
                what: "state machine metadata",
                detail: e.to_string(),
            })?;
        let meta = SnapshotMeta {
            last_log_id: state.last_applied,
            last_membership: state.membership,
        };
        let mut writer = BlobWriter::new(Vec::new(), &meta)?;
        let mut it = view.raw_iterator_cf(cfs.sm_data);
        it.seek_to_first();
        while let Some((key, value)) = it.item() {
            writer.push(key, value)?;
            it.next();
        }
        it.status()?;
        let blob = writer.finish()?;
        let meta = backup_meta(meta, &blob);
        Ok((meta, blob))
    }

    /// The seed of the backup this data directory was restored from
    /// ([`restore`]), if it was.
    pub fn restored_seed(&self) -> Result<Option<u64>, StorageError> {
        let cfs = Handles::of(&self.db)?;
        self.db
            .get_cf(cfs.sm_meta, RESTORED)?
            .map(|b| codec::decode::<u64>(&b))
            .transpose()
            .map_err(|e| StorageError::Corrupt {
                what: "restore seed",
                detail: e.to_string(),
            })
    }
}

fn backup_meta(meta: SnapshotMeta, blob: &[u8]) -> BackupMeta {
    BackupMeta {
        last_log_id: meta.last_log_id,
        membership: meta.last_membership,
        checksum: snapshot_format::stored_checksum(blob).unwrap_or(0),
    }
}

/// Check `blob` whole (magic, checksum, frames, key order, row count) and
/// give every row to `row`, in key order. `row` sees rows before the check
/// is complete: act on them only once this returns `Ok`.
pub fn read_backup(
    blob: &[u8],
    row: impl FnMut(Vec<u8>, Vec<u8>),
) -> Result<BackupMeta, BackupError> {
    let mut row = row;
    let meta = snapshot_format::read_blob(blob, |key, value| {
        row(key, value);
        Ok(())
    })?;
    Ok(backup_meta(meta, blob))
}

/// The restore seed of `blob` restored with `plan` (never 0).
fn seed_of(blob: &[u8], plan: &[u8]) -> u64 {
    let mut bytes = snapshot_format::stored_checksum(blob)
        .unwrap_or(0)
        .to_be_bytes()
        .to_vec();
    bytes.extend_from_slice(plan);
    snapshot_format::checksum(&bytes).max(1)
}

/// Seed the new data directory `dir` with the rows of `blob`, each value
/// passed through `transform(key, value)` (which may leave a row out with
/// `None`, or refuse it: nothing is written then), then the rows of `extra` (rows the backup lacks), and
/// record the restore's seed: a digest of the backup's checksum and `plan`,
/// the caller's description of everything else that makes the restored
/// state what it is (the transform's parameters, the members), so members
/// restored alike report the same seed (see the module docs).
///
/// The whole backup is checked before anything is written, and `dir` must
/// not exist or be empty. The directory is built beside it
/// (`<dir>.restoring`), synced, and renamed into place: a restore that
/// fails or is cut short leaves no directory that looks new or restored.
pub fn restore(
    dir: &Path,
    blob: &[u8],
    plan: &[u8],
    mut transform: impl FnMut(&[u8], &[u8]) -> Result<Option<Vec<u8>>, String>,
    extra: &[(Vec<u8>, Vec<u8>)],
) -> Result<BackupMeta, BackupError> {
    let seed = seed_of(blob, plan);
    let mut refused = None;
    read_backup(blob, |key, value| {
        if refused.is_none() {
            if let Err(why) = transform(&key, &value) {
                refused = Some(why);
            }
        }
    })?;
    if let Some(why) = refused {
        return Err(BackupError::Refused(why));
    }
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| BackupError::Storage(StorageError::Io { what, path, source })
    };
    let target_exists = match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::NotEmpty(dir.to_path_buf()));
            }
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(source) => return Err(io("read data directory", dir)(source)),
    };
    let mut building = dir.as_os_str().to_owned();
    building.push(".restoring");
    let building = std::path::PathBuf::from(building);
    if building.exists() {
        // What an earlier restore left when it failed or was cut short.
        std::fs::remove_dir_all(&building).map_err(io("remove", &building))?;
    }
    let meta = {
        let (_log, sm) = crate::open(&building, crate::StorageOptions::default())?;
        let reader = sm.reader();
        let db = &reader.db;
        let cfs = Handles::of(db)?;
        let mut batch = WriteBatch::default();
        let mut failed = None;
        let meta = read_backup(blob, |key, value| {
            if failed.is_some() {
                return;
            }
            match transform(&key, &value) {
                Ok(Some(value)) => batch.put_cf(cfs.sm_data, &key, &value),
                Ok(None) => {}
                Err(why) => failed = Some(BackupError::Refused(why)),
            }
            if batch.size_in_bytes() >= BATCH_BYTES {
                if let Err(e) = db.write(std::mem::take(&mut batch)) {
                    failed = Some(e.into());
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        for (key, value) in extra {
            batch.put_cf(cfs.sm_data, key, value);
        }
        let encoded = codec::encode(&seed).map_err(|e| BackupError::Damaged(e.to_string()))?;
        batch.put_cf(cfs.sm_meta, RESTORED, encoded);
        db.write(batch)?;
        db.flush_wal(true)?;
        meta
        // The store closes here, before the directory moves.
    };
    if target_exists {
        std::fs::remove_dir(dir).map_err(io("remove the empty", dir))?;
    }
    std::fs::rename(&building, dir).map_err(io("rename into place", dir))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(io("sync the parent of", dir))?;
    tracing::info!(dir = %dir.display(), last_index = meta.last_index(), seed, "restored a backup");
    Ok(meta)
}
