//! [`Staged`]: a [`Store`] view that holds every write back until the
//! command has fully succeeded.
//!
//! Lock commands touch several records (the lock, the session, the request
//! memory, counters). They run against a `Staged` view of the store; only if
//! the command succeeds are the staged writes handed to the real store, in
//! key order. A refused command therefore writes nothing by construction,
//! whatever point it was refused at.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::store::{bounds_empty, KeyValue};
use crate::{Store, StoreError};

/// Reads go through to `base` unless this view wrote the key; writes are kept
/// in memory (`None` = deleted) until [`Staged::into_writes`].
pub(crate) struct Staged<'a, S: Store> {
    base: &'a S,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl<'a, S: Store> Staged<'a, S> {
    pub(crate) fn new(base: &'a S) -> Self {
        Staged {
            base,
            writes: BTreeMap::new(),
        }
    }

    /// The staged writes in key order: `Some(value)` puts, `None` deletes.
    pub(crate) fn into_writes(self) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        self.writes
    }

    fn staged_in(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
    ) -> impl DoubleEndedIterator<Item = (&Vec<u8>, &Option<Vec<u8>>)> {
        let empty = bounds_empty(lower, upper);
        let range = if empty {
            None
        } else {
            Some(self.writes.range::<[u8], _>((lower, upper)))
        };
        range.into_iter().flatten()
    }
}

/// Apply staged writes to `store`, in key order.
pub(crate) fn commit<S: Store>(
    store: &mut S,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
) -> Result<(), StoreError> {
    for (k, v) in writes {
        match v {
            Some(v) => store.put(&k, &v)?,
            None => store.delete(&k)?,
        }
    }
    Ok(())
}

impl<S: Store> Store for Staged<'_, S> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.writes.get(key) {
            Some(staged) => Ok(staged.clone()),
            None => self.base.get(key),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        self.writes.insert(key.to_vec(), None);
        Ok(())
    }

    /// Each staged key can hide at most one base row, so the first `limit`
    /// merged rows lie within the first `limit + staged keys in range` base
    /// rows plus the staged puts.
    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<KeyValue>, StoreError> {
        if limit == 0 || bounds_empty(lower, upper) {
            return Ok(Vec::new());
        }
        let staged = self.staged_in(lower, upper).count();
        let base = self
            .base
            .scan(lower, upper, reverse, limit.saturating_add(staged))?;
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = base
            .into_iter()
            .filter(|(k, _)| !self.writes.contains_key(k))
            .collect();
        for (k, v) in self.staged_in(lower, upper) {
            if let Some(v) = v {
                merged.insert(k.clone(), v.clone());
            }
        }
        Ok(if reverse {
            merged.into_iter().rev().take(limit).collect()
        } else {
            merged.into_iter().take(limit).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(0u8..4, 0..3)
    }

    fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
        prop_oneof![
            Just(Bound::Unbounded),
            key().prop_map(Bound::Included),
            key().prop_map(Bound::Excluded),
        ]
    }

    fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
        match b {
            Bound::Included(k) => Bound::Included(k.as_slice()),
            Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
            Bound::Unbounded => Bound::Unbounded,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A staged view reads exactly like the store it would become, and
        /// committing it produces that store.
        #[test]
        fn staged_reads_like_the_committed_store(
            base in prop::collection::btree_map(key(), key(), 0..12),
            writes in prop::collection::vec((key(), prop::option::of(key())), 0..12),
            lower in bound(),
            upper in bound(),
            reverse in any::<bool>(),
            limit in 0usize..8,
        ) {
            let base = MemStore { map: base };
            let mut expected = base.clone();
            let mut staged = Staged::new(&base);
            for (k, v) in &writes {
                match v {
                    Some(v) => {
                        staged.put(k, v).unwrap();
                        expected.put(k, v).unwrap();
                    }
                    None => {
                        staged.delete(k).unwrap();
                        expected.delete(k).unwrap();
                    }
                }
            }
            for (k, _) in &writes {
                prop_assert_eq!(staged.get(k).unwrap(), expected.get(k).unwrap());
            }
            let (l, u) = (as_ref(&lower), as_ref(&upper));
            prop_assert_eq!(
                staged.scan(l, u, reverse, limit).unwrap(),
                expected.scan(l, u, reverse, limit).unwrap()
            );
            let writes = staged.into_writes();
            let mut committed = base.clone();
            commit(&mut committed, writes).unwrap();
            prop_assert_eq!(committed, expected);
        }
    }
}
