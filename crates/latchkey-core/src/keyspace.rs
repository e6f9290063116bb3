//! How the core lays out its state in a [`crate::Store`]'s single byte keyspace.
//!
//! Every key starts with one tag byte naming its room, so user data can never
//! collide with sequences or (later) lock state, and a scan of user data never
//! sees anything else.

/// User key/value data: `D` + user key.
pub const DATA: u8 = b'D';
/// Sequences: `Q` + sequence key -> next start (u64, big-endian).
pub const SEQUENCE: u8 = b'Q';
/// Core metadata: `M` + name.
pub const META: u8 = b'M';

/// Meta key holding the largest leader time applied so far (u64, big-endian).
pub const META_NOW: &[u8] = b"Mnow";

/// `tag` followed by `key`.
pub fn tagged(tag: u8, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 1);
    out.push(tag);
    out.extend_from_slice(key);
    out
}

/// The smallest byte string greater than every string starting with `prefix`,
/// or `None` if there is none (the prefix is empty or all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Decode a big-endian u64 cell; a cell of the wrong length reads as `None`.
pub fn read_u64(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte_below_max() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        assert_eq!(prefix_end(b""), None);
    }
}
