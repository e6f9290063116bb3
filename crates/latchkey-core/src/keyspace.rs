//! How the core lays out its state in a [`crate::Store`]'s single byte keyspace.
//!
//! Every key starts with one tag byte naming its room, so user data can never
//! collide with sequences or lock state, and a scan of user data never sees
//! anything else.
//!
//! | tag | room | key after the tag | value |
//! |-----|------|-------------------|-------|
//! | `D` | user data | user key | create revision, mod revision, version, bound session or 0 (u64 big-endian each), then the user value (see [`crate::data`]) |
//! | `E` | a session's keys | session id (8 bytes) + user key | empty |
//! | `W` | watch history | revision, u64 big-endian | what that revision changed (codec, see [`crate::history`]) |
//! | `Q` | sequences | sequence key | next start, u64 big-endian |
//! | `M` | core metadata | name | see the `META_*` constants |
//! | `S` | lock sessions | session id, u64 big-endian | session record (codec) |
//! | `L` | locks | lock name, UTF-8 | lock record: holders, queue, lock-delay (codec) |
//! | `H` | a session's locks | session id (8 bytes) + lock name | empty |
//! | `R` | remembered requests | session id (8 bytes) + request id (8 bytes) | request record (codec) |
//! | `A` | access control | `e` (enabled), `u` + user, `r` + role, `o` + session id (8 bytes) | `[1]`; user record; role record (codec); owner's name |
//!
//! Fixed-width big-endian ids make every room scan in numeric order. An `H`
//! row exists exactly while the session holds or waits for that lock, and
//! an `E` row exactly while the key is bound to the session, so ending a
//! session visits only its own locks and keys.

/// Access control ([`crate::auth`]): `A` + kind + name.
pub const AUTH: u8 = b'A';
/// User key/value data: `D` + user key.
pub const DATA: u8 = b'D';
/// The watch history: `W` + revision (u64, big-endian) -> the record of
/// what that revision changed ([`crate::history`]).
pub const HISTORY: u8 = b'W';
/// Sequences: `Q` + sequence key -> next start (u64, big-endian).
pub const SEQUENCE: u8 = b'Q';
/// Core metadata: `M` + name.
pub const META: u8 = b'M';

/// Lock sessions: `S` + session id (u64, big-endian) -> session record.
pub const SESSION: u8 = b'S';
/// Locks: `L` + lock name -> lock record. Absent while the lock is free.
pub const LOCK: u8 = b'L';
/// Index of each session's locks: `H` + session id + lock name -> empty.
pub const SESSION_LOCKS: u8 = b'H';
/// Index of the keys bound to each session: `E` + session id + user key
/// -> empty.
pub const SESSION_KEYS: u8 = b'E';
/// Per-session memory of acquire/release outcomes: `R` + session id +
/// request id (both u64, big-endian) -> request record.
pub const REQUEST: u8 = b'R';

/// Meta key holding the largest leader time applied so far (u64, big-endian).
pub const META_NOW: &[u8] = b"Mnow";
/// Meta key holding the cluster's revision: raised by one by every applied
/// command that changes at least one key (u64, big-endian; absent = 0).
pub const META_REVISION: &[u8] = b"Mrev";
/// Meta key holding the oldest revision the watch history keeps and the
/// bytes of records it keeps (u64 big-endian each; absent: the history is
/// empty and starts at the next revision). See [`crate::history`].
pub const META_HISTORY: &[u8] = b"Mhist";
/// Meta key holding the last session id issued (u64, big-endian; absent = 0).
pub const META_LAST_SESSION: &[u8] = b"Msession";
/// Meta key holding how many sessions are live (u64, big-endian; absent =
/// 0): checked against [`crate::limits::MAX_LIVE_SESSIONS`] when a session
/// opens, kept equal to the number of `S` rows. A state written before this
/// row existed has its `S` rows counted the first time a session opens or
/// ends, so the count is a function of the state on every replica.
pub const META_LIVE_SESSIONS: &[u8] = b"Mlive";
/// Meta key holding the last fencing token issued (u64, big-endian; absent = 0).
pub const META_LAST_TOKEN: &[u8] = b"Mtoken";
/// Meta key holding where a sequence with no row of its own starts (u64,
/// big-endian; absent = 0). Only a restore sets it (`crate::backup`), so
/// that a sequence first used after the backup does not restart at 0.
pub const META_SEQUENCE_FLOOR: &[u8] = b"Mseqfloor";

/// `E` + session id: the prefix of every [`session_key_row`] of a session.
pub fn session_keys_prefix(session: u64) -> Vec<u8> {
    tagged(SESSION_KEYS, &session.to_be_bytes())
}

/// `E` + session id + user key: `key` is bound to `session` (see
/// [`crate::data`]).
pub fn session_key_row(session: u64, key: &[u8]) -> Vec<u8> {
    let mut k = session_keys_prefix(session);
    k.extend_from_slice(key);
    k
}

/// `tag` followed by `key`.
pub fn tagged(tag: u8, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 1);
    out.push(tag);
    out.extend_from_slice(key);
    out
}

/// `S` + session id.
pub fn session_key(session: u64) -> Vec<u8> {
    tagged(SESSION, &session.to_be_bytes())
}

/// `L` + lock name.
pub fn lock_key(name: &str) -> Vec<u8> {
    tagged(LOCK, name.as_bytes())
}

/// `H` + session id: the prefix of every [`session_lock_key`] of a session.
pub fn session_locks_prefix(session: u64) -> Vec<u8> {
    tagged(SESSION_LOCKS, &session.to_be_bytes())
}

/// `H` + session id + lock name.
pub fn session_lock_key(session: u64, name: &str) -> Vec<u8> {
    let mut k = session_locks_prefix(session);
    k.extend_from_slice(name.as_bytes());
    k
}

/// `R` + session id: the prefix of every [`request_key`] of a session.
pub fn requests_prefix(session: u64) -> Vec<u8> {
    tagged(REQUEST, &session.to_be_bytes())
}

/// `R` + session id + request id.
pub fn request_key(session: u64, request_id: u64) -> Vec<u8> {
    let mut k = requests_prefix(session);
    k.extend_from_slice(&request_id.to_be_bytes());
    k
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
