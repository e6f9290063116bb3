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
//! the row count, so a damaged or truncated blob is an error, never a panic
//! and never a half-installed state.

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

/// A snapshot blob is not what this build writes.
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
}

/// FNV-1a, 64 bit: cheap, and enough to catch damaged or truncated blobs.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Writes a blob row by row.
pub(crate) struct BlobWriter {
    out: Vec<u8>,
    pending: Vec<(Vec<u8>, Vec<u8>)>,
    pending_bytes: usize,
    rows: u64,
}

impl BlobWriter {
    /// Start a blob for a snapshot described by `meta`.
    pub(crate) fn new(meta: &SnapshotMeta) -> Result<Self, BlobError> {
        let mut w = BlobWriter {
            out: MAGIC.to_vec(),
            pending: Vec::new(),
            pending_bytes: 0,
            rows: 0,
        };
        w.frame(&Frame::Header { meta: meta.clone() })?;
        Ok(w)
    }

    fn frame(&mut self, frame: &Frame) -> Result<(), BlobError> {
        let bytes = codec::encode(frame)?;
        let len = u32::try_from(bytes.len())
            .map_err(|_| BlobError::Malformed(format!("frame of {} bytes", bytes.len())))?;
        self.out.extend_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(&bytes);
        Ok(())
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

    /// Close the blob.
    pub(crate) fn finish(mut self) -> Result<Vec<u8>, BlobError> {
        self.flush_rows()?;
        let rows = self.rows;
        self.frame(&Frame::End { rows })?;
        let sum = checksum(&self.out);
        self.out.extend_from_slice(&sum.to_be_bytes());
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

/// Check magic and checksum; return the frames' bytes.
fn verified_body(blob: &[u8]) -> Result<&[u8], BlobError> {
    if blob.len() < MAGIC.len() + CHECKSUM_LEN || !blob.starts_with(MAGIC) {
        return Err(BlobError::Magic);
    }
    let (covered, sum) = blob.split_at(blob.len() - CHECKSUM_LEN);
    let stored = <[u8; CHECKSUM_LEN]>::try_from(sum).map_err(|_| BlobError::Magic)?;
    if checksum(covered) != u64::from_be_bytes(stored) {
        return Err(BlobError::Checksum);
    }
    Ok(&covered[MAGIC.len()..])
}

/// Split off the next frame.
fn next_frame(body: &mut &[u8]) -> Result<Frame, BlobError> {
    if body.len() < LEN_LEN {
        return Err(BlobError::Malformed("truncated frame length".into()));
    }
    let (len, rest) = body.split_at(LEN_LEN);
    let len = <[u8; LEN_LEN]>::try_from(len)
        .map(u32::from_be_bytes)
        .map_err(|_| BlobError::Malformed("frame length".into()))?;
    let len = usize::try_from(len).map_err(|_| BlobError::Malformed("frame length".into()))?;
    if rest.len() < len {
        return Err(BlobError::Malformed("truncated frame".into()));
    }
    let (frame, rest) = rest.split_at(len);
    *body = rest;
    Ok(codec::decode(frame)?)
}

/// The meta of a blob, checking its integrity but not decoding its rows.
pub(crate) fn read_meta(blob: &[u8]) -> Result<SnapshotMeta, BlobError> {
    let mut body = verified_body(blob)?;
    match next_frame(&mut body)? {
        Frame::Header { meta } => Ok(meta),
        _ => Err(BlobError::Malformed("first frame is not the header".into())),
    }
}

/// Decode a whole blob: every row goes to `row` in ascending key order, then
/// the meta is returned. Fails, having possibly visited some rows, if any
/// part of the blob is malformed; callers must only act on the rows once
/// this returns `Ok`.
pub(crate) fn read_rows(
    blob: &[u8],
    mut row: impl FnMut(Vec<u8>, Vec<u8>),
) -> Result<SnapshotMeta, BlobError> {
    let mut body = verified_body(blob)?;
    let meta = match next_frame(&mut body)? {
        Frame::Header { meta } => meta,
        _ => return Err(BlobError::Malformed("first frame is not the header".into())),
    };
    let mut count: u64 = 0;
    let mut previous: Option<Vec<u8>> = None;
    loop {
        match next_frame(&mut body)? {
            Frame::Header { .. } => return Err(BlobError::Malformed("second header".into())),
            Frame::Rows(rows) => {
                for (key, value) in rows {
                    if previous.as_ref().is_some_and(|p| *p >= key) {
                        return Err(BlobError::Malformed("keys out of order".into()));
                    }
                    previous = Some(key.clone());
                    count += 1;
                    row(key, value);
                }
            }
            Frame::End { rows } => {
                if rows != count {
                    return Err(BlobError::Malformed(format!(
                        "end frame says {rows} rows, found {count}"
                    )));
                }
                if !body.is_empty() {
                    return Err(BlobError::Malformed("bytes after the end frame".into()));
                }
                return Ok(meta);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Member;
    use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership};
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn meta() -> SnapshotMeta {
        let log_id = LogId::new(CommittedLeaderId::new(3, 1), 42);
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
                Membership::new(vec![voters], nodes),
            ),
            snapshot_id: "3-42-x".into(),
        }
    }

    fn blob(rows: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut w = BlobWriter::new(&meta()).unwrap();
        for (k, v) in rows {
            w.push(k, v).unwrap();
        }
        w.finish().unwrap()
    }

    type Rows = Vec<(Vec<u8>, Vec<u8>)>;

    fn rows_of(blob: &[u8]) -> Result<(SnapshotMeta, Rows), BlobError> {
        let mut rows = Vec::new();
        let meta = read_rows(blob, |k, v| rows.push((k, v)))?;
        Ok((meta, rows))
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
            assert!(rows_of(&bad).is_err(), "flipped byte {i} went unnoticed");
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
