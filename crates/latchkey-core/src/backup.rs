//! What a backup of the state holds ([`Census`]) and how a restore moves its
//! counters on ([`bump_row`]), row by row over the keyspace
//! ([`crate::keyspace`]).
//!
//! A backup is a cut of the state at one log index. The cluster it came from
//! may have gone on issuing fencing tokens, session ids and sequence ranges
//! after that cut, and those may still be in use (a paused holder, a fence
//! gate that remembers a token, ids stored elsewhere). A restored cluster
//! that counted on from the backup's values would issue them again: two
//! grants with one token would both pass a fence gate. So a restore adds
//! `by` (at least [`MIN_BUMP`], by default [`DEFAULT_BUMP`]) to the last
//! fencing token, the last session id, the cluster's revision (so a watcher
//! that saw a revision of the old cluster never takes a new change for one
//! it has seen), every sequence's next start and the
//! start of sequences not used yet ([`crate::keyspace::META_SEQUENCE_FLOOR`]),
//! writing those it lacks as `by` ([`missing_counters`]):
//! tokens and sequences never go backwards as long as the old cluster issued
//! fewer than `by` of them after the backup (etcd's `--bump-revision` is the
//! same idea). The default, 2^40, is over three years of 10,000 grants a
//! second. Locks held at the backup keep their holders and tokens: those
//! tokens are lower than anything issued since, so a fence refuses them once
//! it has seen a newer grant.
//!
//! Pure functions, like the rest of the crate: the storage crate feeds rows
//! in, and writes what comes out.
//!
//! ```
//! use latchkey_core::backup::{bump_row, Census};
//! use latchkey_core::keyspace::{self, META_LAST_TOKEN};
//!
//! let token = 7u64.to_be_bytes();
//! let bumped = bump_row(META_LAST_TOKEN, &token, 1000).unwrap();
//! assert_eq!(bumped, 1007u64.to_be_bytes());
//! // User data is never touched.
//! let key = keyspace::tagged(keyspace::DATA, b"k");
//! assert_eq!(bump_row(&key, b"v", 1000).unwrap(), b"v");
//!
//! let mut census = Census::default();
//! census.add(&key, b"v");
//! census.add(META_LAST_TOKEN, &bumped);
//! assert_eq!((census.keys, census.last_token), (1, 1007));
//! ```

use serde::Serialize;

use crate::codec;
use crate::keyspace::{
    read_u64, AUTH, DATA, HISTORY, LOCK, META_HISTORY, META_LAST_SESSION, META_LAST_TOKEN,
    META_REVISION, META_SEQUENCE_FLOOR, SEQUENCE, SESSION,
};
use crate::lock::lock_table::LockRecord;

/// Added by default to every counter on restore: 2^40.
pub const DEFAULT_BUMP: u64 = 1 << 40;
/// The smallest bump a restore accepts: a restore that does not move the
/// counters at all would reissue every token granted after the backup.
pub const MIN_BUMP: u64 = 1_000_000;

/// A counter cannot be moved on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BumpError {
    /// The counter plus the bump does not fit in 64 bits.
    #[error("counter {counter} is at {value}: adding {by} overflows; restore with a smaller bump")]
    Overflow {
        /// Which counter (a sequence's key, or "fencing tokens" / "session ids").
        counter: String,
        /// Its value in the backup.
        value: u64,
        /// The bump asked for.
        by: u64,
    },
    /// A counter cell that is not 8 bytes: the backup is damaged.
    #[error("counter {counter} is {len} bytes instead of 8: the backup is damaged")]
    Malformed {
        /// Which counter.
        counter: String,
        /// Its length.
        len: usize,
    },
}

/// The counters every restore writes (moved on by the bump), whether or not
/// the backup holds them: a counter the backup lacks was 0 then, and the
/// old cluster may have issued from it since.
pub const RESTORED_COUNTERS: [&[u8]; 4] = [
    META_LAST_TOKEN,
    META_LAST_SESSION,
    META_SEQUENCE_FLOOR,
    META_REVISION,
];

/// Which counter a row holds, if it holds one a restore moves on.
fn counter_name(key: &[u8]) -> Option<String> {
    if key == META_LAST_TOKEN {
        Some("fencing tokens".to_string())
    } else if key == META_LAST_SESSION {
        Some("session ids".to_string())
    } else if key == META_SEQUENCE_FLOOR {
        Some("the start of new sequences".to_string())
    } else if key == META_REVISION {
        Some("the cluster's revision".to_string())
    } else if key.first() == Some(&SEQUENCE) {
        Some(format!("sequence {:?}", String::from_utf8_lossy(&key[1..])))
    } else {
        None
    }
}

/// The value a restore writes for the row `key` = `value` of a backup: the
/// counters (last fencing token, last session id, the start of sequences
/// not used yet, every sequence) moved on by `by`, anything else unchanged.
/// A sequence that would pass `u64::MAX` stays at `u64::MAX` (exhausted:
/// nothing of it is issued again); the other counters refuse to overflow.
pub fn bump_row(key: &[u8], value: &[u8], by: u64) -> Result<Vec<u8>, BumpError> {
    let Some(counter) = counter_name(key) else {
        return Ok(value.to_vec());
    };
    let Some(current) = read_u64(value) else {
        return Err(BumpError::Malformed {
            counter,
            len: value.len(),
        });
    };
    let next = match current.checked_add(by) {
        Some(next) => next,
        None if key.first() == Some(&SEQUENCE) => u64::MAX,
        None => {
            return Err(BumpError::Overflow {
                counter,
                value: current,
                by,
            })
        }
    };
    Ok(next.to_be_bytes().to_vec())
}

/// What a restore writes for the row `key` = `value` of a backup: `None`
/// for the watch history (its records and `Mhist`, see [`crate::history`]),
/// which a restore leaves out: the revisions it bumps past were never
/// recorded, so a watcher must not resume across it (its start revision is
/// then before the new history and refused as compacted); every other row
/// as [`bump_row`] moves it on.
pub fn restore_row(key: &[u8], value: &[u8], by: u64) -> Result<Option<Vec<u8>>, BumpError> {
    if key.first() == Some(&HISTORY) || key == META_HISTORY {
        return Ok(None);
    }
    bump_row(key, value, by).map(Some)
}

/// The rows a restore writes for the [`RESTORED_COUNTERS`] the backup does
/// not hold (`census` counted it): each at `by`, as if it had been 0.
pub fn missing_counters(census: &Census, by: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    RESTORED_COUNTERS
        .iter()
        .filter(|key| !census.counters.iter().any(|seen| seen.as_slice() == **key))
        .map(|key| (key.to_vec(), by.to_be_bytes().to_vec()))
        .collect()
}

/// What a backup holds, counted row by row ([`Census::add`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Census {
    /// Rows of every kind.
    pub rows: u64,
    /// User keys.
    pub keys: u64,
    /// Bytes of user keys and values (without their revisions).
    pub data_bytes: u64,
    /// Sequences.
    pub sequences: u64,
    /// Lock sessions.
    pub sessions: u64,
    /// Locks held, queued for or in lock-delay.
    pub locks: u64,
    /// Grants among them (a shared lock counts each holder).
    pub holders: u64,
    /// Acquires waiting for them (a multi-lock's wait counts once, like
    /// the lock census's).
    pub waiters: u64,
    /// Access-control rows (users, roles, the enabled flag, owners).
    pub access_control_rows: u64,
    /// The last fencing token issued (0: none).
    pub last_token: u64,
    /// The last session id issued (0: none).
    pub last_session: u64,
    /// Where sequences not used yet start (0 unless restored before).
    pub sequence_floor: u64,
    /// The cluster's revision (0: no key was ever written).
    pub revision: u64,
    /// Which of [`RESTORED_COUNTERS`] the backup holds.
    #[serde(skip)]
    pub counters: Vec<Vec<u8>>,
    /// Lock rows that do not decode (a damaged backup: never restored).
    pub damaged: u64,
}

impl Census {
    /// Count the row `key` = `value`.
    pub fn add(&mut self, key: &[u8], value: &[u8]) {
        self.rows += 1;
        match key.first() {
            Some(&DATA) => {
                self.keys += 1;
                match value.len().checked_sub(crate::data::HEADER_LEN) {
                    Some(user_value) => self.data_bytes += (key.len() - 1 + user_value) as u64,
                    // Shorter than its revisions: a damaged backup.
                    None => self.damaged += 1,
                }
            }
            Some(&SEQUENCE) => self.sequences += 1,
            Some(&SESSION) => self.sessions += 1,
            Some(&LOCK) => {
                self.locks += 1;
                let name = key.get(1..).and_then(|n| std::str::from_utf8(n).ok());
                match (name, codec::decode::<LockRecord>(value)) {
                    (Some(name), Ok(record)) => {
                        self.holders += record.holders.len() as u64;
                        self.waiters += record.waits_counted(name);
                    }
                    _ => self.damaged += 1,
                }
            }
            Some(&AUTH) => self.access_control_rows += 1,
            _ if key == META_LAST_TOKEN => match read_u64(value) {
                Some(v) => self.last_token = v,
                None => self.damaged += 1,
            },
            _ if key == META_LAST_SESSION => match read_u64(value) {
                Some(v) => self.last_session = v,
                None => self.damaged += 1,
            },
            _ if key == META_SEQUENCE_FLOOR => match read_u64(value) {
                Some(v) => self.sequence_floor = v,
                None => self.damaged += 1,
            },
            _ if key == META_REVISION => match read_u64(value) {
                Some(v) => self.revision = v,
                None => self.damaged += 1,
            },
            _ => {}
        }
        if RESTORED_COUNTERS.contains(&key) {
            self.counters.push(key.to_vec());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::tagged;
    use proptest::prelude::*;

    #[test]
    fn counters_move_on_and_nothing_else_does() {
        let seq = tagged(SEQUENCE, b"ids");
        assert_eq!(
            bump_row(&seq, &5u64.to_be_bytes(), 10).unwrap(),
            15u64.to_be_bytes()
        );
        assert_eq!(
            bump_row(META_LAST_SESSION, &0u64.to_be_bytes(), 10).unwrap(),
            10u64.to_be_bytes()
        );
        for key in [
            tagged(DATA, b"x"),
            tagged(LOCK, b"x"),
            tagged(SESSION, &1u64.to_be_bytes()),
            b"Mnow".to_vec(),
        ] {
            assert_eq!(bump_row(&key, b"12345678", 10).unwrap(), b"12345678");
        }
    }

    #[test]
    fn a_restore_leaves_the_watch_history_out() {
        let record = tagged(HISTORY, &3u64.to_be_bytes());
        assert_eq!(restore_row(&record, b"r", 10).unwrap(), None);
        assert_eq!(restore_row(META_HISTORY, &[0; 16], 10).unwrap(), None);
        assert_eq!(
            restore_row(META_REVISION, &3u64.to_be_bytes(), 10).unwrap(),
            Some(13u64.to_be_bytes().to_vec())
        );
        let key = tagged(DATA, b"k");
        assert_eq!(restore_row(&key, b"v", 10).unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn overflow_and_damage_are_errors() {
        let err = bump_row(META_LAST_TOKEN, &u64::MAX.to_be_bytes(), 1).unwrap_err();
        assert!(matches!(err, BumpError::Overflow { .. }), "{err}");
        assert!(err.to_string().contains("fencing tokens"));
        let seq = tagged(SEQUENCE, b"s");
        // A sequence stays exhausted rather than refuse the restore.
        assert_eq!(
            bump_row(&seq, &(u64::MAX - 1).to_be_bytes(), 5).unwrap(),
            u64::MAX.to_be_bytes()
        );
        let err = bump_row(&seq, b"short", 1).unwrap_err();
        assert!(matches!(err, BumpError::Malformed { len: 5, .. }), "{err}");
    }

    #[test]
    fn census_counts_rooms() {
        let mut c = Census::default();
        let row = [[0u8; crate::data::HEADER_LEN].as_slice(), b"cde"].concat();
        c.add(&tagged(DATA, b"ab"), &row);
        c.add(&tagged(SEQUENCE, b"s"), &3u64.to_be_bytes());
        c.add(&tagged(SESSION, &1u64.to_be_bytes()), b"x");
        c.add(&tagged(LOCK, b"l"), b"\xff\xff not a record");
        c.add(META_LAST_TOKEN, &9u64.to_be_bytes());
        c.add(META_LAST_SESSION, &4u64.to_be_bytes());
        c.add(&tagged(AUTH, b"e"), &[1]);
        c.add(META_REVISION, &12u64.to_be_bytes());
        assert_eq!(c.rows, 8);
        assert_eq!(c.revision, 12);
        let mut short = Census::default();
        short.add(&tagged(DATA, b"ab"), b"cde");
        assert_eq!((short.keys, short.damaged, short.data_bytes), (1, 1, 0));
        assert_eq!(
            (c.keys, c.data_bytes, c.sequences, c.sessions),
            (1, 5, 1, 1)
        );
        assert_eq!((c.locks, c.damaged), (1, 1));
        assert_eq!((c.last_token, c.last_session), (9, 4));
        assert_eq!(c.access_control_rows, 1);
    }

    /// A multi-lock waits in each of its locks' queues but is one wait.
    #[test]
    fn census_counts_a_multi_lock_wait_once() {
        use crate::lock::lock_table::{LockRecord, Waiter};
        use crate::lock::{LockMode, SessionId};
        let waiter = |owner: u64, group: &[&str]| Waiter {
            session: SessionId(1),
            owner,
            request_id: owner,
            mode: LockMode::Exclusive,
            wait_ms: 1_000,
            lease_ms: None,
            lock_delay_ms: None,
            value: Vec::new(),
            group: group.iter().map(|n| n.to_string()).collect(),
        };
        let record = |queue: Vec<Waiter>| {
            codec::encode(&LockRecord {
                queue,
                ..LockRecord::default()
            })
            .unwrap()
        };
        let mut c = Census::default();
        let both = ["a", "b"];
        c.add(
            &tagged(LOCK, b"a"),
            &record(vec![waiter(1, &both), waiter(2, &[])]),
        );
        c.add(&tagged(LOCK, b"b"), &record(vec![waiter(1, &both)]));
        assert_eq!((c.locks, c.waiters, c.damaged), (2, 2, 0));
        c.add(&tagged(LOCK, b"\xff"), &record(vec![waiter(3, &[])]));
        assert_eq!((c.locks, c.waiters, c.damaged), (3, 2, 1));
    }

    #[test]
    fn counters_missing_from_a_backup_are_written() {
        let mut c = Census::default();
        assert_eq!(missing_counters(&c, 7).len(), 4);
        c.add(META_LAST_TOKEN, &9u64.to_be_bytes());
        let missing = missing_counters(&c, 7);
        assert_eq!(
            missing,
            vec![
                (META_LAST_SESSION.to_vec(), 7u64.to_be_bytes().to_vec()),
                (META_SEQUENCE_FLOOR.to_vec(), 7u64.to_be_bytes().to_vec()),
                (META_REVISION.to_vec(), 7u64.to_be_bytes().to_vec()),
            ]
        );
    }

    proptest! {
        /// Every counter strictly grows by exactly `by` (or the restore
        /// refuses); every other row is written back byte for byte.
        #[test]
        fn bump_is_exact(
            key in prop::collection::vec(any::<u8>(), 0..12),
            value in prop::collection::vec(any::<u8>(), 0..12),
            counter in any::<u64>(),
            by in 1u64..u64::MAX,
        ) {
            match counter_name(&key) {
                None => prop_assert_eq!(bump_row(&key, &value, by).unwrap(), value.clone()),
                Some(_) => {
                    match bump_row(&key, &counter.to_be_bytes(), by) {
                        Ok(out) => prop_assert_eq!(
                            read_u64(&out),
                            Some(counter.saturating_add(by))
                        ),
                        Err(e) => {
                            let overflowed = matches!(e, BumpError::Overflow { .. });
                            prop_assert!(overflowed && counter.checked_add(by).is_none());
                        }
                    }
                    if value.len() != 8 {
                        prop_assert!(bump_row(&key, &value, by).is_err());
                    }
                }
            }
            let mut census = Census::default();
            census.add(&key, &value);
            prop_assert_eq!(census.rows, 1);
        }
    }
}
