//! The data room: user keys with their revisions, and the one counter
//! that numbers every change ([`crate::keyspace::META_REVISION`]).
//!
//! A `D` row's value is a 32-byte header, `create_revision`,
//! `mod_revision`, `version` and `session` (u64 big-endian each), followed
//! by the user's value. `session` is the session the key is bound to, 0 for
//! none: a key bound to a session is deleted when the session ends (close
//! or expiry), in the same command, at that command's revision. A bound key
//! also has an index row, `E` + session id + key
//! ([`keyspace::session_key_row`]), so that the end visits exactly the
//! session's keys. Binding follows etcd's leases: every write sets the
//! key's binding. Only [`crate::Command::PutBound`] binds; every other
//! write of the key (put, compare-and-put, get-and-put, put-if-absent that
//! writes, a batch's or a fenced write's put) unbinds it. Letting those
//! carry a session too is left for later.
//!
//! Every write of user data goes through a [`Change`]: it draws the
//! next revision the first time the command changes a key, stamps each key
//! it writes with it, and stores the counter when the command ends. A
//! command that changes nothing (a failed test, a delete of an absent key)
//! raises nothing, and since the core checks everything before its first
//! write, a refused command leaves the counter as it was.
//!
//! ```
//! use latchkey_core::data::{self, Change};
//! use latchkey_core::MemStore;
//!
//! let mut store = MemStore::default();
//! let mut change = Change::begin(&store).unwrap();
//! change.put(&mut store, b"a", b"1").unwrap();
//! change.put(&mut store, b"b", b"2").unwrap();
//! assert_eq!(change.finish(&mut store).unwrap(), 1); // one command, one revision
//! let a = data::get(&store, b"a").unwrap().unwrap();
//! assert_eq!((a.create_revision, a.mod_revision, a.version), (1, 1, 1));
//! ```

use crate::command::{RevisionField, Test, Versioned};
use crate::history::Recorder;
use crate::keyspace::{self, DATA, META_REVISION};
use crate::{CommandError, Store, StoreError};

/// Bytes of a `D` row before the user's value.
pub const HEADER_LEN: usize = 32;

/// The `D` row key of a user key.
pub fn data_key(key: &[u8]) -> Vec<u8> {
    keyspace::tagged(DATA, key)
}

/// A `D` row's value for `v`, bound to `session` (0: none).
pub fn encode(v: &Versioned, session: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + v.value.len());
    out.extend_from_slice(&v.create_revision.to_be_bytes());
    out.extend_from_slice(&v.mod_revision.to_be_bytes());
    out.extend_from_slice(&v.version.to_be_bytes());
    out.extend_from_slice(&session.to_be_bytes());
    out.extend_from_slice(&v.value);
    out
}

/// Header field `i` (u64) of the `D` row of `key` holding `row`. A row
/// shorter than its header means the store is damaged: the replica stops
/// rather than serve a made-up revision.
fn field(key: &[u8], row: &[u8], i: usize) -> Result<u64, StoreError> {
    if row.len() < HEADER_LEN {
        return Err(StoreError(format!(
            "corrupt data row {:?}: {} bytes, shorter than its {HEADER_LEN}-byte header",
            String::from_utf8_lossy(key),
            row.len()
        )));
    }
    row.get(i * 8..i * 8 + 8)
        .and_then(keyspace::read_u64)
        .ok_or_else(|| {
            StoreError(format!(
                "corrupt data row {:?}",
                String::from_utf8_lossy(key)
            ))
        })
}

/// The value and revisions of the `D` row of `key` holding `row`.
pub fn decode(key: &[u8], row: &[u8]) -> Result<Versioned, StoreError> {
    Ok(Versioned {
        create_revision: field(key, row, 0)?,
        mod_revision: field(key, row, 1)?,
        version: field(key, row, 2)?,
        value: row[HEADER_LEN..].to_vec(),
    })
}

/// The session the `D` row of `key` holding `row` is bound to (0: none).
pub fn bound_session(key: &[u8], row: &[u8]) -> Result<u64, StoreError> {
    field(key, row, 3)
}

/// How many keys are bound to `session`, counting at most `max`.
pub fn session_key_count<S: Store>(
    store: &S,
    session: u64,
    max: usize,
) -> Result<usize, StoreError> {
    let prefix = keyspace::session_keys_prefix(session);
    Ok(index_rows(store, &prefix, max)?.len())
}

/// The `E` rows under `prefix` (one session's), at most `max`.
fn index_rows<S: Store>(
    store: &S,
    prefix: &[u8],
    max: usize,
) -> Result<Vec<crate::store::KeyValue>, StoreError> {
    use std::ops::Bound;
    let upper = keyspace::prefix_end(prefix);
    let upper = match &upper {
        Some(u) => Bound::Excluded(u.as_slice()),
        None => Bound::Unbounded,
    };
    store.scan(Bound::Included(prefix), upper, false, max)
}

/// Every `E` row key under `prefix`: one session's bound keys, however
/// many (the put's limit is a policy that a later build may change, never
/// a reason to refuse the rows a state holds), read in chunks.
fn session_keys<S: Store>(store: &S, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
    use std::ops::Bound;
    const CHUNK: usize = 1024;
    let upper = keyspace::prefix_end(prefix);
    let upper = match &upper {
        Some(u) => Bound::Excluded(u.as_slice()),
        None => Bound::Unbounded,
    };
    let mut out: Vec<Vec<u8>> = Vec::new();
    loop {
        let lower = match out.last() {
            Some(k) => Bound::Excluded(k.as_slice()),
            None => Bound::Included(prefix),
        };
        let chunk = store.scan(lower, upper, false, CHUNK)?;
        let done = chunk.len() < CHUNK;
        out.extend(chunk.into_iter().map(|(k, _)| k));
        if done {
            return Ok(out);
        }
    }
}

/// Whether `key` is bound to `session`.
pub fn is_bound_to<S: Store>(store: &S, key: &[u8], session: u64) -> Result<bool, StoreError> {
    Ok(store
        .get(&keyspace::session_key_row(session, key))?
        .is_some())
}

/// The user key `key`'s value and revisions.
pub fn get<S: Store>(store: &S, key: &[u8]) -> Result<Option<Versioned>, StoreError> {
    match store.get(&data_key(key))? {
        None => Ok(None),
        Some(row) => decode(key, &row).map(Some),
    }
}

/// The cluster's revision: how many commands changed keys so far (plus
/// what restores added, see [`crate::backup`]).
pub fn revision<S: Store>(store: &S) -> Result<u64, StoreError> {
    crate::store::read_counter(store, META_REVISION)
}

/// Whether `test` holds for `key`, whose current state is `current`.
/// A revision test on an absent key is refused: it has no revisions.
pub fn test_holds(
    key: &[u8],
    test: &Test,
    current: Option<&Versioned>,
) -> Result<bool, CommandError> {
    match test {
        Test::ValueIs(expected) => Ok(current.map(|v| &v.value) == expected.as_ref()),
        Test::Exists(exists) => Ok(current.is_some() == *exists),
        Test::Revision {
            field,
            compare,
            value,
        } => {
            let Some(v) = current else {
                return Err(CommandError::KeyAbsent {
                    key: String::from_utf8_lossy(key).into_owned(),
                });
            };
            let actual = match field {
                RevisionField::Create => v.create_revision,
                RevisionField::Mod => v.mod_revision,
                RevisionField::Version => v.version,
            };
            Ok(compare.holds(actual, *value))
        }
    }
}

/// The changes of one command to user data, all at one revision, and
/// their record in the watch history ([`crate::history`]).
#[derive(Debug)]
pub struct Change {
    /// The revision before the command.
    before: u64,
    /// Whether a key changed: the command then takes `before + 1`.
    changed: bool,
    /// What changed, for the history.
    record: Recorder,
}

impl Change {
    /// Start a command's changes at the store's current revision.
    pub fn begin<S: Store>(store: &S) -> Result<Self, StoreError> {
        Ok(Change {
            before: revision(store)?,
            changed: false,
            record: Recorder::default(),
        })
    }

    /// The revision this command's changes take.
    fn at(&self) -> u64 {
        self.before.saturating_add(1)
    }

    /// Set `key` to `value`, bound to no session: created at this revision
    /// if absent, else its version goes up by one. Returns the key's state
    /// now.
    pub fn put<S: Store>(
        &mut self,
        store: &mut S,
        key: &[u8],
        value: &[u8],
    ) -> Result<Versioned, StoreError> {
        self.put_bound(store, key, value, 0)
    }

    /// As [`Change::put`], bound to `session` (0: none). The caller checked
    /// that the session is live and may hold one more key.
    pub fn put_bound<S: Store>(
        &mut self,
        store: &mut S,
        key: &[u8],
        value: &[u8],
        session: u64,
    ) -> Result<Versioned, StoreError> {
        let at = self.at();
        let k = data_key(key);
        let (old, old_session) = match store.get(&k)? {
            Some(row) => (Some(decode(key, &row)?), bound_session(key, &row)?),
            None => (None, 0),
        };
        if old_session != session {
            if old_session != 0 {
                store.delete(&keyspace::session_key_row(old_session, key))?;
            }
            if session != 0 {
                store.put(&keyspace::session_key_row(session, key), &[])?;
            }
        }
        let now = match &old {
            Some(old) => Versioned {
                value: value.to_vec(),
                create_revision: old.create_revision,
                mod_revision: at,
                version: old.version.saturating_add(1),
            },
            None => Versioned {
                value: value.to_vec(),
                create_revision: at,
                mod_revision: at,
                version: 1,
            },
        };
        store.put(&k, &encode(&now, session))?;
        self.changed = true;
        self.record.note(key, Some(now.clone()), old);
        Ok(now)
    }

    /// Remove the `D` row `row_key` = `row`, already read as present: the
    /// caller decides ([`Change::delete`], a range's scan).
    pub fn remove_row<S: Store>(
        &mut self,
        store: &mut S,
        row_key: &[u8],
        row: &[u8],
    ) -> Result<(), StoreError> {
        let key = row_key.get(1..).unwrap_or_default();
        let previous = decode(key, row)?;
        let session = bound_session(key, row)?;
        if session != 0 {
            store.delete(&keyspace::session_key_row(session, key))?;
        }
        store.delete(row_key)?;
        self.changed = true;
        self.record.note(key, None, Some(previous));
        Ok(())
    }

    /// Remove `key` if present; whether it was.
    pub fn delete<S: Store>(&mut self, store: &mut S, key: &[u8]) -> Result<bool, StoreError> {
        let k = data_key(key);
        let Some(row) = store.get(&k)? else {
            return Ok(false);
        };
        self.remove_row(store, &k, &row)?;
        Ok(true)
    }

    /// Delete every key bound to `session` (it ends), in key order; how
    /// many.
    pub fn delete_session_keys<S: Store>(
        &mut self,
        store: &mut S,
        session: u64,
    ) -> Result<u32, StoreError> {
        let prefix = keyspace::session_keys_prefix(session);
        let mut deleted = 0u32;
        for index_key in session_keys(store, &prefix)? {
            let key = index_key.get(prefix.len()..).unwrap_or_default();
            let k = data_key(key);
            match store.get(&k)? {
                Some(row) if bound_session(key, &row)? == session => {
                    self.remove_row(store, &k, &row)?;
                    deleted = deleted.saturating_add(1);
                }
                // An index row without its key: damage.
                _ => {
                    return Err(StoreError(format!(
                        "corrupt session-key index: session {session} lists {:?}, which is \
                         not bound to it",
                        String::from_utf8_lossy(key)
                    )))
                }
            }
        }
        Ok(deleted)
    }

    /// End the command: if a key changed, store the raised revision and the
    /// command's record in the history. Returns the revision after the
    /// command.
    pub fn finish<S: Store>(self, store: &mut S) -> Result<u64, StoreError> {
        if !self.changed {
            return Ok(self.before);
        }
        let at = self.at();
        store.put(META_REVISION, &at.to_be_bytes())?;
        self.record.write(store, at)?;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;

    #[test]
    fn a_row_round_trips_and_a_short_row_is_an_error() {
        let v = Versioned {
            value: b"xyz".to_vec(),
            create_revision: 3,
            mod_revision: 9,
            version: 4,
        };
        assert_eq!(decode(b"k", &encode(&v, 7)).unwrap(), v);
        assert_eq!(bound_session(b"k", &encode(&v, 7)).unwrap(), 7);
        let err = decode(b"k", &[0; 31]).unwrap_err();
        assert!(err.0.contains("corrupt data row"), "{err}");
    }

    #[test]
    fn a_command_that_changes_nothing_raises_nothing() {
        let mut store = MemStore::default();
        let mut change = Change::begin(&store).unwrap();
        assert!(!change.delete(&mut store, b"absent").unwrap());
        assert_eq!(change.finish(&mut store).unwrap(), 0);
        assert!(store.map.is_empty());
    }

    #[test]
    fn a_rewrite_keeps_the_create_revision_and_counts_the_version() {
        let mut store = MemStore::default();
        for _ in 0..3 {
            let mut change = Change::begin(&store).unwrap();
            change.put(&mut store, b"k", b"v").unwrap();
            change.finish(&mut store).unwrap();
        }
        let v = get(&store, b"k").unwrap().unwrap();
        assert_eq!((v.create_revision, v.mod_revision, v.version), (1, 3, 3));
        let mut change = Change::begin(&store).unwrap();
        assert!(change.delete(&mut store, b"k").unwrap());
        change.put(&mut store, b"k", b"again").unwrap();
        assert_eq!(change.finish(&mut store).unwrap(), 4);
        let v = get(&store, b"k").unwrap().unwrap();
        assert_eq!((v.create_revision, v.mod_revision, v.version), (4, 4, 1));
    }

    #[test]
    fn a_revision_test_on_an_absent_key_is_refused() {
        let test = Test::mod_revision_is(1);
        assert!(matches!(
            test_holds(b"k", &test, None),
            Err(CommandError::KeyAbsent { .. })
        ));
        assert_eq!(test_holds(b"k", &Test::Exists(false), None), Ok(true));
        assert_eq!(test_holds(b"k", &Test::ValueIs(None), None), Ok(true));
    }
}
