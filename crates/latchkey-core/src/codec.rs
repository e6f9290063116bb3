//! The one place where latchkey encodes values for the log, snapshots and the wire.
//!
//! Format: one version byte ([`FORMAT_VERSION`]) followed by bincode 2
//! (standard config, serde). Swapping the format means changing this module
//! and bumping the version; decoding refuses versions it does not know.

use serde::{de::DeserializeOwned, Serialize};

/// Version byte written in front of every encoded value.
pub const FORMAT_VERSION: u8 = 1;

/// Largest value [`decode`] accepts, so a hostile length prefix cannot make
/// the decoder allocate without bound.
pub const MAX_DECODE_BYTES: usize = 256 * 1024 * 1024;

/// A value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("cannot encode: {0}")]
    Encode(String),
    #[error("cannot decode: {0}")]
    Decode(String),
    #[error("unknown format version {0} (this build reads version {FORMAT_VERSION})")]
    Version(u8),
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
