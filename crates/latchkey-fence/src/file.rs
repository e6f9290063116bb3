//! [`FileFenceGate`]: the gate that remembers across restarts, in one
//! state file (its format is in `file_format`).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::iter;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::FenceError;
use crate::file_format::{decode, encode};
use crate::gate::FenceGate;
use crate::rule::{decide, Admission};
use crate::table::lock_table;

/// A fence gate that remembers across restarts, in one state file.
///
/// Every raised token is on disk before [`FenceGate::admit`] returns; the
/// file format and the write protocol are described below. If persisting
/// fails, `admit` returns [`FenceError::Io`] and the gate keeps remembering
/// what it did before (the file may already hold the new token, which is
/// never less safe).
///
/// Exactly one gate may use a state file at a time: share one gate between
/// threads (it is `Sync`) rather than opening the file twice, in one
/// process or several, or the last writer's table overwrites the other's.
/// Deleting the state file makes the gate forget every token on the next
/// open.
///
/// # The state file
///
/// UTF-8 text, one record per line, every line ending in `\n`:
///
/// ```text
/// latchkey-fence 1
/// <resource>\t<token>
/// ...
/// end\t<entries>\t<checksum>
/// ```
///
/// - The first line names the format and its version (`1`).
/// - One line per resource, sorted by resource (readers do not depend on
///   the order). The resource is escaped: `\` as `\\`, tab as `\t`, line
///   feed as `\n`, carriage return as `\r`; every other character is
///   written as is. The token is in decimal, without sign or leading zeros,
///   and never 0. A resource appears at most once.
/// - The last line holds the number of resource lines (decimal) and the
///   FNV-1a 64 checksum of every byte before the `end` line, as 16
///   lower-case hex digits.
///
/// Anything else (a missing `end` line, a wrong count or checksum, bad
/// escapes, duplicates, a zero or malformed token, a version this build does
/// not know, an empty file) is [`FenceError::Corrupt`]: the gate refuses to
/// open rather than start with an unknown set of tokens.
///
/// Every raised token rewrites the whole file: write `<path>.tmp`, fsync
/// it, rename it over `<path>`, fsync the directory; only then is the new
/// token visible. A crash at any point leaves either the old or the new
/// file. The cost is one rewrite of all resources per raised token (a
/// repeated token costs no I/O), and admissions to one gate are serialized
/// during the rewrite: meant for up to some thousands of resources.
#[derive(Debug)]
pub struct FileFenceGate {
    path: PathBuf,
    temp: PathBuf,
    dir: PathBuf,
    highest: Mutex<BTreeMap<String, u64>>,
}

impl FileFenceGate {
    /// Open the gate stored at `path`, loading the tokens it remembers.
    ///
    /// A missing file is a gate that has seen nothing: it is created (empty)
    /// at once, so an unwritable location fails here rather than at the
    /// first admission. The directory must exist. A file that cannot be
    /// read as a complete state file is [`FenceError::Corrupt`]; the gate
    /// never opens with part of its tokens.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FenceError> {
        let path = path.as_ref().to_path_buf();
        if path.file_name().is_none() {
            return Err(FenceError::Io {
                action: "open the fence state file",
                path,
                source: io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"),
            });
        }
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut temp = path.clone().into_os_string();
        temp.push(".tmp");
        let mut gate = FileFenceGate {
            temp: PathBuf::from(temp),
            dir,
            highest: Mutex::default(),
            path,
        };
        match fs::read(&gate.path) {
            Ok(bytes) => {
                let table = decode(&bytes).map_err(|detail| FenceError::Corrupt {
                    path: gate.path.clone(),
                    detail,
                })?;
                gate.highest = Mutex::new(table);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                gate.persist(&encode(iter::empty()))?;
            }
            Err(source) => {
                return Err(FenceError::Io {
                    action: "read the fence state file",
                    path: gate.path,
                    source,
                })
            }
        }
        Ok(gate)
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Durably replace the state file with `bytes`: temp file, fsync,
    /// rename, fsync of the directory. A failure before the rename removes
    /// the temp file (best effort) and leaves the old file in place.
    fn persist(&self, bytes: &[u8]) -> Result<(), FenceError> {
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| FenceError::Io {
                action,
                path,
                source,
            }
        };
        let written = File::create(&self.temp)
            .map_err(io("create the temporary state file", &self.temp))
            .and_then(|mut file| {
                file.write_all(bytes)
                    .map_err(io("write the temporary state file", &self.temp))?;
                file.sync_all()
                    .map_err(io("fsync the temporary state file", &self.temp))
            })
            .and_then(|()| {
                fs::rename(&self.temp, &self.path)
                    .map_err(io("rename the temporary state file over", &self.path))
            });
        if let Err(e) = written {
            // Nothing useful to do if this fails too: the next persist
            // truncates the temp file anyway.
            let _ = fs::remove_file(&self.temp);
            return Err(e);
        }
        sync_dir(&self.dir).map_err(io("fsync the directory", &self.dir))
    }
}

impl FenceGate for FileFenceGate {
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError> {
        let mut table = lock_table(&self.highest);
        let admission = decide(resource, token, table.get(resource).copied())?;
        if let Admission::Raised { .. } = admission {
            // Persist the table as it will be, then update memory: a failed
            // persist leaves memory as it was.
            let below = table
                .range::<str, _>((Bound::Unbounded, Bound::Excluded(resource)))
                .map(|(r, t)| (r.as_str(), *t));
            let above = table
                .range::<str, _>((Bound::Excluded(resource), Bound::Unbounded))
                .map(|(r, t)| (r.as_str(), *t));
            let bytes = encode(below.chain(iter::once((resource, token))).chain(above));
            self.persist(&bytes)?;
            table.insert(resource.to_owned(), token);
        }
        Ok(admission)
    }

    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError> {
        Ok(lock_table(&self.highest).get(resource).copied())
    }
}

/// Make a rename in `dir` durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Make a rename in `dir` durable (not possible through std here; the
/// rename itself is atomic).
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}
