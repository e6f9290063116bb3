//! Which keys a watch names ([`Selection`]), and what it is told of them:
//! the changes of each revision ([`crate::history`]) cut down to those keys.
//!
//! ```
//! use latchkey_core::watch::Selection;
//!
//! let members = Selection::Prefix(b"members/".to_vec());
//! assert!(members.validate().is_ok());
//! assert!(members.contains(b"members/a"));
//! assert!(!members.contains(b"member"));
//! // A watch of an empty prefix is refused: watch the range from the empty
//! // key to name every key.
//! assert!(Selection::Prefix(Vec::new()).validate().is_err());
//! assert!(Selection::Range { start: Vec::new(), end: None }.contains(b"anything"));
//! ```

use crate::command::ScanRange;
use crate::history::{KeyChange, Record};
use crate::limits::MAX_KEY_LEN;
use crate::CommandError;

/// The keys a watch names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// One key.
    Key(Vec<u8>),
    /// The keys in `[start, end)`; `end: None`: every key from `start` on.
    Range {
        /// The first key (inclusive); empty: from the first key.
        start: Vec<u8>,
        /// The end (exclusive); `None`: to the last key.
        end: Option<Vec<u8>>,
    },
    /// Every key starting with these bytes.
    Prefix(Vec<u8>),
}

fn too_long(what: &str, bytes: &[u8]) -> Result<(), CommandError> {
    if bytes.len() > MAX_KEY_LEN {
        return Err(CommandError::invalid(format!(
            "the watched {what} is {} bytes, the limit is {MAX_KEY_LEN}",
            bytes.len()
        )));
    }
    Ok(())
}

impl Selection {
    /// One key.
    pub fn key(key: impl AsRef<[u8]>) -> Self {
        Selection::Key(key.as_ref().to_vec())
    }

    /// Every key starting with `prefix`.
    pub fn prefix(prefix: impl AsRef<[u8]>) -> Self {
        Selection::Prefix(prefix.as_ref().to_vec())
    }

    /// The keys in `[start, end)`.
    pub fn range(start: impl AsRef<[u8]>, end: impl AsRef<[u8]>) -> Self {
        Selection::Range {
            start: start.as_ref().to_vec(),
            end: Some(end.as_ref().to_vec()),
        }
    }

    /// Every key.
    pub fn all() -> Self {
        Selection::Range {
            start: Vec::new(),
            end: None,
        }
    }

    /// Refuse a selection that names no key, or breaks the key limit: an
    /// empty key or prefix, a range whose end is not after its start.
    pub fn validate(&self) -> Result<(), CommandError> {
        match self {
            Selection::Key(key) => {
                if key.is_empty() {
                    return Err(CommandError::invalid("the watched key must not be empty"));
                }
                too_long("key", key)
            }
            Selection::Prefix(prefix) => {
                if prefix.is_empty() {
                    return Err(CommandError::invalid(
                        "the watched prefix must not be empty (to watch every key, watch the \
                         range from the empty key)",
                    ));
                }
                too_long("prefix", prefix)
            }
            Selection::Range { start, end } => {
                too_long("range start", start)?;
                if let Some(end) = end {
                    too_long("range end", end)?;
                    if end <= start {
                        return Err(CommandError::invalid(
                            "the watched range's end must be after its start",
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// Whether `key` is one of the selected keys.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            Selection::Key(k) => k.as_slice() == key,
            Selection::Prefix(p) => key.starts_with(p),
            Selection::Range { start, end } => {
                key >= start.as_slice() && end.as_ref().is_none_or(|e| key < e.as_slice())
            }
        }
    }

    /// The same keys as a scan (ascending, `limit` entries at most): what a
    /// caller lists before watching, and what access control checks.
    pub fn as_scan(&self, limit: u32) -> ScanRange {
        let (start, end, prefix) = match self {
            Selection::Key(k) => {
                let mut end = k.clone();
                end.push(0);
                (k.clone(), Some(end), Vec::new())
            }
            Selection::Range { start, end } => (start.clone(), end.clone(), Vec::new()),
            Selection::Prefix(p) => (Vec::new(), None, p.clone()),
        };
        ScanRange {
            start,
            end,
            prefix,
            limit,
            reverse: false,
        }
    }

    /// The changes of `record` to the selected keys, in order (empty when
    /// it changed none of them).
    pub fn pick<'a>(&'a self, record: &'a Record) -> impl Iterator<Item = &'a KeyChange> + 'a {
        record.changes.iter().filter(|c| self.contains(&c.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(vec![0u8, b'a', b'b', 0xff]), 0..4)
    }

    fn selection() -> impl Strategy<Value = Selection> {
        prop_oneof![
            key().prop_map(Selection::Key),
            key().prop_map(Selection::Prefix),
            (key(), prop::option::of(key()))
                .prop_map(|(start, end)| Selection::Range { start, end }),
        ]
    }

    proptest! {
        /// A valid selection contains exactly the keys its scan visits.
        #[test]
        fn contains_agrees_with_the_scan(sel in selection(), keys in prop::collection::btree_set(key(), 0..12)) {
            prop_assume!(sel.validate().is_ok());
            let mut store = MemStore::default();
            for k in keys.iter().filter(|k| !k.is_empty()) {
                let put = crate::Command::Put { key: k.clone(), value: b"v".to_vec() };
                crate::apply(&mut store, &crate::Request { now: 1, command: put }).unwrap().unwrap();
            }
            let scanned: Vec<Vec<u8>> = match crate::query(&store, &crate::Query::Scan(sel.as_scan(0))).unwrap() {
                Ok(crate::Outcome::Entries { entries, .. }) => entries.into_iter().map(|(k, _)| k).collect(),
                other => panic!("{other:?}"),
            };
            let contained: Vec<Vec<u8>> = keys.iter().filter(|k| !k.is_empty() && sel.contains(k)).cloned().collect();
            prop_assert_eq!(scanned, contained);
        }
    }

    #[test]
    fn bad_selections_are_refused() {
        for bad in [
            Selection::Key(Vec::new()),
            Selection::Prefix(Vec::new()),
            Selection::Key(vec![1; MAX_KEY_LEN + 1]),
            Selection::Range {
                start: b"b".to_vec(),
                end: Some(b"a".to_vec()),
            },
            Selection::Range {
                start: b"a".to_vec(),
                end: Some(b"a".to_vec()),
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
