//! Model-based test: random command and query sequences are applied both to a
//! [`MemStore`] through [`latchkey_core::apply`] / [`latchkey_core::query`] and to
//! a deliberately naive reference model; outcomes and full contents must agree
//! after every step.

use std::collections::BTreeMap;

mod strategies;

use latchkey_core::history::{self, KeyChange, Record};
use latchkey_core::keyspace::{self, DATA, META_NOW, META_REVISION, SEQUENCE};
use latchkey_core::limits::MAX_SCAN_LIMIT;
use latchkey_core::{
    apply, codec, query, BatchOp, Command, CommandError, CommandResult, Compare, Condition,
    MemStore, Millis, Outcome, Query, Request, RevisionField, ScanRange, Test, Versioned,
};
use proptest::prelude::*;

// ---------------------------------------------------------------- reference model

/// What the state machine should hold, written without looking at kv.rs or
/// data.rs: linear scans and a plain `BTreeMap` per room, and one revision
/// counter that every command changing a key raises by one.
#[derive(Debug, Default, Clone)]
struct Model {
    data: BTreeMap<Vec<u8>, Versioned>,
    sequences: BTreeMap<Vec<u8>, u64>,
    clock: Millis,
    /// The cluster's revision.
    revision: u64,
    /// The watch history: one record for each revision, in order.
    history: Vec<Record>,
}

fn invalid() -> CommandResult {
    Err(CommandError::InvalidArgument(String::new()))
}

/// Error messages are for humans; compare only which error it was.
fn normalize(result: CommandResult) -> CommandResult {
    match result {
        Err(CommandError::InvalidArgument(_)) => invalid(),
        Ok(Outcome::Group(results)) => {
            Ok(Outcome::Group(results.into_iter().map(normalize).collect()))
        }
        other => other,
    }
}

/// The changes of one command: every key it writes is stamped with the
/// revision after the model's current one, which the command takes if it
/// changed anything.
struct Edit<'a> {
    model: &'a mut Model,
    changed: bool,
    /// Every key changed, in order, for the history.
    changes: Vec<KeyChange>,
}

impl Edit<'_> {
    fn at(&self) -> u64 {
        self.model.revision + 1
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Versioned {
        let at = self.at();
        let (create_revision, version) = match self.model.data.get(key) {
            Some(old) => (old.create_revision, old.version + 1),
            None => (at, 1),
        };
        let now = Versioned {
            value: value.to_vec(),
            create_revision,
            mod_revision: at,
            version,
        };
        let previous = self.model.data.insert(key.to_vec(), now.clone());
        self.changed = true;
        self.changes.push(KeyChange {
            key: key.to_vec(),
            current: Some(now.clone()),
            previous,
        });
        now
    }

    fn delete(&mut self, key: &[u8]) -> bool {
        let removed = self.model.data.remove(key);
        let existed = removed.is_some();
        if let Some(previous) = removed {
            self.changes.push(KeyChange {
                key: key.to_vec(),
                current: None,
                previous: Some(previous),
            });
        }
        self.changed |= existed;
        existed
    }

    /// The revision after the command.
    fn finish(self) -> u64 {
        if self.changed {
            self.model.revision += 1;
            self.model.history.push(Record {
                revision: self.model.revision,
                changes: self.changes,
                previous_dropped: false,
            });
        }
        self.model.revision
    }
}

/// Whether `test` holds for `key` (None: absent); a revision test on an
/// absent key is refused.
fn holds(key: &[u8], test: &Test, current: Option<&Versioned>) -> Result<bool, CommandError> {
    match (test, current) {
        (Test::ValueIs(expected), _) => Ok(current.map(|v| &v.value) == expected.as_ref()),
        (Test::Exists(exists), _) => Ok(current.is_some() == *exists),
        (Test::Revision { .. }, None) => Err(CommandError::KeyAbsent {
            key: String::from_utf8_lossy(key).into_owned(),
        }),
        (
            Test::Revision {
                field,
                compare,
                value,
            },
            Some(v),
        ) => {
            let actual = match field {
                RevisionField::Create => v.create_revision,
                RevisionField::Mod => v.mod_revision,
                RevisionField::Version => v.version,
            };
            Ok(match compare {
                Compare::Equal => actual == *value,
                Compare::NotEqual => actual != *value,
                Compare::Less => actual < *value,
                Compare::Greater => actual > *value,
            })
        }
    }
}

impl Model {
    fn apply(&mut self, request: &Request) -> CommandResult {
        match &request.command {
            // A group: each command as if it were an entry of its own.
            Command::Group { commands } => Ok(Outcome::Group(
                commands
                    .iter()
                    .map(|command| self.apply_one(request.now, command))
                    .collect(),
            )),
            command => self.apply_one(request.now, command),
        }
    }

    fn apply_one(&mut self, now: Millis, command: &Command) -> CommandResult {
        let result = self.execute(command);
        if result.is_ok() {
            self.clock = self.clock.max(now);
        }
        result
    }

    fn edit(&mut self) -> Edit<'_> {
        Edit {
            model: self,
            changed: false,
            changes: Vec::new(),
        }
    }

    /// Only empty keys and inverted ranges are generated as invalid input:
    /// everything else stays far below the limits.
    fn execute(&mut self, command: &Command) -> CommandResult {
        match command {
            Command::Put { key, value } => {
                if key.is_empty() {
                    return invalid();
                }
                let mut edit = self.edit();
                edit.put(key, value);
                Ok(Outcome::Written {
                    revision: edit.finish(),
                })
            }
            Command::PutIfAbsent { key, value } => {
                if key.is_empty() {
                    return invalid();
                }
                let previous = self.data.get(key).map(|v| v.value.clone());
                let mut edit = self.edit();
                if previous.is_none() {
                    edit.put(key, value);
                }
                Ok(Outcome::Previous {
                    previous,
                    revision: edit.finish(),
                })
            }
            Command::CompareAndPut { key, test, value } => {
                if key.is_empty() {
                    return invalid();
                }
                let current = self.data.get(key).cloned();
                let succeeded = holds(key, test, current.as_ref())?;
                let mut edit = self.edit();
                let current = if succeeded {
                    Some(edit.put(key, value))
                } else {
                    current
                };
                Ok(Outcome::Swapped {
                    succeeded,
                    current,
                    revision: edit.finish(),
                })
            }
            Command::GetAndPut { key, value } => {
                if key.is_empty() {
                    return invalid();
                }
                let previous = self.data.get(key).map(|v| v.value.clone());
                let mut edit = self.edit();
                edit.put(key, value);
                Ok(Outcome::Previous {
                    previous,
                    revision: edit.finish(),
                })
            }
            Command::Delete { key } => {
                if key.is_empty() {
                    return invalid();
                }
                let mut edit = self.edit();
                let count = u64::from(edit.delete(key));
                Ok(Outcome::Deleted {
                    count,
                    revision: edit.finish(),
                })
            }
            Command::DeleteRange { start, end } => {
                if end.is_empty() || start >= end {
                    return invalid();
                }
                let doomed: Vec<Vec<u8>> = self
                    .data
                    .keys()
                    .filter(|k| *k >= start && *k < end)
                    .cloned()
                    .collect();
                let mut edit = self.edit();
                for k in &doomed {
                    edit.delete(k);
                }
                Ok(Outcome::Deleted {
                    count: doomed.len() as u64,
                    revision: edit.finish(),
                })
            }
            Command::Batch { conditions, ops } => {
                let condition_keys = conditions.iter().map(|c| &c.key);
                let op_keys = ops.iter().map(|op| match op {
                    BatchOp::Put { key, .. } | BatchOp::Delete { key } => key,
                });
                if condition_keys.chain(op_keys).any(|k| k.is_empty()) {
                    return invalid();
                }
                for (i, Condition { key, test }) in conditions.iter().enumerate() {
                    if !holds(key, test, self.data.get(key))? {
                        return Ok(Outcome::Batch {
                            failed_condition: Some(i as u32),
                            revision: self.revision,
                        });
                    }
                }
                let mut edit = self.edit();
                for op in ops {
                    match op {
                        BatchOp::Put { key, value } => {
                            edit.put(key, value);
                        }
                        BatchOp::Delete { key } => {
                            edit.delete(key);
                        }
                    }
                }
                Ok(Outcome::Batch {
                    failed_condition: None,
                    revision: edit.finish(),
                })
            }
            Command::NextSequence { key, step } => {
                if key.is_empty() {
                    return invalid();
                }
                let start = self.sequences.get(key).copied().unwrap_or(0);
                let Some(end) = start.checked_add(*step) else {
                    return Err(CommandError::SequenceExhausted {
                        key: String::from_utf8_lossy(key).into_owned(),
                        step: *step,
                    });
                };
                if *step > 0 {
                    self.sequences.insert(key.clone(), end);
                }
                Ok(Outcome::Sequence { start, end })
            }
            // This model covers the KV room only; tests/lock_properties.rs
            // covers the lock service.
            // tests/session_keys.rs covers keys bound to sessions,
            // tests/retry_safe_writes.rs retry-safe writes.
            Command::Lock(_)
            | Command::Auth(_)
            | Command::As { .. }
            | Command::PutBound { .. }
            | Command::Once { .. } => {
                unreachable!("the generators make no lock, access-control, bound or once commands")
            }
            Command::Group { .. } => invalid(),
        }
    }

    fn query(&self, q: &Query) -> CommandResult {
        match q {
            Query::Get { key } => {
                if key.is_empty() {
                    return invalid();
                }
                Ok(Outcome::Value {
                    value: self.data.get(key).cloned(),
                    revision: self.revision,
                })
            }
            Query::MultiGet { keys } => {
                if keys.iter().any(Vec::is_empty) {
                    return invalid();
                }
                Ok(Outcome::Values {
                    values: keys.iter().map(|k| self.data.get(k).cloned()).collect(),
                    revision: self.revision,
                })
            }
            Query::Scan(range) => {
                if range.limit > MAX_SCAN_LIMIT {
                    return invalid();
                }
                let limit = if range.limit == 0 {
                    MAX_SCAN_LIMIT
                } else {
                    range.limit
                } as usize;
                let mut matching: Vec<(Vec<u8>, Versioned)> = self
                    .data
                    .iter()
                    .filter(|(k, _)| {
                        **k >= range.start
                            && range.end.as_ref().is_none_or(|e| *k < e)
                            && k.starts_with(&range.prefix)
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if range.reverse {
                    matching.reverse();
                }
                let more = matching.len() > limit;
                matching.truncate(limit);
                Ok(Outcome::Entries {
                    entries: matching,
                    more,
                    revision: self.revision,
                })
            }
            Query::Lock(_) | Query::Auth(_) | Query::As { .. } => {
                unreachable!("the generators make no lock or access-control queries")
            }
        }
    }

    /// The exact raw contents a [`MemStore`] must hold for this model.
    fn expected_raw(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut raw = BTreeMap::new();
        for (k, v) in &self.data {
            // create revision, mod revision, version, bound session (none:
            // 0) (u64 BE each), value.
            let mut row = Vec::new();
            row.extend_from_slice(&v.create_revision.to_be_bytes());
            row.extend_from_slice(&v.mod_revision.to_be_bytes());
            row.extend_from_slice(&v.version.to_be_bytes());
            row.extend_from_slice(&0u64.to_be_bytes());
            row.extend_from_slice(&v.value);
            raw.insert(keyspace::tagged(DATA, k), row);
        }
        for (k, n) in &self.sequences {
            raw.insert(keyspace::tagged(SEQUENCE, k), n.to_be_bytes().to_vec());
        }
        // The clock cell exists once a successful command carried a stamp above 0.
        if self.clock > 0 {
            raw.insert(META_NOW.to_vec(), self.clock.to_be_bytes().to_vec());
        }
        // The revision cell exists once a command changed a key.
        if self.revision > 0 {
            raw.insert(META_REVISION.to_vec(), self.revision.to_be_bytes().to_vec());
        }
        // Every revision's record (these tests stay far inside the
        // window), and the window: the oldest revision kept and the bytes
        // kept.
        let mut bytes = 0u64;
        for record in &self.history {
            let row = codec::encode(record).expect("encodes");
            bytes += row.len() as u64;
            raw.insert(history::record_key(record.revision), row);
        }
        if let Some(first) = self.history.first() {
            let mut cell = first.revision.to_be_bytes().to_vec();
            cell.extend_from_slice(&bytes.to_be_bytes());
            raw.insert(keyspace::META_HISTORY.to_vec(), cell);
        }
        raw
    }
}

// ---------------------------------------------------------------- generators

#[derive(Debug, Clone)]
enum Step {
    Write(Request),
    Read(Query),
}

/// A handful of short keys with shared prefixes, so commands collide and
/// prefixes and ranges cut through them; the 0xff keys exercise prefix ends.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec![
        &b"a"[..],
        b"ab",
        b"abc",
        b"b",
        b"ba",
        b"c",
        &[0x00],
        &[0xff],
        &[0xff, 0xff],
    ])
    .prop_map(<[u8]>::to_vec)
}

/// Mostly valid keys, sometimes the empty (invalid) key.
fn key_or_empty() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![12 => key(), 1 => Just(Vec::new())]
}

/// A range bound: a key, or empty.
fn bound() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![4 => key(), 1 => Just(Vec::new())]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec![&b""[..], b"x", b"y", b"zz"]).prop_map(<[u8]>::to_vec)
}

fn step_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..4,
        1 => Just(u64::MAX / 2),
        1 => Just(u64::MAX - 1),
        1 => Just(u64::MAX),
    ]
}

/// A revision number to compare with: mostly small, where keys' versions
/// and early revisions are, so every comparison goes both ways.
fn revision_value() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0u64..5, 2 => 0u64..40]
}

/// Every kind of test, on values of [`value`] and revisions near the ones
/// a run reaches.
fn test() -> impl Strategy<Value = Test> {
    strategies::key_test(value(), revision_value())
}

fn condition() -> impl Strategy<Value = Condition> {
    (key_or_empty(), test()).prop_map(|(key, test)| Condition { key, test })
}

fn batch_op() -> impl Strategy<Value = BatchOp> {
    prop_oneof![
        (key_or_empty(), value()).prop_map(|(key, value)| BatchOp::Put { key, value }),
        key_or_empty().prop_map(|key| BatchOp::Delete { key }),
    ]
}

/// A single command, or now and then a group of them (as a leader forms
/// from concurrent requests).
fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        8 => single_command(),
        1 => prop::collection::vec(single_command(), 0..5)
            .prop_map(|commands| Command::Group { commands }),
    ]
}

fn single_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        3 => (key_or_empty(), value()).prop_map(|(key, value)| Command::Put { key, value }),
        2 => (key_or_empty(), value()).prop_map(|(key, value)| Command::PutIfAbsent { key, value }),
        3 => (key_or_empty(), test(), value()).prop_map(
            |(key, test, value)| Command::CompareAndPut { key, test, value }
        ),
        2 => (key_or_empty(), value()).prop_map(|(key, value)| Command::GetAndPut { key, value }),
        2 => key_or_empty().prop_map(|key| Command::Delete { key }),
        1 => (bound(), bound()).prop_map(|(start, end)| Command::DeleteRange { start, end }),
        3 => (
            prop::collection::vec(condition(), 0..4),
            prop::collection::vec(batch_op(), 0..5)
        )
            .prop_map(|(conditions, ops)| Command::Batch { conditions, ops }),
        2 => (key_or_empty(), step_size()).prop_map(|(key, step)| Command::NextSequence { key, step }),
    ]
}

fn scan_range() -> impl Strategy<Value = ScanRange> {
    (
        bound(),
        prop::option::of(bound()),
        prop_oneof![2 => Just(Vec::new()), 3 => key()],
        prop_oneof![2 => Just(0u32), 3 => 1u32..5],
        any::<bool>(),
    )
        .prop_map(|(start, end, prefix, limit, reverse)| ScanRange {
            start,
            end,
            prefix,
            limit,
            reverse,
        })
}

fn read() -> impl Strategy<Value = Query> {
    prop_oneof![
        2 => key_or_empty().prop_map(|key| Query::Get { key }),
        1 => prop::collection::vec(key_or_empty(), 0..4).prop_map(|keys| Query::MultiGet { keys }),
        3 => scan_range().prop_map(Query::Scan),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..1_000, command()).prop_map(|(now, command)| Step::Write(Request { now, command })),
        1 => read().prop_map(Step::Read),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..64)
}

// ---------------------------------------------------------------- properties

fn everything() -> Query {
    Query::Scan(ScanRange::prefix(Vec::new(), 0))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every outcome and, after every step, the whole store match the model.
    #[test]
    fn memstore_matches_model(steps in steps()) {
        let mut store = MemStore::default();
        let mut model = Model::default();
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Write(request) => {
                    let got = apply(&mut store, request).expect("MemStore never fails");
                    let want = model.apply(request);
                    prop_assert_eq!(normalize(got), want, "step {}: {:?}", i, request);
                }
                Step::Read(q) => {
                    let got = query(&store, q).expect("MemStore never fails");
                    let want = model.query(q);
                    prop_assert_eq!(normalize(got), want, "step {}: {:?}", i, q);
                }
            }
            let all = query(&store, &everything()).expect("MemStore never fails");
            prop_assert_eq!(all, model.query(&everything()), "data after step {}", i);
            prop_assert_eq!(&store.map, &model.expected_raw(), "raw store after step {}", i);
        }
    }

    /// Two replicas fed the same log end byte-identical, having returned the
    /// same results on the way.
    #[test]
    fn replicas_are_deterministic(steps in steps()) {
        let mut a = MemStore::default();
        let mut b = MemStore::default();
        for step in &steps {
            if let Step::Write(request) = step {
                // Each replica decodes its own copy of the log entry.
                let entry = codec::encode(request).expect("encodes");
                let copy: Request = codec::decode(&entry).expect("decodes");
                let ra = apply(&mut a, request).expect("MemStore never fails");
                let rb = apply(&mut b, &copy).expect("MemStore never fails");
                prop_assert_eq!(codec::encode(&ra).expect("encodes"), codec::encode(&rb).expect("encodes"));
            }
        }
        let snapshot = |s: &MemStore| {
            codec::encode(&s.map.iter().collect::<Vec<_>>()).expect("encodes")
        };
        prop_assert_eq!(snapshot(&a), snapshot(&b));
        prop_assert_eq!(a, b);
    }
}
