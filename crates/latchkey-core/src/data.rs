//! The data room: user keys with their revisions, and the one counter
//! that numbers every change ([`crate::keyspace::META_REVISION`]).
//!
//! A `D` row's value is a 24-byte header, `create_revision`,
//! `mod_revision`, `version` (u64 big-endian each), followed by the user's
//! value. Every write of user data goes through a [`Change`]: it draws the
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
pub const HEADER_LEN: usize = 24;

/// The `D` row key of a user key.
pub fn data_key(key: &[u8]) -> Vec<u8> {
    keyspace::tagged(DATA, key)
}

/// A `D` row's value for `v`.
pub fn encode(v: &Versioned) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + v.value.len());
    out.extend_from_slice(&v.create_revision.to_be_bytes());
    out.extend_from_slice(&v.mod_revision.to_be_bytes());
    out.extend_from_slice(&v.version.to_be_bytes());
    out.extend_from_slice(&v.value);
    out
}

/// The value and revisions of the `D` row of `key` holding `row`. A row
/// shorter than its header means the store is damaged: the replica stops
/// rather than serve a made-up revision.
pub fn decode(key: &[u8], row: &[u8]) -> Result<Versioned, StoreError> {
    let field = |i: usize| {
        row.get(i * 8..i * 8 + 8)
            .and_then(keyspace::read_u64)
            .ok_or_else(|| {
                StoreError(format!(
                    "corrupt data row {:?}: {} bytes, shorter than its {HEADER_LEN}-byte header",
                    String::from_utf8_lossy(key),
                    row.len()
                ))
            })
    };
    Ok(Versioned {
        create_revision: field(0)?,
        mod_revision: field(1)?,
        version: field(2)?,
        value: row[HEADER_LEN..].to_vec(),
    })
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

    /// Set `key` to `value`: created at this revision if absent, else its
    /// version goes up by one. Returns the key's state now.
    pub fn put<S: Store>(
        &mut self,
        store: &mut S,
        key: &[u8],
        value: &[u8],
    ) -> Result<Versioned, StoreError> {
        let at = self.at();
        let old = get(store, key)?;
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
        store.put(&data_key(key), &encode(&now))?;
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
        assert_eq!(decode(b"k", &encode(&v)).unwrap(), v);
        let err = decode(b"k", &[0; 23]).unwrap_err();
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
