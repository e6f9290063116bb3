//! The one place where latchkey encodes values for the log, snapshots and the wire.
//!
//! Format: one version byte ([`FORMAT_VERSION`]) followed by bincode 2
//! (standard config, serde). Swapping the format means changing this module
//! and bumping the version; decoding refuses versions it does not know.

use serde::{de::DeserializeOwned, Serialize};

/// Version byte written in front of every encoded value.
///
/// 2: the membership in log entries and snapshots records each member's
/// data-directory incarnation (`latchkey_storage::Member`), and Raft
/// messages carry it.
///
/// 3: sessions have a secret ([`crate::lock::SessionSecret`]): in the
/// session record, in `OpenSession` and in every client command acting for
/// a session; the leader's wait timeout is its own command (`ExpireWait`).
///
/// 4: the membership records each member's client address besides its peer
/// address (`latchkey_storage::Member`), since replicas serve clients and
/// peers on separate listeners.
///
/// 5: keys have revisions: `CompareAndPut` carries a [`crate::Test`]
/// instead of an expected value, a batch's [`crate::Condition`] is a key
/// and a test, and a user-data row starts with the key's create revision,
/// mod revision and version (see [`crate::data`]).
///
/// 6: keys can be bound to a session ([`crate::Command::PutBound`]): a
/// user-data row's header also holds the session it is bound to, and a
/// session's keys are indexed under `E` (see [`crate::keyspace`]).
///
/// 7: key-value writes can be retry-safe ([`crate::Command::Once`]): a
/// session's remembered request holds either a lock command or the digest
/// of a write, and its answer may be a write's outcome.
///
/// 8: elections ([`crate::lock::election_lock_name`]): an acquire carries
/// a candidate's value, holders and waiters in a lock record keep it, and
/// [`crate::lock::LockCommand::Proclaim`] is new.
///
/// 9: semaphores: an acquire carries `permits`, a lock record keeps the
/// count, [`crate::CommandError::PermitsMismatch`] is new; `Proclaim` and
/// its outcome moved to the end of their enums.
///
/// 10: multi-locks: a lock record's waiter keeps the `group` of locks it
/// waits for; `AcquireAll`, `ReleaseAll` and their outcomes are appended.
///
/// 11: countdown checkpoints: a session record keeps `left_ms` and a lock
/// record's holder `lease_left_ms`; `LockCommand::Checkpoint` and
/// `LockOutcome::Checkpointed` are appended.
///
/// 12: operator tools: `OpenSession` carries a `name`; a session record
/// keeps `name`, `forced_total` and `forced`; `LockCommand::ForceRelease`,
/// `LockQuery::Sessions`, their outcomes and `HoldEnd::Forced` are
/// appended.
pub const FORMAT_VERSION: u8 = 12;

/// Largest value [`decode`] accepts, so a hostile length prefix cannot make
/// the decoder allocate without bound.
pub const MAX_DECODE_BYTES: usize = 256 * 1024 * 1024;

/// A value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The value could not be encoded; carries bincode's message.
    #[error("cannot encode: {0}")]
    Encode(String),
    /// The bytes after the version byte do not decode to the expected type
    /// (malformed, over [`MAX_DECODE_BYTES`], or with trailing bytes).
    #[error("cannot decode: {0}")]
    Decode(String),
    /// The version byte is not [`FORMAT_VERSION`]; it carries the byte read.
    #[error("unknown format version {0} (this build reads version {FORMAT_VERSION})")]
    Version(u8),
    /// There was nothing to decode, not even the version byte.
    #[error("cannot decode: empty input")]
    Empty,
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_DECODE_BYTES>()
}

/// Encode `value` with the version byte in front.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    Ok(out)
}

/// The SHA-256 of `value`'s encoding (the body [`encode`] writes after its
/// version byte), computed without holding the encoding in memory. Equal
/// values have equal digests on every replica.
pub fn digest<T: Serialize + ?Sized>(value: &T) -> Result<[u8; 32], CodecError> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    bincode::serde::encode_into_std_write(value, &mut hasher, config())
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    Ok(hasher.finalize().into())
}

/// Decode bytes produced by [`encode`]. Trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(CodecError::Version(version));
    }
    let (value, read) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| CodecError::Decode(e.to_string()))?;
    if read != body.len() {
        return Err(CodecError::Decode(format!(
            "{} trailing bytes",
            body.len() - read
        )));
    }
    Ok(value)
}

/// Serde helpers for `Vec<u8>` fields: (de)serialize them as one byte
/// string (`serialize_bytes` / `deserialize_bytes`) instead of one `u8` at a
/// time. bincode writes both forms identically (a length, then the bytes),
/// so the encoding does not change; only the per-byte calls go. Decoding
/// borrows the bytes from the input before copying them, so a hostile
/// length prefix fails on the short input without allocating the claim.
///
/// Use as `#[serde(with = "latchkey_core::codec::bytes")]`.
pub mod bytes {
    use serde::de::{Deserializer, Error, SeqAccess, Visitor};
    use serde::Serializer;

    /// Serialize `value` as one byte string.
    pub fn serialize<S: Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(value)
    }

    /// Deserialize a byte string (or, from formats without one, a sequence
    /// of bytes).
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_bytes(BytesVisitor)
    }

    pub(super) struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a byte string")
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }
}

/// [`bytes`] for `Option<Vec<u8>>` fields.
///
/// Use as `#[serde(with = "latchkey_core::codec::opt_bytes")]`.
pub mod opt_bytes {
    use serde::de::{Deserializer, Error, Visitor};
    use serde::{Serialize, Serializer};

    struct AsBytes<'a>(&'a [u8]);

    impl Serialize for AsBytes<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(self.0)
        }
    }

    /// Serialize `value` as an option of one byte string.
    pub fn serialize<S: Serializer>(
        value: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => serializer.serialize_some(&AsBytes(v)),
            None => serializer.serialize_none(),
        }
    }

    /// Deserialize an option of a byte string.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        deserializer.deserialize_option(OptVisitor)
    }

    struct OptVisitor;

    impl<'de> Visitor<'de> for OptVisitor {
        type Value = Option<Vec<u8>>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an optional byte string")
        }

        fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_bytes(super::bytes::BytesVisitor).map(Some)
        }
    }
}
