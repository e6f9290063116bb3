//! [`Overlay`]: buffered writes layered over a read-only [`Store`].
//!
//! Two users, one implementation: the storage shell applies every entry of
//! one `apply()` call against an overlay and commits its writes in a single
//! RocksDB write batch; the lock commands run against an overlay of their own
//! so a refused command writes nothing. Reads through an overlay see its own
//! earlier writes (including deletes) exactly as if they had been committed.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::store::bounds_empty;
use crate::{Store, StoreError};

/// Base rows fetched per round once a scan has run into rows the overlay
/// hides; bounds both the rounds and the memory of one scan.
const SCAN_CHUNK: usize = 256;

/// A key/value row as the [`Store`] trait returns it.
type Row = (Vec<u8>, Vec<u8>);

/// Writes buffered over a read-only `base`: `Some(value)` is a put, `None` a
/// delete that hides whatever the base holds at that key.
pub struct Overlay<'b, B: Store + ?Sized> {
    base: &'b B,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    chunk: usize,
}

impl<'b, B: Store + ?Sized> Overlay<'b, B> {
    /// An empty overlay over `base`. The base is only read.
    pub fn new(base: &'b B) -> Self {
        Overlay {
            base,
            writes: BTreeMap::new(),
            chunk: SCAN_CHUNK,
        }
    }

    /// The buffered writes in key order, ready for one atomic commit.
    pub fn into_writes(self) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        self.writes
    }

    /// The first `limit` base rows in `(lower, upper)`, in scan order, whose
    /// keys the overlay does not touch.
    fn untouched_base_rows(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let mut rows: Vec<Row> = Vec::new();
        let mut lo: Bound<Vec<u8>> = lower.map(<[u8]>::to_vec);
        let mut hi: Bound<Vec<u8>> = upper.map(<[u8]>::to_vec);
        // The first round asks for exactly what is needed; later rounds exist
        // only because the overlay hid rows, and fetch in chunks.
        let mut fetch = limit;
        loop {
            if bounds_empty(as_ref(&lo), as_ref(&hi)) {
                break;
            }
            let chunk = self.base.scan(as_ref(&lo), as_ref(&hi), reverse, fetch)?;
            let exhausted = chunk.len() < fetch;
            let last = chunk.last().map(|(k, _)| k.clone());
            rows.extend(
                chunk
                    .into_iter()
                    .filter(|(k, _)| !self.writes.contains_key(k)),
            );
            if exhausted || rows.len() >= limit {
                break;
            }
            let Some(last) = last else { break };
            if reverse {
                hi = Bound::Excluded(last);
            } else {
                lo = Bound::Excluded(last);
            }
            fetch = (limit - rows.len()).max(self.chunk);
        }
        rows.truncate(limit);
        Ok(rows)
    }

    /// The first `limit` overlay puts in `(lower, upper)`, in scan order.
    fn overlay_rows(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Vec<Row> {
        let range = self
            .writes
            .range::<[u8], _>((lower, upper))
            .filter_map(|(k, v)| v.as_ref().map(|v| (k.clone(), v.clone())));
        if reverse {
            range.rev().take(limit).collect()
        } else {
            range.take(limit).collect()
        }
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Merge two lists sorted in scan order with disjoint keys, keeping `limit`.
fn merge(a: Vec<Row>, b: Vec<Row>, reverse: bool, limit: usize) -> Vec<Row> {
    let mut out = Vec::with_capacity(limit.min(a.len() + b.len()));
    let mut a = a.into_iter().peekable();
    let mut b = b.into_iter().peekable();
    while out.len() < limit {
        let take_a = match (a.peek(), b.peek()) {
            (Some((ka, _)), Some((kb, _))) => (ka < kb) != reverse,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_a { a.next() } else { b.next() };
        out.extend(next);
    }
    out
}

impl<B: Store + ?Sized> Store for Overlay<'_, B> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.writes.get(key) {
            Some(buffered) => Ok(buffered.clone()),
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

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        if limit == 0 || bounds_empty(lower, upper) {
            return Ok(Vec::new());
        }
        let base = self.untouched_base_rows(lower, upper, reverse, limit)?;
        let buffered = self.overlay_rows(lower, upper, reverse, limit);
        Ok(merge(base, buffered, reverse, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;
    use proptest::prelude::*;

    fn store(pairs: &[(&[u8], &[u8])]) -> MemStore {
        let mut s = MemStore::default();
        for (k, v) in pairs {
            s.map.insert(k.to_vec(), v.to_vec());
        }
        s
    }

    #[test]
    fn reads_see_buffered_puts_and_deletes() {
        let base = store(&[(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]);
        let mut o = Overlay::new(&base);
        o.put(b"b", b"20").unwrap();
        o.delete(b"c").unwrap();
        o.put(b"d", b"4").unwrap();
        assert_eq!(o.get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(o.get(b"b").unwrap(), Some(b"20".to_vec()));
        assert_eq!(o.get(b"c").unwrap(), None);
        let all = o
            .scan(Bound::Unbounded, Bound::Unbounded, false, 10)
            .unwrap();
        let keys: Vec<&[u8]> = all.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b", b"d"]);
        let rev = o.scan(Bound::Unbounded, Bound::Unbounded, true, 2).unwrap();
        assert_eq!(
            rev,
            vec![
                (b"d".to_vec(), b"4".to_vec()),
                (b"b".to_vec(), b"20".to_vec())
            ]
        );
    }

    #[test]
    fn hidden_deletes_do_not_eat_the_limit() {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0u8..50).map(|i| (vec![i], vec![i])).collect();
        let mut base = MemStore::default();
        base.map.extend(pairs);
        let mut o = Overlay::new(&base);
        o.chunk = 3;
        for i in 0u8..45 {
            o.delete(&[i]).unwrap();
        }
        let rows = o
            .scan(Bound::Unbounded, Bound::Unbounded, false, 2)
            .unwrap();
        assert_eq!(rows, vec![(vec![45], vec![45]), (vec![46], vec![46])]);
        for i in 49u8..50 {
            o.delete(&[i]).unwrap();
        }
        let rows = o.scan(Bound::Unbounded, Bound::Unbounded, true, 1).unwrap();
        assert_eq!(rows, vec![(vec![48], vec![48])]);
    }

    #[test]
    fn into_writes_keeps_last_write_per_key() {
        let base = MemStore::default();
        let mut o = Overlay::new(&base);
        o.put(b"k", b"1").unwrap();
        o.delete(b"k").unwrap();
        o.put(b"j", b"2").unwrap();
        let w = o.into_writes();
        assert_eq!(w.get(&b"k"[..]), Some(&None));
        assert_eq!(w.get(&b"j"[..]), Some(&Some(b"2".to_vec())));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(Vec<u8>, Vec<u8>),
        Delete(Vec<u8>),
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(0u8..4, 0..3)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (key(), prop::collection::vec(any::<u8>(), 0..3)).prop_map(|(k, v)| Op::Put(k, v)),
            key().prop_map(Op::Delete),
        ]
    }

    fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
        prop_oneof![
            Just(Bound::Unbounded),
            key().prop_map(Bound::Included),
            key().prop_map(Bound::Excluded),
        ]
    }

    fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
        super::as_ref(b)
    }

    proptest! {
        /// Every read through the overlay equals the same read on a MemStore
        /// that received the same writes directly.
        #[test]
        fn overlay_matches_memstore(
            initial in prop::collection::btree_map(key(), prop::collection::vec(any::<u8>(), 0..3), 0..20),
            ops in prop::collection::vec(op(), 0..40),
            scans in prop::collection::vec((bound(), bound(), any::<bool>(), 0usize..8), 1..10),
            chunk in 1usize..5,
        ) {
            let base = MemStore { map: initial };
            let mut model = base.clone();
            let mut overlay = Overlay::new(&base);
            overlay.chunk = chunk;
            for op in &ops {
                match op {
                    Op::Put(k, v) => {
                        overlay.put(k, v).unwrap();
                        model.put(k, v).unwrap();
                    }
                    Op::Delete(k) => {
                        overlay.delete(k).unwrap();
                        model.delete(k).unwrap();
                    }
                }
            }
            for k in (0u8..4).flat_map(|a| (0u8..4).map(move |b| vec![a, b])).chain([vec![], vec![1]]) {
                prop_assert_eq!(overlay.get(&k).unwrap(), model.get(&k).unwrap());
            }
            for (lo, hi, reverse, limit) in &scans {
                let got = overlay.scan(as_ref(lo), as_ref(hi), *reverse, *limit).unwrap();
                let want = model.scan(as_ref(lo), as_ref(hi), *reverse, *limit).unwrap();
                prop_assert_eq!(got, want);
            }
            // Committing the writes over the base yields the model.
            let mut committed = base.clone();
            for (k, v) in overlay.into_writes() {
                match v {
                    Some(v) => { committed.map.insert(k, v); }
                    None => { committed.map.remove(&k); }
                }
            }
            prop_assert_eq!(committed, model);
        }
    }
}
