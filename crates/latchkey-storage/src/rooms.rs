//! [`Rooms`]: the state machine's small, hot rows kept in memory, so that
//! applying a lock command reads nothing from RocksDB.
//!
//! Applying an acquire or a release reads a session, a lock, the session's
//! lock index, its request memory, the access-control switch and the core's
//! counters: about four point reads and a short scan per command, through
//! RocksDB's memtables, block cache and (on a long-lived replica) levels
//! full of tombstones. Those rows are kept here as well, in one ordered map:
//! every row whose tag is one of [`CACHED_TAGS`] (sessions `S`, locks `L`,
//! session locks `H`, a session's bound keys `E`, request memory `R`,
//! access control `A`, core metadata `M`). Ending a session scans its `H`
//! and `E` rows, and a put bound to a session counts its `E` rows, so
//! those scans stay in memory too. User data (`D`) and sequences (`Q`),
//! which a user can grow without bound, stay in RocksDB only.
//!
//! The map is a copy, never the truth: every write still goes to RocksDB in
//! the apply batch, and the map takes the batch's writes to its tags only
//! once RocksDB has committed that batch ([`Rooms::commit`]). It is loaded
//! from RocksDB when the store opens and again after a snapshot install
//! replaced the rows ([`Rooms::load`]); nothing else writes the state
//! machine's rows while a [`crate::StateMachine`] applies (a restore
//! writes a directory through a store that never applies, then closes it). So the map always equals what RocksDB
//! holds under those tags, which a property test in `state_machine.rs`
//! checks after random command sequences, across reopen and snapshot
//! install.
//!
//! [`ApplyView`] is the read side the state machine applies against: a
//! [`Store`] that answers keys under a cached tag from the map and the rest
//! from RocksDB; a scan that crosses tags is split at the tag boundaries and
//! each part asked of its side, in scan order, so the result is the same
//! as a scan of RocksDB alone. Queries (reads by clients) still read
//! RocksDB through [`crate::StateReader`], from any thread, as before.
//!
//! Memory: the map holds the live lock state (sessions, held and queued
//! locks, up to `MAX_REMEMBERED_REQUESTS` remembered outcomes per session)
//! and the access-control rules, about the size of those rows plus some 80
//! bytes each; [`Rooms::bytes`] counts the keys and values, and
//! [`crate::StateReader::lock_rooms_bytes`] reports it (the
//! `latchkey_storage_lock_rooms_bytes` gauge). The core caps live sessions
//! (`latchkey_core::limits::MAX_LIVE_SESSIONS`) and the keys bound to each
//! (`MAX_KEYS_PER_SESSION`, each `E` row a copy of its key); the locks a
//! session holds are not capped, so a client may still grow it that way, as
//! it could grow RocksDB's share of the same rows before.

use std::collections::BTreeMap;
use std::ops::Bound;

use latchkey_core::keyspace;
use latchkey_core::store::{bounds_empty, MemStore};
use latchkey_core::{Store, StoreError};
use rocksdb::{IteratorMode, DB};

use crate::columns::Handles;
use crate::data_view::DataView;
use crate::error::StorageError;

/// The tags whose rows live in memory as well as in RocksDB.
pub(crate) const CACHED_TAGS: [u8; 7] = [
    keyspace::AUTH,
    keyspace::SESSION_KEYS,
    keyspace::SESSION_LOCKS,
    keyspace::LOCK,
    keyspace::META,
    keyspace::REQUEST,
    keyspace::SESSION,
];

/// Is `key` in a cached room? (The empty key is in no room.)
fn cached(key: &[u8]) -> bool {
    key.first().is_some_and(|tag| is_cached_tag(*tag))
}

fn is_cached_tag(tag: u8) -> bool {
    CACHED_TAGS.contains(&tag)
}

/// The cached rows (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Rooms {
    rows: MemStore,
    bytes: usize,
}

impl Rooms {
    /// Every row under a cached tag, read from the state machine's data.
    pub(crate) fn load(db: &DB) -> Result<Self, StorageError> {
        let cfs = Handles::of(db)?;
        let mut rooms = Rooms::default();
        for tag in CACHED_TAGS {
            let start = [tag];
            for row in db.iterator_cf(
                cfs.sm_data,
                IteratorMode::From(&start, rocksdb::Direction::Forward),
            ) {
                let (key, value) = row?;
                if key.first() != Some(&tag) {
                    break;
                }
                rooms.bytes += key.len() + value.len();
                rooms.rows.map.insert(key.into_vec(), value.into_vec());
            }
        }
        Ok(rooms)
    }

    /// Take the writes of an apply batch that RocksDB has just committed:
    /// those under a cached tag; the rest are ignored.
    pub(crate) fn commit(&mut self, writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>) {
        for (key, value) in writes {
            if !cached(&key) {
                continue;
            }
            let key_len = key.len();
            let (added, old) = match value {
                Some(value) => (key_len + value.len(), self.rows.map.insert(key, value)),
                None => (0, self.rows.map.remove(&key)),
            };
            let removed = old.map_or(0, |old| key_len + old.len());
            self.bytes = (self.bytes + added).saturating_sub(removed);
        }
    }

    /// Bytes of keys and values held (not counting the map's own overhead).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The rows, for tests that compare them with RocksDB.
    #[cfg(test)]
    pub(crate) fn rows(&self) -> &BTreeMap<Vec<u8>, Vec<u8>> {
        &self.rows.map
    }
}

/// What the state machine applies against: cached rooms from [`Rooms`], the
/// rest from RocksDB (see the module docs). Read-only, like [`DataView`].
pub(crate) struct ApplyView<'a> {
    pub(crate) rooms: &'a Rooms,
    pub(crate) data: DataView<'a>,
}

impl Store for ApplyView<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if cached(key) {
            self.rooms.rows.get(key)
        } else {
            self.data.get(key)
        }
    }

    fn put(&mut self, _key: &[u8], _value: &[u8]) -> Result<(), StoreError> {
        Err(StoreError("the apply view is read-only".into()))
    }

    fn delete(&mut self, _key: &[u8]) -> Result<(), StoreError> {
        Err(StoreError("the apply view is read-only".into()))
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StoreError> {
        let mut rows = Vec::new();
        let runs: &[Run] = &TAG_RUNS;
        for i in 0..runs.len() {
            let run = &runs[if reverse { runs.len() - 1 - i } else { i }];
            if rows.len() >= limit {
                break;
            }
            let (first, end) = (run.first.map(|t| [t]), run.end.map(|t| [t]));
            let run_lower = first
                .as_ref()
                .map_or(Bound::Unbounded, |t| Bound::Included(&t[..]));
            let run_upper = end
                .as_ref()
                .map_or(Bound::Unbounded, |t| Bound::Excluded(&t[..]));
            let lo = tighter_lower(lower, run_lower);
            let hi = tighter_upper(upper, run_upper);
            if bounds_empty(lo, hi) {
                continue;
            }
            let want = limit - rows.len();
            rows.extend(if run.in_memory {
                self.rooms.rows.scan(lo, hi, reverse, want)?
            } else {
                self.data.scan(lo, hi, reverse, want)?
            });
        }
        Ok(rows)
    }
}

/// A maximal run of tags on the same side: keys from `[first]` (from the
/// empty key if `None`) up to, not including, `[end]` (unbounded if `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first: Option<u8>,
    end: Option<u8>,
    in_memory: bool,
}

/// The keyspace cut into [`Run`]s, in key order.
static TAG_RUNS: std::sync::LazyLock<Vec<Run>> = std::sync::LazyLock::new(|| {
    let mut runs = Vec::new();
    let mut first = None;
    let mut in_memory = false;
    for tag in 0..=u8::MAX {
        if is_cached_tag(tag) != in_memory {
            runs.push(Run {
                first,
                end: Some(tag),
                in_memory,
            });
            first = Some(tag);
            in_memory = !in_memory;
        }
    }
    runs.push(Run {
        first,
        end: None,
        in_memory,
    });
    runs
});

/// The higher of two lower bounds (at equal keys, an excluded bound is the
/// higher).
fn tighter_lower<'k>(a: Bound<&'k [u8]>, b: Bound<&'k [u8]>) -> Bound<&'k [u8]> {
    match (a, b) {
        (Bound::Unbounded, x) | (x, Bound::Unbounded) => x,
        (Bound::Included(x), Bound::Included(y)) => Bound::Included(x.max(y)),
        (Bound::Excluded(x), Bound::Excluded(y)) => Bound::Excluded(x.max(y)),
        (Bound::Included(i), Bound::Excluded(e)) | (Bound::Excluded(e), Bound::Included(i)) => {
            if i > e {
                Bound::Included(i)
            } else {
                Bound::Excluded(e)
            }
        }
    }
}

/// The lower of two upper bounds (at equal keys, an excluded bound is the
/// lower).
fn tighter_upper<'k>(a: Bound<&'k [u8]>, b: Bound<&'k [u8]>) -> Bound<&'k [u8]> {
    match (a, b) {
        (Bound::Unbounded, x) | (x, Bound::Unbounded) => x,
        (Bound::Included(x), Bound::Included(y)) => Bound::Included(x.min(y)),
        (Bound::Excluded(x), Bound::Excluded(y)) => Bound::Excluded(x.min(y)),
        (Bound::Included(i), Bound::Excluded(e)) | (Bound::Excluded(e), Bound::Included(i)) => {
            if i < e {
                Bound::Included(i)
            } else {
                Bound::Excluded(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Rows under every kind of tag: cached, not cached, and around the
    /// run boundaries.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        let tag = prop_oneof![
            Just(keyspace::AUTH),
            Just(keyspace::DATA),
            Just(keyspace::SESSION_KEYS),
            Just(keyspace::SESSION_LOCKS),
            Just(keyspace::LOCK),
            Just(keyspace::META),
            Just(keyspace::SEQUENCE),
            Just(keyspace::REQUEST),
            Just(keyspace::SESSION),
            Just(0u8),
            Just(0x4e),
            Just(0xff),
        ];
        (tag, proptest::collection::vec(any::<u8>(), 0..3)).prop_map(|(t, mut rest)| {
            rest.insert(0, t);
            rest
        })
    }

    fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
        prop_oneof![
            Just(Bound::Unbounded),
            key().prop_map(Bound::Included),
            key().prop_map(Bound::Excluded),
        ]
    }

    proptest! {
        // Each case opens a RocksDB instance.
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A scan through the view returns exactly what a scan of one store
        /// holding every row returns, whatever the bounds, direction and
        /// limit; gets too.
        #[test]
        fn the_view_reads_like_one_store(
            rows in proptest::collection::btree_map(key(), proptest::collection::vec(any::<u8>(), 0..3), 0..40),
            lower in bound(),
            upper in bound(),
            reverse in any::<bool>(),
            limit in 0usize..50,
            probe in key(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (_log, sm) = crate::open(dir.path(), crate::StorageOptions::default()).unwrap();
            let reader = sm.reader();
            let db = &reader.db;
            let cfs = Handles::of(db).unwrap();
            let mut whole = MemStore::default();
            for (k, v) in &rows {
                db.put_cf(cfs.sm_data, k, v).unwrap();
                whole.map.insert(k.clone(), v.clone());
            }
            let rooms = Rooms::load(db).unwrap();
            prop_assert!(rooms.rows().keys().all(|k| cached(k)));
            prop_assert_eq!(
                rooms.rows().len(),
                rows.keys().filter(|k| cached(k)).count()
            );
            let view = ApplyView { rooms: &rooms, data: DataView::live(db).unwrap() };
            let (lo, hi) = (as_ref(&lower), as_ref(&upper));
            prop_assert_eq!(
                view.scan(lo, hi, reverse, limit).unwrap(),
                whole.scan(lo, hi, reverse, limit).unwrap()
            );
            prop_assert_eq!(view.get(&probe).unwrap(), whole.get(&probe).unwrap());
        }
    }

    fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
        match b {
            Bound::Included(k) => Bound::Included(k.as_slice()),
            Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
            Bound::Unbounded => Bound::Unbounded,
        }
    }

    #[test]
    fn runs_cover_the_keyspace_in_order() {
        let runs: &[Run] = &TAG_RUNS;
        assert_eq!(runs.first().map(|r| r.first), Some(None));
        assert_eq!(runs.last().map(|r| r.end), Some(None));
        for pair in runs.windows(2) {
            assert!(
                pair[0].end.is_some() && pair[0].end == pair[1].first,
                "{pair:?}"
            );
            assert_ne!(pair[0].in_memory, pair[1].in_memory, "runs alternate sides");
        }
        let in_memory: Vec<u8> = runs
            .iter()
            .filter(|r| r.in_memory)
            .flat_map(|r| match (r.first, r.end) {
                (Some(s), Some(e)) => s..e,
                other => panic!("a cached run is bounded: {other:?}"),
            })
            .collect();
        let mut tags = CACHED_TAGS.to_vec();
        tags.sort_unstable();
        assert_eq!(in_memory, tags);
    }

    #[test]
    fn commit_keeps_only_cached_rows_and_counts_bytes() {
        let mut rooms = Rooms::default();
        let mut writes = BTreeMap::new();
        writes.insert(keyspace::session_key(1), Some(b"abc".to_vec()));
        writes.insert(keyspace::tagged(keyspace::DATA, b"k"), Some(b"v".to_vec()));
        rooms.commit(writes);
        assert_eq!(rooms.rows().len(), 1);
        assert_eq!(rooms.bytes(), 9 + 3);
        let mut writes = BTreeMap::new();
        writes.insert(keyspace::session_key(1), Some(b"a".to_vec()));
        rooms.commit(writes);
        assert_eq!(rooms.bytes(), 9 + 1);
        let mut writes = BTreeMap::new();
        writes.insert(keyspace::session_key(1), None);
        writes.insert(keyspace::session_key(2), None);
        rooms.commit(writes);
        assert_eq!(rooms.bytes(), 0);
        assert!(rooms.rows().is_empty());
    }
}
