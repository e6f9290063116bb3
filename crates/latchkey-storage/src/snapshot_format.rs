//! The snapshot blob: what a snapshot file holds and what travels to a
//! follower.
//!
//! ```text
//! blob  = MAGIC (8 bytes) frame* checksum (u64 big-endian, FNV-1a 64 of all bytes before it)
//! frame = length (u32 big-endian) codec(Frame)
//! ```
//!
//! Frames, in order: one [`Frame::Header`] (the snapshot's meta, which holds
//! the last applied log id and membership), any number of [`Frame::Rows`]
//! (state machine key/value pairs, keys strictly ascending across frames),
//! and one [`Frame::End`] with the row count. Every value is encoded with
//! [`latchkey_core::codec`]; framing keeps each encoded piece far below the
//! codec's decode limit however large the state is.
//!
//! Decoding checks the magic, the checksum, the frame order, key order and
//! the row count, so a damaged or truncated blob is an error, never a panic.
//!
//! Both directions stream: [`BlobWriter`] writes to any [`Write`] and
//! [`read_blob`] reads from any [`Read`], holding one frame (at most
//! [`MAX_FRAME`] bytes) at a time, so a snapshot of any size is built, sent
//! and installed in bounded memory. The price of streaming is that the
//! checksum is only known at the end: a reader sees rows before it knows the
//! blob is whole, so whoever acts on rows reads the blob twice (once to
//! check it, once to act; see `snapshot_install`).

use std::io::{self, Read, Write};

use latchkey_core::codec::{self, CodecError};
use serde::{Deserialize, Serialize};

use crate::types::SnapshotMeta;

/// First bytes of every snapshot blob: format name and version.
const MAGIC: &[u8; 8] = b"LKSNAP01";
/// Bytes of the trailing checksum.
const CHECKSUM_LEN: usize = 8;
/// Bytes of a frame's length prefix.
const LEN_LEN: usize = 4;
/// A rows frame is closed once its keys and values pass this many bytes.
const FRAME_BYTES: usize = 4 * 1024 * 1024;
/// The largest frame a reader accepts: a rows frame closes after passing
/// [`FRAME_BYTES`] by at most one row, and a row is far below 4 MiB (the
/// command limit). A damaged length prefix therefore costs at most this
/// much memory before it is refused.
pub(crate) const MAX_FRAME: usize = 4 * FRAME_BYTES;

/// One piece of a snapshot blob.
#[derive(Debug, Serialize, Deserialize)]
enum Frame {
    /// Always first: what the snapshot describes.
    Header { meta: SnapshotMeta },
    /// A run of state machine rows, keys ascending.
    Rows(Vec<(Vec<u8>, Vec<u8>)>),
    /// Always last: how many rows came before.
    End { rows: u64 },
}

/// A snapshot blob is not what this build writes, or could not be read or
/// written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BlobError {
    #[error("not a latchkey snapshot (bad magic or too short)")]
    Magic,
    #[error("snapshot checksum mismatch: the blob is damaged")]
    Checksum,
    #[error("snapshot frame: {0}")]
    Codec(#[from] CodecError),
    #[error("malformed snapshot: {0}")]
    Malformed(String),
    #[error("snapshot i/o: {0}")]
    Io(#[from] io::Error),
}

/// FNV-1a, 64 bit, fed piece by piece: cheap, and enough to catch damaged
/// or truncated blobs.
#[derive(Debug, Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fnv(Self::OFFSET)
    }

    fn update(&mut self, bytes: &[u8]) {
        self.0 = bytes
            .iter()
            .fold(self.0, |h, &b| (h ^ u64::from(b)).wrapping_mul(Self::PRIME));
    }
}

/// The checksum of `bytes` (what a blob stores over everything before it).
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    let mut h = Fnv::new();
    h.update(bytes);
    h.0
}

/// Writes a blob row by row to `W`, one frame at a time.
pub(crate) struct BlobWriter<W: Write> {
    out: W,
    sum: Fnv,
    pending: Vec<(Vec<u8>, Vec<u8>)>,
    pending_bytes: usize,
    rows: u64,
}

impl<W: Write> BlobWriter<W> {
    /// Start a blob for a snapshot described by `meta`, written to `out`.
    pub(crate) fn new(out: W, meta: &SnapshotMeta) -> Result<Self, BlobError> {
        let mut w = BlobWriter {
            out,
            sum: Fnv::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            rows: 0,
        };
        w.write(MAGIC)?;
        w.frame(&Frame::Header { meta: meta.clone() })?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), BlobError> {
        self.sum.update(bytes);
        self.out.write_all(bytes)?;
        Ok(())
    }

    fn frame(&mut self, frame: &Frame) -> Result<(), BlobError> {
        let bytes = codec::encode(frame)?;
        let len = u32::try_from(bytes.len())
            .ok()
            .filter(|&len| len as usize <= MAX_FRAME)
            .ok_or_else(|| BlobError::Malformed(format!("frame of {} bytes", bytes.len())))?;
        self.write(&len.to_be_bytes())?;
        self.write(&bytes)
    }

    fn flush_rows(&mut self) -> Result<(), BlobError> {
        if !self.pending.is_empty() {
            let rows = std::mem::take(&mut self.pending);
            self.pending_bytes = 0;
            self.frame(&Frame::Rows(rows))?;
        }
        Ok(())
    }

    /// Add one row. Rows must come in ascending key order.
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), BlobError> {
        self.pending_bytes += key.len() + value.len();
        self.pending.push((key.to_vec(), value.to_vec()));
        self.rows += 1;
        if self.pending_bytes >= FRAME_BYTES {
            self.flush_rows()?;
        }
        Ok(())
    }

    /// Close the blob (end frame and checksum) and flush it; returns the
    /// writer.
    pub(crate) fn finish(mut self) -> Result<W, BlobError> {
        self.flush_rows()?;
        let rows = self.rows;
        self.frame(&Frame::End { rows })?;
        let sum = self.sum.0;
        self.out.write_all(&sum.to_be_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// The checksum stored at the end of `blob` (not checked here).
pub(crate) fn stored_checksum(blob: &[u8]) -> Option<u64> {
    let tail = blob.len().checked_sub(CHECKSUM_LEN)?;
    <[u8; CHECKSUM_LEN]>::try_from(&blob[tail..])
        .ok()
        .map(u64::from_be_bytes)
}

/// Reads `buf.len()` bytes; `Ok(false)` if the input ended first.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> Result<bool, BlobError> {
    match input.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The next frame, its bytes added to `sum`.
fn next_frame(input: &mut impl Read, sum: &mut Fnv) -> Result<Frame, BlobError> {
    let mut len = [0u8; LEN_LEN];
    if !read_full(input, &mut len)? {
        return Err(BlobError::Malformed("truncated frame length".into()));
    }
    sum.update(&len);
    let len = usize::try_from(u32::from_be_bytes(len))
        .ok()
        .filter(|&len| len <= MAX_FRAME)
        .ok_or_else(|| BlobError::Malformed("frame longer than any writer makes".into()))?;
    let mut frame = Vec::new();
    input.by_ref().take(len as u64).read_to_end(&mut frame)?;
    if frame.len() < len {
        return Err(BlobError::Malformed("truncated frame".into()));
    }
    sum.update(&frame);
    Ok(codec::decode(&frame)?)
}

/// Read a whole blob from `input`: every row goes to `row` in ascending key
/// order, then the meta is returned once the end frame, the checksum and
/// the end of the input are checked.
///
/// `row` sees rows before the checksum is checked: a caller that acts on
/// them first reads the blob with a `row` that does nothing (see
/// [`verify`]) and only then for real. An error from `row` stops the read
/// and is returned.
///
/// Damage usually first shows as a frame that makes no sense (a bad
/// length, an undecodable frame, keys out of order); the rest of the input
/// is then read to check the checksum, and a mismatch is reported as
/// [`BlobError::Checksum`], the cause, rather than as the symptom.
pub(crate) fn read_blob<R: Read>(
    mut input: R,
    row: impl FnMut(Vec<u8>, Vec<u8>) -> io::Result<()>,
) -> Result<SnapshotMeta, BlobError> {
    let mut sum = Fnv::new();
    match read_frames(&mut input, &mut sum, row) {
        Err(e @ (BlobError::Malformed(_) | BlobError::Codec(_))) => {
            match rest_matches(&mut input, sum) {
                Ok(false) => Err(BlobError::Checksum),
                _ => Err(e),
            }
        }
        other => other,
    }
}

/// Whether the rest of `input` ends in the checksum of everything read
/// (`sum`, plus the rest up to the last 8 bytes).
fn rest_matches(input: &mut impl Read, mut sum: Fnv) -> io::Result<bool> {
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = input.read(&mut buf)?;
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > CHECKSUM_LEN {
            let covered = tail.len() - CHECKSUM_LEN;
            sum.update(&tail[..covered]);
            tail.drain(..covered);
        }
    }
    Ok(<[u8; CHECKSUM_LEN]>::try_from(tail.as_slice())
        .is_ok_and(|stored| u64::from_be_bytes(stored) == sum.0))
}

/// [`read_blob`]'s reading, with the running checksum in `sum`.
fn read_frames<R: Read>(
    mut input: R,
    sum: &mut Fnv,
    mut row: impl FnMut(Vec<u8>, Vec<u8>) -> io::Result<()>,
) -> Result<SnapshotMeta, BlobError> {
    let mut magic = [0u8; MAGIC.len()];
    if !read_full(&mut input, &mut magic)? || &magic != MAGIC {
        return Err(BlobError::Magic);
    }
    sum.update(&magic);
    let meta = match next_frame(&mut input, sum)? {
        Frame::Header { meta } => meta,
        _ => return Err(BlobError::Malformed("first frame is not the header".into())),
    };
    let mut count: u64 = 0;
    let mut previous: Option<Vec<u8>> = None;
    loop {
        match next_frame(&mut input, sum)? {
            Frame::Header { .. } => return Err(BlobError::Malformed("second header".into())),
            Frame::Rows(rows) => {
                for (key, value) in rows {
                    if previous.as_ref().is_some_and(|p| *p >= key) {
                        return Err(BlobError::Malformed("keys out of order".into()));
                    }
                    previous = Some(key.clone());
                    count += 1;
                    row(key, value)?;
                }
            }
            Frame::End { rows } => {
                if rows != count {
                    return Err(BlobError::Malformed(format!(
                        "end frame says {rows} rows, found {count}"
                    )));
                }
                break;
            }
        }
    }
    let mut stored = [0u8; CHECKSUM_LEN];
    if !read_full(&mut input, &mut stored)? {
        return Err(BlobError::Malformed("truncated checksum".into()));
    }
    if sum.0 != u64::from_be_bytes(stored) {
        return Err(BlobError::Checksum);
    }
    let mut extra = [0u8; 1];
    if read_full(&mut input, &mut extra)? {
        return Err(BlobError::Malformed("bytes after the checksum".into()));
    }
    Ok(meta)
}

/// Check a whole blob (everything [`read_blob`] checks) without keeping any
/// of its rows; returns its meta.
pub(crate) fn verify<R: Read>(input: R) -> Result<SnapshotMeta, BlobError> {
    read_blob(input, |_, _| Ok(()))
}

/// A reader that copies every byte it reads to `copy`: checking a blob
/// while saving it takes one pass.
pub(crate) struct Tee<R, W> {
    pub(crate) input: R,
    pub(crate) copy: W,
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.input.read(buf)?;
        self.copy.write_all(&buf[..n])?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Member;
    use crate::types::{Membership, StoredMembership};
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn meta() -> SnapshotMeta {
        let log_id = crate::types::log_id(3, 1, 42);
        let nodes: BTreeMap<u64, Member> = [
            (1, Member::new("a:1", "a:0", 1)),
            (2, Member::new("b:2", "b:0", 2)),
        ]
        .into();
        let voters: BTreeSet<u64> = [1, 2].into();
        SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: StoredMembership::new(
                Some(log_id),
                Membership::new(vec![voters], nodes).unwrap(),
            ),
        }
    }

    fn blob(rows: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut w = BlobWriter::new(Vec::new(), &meta()).unwrap();
        for (k, v) in rows {
            w.push(k, v).unwrap();
        }
        w.finish().unwrap()
    }

    type Rows = Vec<(Vec<u8>, Vec<u8>)>;

    fn rows_of(blob: &[u8]) -> Result<(SnapshotMeta, Rows), BlobError> {
        let mut rows = Vec::new();
        let meta = read_blob(blob, |k, v| {
            rows.push((k, v));
            Ok(())
        })?;
        Ok((meta, rows))
    }

    fn read_meta(blob: &[u8]) -> Result<SnapshotMeta, BlobError> {
        verify(blob)
    }

    #[test]
    fn round_trip() {
        let rows: Vec<(Vec<u8>, Vec<u8>)> = (0u32..5000)
            .map(|i| (i.to_be_bytes().to_vec(), vec![7u8; 1000]))
            .collect();
        let b = blob(&rows);
        assert_eq!(read_meta(&b).unwrap(), meta());
        let (m, back) = rows_of(&b).unwrap();
        assert_eq!(m, meta());
        assert_eq!(back, rows);
    }

    /// The stored checksum covers every byte before it, as the format says
    /// (a blob written in one piece and one written frame by frame agree).
    #[test]
    fn the_checksum_covers_everything_before_it() {
        let b = blob(&[(b"a".to_vec(), b"1".to_vec())]);
        let (covered, _) = b.split_at(b.len() - CHECKSUM_LEN);
        assert_eq!(stored_checksum(&b), Some(checksum(covered)));
    }

    /// A frame longer than any writer makes is refused from its length
    /// prefix, before anything of that size is read or allocated.
    #[test]
    fn a_huge_frame_length_is_refused_before_reading_it() {
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(&u32::MAX.to_be_bytes());
        let sum = checksum(&bad);
        bad.extend_from_slice(&sum.to_be_bytes());
        // The checksum holds, so the frame itself is named as the problem.
        assert!(matches!(verify(&bad[..]), Err(BlobError::Malformed(_))));
    }

    /// Copying through a [`Tee`] while checking gives the same bytes.
    #[test]
    fn a_tee_copies_what_it_checks() {
        let b = blob(&[(b"a".to_vec(), vec![1; 100]), (b"b".to_vec(), vec![2; 100])]);
        let mut tee = Tee {
            input: &b[..],
            copy: Vec::new(),
        };
        assert_eq!(verify(&mut tee).unwrap(), meta());
        assert_eq!(tee.copy, b);
    }

    /// An error from the row callback stops the read and is returned.
    #[test]
    fn a_failing_row_callback_stops_the_read() {
        let b = blob(&[
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), b"2".to_vec()),
        ]);
        let mut seen = 0;
        let result = read_blob(&b[..], |_, _| {
            seen += 1;
            Err(io::Error::other("sink full"))
        });
        assert!(matches!(result, Err(BlobError::Io(_))));
        assert_eq!(seen, 1);
    }

    #[test]
    fn empty_state_round_trips() {
        let b = blob(&[]);
        let (m, back) = rows_of(&b).unwrap();
        assert_eq!(m, meta());
        assert!(back.is_empty());
    }

    #[test]
    fn damage_is_an_error() {
        let b = blob(&[
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), b"2".to_vec()),
        ]);
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x40;
            let err = rows_of(&bad).unwrap_err();
            // Past the magic, damage is named as such, whatever it broke.
            if i >= MAGIC.len() {
                assert!(matches!(err, BlobError::Checksum), "byte {i}: {err}");
            }
        }
        for len in 0..b.len() {
            assert!(
                rows_of(&b[..len]).is_err(),
                "truncation to {len} went unnoticed"
            );
        }
        assert!(rows_of(b"").is_err());
        assert!(read_meta(b"garbage").is_err());
    }

    #[test]
    fn out_of_order_rows_are_refused() {
        let b = blob(&[
            (b"b".to_vec(), b"1".to_vec()),
            (b"a".to_vec(), b"2".to_vec()),
        ]);
        assert!(matches!(rows_of(&b), Err(BlobError::Malformed(_))));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = rows_of(&bytes);
            let _ = read_meta(&bytes);
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&bytes);
            let sum = checksum(&framed);
            framed.extend_from_slice(&sum.to_be_bytes());
            let _ = rows_of(&framed);
            let _ = read_meta(&framed);
        }
    }
}
