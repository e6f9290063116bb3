//! [`SnapshotFile`]: the current snapshot, kept durably as one file so that
//! `get_current_snapshot` survives restarts.
//!
//! A new snapshot is written to a temporary file in the same directory
//! ([`SnapshotFile::stage`]), fsynced, renamed over the current one, and the
//! directory is fsynced ([`SnapshotFile::commit`]): after a crash the current
//! file is either the old snapshot or the new one, never a mix. Temporary
//! files a crash left behind are removed when the directory is opened.
//! Snapshots are never held in memory whole: they are written and read as
//! files, one frame at a time (see `snapshot_format`).

use std::fs::{self, File};
use std::io::{self, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use tempfile::NamedTempFile;

use crate::error::StorageError;
use crate::snapshot_format;
use crate::types::SnapshotMeta;

const CURRENT: &str = "current.snap";
/// Every temporary file is named `<prefix>...<TEMP_SUFFIX>`.
const TEMP_SUFFIX: &str = ".tmp";

/// The directory holding the current snapshot. Shared by the state machine
/// (installs) and snapshot builders (which run concurrently with it).
pub(crate) struct SnapshotFile {
    dir: PathBuf,
    /// Meta of the current snapshot; the lock also serializes commits.
    current: Mutex<Option<SnapshotMeta>>,
}

fn poisoned() -> io::Error {
    io::Error::other("snapshot file lock poisoned by a panic")
}

impl SnapshotFile {
    /// Open (creating) the snapshot directory, remove what interrupted
    /// writes left, and check the current snapshot whole (it is read once,
    /// a frame at a time), keeping its meta.
    pub(crate) fn open(dir: &Path) -> Result<Self, StorageError> {
        let io_err = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| StorageError::Io { what, path, source }
        };
        fs::create_dir_all(dir).map_err(io_err("create snapshot directory", dir))?;
        for entry in fs::read_dir(dir).map_err(io_err("list snapshot directory", dir))? {
            let entry = entry.map_err(io_err("list snapshot directory", dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Ours, and what `tempfile` names a file when it cannot make an
            // unnamed one.
            if name.ends_with(TEMP_SUFFIX) || name.starts_with(".tmp") {
                // An interrupted build or install; the current file is whole.
                let path = entry.path();
                fs::remove_file(&path).map_err(io_err("remove", &path))?;
            }
        }
        let path = dir.join(CURRENT);
        let current = match File::open(&path) {
            Ok(file) => Some(snapshot_format::verify(BufReader::new(file)).map_err(|e| {
                StorageError::Corrupt {
                    what: "current snapshot",
                    detail: e.to_string(),
                }
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("open", &path)(e)),
        };
        Ok(SnapshotFile {
            dir: dir.to_path_buf(),
            current: Mutex::new(current),
        })
    }

    fn lock(&self) -> io::Result<MutexGuard<'_, Option<SnapshotMeta>>> {
        self.current.lock().map_err(|_| poisoned())
    }

    /// The directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last log id the current snapshot covers (`None` without one).
    /// A poisoned lock still holds the meta of the file in place (it is
    /// set only after the rename).
    pub(crate) fn current_log_id(&self) -> Option<crate::types::LogId> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().and_then(|m| m.last_log_id)
    }

    /// The current snapshot file's size in bytes (0 without one, or if it
    /// cannot be read: the snapshot pace then treats it as small).
    pub(crate) fn current_bytes(&self) -> u64 {
        std::fs::metadata(self.dir.join(CURRENT)).map_or(0, |m| m.len())
    }

    /// The current snapshot's meta, if there is one.
    pub(crate) fn current(&self) -> io::Result<Option<SnapshotMeta>> {
        Ok(self.lock()?.clone())
    }

    /// A new temporary file in the snapshot directory, removed when dropped
    /// unless committed.
    pub(crate) fn stage(&self, purpose: &str) -> io::Result<NamedTempFile> {
        tempfile::Builder::new()
            .prefix(purpose)
            .suffix(TEMP_SUFFIX)
            .tempfile_in(&self.dir)
    }

    /// Where an install writes its `n`th SST file (a temporary file: the
    /// install removes it once ingested, and opening removes leftovers).
    pub(crate) fn sst_path(&self, n: usize) -> PathBuf {
        self.dir.join(format!("ingest-{n}.sst{TEMP_SUFFIX}"))
    }

    /// A temporary file for bytes received from the leader: it has no name,
    /// so it disappears when dropped or when the process dies.
    pub(crate) fn incoming(&self) -> io::Result<File> {
        tempfile::tempfile_in(&self.dir)
    }

    /// Make the blob in `staged` (described by `meta`) the current
    /// snapshot, durably. Returns whether it was made current, and the
    /// file, open and rewound, for reading.
    ///
    /// With `only_if_newer`, a snapshot older than the current one is not
    /// made current (a build that raced with an install); the file is then
    /// returned unlinked.
    pub(crate) fn commit(
        &self,
        staged: NamedTempFile,
        meta: &SnapshotMeta,
        only_if_newer: bool,
    ) -> io::Result<(bool, File)> {
        let mut current = self.lock()?;
        if only_if_newer {
            if let Some(cur) = current.as_ref() {
                if cur.last_log_id > meta.last_log_id {
                    tracing::info!(built = %meta, current = %cur, "not saving a snapshot older than the current one");
                    let mut file = staged.into_file();
                    file.seek(SeekFrom::Start(0))?;
                    return Ok((false, file));
                }
            }
        }
        staged.as_file().sync_all()?;
        let mut file = staged
            .persist(self.dir.join(CURRENT))
            .map_err(|e| e.error)?;
        File::open(&self.dir)?.sync_all()?;
        *current = Some(meta.clone());
        file.seek(SeekFrom::Start(0))?;
        Ok((true, file))
    }

    /// The current snapshot's meta and file (open at its start), checked
    /// whole for damage first.
    pub(crate) fn load(&self) -> io::Result<Option<(SnapshotMeta, File)>> {
        let current = self.lock()?;
        let Some(expected) = current.as_ref() else {
            return Ok(None);
        };
        let mut file = File::open(self.dir.join(CURRENT))?;
        let meta = snapshot_format::verify(BufReader::new(&file)).map_err(io::Error::other)?;
        if meta != *expected {
            return Err(io::Error::other(format!(
                "the current snapshot file describes {meta}, but {expected} was saved"
            )));
        }
        file.seek(SeekFrom::Start(0))?;
        Ok(Some((meta, file)))
    }
}
