//! [`AckMark`]: the data directory's identity and the high-water mark of
//! what this replica has acknowledged, in a small file of its own.
//!
//! # Why a second file
//!
//! Raft's promises rest on every replica keeping what it acknowledged: an
//! appended entry it reported flushed may have completed a commit quorum,
//! and a vote it granted may have elected a leader. RocksDB recovers its
//! write-ahead log *point in time*: a WAL cut short (a truncated file, a
//! lost tail, a restore of an older copy of `db/`) opens without complaint
//! at an earlier state. A replica that came back like that and voted would
//! let the cluster lose committed entries, or elect two leaders in a term.
//! So every acknowledgement is first recorded here, and [`crate::open`]
//! refuses a log or a vote behind the mark ([`crate::StorageError::LostAcknowledged`]).
//!
//! # What it holds
//!
//! - `incarnation`: a random, non-zero number drawn when the data directory
//!   is first created. The cluster records each member's incarnation in its
//!   membership, and a replica refuses Raft messages addressed to another
//!   incarnation: a wiped directory is a new member, never the old one.
//! - `vote`: the last vote saved (recorded after RocksDB's synced write,
//!   before `save_vote` returns, so the mark is never ahead of the disk).
//! - `log_index`: the last log index acknowledged as flushed (recorded after
//!   each group-commit WAL sync and before the new durable index is
//!   published or any callback fires). A truncation lowers it *before* it
//!   truncates, so a crash in between leaves the mark at or below the log;
//! - `floor`: the highest index flushed while the saved vote (its term and
//!   candidate) was the current one. Those entries were acknowledged to the
//!   current leader, who may have counted them in a commit quorum, so a
//!   truncation never lowers the mark below them. Raft itself never
//!   truncates them (a leader never sends entries conflicting with what a
//!   follower matched), but openraft installing a snapshot may first
//!   truncate the log from the local commit index on: a crash before the
//!   snapshot is in place would otherwise come back with fewer acknowledged
//!   entries and a mark that agrees. With the floor it is refused instead.
//!
//! # Format and crash safety
//!
//! Two 512-byte slots at offsets 0 and 4096, written alternately with a
//! sequence number; each slot is `MAGIC`, `seq`, payload length, the codec
//! payload and a CRC-32 of all that. A write goes to the slot not holding
//! the newest record and is fdatasynced before the call returns, so a torn
//! write leaves the other slot intact. Reading takes the valid slot with the
//! higher sequence. A file with no valid slot is refused as corrupt.
//!
//! The cost is one extra `fdatasync` of a preallocated block per group
//! commit (overwriting in place: no metadata to journal).
//!
//! What this cannot detect: a *whole* data directory replaced by an older
//! copy of itself (the mark comes back with it). The leader's network layer
//! refuses a follower whose log went backwards (latchkey-server), and the
//! README's repair guide says never to restore a replica's directory from a
//! backup.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use latchkey_core::codec;
use serde::{Deserialize, Serialize};

use crate::error::StorageError;
use crate::types::Vote;

/// File name of the mark inside the data directory.
pub const MARK_FILE: &str = "acknowledged.mark";

const MAGIC: &[u8; 8] = b"LKMARK01";
const SLOT_BYTES: usize = 512;
const SLOT_OFFSETS: [u64; 2] = [0, 4096];
/// magic (8) + seq (8) + length (4) ... payload ... + crc (4)
const HEADER_BYTES: usize = 20;

/// What one slot records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkRecord {
    /// This data directory's identity (non-zero).
    pub incarnation: u64,
    /// The last vote this replica saved.
    pub vote: Option<Vote>,
    /// The last log index this replica acknowledged as flushed (0: none).
    pub log_index: u64,
    /// The highest index flushed under the current vote (see the module
    /// docs); truncations never lower `log_index` below it.
    pub floor: u64,
}

/// The open mark file with its current record.
#[derive(Debug)]
pub struct AckMark {
    file: File,
    path: PathBuf,
    record: MarkRecord,
    seq: u64,
    /// Slot holding the current record.
    slot: usize,
}

fn io_err(what: &'static str, path: &Path, source: io::Error) -> StorageError {
    StorageError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(detail: impl Into<String>) -> StorageError {
    StorageError::Corrupt {
        what: "acknowledgement mark",
        detail: detail.into(),
    }
}

/// Encode `record` as slot bytes with sequence number `seq`.
fn encode_slot(seq: u64, record: &MarkRecord) -> Result<Vec<u8>, StorageError> {
    let payload = codec::encode(record).map_err(|e| corrupt(e.to_string()))?;
    if HEADER_BYTES + payload.len() > SLOT_BYTES {
        return Err(corrupt(format!(
            "record of {} bytes does not fit a slot",
            payload.len()
        )));
    }
    let mut slot = Vec::with_capacity(SLOT_BYTES);
    slot.extend_from_slice(MAGIC);
    slot.extend_from_slice(&seq.to_le_bytes());
    slot.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    slot.extend_from_slice(&payload);
    let crc = crc32fast::hash(&slot);
    slot.extend_from_slice(&crc.to_le_bytes());
    slot.resize(SLOT_BYTES, 0);
    Ok(slot)
}

/// Decode slot bytes; `None` when the slot is empty, torn or damaged.
fn decode_slot(bytes: &[u8]) -> Option<(u64, MarkRecord)> {
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
    let len = u32::from_le_bytes(bytes[16..20].try_into().ok()?) as usize;
    let end = 20usize.checked_add(len)?;
    let crc_end = end.checked_add(4)?;
    if crc_end > bytes.len() {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[end..crc_end].try_into().ok()?);
    if crc32fast::hash(&bytes[..end]) != crc {
        return None;
    }
    let record: MarkRecord = codec::decode(&bytes[20..end]).ok()?;
    (record.incarnation != 0).then_some((seq, record))
}

/// A fresh random incarnation (never 0).
fn new_incarnation() -> Result<u64, StorageError> {
    loop {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).map_err(|e| StorageError::Io {
            what: "draw a random incarnation",
            path: PathBuf::new(),
            source: io::Error::other(e.to_string()),
        })?;
        let n = u64::from_le_bytes(bytes);
        if n != 0 {
            return Ok(n);
        }
    }
}

impl AckMark {
    /// Open the mark in `dir`; `None` when there is no mark file.
    pub(crate) fn open(dir: &Path) -> Result<Option<AckMark>, StorageError> {
        let path = dir.join(MARK_FILE);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("open acknowledgement mark", &path, e)),
        };
        let (seq, record, slot) = newest_slot(&file, &path)?;
        Ok(Some(AckMark {
            file,
            path,
            record,
            seq,
            slot,
        }))
    }

    /// Create a new mark in `dir` with a fresh incarnation, durably (file
    /// and directory entry synced).
    ///
    /// The first record is written and synced under a temporary name and
    /// then renamed into place, so a crash never leaves a mark file without
    /// a valid record (which would be refused as corrupt ever after).
    pub(crate) fn create(dir: &Path) -> Result<AckMark, StorageError> {
        let path = dir.join(MARK_FILE);
        let temp = dir.join(format!("{MARK_FILE}.new"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)
            .map_err(|e| io_err("create acknowledgement mark", &temp, e))?;
        let record = MarkRecord {
            incarnation: new_incarnation()?,
            vote: None,
            log_index: 0,
            floor: 0,
        };
        let mut mark = AckMark {
            file,
            path: path.clone(),
            record: record.clone(),
            seq: 0,
            slot: 1,
        };
        mark.write(record)?;
        std::fs::rename(&temp, &mark.path)
            .map_err(|e| io_err("put the acknowledgement mark in place", &mark.path, e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err("sync data directory", dir, e))?;
        tracing::info!(
            incarnation = mark.record.incarnation,
            "new data directory: drew a new incarnation"
        );
        Ok(mark)
    }

    /// The current record.
    pub fn record(&self) -> &MarkRecord {
        &self.record
    }

    /// This data directory's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.record.incarnation
    }

    /// Where the mark lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Durably record `vote` (call after the vote itself is synced).
    pub(crate) fn record_vote(&mut self, vote: &Vote) -> io::Result<()> {
        if self.record.vote.as_ref() == Some(vote) {
            return Ok(());
        }
        // Another leader (or candidate): what was acknowledged to the
        // previous one may be truncated if it conflicts.
        let same_leader = self
            .record
            .vote
            .is_some_and(|v| v.leader_id() == vote.leader_id());
        let record = MarkRecord {
            vote: Some(*vote),
            floor: if same_leader { self.record.floor } else { 0 },
            ..self.record.clone()
        };
        self.write(record).map_err(io::Error::other)
    }

    /// Durably record that the log is acknowledged up to `index` (call after
    /// the sync covering it, before acknowledging). Never lowers the mark.
    pub(crate) fn record_flushed(&mut self, index: u64) -> io::Result<()> {
        if index <= self.record.log_index {
            return Ok(());
        }
        let record = MarkRecord {
            log_index: index,
            floor: self.record.floor.max(index),
            ..self.record.clone()
        };
        self.write(record).map_err(io::Error::other)
    }

    /// Durably lower the mark to `index` ahead of a truncation that leaves
    /// the log ending there, but never below what was acknowledged to the
    /// current leader (`floor`).
    pub(crate) fn record_truncation(&mut self, index: u64) -> io::Result<()> {
        let kept = index.max(self.record.floor);
        if index < self.record.floor {
            tracing::warn!(
                truncated_from = index + 1,
                acknowledged_to_leader = self.record.floor,
                "truncating entries acknowledged to the current leader (openraft installs a \
                 snapshot this way): until the snapshot is in place, a restart is refused"
            );
        }
        if kept >= self.record.log_index {
            return Ok(());
        }
        let record = MarkRecord {
            log_index: kept,
            ..self.record.clone()
        };
        self.write(record).map_err(io::Error::other)
    }

    fn write(&mut self, record: MarkRecord) -> Result<(), StorageError> {
        let seq = self.seq + 1;
        let slot = 1 - self.slot;
        let bytes = encode_slot(seq, &record)?;
        self.file
            .write_all_at(&bytes, SLOT_OFFSETS[slot])
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_err("write acknowledgement mark", &self.path, e))?;
        self.seq = seq;
        self.slot = slot;
        self.record = record;
        Ok(())
    }
}

/// The mark in `dir` as it is on disk, read without opening it for
/// writing: for tools and test harnesses that inspect a data directory
/// (a running replica keeps writing it). `Ok(None)` when there is no mark.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// assert!(latchkey_storage::ack_mark::read(dir.path())?.is_none());
/// let (log, _sm) = latchkey_storage::open(dir.path(), Default::default())?;
/// let mark = latchkey_storage::ack_mark::read(dir.path())?.ok_or("no mark")?;
/// assert_eq!(mark.incarnation, log.incarnation());
/// # Ok(()) }
/// ```
pub fn read(dir: &Path) -> Result<Option<MarkRecord>, StorageError> {
    let path = dir.join(MARK_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("open acknowledgement mark", &path, e)),
    };
    newest_slot(&file, &path).map(|(_, record, _)| Some(record))
}

/// The valid slot with the highest sequence: (sequence, record, slot).
fn newest_slot(file: &File, path: &Path) -> Result<(u64, MarkRecord, usize), StorageError> {
    let mut best: Option<(u64, MarkRecord, usize)> = None;
    for (slot, offset) in SLOT_OFFSETS.iter().enumerate() {
        let mut bytes = vec![0u8; SLOT_BYTES];
        let read = read_up_to(file, &mut bytes, *offset)
            .map_err(|e| io_err("read acknowledgement mark", path, e))?;
        bytes.truncate(read);
        if let Some((seq, record)) = decode_slot(&bytes) {
            if best.as_ref().is_none_or(|(s, _, _)| seq > *s) {
                best = Some((seq, record, slot));
            }
        }
    }
    best.ok_or_else(|| {
        corrupt(format!(
            "{} holds no valid record (damaged or not a latchkey mark)",
            path.display()
        ))
    })
}

/// Whether a freshly opened log (`vote`, and `last_index`, the index of its
/// last entry or purged entry) still holds everything `mark` says was
/// acknowledged; the error says what is missing.
pub(crate) fn check(
    mark: &MarkRecord,
    vote: Option<&Vote>,
    last_index: Option<u64>,
) -> Result<(), String> {
    let last = last_index.unwrap_or(0);
    if last < mark.log_index {
        return Err(format!(
            "the Raft log ends at index {last} but entries up to {} were acknowledged \
             (a write-ahead log cut short or a part of the directory replaced)",
            mark.log_index
        ));
    }
    if let Some(acked) = &mark.vote {
        if !vote_kept(vote, acked) {
            let found = vote.map_or("none".to_string(), |v| v.to_string());
            return Err(format!(
                "the saved vote is {found} but vote {acked} was acknowledged"
            ));
        }
    }
    Ok(())
}

/// Whether `found` (read from the disk) still holds the promise of `acked`:
/// its ballot is the same or later. latchkey's leader ids are openraft's
/// `leader_id_adv`, which orders ballots by (term, candidate id), a total
/// order: in one term a higher candidate id is a later ballot, and a
/// replica moves to it legitimately (a leader answered with a higher ballot
/// steps down and saves it, without granting anything). So a vote of the
/// same term for a higher candidate keeps the promise; a lower term, or a
/// lower candidate in the same term, means the acknowledged vote was lost.
/// The `committed` flag is not compared: losing it only makes the replica
/// stand for election again (an uncommitted and a committed vote of the same
/// leader id compare the same way against every other leader id).
///
/// Written out rather than through `Vote`'s `PartialOrd`, so that the
/// meaning stays the same whatever openraft features are on, and so that
/// bytes read from a disk can never reach a panicking comparison.
fn vote_kept(found: Option<&Vote>, acked: &Vote) -> bool {
    let Some(found) = found else {
        return false;
    };
    let ballot = |v: &Vote| (v.leader_id.term, v.leader_id.node_id);
    ballot(found) >= ballot(acked)
}

/// Read as much of `buf` as the file holds from `offset`.
fn read_up_to(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use crate::types::Vote;

    use super::*;

    #[test]
    fn a_new_mark_reads_back_and_records_survive_reopening(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut mark = AckMark::create(dir.path())?;
        let incarnation = mark.incarnation();
        assert_ne!(incarnation, 0);
        mark.record_flushed(7)?;
        mark.record_vote(&Vote::new(3, 2))?;
        mark.record_flushed(5)?; // never lowers
        drop(mark);
        let again = AckMark::open(dir.path())?.ok_or("mark vanished")?;
        assert_eq!(
            again.record(),
            &MarkRecord {
                incarnation,
                vote: Some(Vote::new(3, 2)),
                log_index: 7,
                floor: 0,
            }
        );
        Ok(())
    }

    #[test]
    fn a_torn_newest_slot_falls_back_to_the_other() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut mark = AckMark::create(dir.path())?;
        mark.record_flushed(10)?;
        mark.record_flushed(20)?;
        let slot = mark.slot;
        drop(mark);
        // Damage the newest slot's payload.
        let file = OpenOptions::new()
            .write(true)
            .open(dir.path().join(MARK_FILE))?;
        file.write_all_at(&[0xff; 4], SLOT_OFFSETS[slot] + 22)?;
        let again = AckMark::open(dir.path())?.ok_or("mark vanished")?;
        assert_eq!(again.record().log_index, 10);
        Ok(())
    }

    #[test]
    fn a_mark_with_no_valid_slot_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join(MARK_FILE), b"garbage")?;
        assert!(matches!(
            AckMark::open(dir.path()),
            Err(StorageError::Corrupt { .. })
        ));
        Ok(())
    }

    #[test]
    fn check_refuses_a_log_or_vote_behind_the_mark() {
        let mark = MarkRecord {
            incarnation: 1,
            vote: Some(Vote::new(4, 2)),
            log_index: 10,
            floor: 10,
        };
        assert!(check(&mark, Some(&Vote::new(4, 2)), Some(10)).is_ok());
        assert!(check(&mark, Some(&Vote::new(5, 3)), Some(12)).is_ok());
        let short = check(&mark, Some(&Vote::new(4, 2)), Some(9));
        assert!(short.is_err_and(|e| e.contains("ends at index 9")));
        assert!(check(&mark, Some(&Vote::new(4, 2)), None).is_err());
        assert!(check(&mark, Some(&Vote::new(3, 2)), Some(10)).is_err());
        assert!(check(&mark, None, Some(10)).is_err());
        // Same term, a lower candidate: the acknowledged vote was lost.
        assert!(check(&mark, Some(&Vote::new(4, 1)), Some(10)).is_err());
        // Same term, a higher candidate: a later ballot, kept.
        assert!(check(&mark, Some(&Vote::new(4, 3)), Some(10)).is_ok());
        // Committed votes of two leaders in one term: compared, no panic.
        let committed = MarkRecord {
            vote: Some(Vote::new_committed(4, 2)),
            ..mark.clone()
        };
        assert!(check(&committed, Some(&Vote::new_committed(4, 1)), Some(10)).is_err());
        assert!(check(&committed, Some(&Vote::new_committed(4, 3)), Some(10)).is_ok());
        // A leader that saw a higher ballot of its own term stepped down and
        // saved it (a follower woke from a pause and stood for election):
        // it must start again.
        assert!(check(&committed, Some(&Vote::new(4, 3)), Some(10)).is_ok());
        // Only the committed flag lost (a leader's vote lowered at start).
        assert!(check(&committed, Some(&Vote::new(4, 2)), Some(10)).is_ok());
        let fresh = MarkRecord {
            incarnation: 1,
            vote: None,
            log_index: 0,
            floor: 0,
        };
        assert!(check(&fresh, None, None).is_ok());
    }

    #[test]
    fn truncation_lowers_the_mark_but_not_below_the_current_leaders_acks(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut mark = AckMark::create(dir.path())?;
        mark.record_vote(&Vote::new(1, 1))?;
        mark.record_flushed(10)?;
        // A new leader: what the old one was sent may be truncated.
        mark.record_vote(&Vote::new(2, 2))?;
        mark.record_truncation(6)?;
        assert_eq!(mark.record().log_index, 6);
        mark.record_truncation(8)?; // never raises
        assert_eq!(mark.record().log_index, 6);
        // Acknowledged to leader 2 up to 9: a truncation to 4 keeps 9.
        mark.record_flushed(9)?;
        mark.record_vote(&Vote::new_committed(2, 2))?; // same leader, committed
        mark.record_truncation(4)?;
        assert_eq!(mark.record().log_index, 9);
        Ok(())
    }
}
