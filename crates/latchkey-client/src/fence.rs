//! The fence gate: how external storage refuses writes from a lock holder
//! that has been superseded ([`FenceGate`], with [`MemoryFenceGate`] and
//! [`FileFenceGate`]). The rules and the state file's format are documented
//! on those types.
//!
//! This room imports no other module of the client: a gate runs in the
//! storage service, not in the lock holder, and needs no cluster. (The
//! holder's fenced writes to latchkey's own KV are in `lock/fenced.rs`.)

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::iter;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// What a storage service asks before performing a fenced write.
///
/// A lease-based lock cannot stop a paused holder (GC pause, SIGSTOP,
/// partition) from acting after its lease ran out; only the resource can.
/// Every exclusive grant of a latchkey lock carries a fencing token, strictly
/// increasing across the cluster. A storage service that puts a
/// [`FenceGate`] in front of its writes remembers the highest token it has
/// seen per resource and refuses anything older: client 1 gets token 33 and
/// pauses, its lease expires, client 2 gets token 34 and writes; when client
/// 1 wakes and writes with 33, the gate has seen 34 and refuses.
///
/// A gate knows nothing of the network or of the lock API: a token is a
/// plain `u64`, a resource is any `&str` the storage service chooses (a
/// bucket, a file, a table row, usually the lock's name).
///
/// Implementations are shared between the threads serving writes, hence
/// `Send + Sync`.
///
/// # Rules
///
/// Every implementation of [`FenceGate`] follows these (the conformance
/// suite in `tests/fence.rs` checks them):
///
/// 1. **Per resource.** Each resource has its own highest token. Resource
///    names are compared byte for byte, without normalisation; any string,
///    including the empty one, is a valid name.
/// 2. **Zero is refused.** latchkey never issues token 0, so a 0 is a bug in
///    the caller (an unset default): [`FenceError::ZeroToken`].
/// 3. **Lower is refused.** A token lower than the highest seen for the
///    resource is refused with [`FenceError::Stale`]: a newer holder has
///    written and the caller must stop.
/// 4. **Equal is accepted.** The same holder writing again:
///    [`Admission::Repeated`]. Nothing changes and nothing is written.
/// 5. **Higher (or first) is accepted and recorded** before `admit`
///    returns: [`Admission::Raised`]. For a durable gate, recorded means
///    on disk.
/// 6. **Atomic per resource.** The comparison and the update happen as one
///    step: of concurrent admissions, every accepted token is at least every
///    token accepted before it, and the final highest is the largest
///    accepted token.
/// 7. **An error admits nothing.** Whatever the error, the gate's state is
///    unchanged and the caller must not perform the write.
/// 8. **Never forgets.** The highest token only grows; there is no expiry.
///    Forgetting a resource would readmit its stale writers.
///
/// The gate only enforces order: a writer whose token is the highest seen is
/// admitted even if its lock has since expired, until a newer holder writes.
/// That is what fencing promises; for a linearizable "is this grant still
/// current?" ask the cluster
/// ([`Client::check_sequencer`](crate::Client::check_sequencer)).
///
/// # Guarding a storage service
///
/// Admission and the write it guards must be one step per resource:
/// otherwise writer 33 could be admitted, writer 34 admitted and written,
/// and writer 33's write land last. Hold the resource's write lock across
/// both:
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// use latchkey_client::{FenceError, FenceGate, MemoryFenceGate};
///
/// /// A blob store that refuses writes from superseded lock holders.
/// struct BlobStore<G> {
///     gate: G,
///     blobs: Mutex<HashMap<String, Vec<u8>>>,
/// }
///
/// impl<G: FenceGate> BlobStore<G> {
///     /// `guard_token` is the fencing token of the writer's lock guard,
///     /// sent along with the request.
///     fn write(&self, resource: &str, guard_token: u64, data: &[u8]) -> Result<(), FenceError> {
///         // Admission and write under the same lock: no writer slips between.
///         let mut blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
///         self.gate.admit(resource, guard_token)?;
///         blobs.insert(resource.to_owned(), data.to_vec());
///         Ok(())
///     }
/// }
///
/// # fn main() -> Result<(), FenceError> {
/// let store = BlobStore { gate: MemoryFenceGate::new(), blobs: Mutex::default() };
/// store.write("reports/q3", 33, b"draft by client 1")?; // client 1 holds token 33
/// // Client 1 pauses, its lease expires; client 2 acquires the lock (token 34).
/// store.write("reports/q3", 34, b"final by client 2")?;
/// // Client 1 wakes up and writes with its old token: refused.
/// let err = store.write("reports/q3", 33, b"late draft").unwrap_err();
/// assert!(matches!(err, FenceError::Stale { token: 33, highest: 34, .. }));
/// assert_eq!(
///     err.to_string(),
///     "token 33 is older than 34 already seen for resource \"reports/q3\": \
///      a newer lock holder has written; this writer must stop"
/// );
/// # Ok(()) }
/// ```
///
/// For a gate that remembers across restarts use [`FileFenceGate`]; a
/// storage service that restarts with an empty [`MemoryFenceGate`] would
/// readmit every stale writer.
pub trait FenceGate: Send + Sync {
    /// Admit a write to `resource` carrying the fencing `token`.
    ///
    /// Accepts a token not lower than the highest seen for `resource` and
    /// records it as the new highest; refuses a lower one with
    /// [`FenceError::Stale`] and token 0 with [`FenceError::ZeroToken`].
    /// On any error nothing is recorded and the write must not happen.
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError>;

    /// The highest token admitted for `resource`, or `None` if none was.
    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError>;
}

/// A token admitted by [`FenceGate::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The token is higher than any seen for the resource (or the first
    /// one); it is now the resource's highest.
    Raised {
        /// The highest token before this one, `None` for the first token.
        previous: Option<u64>,
    },
    /// The token equals the highest already seen: the same holder writing
    /// again. Nothing changed.
    Repeated,
}

/// Why a fence gate did not admit a write. On every variant, nothing was
/// admitted: do not perform the write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer lock holder has written to this resource. The writer holding
    /// `token` lost its lock and must stop; retrying with the same token
    /// will never succeed.
    #[error(
        "token {token} is older than {highest} already seen for resource {resource:?}: \
         a newer lock holder has written; this writer must stop"
    )]
    Stale {
        /// The resource written to.
        resource: String,
        /// The refused token.
        token: u64,
        /// The highest token seen for the resource.
        highest: u64,
    },
    /// Token 0 is never issued by latchkey: the caller passed an unset
    /// value instead of its lock guard's fencing token.
    #[error(
        "token 0 for resource {resource:?} was never issued by latchkey (tokens start at 1): \
         pass the fencing token of the writer's lock guard"
    )]
    ZeroToken {
        /// The resource written to.
        resource: String,
    },
    /// The state file of a [`FileFenceGate`] is damaged, truncated or not a
    /// fence state file. The gate does not open rather than forget tokens.
    #[error(
        "fence state file {} is corrupt: {detail}; the gate will not start with an unknown \
         set of tokens: restore the file from a backup, or move it aside to start empty only \
         once every writer holding an old token has stopped",
        path.display()
    )]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// Reading or durably writing the state of a [`FileFenceGate`] failed.
    /// During [`FenceGate::admit`] the token was not admitted and the gate
    /// still remembers what it did before; the write may be retried once
    /// the cause (full disk, permissions, missing directory) is fixed.
    #[error(
        "fence state I/O failed: could not {action} {}: {source}; nothing was admitted",
        path.display()
    )]
    Io {
        /// What the gate was doing.
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// The decision shared by every gate: what admitting `token` does to a
/// resource whose highest token is `highest`.
fn decide(resource: &str, token: u64, highest: Option<u64>) -> Result<Admission, FenceError> {
    if token == 0 {
        return Err(FenceError::ZeroToken {
            resource: resource.to_owned(),
        });
    }
    match highest {
        Some(highest) if token < highest => Err(FenceError::Stale {
            resource: resource.to_owned(),
            token,
            highest,
        }),
        Some(highest) if token == highest => Ok(Admission::Repeated),
        previous => Ok(Admission::Raised { previous }),
    }
}

/// Lock a gate's table. A panic while holding the lock cannot leave the
/// table half-updated (each admission changes it with one `insert`, after
/// any I/O), so a poisoned lock is simply taken over.
fn lock_table<T>(table: &Mutex<T>) -> MutexGuard<'_, T> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fence gate held in memory: fast, and forgets everything when the
/// process ends. Fit for tests and for storage whose own contents do not
/// outlive the process; otherwise use [`FileFenceGate`].
#[derive(Debug, Default)]
pub struct MemoryFenceGate {
    highest: Mutex<BTreeMap<String, u64>>,
}

impl MemoryFenceGate {
    /// An empty gate: no token seen for any resource.
    pub fn new() -> Self {
        Self::default()
    }
}

impl FenceGate for MemoryFenceGate {
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError> {
        let mut table = lock_table(&self.highest);
        let admission = decide(resource, token, table.get(resource).copied())?;
        if let Admission::Raised { .. } = admission {
            table.insert(resource.to_owned(), token);
        }
        Ok(admission)
    }

    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError> {
        Ok(lock_table(&self.highest).get(resource).copied())
    }
}

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

/// First line of a state file: format name and version.
const HEADER: &str = "latchkey-fence 1";
/// What every state file's first line starts with, whatever the version.
const FORMAT_NAME: &str = "latchkey-fence ";
/// What the last line of a state file starts with.
const END: &str = "end\t";

/// FNV-1a, 64 bit (as the snapshot format): enough to catch damaged or
/// truncated files; it detects every change of a single byte.
fn checksum(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The state file holding `entries` (in the order given).
fn encode<'a>(entries: impl Iterator<Item = (&'a str, u64)>) -> Vec<u8> {
    let mut out = String::with_capacity(64);
    out.push_str(HEADER);
    out.push('\n');
    let mut count = 0u64;
    for (resource, token) in entries {
        escape_into(&mut out, resource);
        out.push('\t');
        out.push_str(&token.to_string());
        out.push('\n');
        count += 1;
    }
    let sum = checksum(out.as_bytes());
    out.push_str(&format!("{END}{count}\t{sum:016x}\n"));
    out.into_bytes()
}

/// Read a state file; the error says what is wrong with it.
fn decode(bytes: &[u8]) -> Result<BTreeMap<String, u64>, String> {
    if bytes.is_empty() {
        return Err("the file is empty (a truncated write?)".to_owned());
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| format!("not UTF-8 text (bad byte at offset {})", e.valid_up_to()))?;
    let first = text.split('\n').next().unwrap_or_default();
    if !text.contains('\n') && HEADER.starts_with(text) {
        return Err("the first line is incomplete: the file is truncated".to_owned());
    }
    if first != HEADER {
        return Err(match first.strip_prefix(FORMAT_NAME) {
            Some(version) => format!(
                "format version {version:?} is not known to this build, which reads version 1 \
                 (was it written by a newer latchkey?)"
            ),
            None => format!("not a latchkey fence state file (first line {first:?})"),
        });
    }
    let Some(content) = text.strip_suffix('\n') else {
        return Err("the last line is incomplete: the file is truncated".to_owned());
    };
    let (body, end) = match content.rfind('\n') {
        Some(i) => content.split_at(i + 1),
        None => ("", content),
    };
    let Some(end) = end.strip_prefix(END) else {
        return Err("no end line: the file is truncated".to_owned());
    };
    let (count, sum) = end
        .split_once('\t')
        .ok_or_else(|| format!("malformed end line {end:?}"))?;
    let count = parse_decimal(count).ok_or_else(|| format!("malformed entry count {count:?}"))?;
    let computed = format!("{:016x}", checksum(body.as_bytes()));
    if sum != computed {
        return Err(format!(
            "checksum mismatch (stored {sum:?}, computed {computed:?}): the file is damaged"
        ));
    }
    let entries = body
        .strip_prefix(HEADER)
        .and_then(|rest| rest.strip_prefix('\n'))
        .ok_or_else(|| "no entries section after the first line".to_owned())?;
    let mut table = BTreeMap::new();
    for (index, line) in entries.split_terminator('\n').enumerate() {
        let line_no = index + 2;
        let (resource, token) = line
            .split_once('\t')
            .ok_or_else(|| format!("line {line_no}: no tab between resource and token"))?;
        let resource = unescape(resource).map_err(|e| format!("line {line_no}: {e}"))?;
        let token = parse_decimal(token)
            .ok_or_else(|| format!("line {line_no}: malformed token {token:?}"))?;
        if token == 0 {
            return Err(format!(
                "line {line_no}: token 0 for resource {resource:?} (never issued)"
            ));
        }
        if table.insert(resource, token).is_some() {
            return Err(format!("line {line_no}: resource appears twice"));
        }
    }
    if table.len() as u64 != count {
        return Err(format!(
            "the end line counts {count} entries but {} were found",
            table.len()
        ));
    }
    Ok(table)
}

/// A decimal `u64` in canonical form: digits only, no sign, no leading zero.
fn parse_decimal(text: &str) -> Option<u64> {
    let value = text.parse::<u64>().ok()?;
    (value.to_string() == text).then_some(value)
}

/// Append `resource`, escaped, to `out`.
fn escape_into(out: &mut String, resource: &str) {
    for c in resource.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

/// The resource name written as `escaped`.
fn unescape(escaped: &str) -> Result<String, String> {
    let mut out = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\') => out.push('\\'),
                Some('t') => out.push('\t'),
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some(other) => return Err(format!("unknown escape \\{other} in resource")),
                None => return Err("resource ends with a lone backslash".to_owned()),
            },
            '\r' => return Err("unescaped carriage return in resource".to_owned()),
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_round_trips() {
        for name in [
            "",
            "plain",
            "a\tb",
            "line\nbreak",
            "cr\r",
            "back\\slash",
            "\\t",
            "é✓",
        ] {
            let mut escaped = String::new();
            escape_into(&mut escaped, name);
            assert!(!escaped.contains(['\t', '\n', '\r']), "{escaped:?}");
            assert_eq!(unescape(&escaped).as_deref(), Ok(name));
        }
    }

    #[test]
    fn encode_then_decode_is_identity() {
        let table: BTreeMap<String, u64> = [("a".to_owned(), 1), ("b\t\\".to_owned(), u64::MAX)]
            .into_iter()
            .collect();
        let bytes = encode(table.iter().map(|(r, t)| (r.as_str(), *t)));
        assert_eq!(decode(&bytes), Ok(table));
        assert_eq!(decode(&encode(iter::empty())), Ok(BTreeMap::new()));
    }

    #[test]
    fn canonical_decimals_only() {
        assert_eq!(parse_decimal("42"), Some(42));
        for bad in ["", "+4", "042", "-1", " 4", "4 ", "18446744073709551616"] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }
}
