//! [`SnapshotFile`]: the current snapshot, kept durably as one file so that
//! `get_current_snapshot` survives restarts.
//!
//! A new snapshot is written to a temporary file, fsynced, renamed over the
//! current one, and the directory is fsynced: after a crash the current file
//! is either the old snapshot or the new one, never a mix.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::error::StorageError;
use crate::snapshot_format;
use crate::types::SnapshotMeta;

const CURRENT: &str = "current.snap";
const TEMPORARY: &str = "current.snap.tmp";

/// The directory holding the current snapshot. Shared by the state machine
/// (installs) and snapshot builders (which run concurrently with it).
pub(crate) struct SnapshotFile {
    dir: PathBuf,
    /// Meta of the current snapshot; the lock also serializes file writes.
    current: Mutex<Option<SnapshotMeta>>,
}

fn poisoned() -> io::Error {
    io::Error::other("snapshot file lock poisoned by a panic")
}

impl SnapshotFile {
    /// Open (creating) the snapshot directory and read the current
    /// snapshot's meta, if there is one.
    pub(crate) fn open(dir: &Path) -> Result<Self, StorageError> {
        let io_err = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| StorageError::Io { what, path, source }
        };
        fs::create_dir_all(dir).map_err(io_err("create snapshot directory", dir))?;
        let tmp = dir.join(TEMPORARY);
        if tmp.exists() {
            // An interrupted write; the current file is still whole.
            fs::remove_file(&tmp).map_err(io_err("remove", &tmp))?;
        }
        let path = dir.join(CURRENT);
        let current = match fs::read(&path) {
            Ok(blob) => {
                Some(
                    snapshot_format::read_meta(&blob).map_err(|e| StorageError::Corrupt {
                        what: "current snapshot",
                        detail: e.to_string(),
                    })?,
                )
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        Ok(SnapshotFile {
            dir: dir.to_path_buf(),
            current: Mutex::new(current),
        })
    }

    fn lock(&self) -> io::Result<MutexGuard<'_, Option<SnapshotMeta>>> {
        self.current.lock().map_err(|_| poisoned())
    }

    /// Make `blob` (described by `meta`) the current snapshot, durably.
    ///
    /// With `only_if_newer`, a snapshot older than the current one is not
    /// saved (a build that raced with an install); returns whether it was.
    pub(crate) fn save(
        &self,
        blob: &[u8],
        meta: &SnapshotMeta,
        only_if_newer: bool,
    ) -> io::Result<bool> {
        let mut current = self.lock()?;
        if only_if_newer {
            if let Some(cur) = current.as_ref() {
                if cur.last_log_id > meta.last_log_id {
                    tracing::info!(built = %meta, current = %cur, "not saving a snapshot older than the current one");
                    return Ok(false);
                }
            }
        }
        let tmp = self.dir.join(TEMPORARY);
        let mut file = File::create(&tmp)?;
        file.write_all(blob)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, self.dir.join(CURRENT))?;
        File::open(&self.dir)?.sync_all()?;
        *current = Some(meta.clone());
        Ok(true)
    }

    /// The current snapshot's meta and blob, checked for damage.
    pub(crate) fn load(&self) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        let current = self.lock()?;
        if current.is_none() {
            return Ok(None);
        }
        let blob = fs::read(self.dir.join(CURRENT))?;
        let meta = snapshot_format::read_meta(&blob).map_err(io::Error::other)?;
        Ok(Some((meta, blob)))
    }
}
