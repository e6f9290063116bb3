//! Model-based test: random command and query sequences are applied both to a
//! [`MemStore`] through [`latchkey_core::apply`] / [`latchkey_core::query`] and to
//! a deliberately naive reference model; outcomes and full contents must agree
//! after every step.

use std::collections::BTreeMap;

use latchkey_core::keyspace::{self, DATA, META_NOW, SEQUENCE};
use latchkey_core::limits::MAX_SCAN_LIMIT;
use latchkey_core::{
    apply, codec, query, BatchOp, Command, CommandError, CommandResult, Condition, MemStore,
    Millis, Outcome, Query, Request, ScanRange,
};
use proptest::prelude::*;

// ---------------------------------------------------------------- reference model

/// What the state machine should hold, written without looking at kv.rs:
/// linear scans and a plain `BTreeMap` per room.
#[derive(Debug, Default, Clone)]
struct Model {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    sequences: BTreeMap<Vec<u8>, u64>,
    clock: Millis,
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

    /// Only empty keys and inverted ranges are generated as invalid input:
    /// everything else stays far below the limits.
    fn execute(&mut self, command: &Command) -> CommandResult {
        match command {
            Command::Put { key, value } => {
                if key.is_empty() {
                    return invalid();
                }
                self.data.insert(key.clone(), value.clone());
                Ok(Outcome::Done)
            }
            Command::PutIfAbsent { key, value } => {
                if key.is_empty() {
                    return invalid();
                }
                match self.data.get(key) {
                    Some(v) => Ok(Outcome::Previous(Some(v.clone()))),
                    None => {
                        self.data.insert(key.clone(), value.clone());
                        Ok(Outcome::Previous(None))
                    }
                }
            }
            Command::CompareAndPut {
                key,
                expected,
                value,
            } => {
                if key.is_empty() {
                    return invalid();
                }
                let current = self.data.get(key).cloned();
                if current == *expected {
                    self.data.insert(key.clone(), value.clone());
                    Ok(Outcome::Swapped {
                        succeeded: true,
                        current: Some(value.clone()),
                    })
                } else {
                    Ok(Outcome::Swapped {
                        succeeded: false,
                        current,
                    })
                }
            }
            Command::GetAndPut { key, value } => {
                if key.is_empty() {
                    return invalid();
                }
                Ok(Outcome::Previous(
                    self.data.insert(key.clone(), value.clone()),
                ))
            }
            Command::Delete { key } => {
                if key.is_empty() {
                    return invalid();
                }
                Ok(Outcome::Deleted(u64::from(self.data.remove(key).is_some())))
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
                for k in &doomed {
                    self.data.remove(k);
                }
                Ok(Outcome::Deleted(doomed.len() as u64))
            }
            Command::Batch { conditions, ops } => {
                let condition_keys = conditions.iter().map(|Condition::ValueIs { key, .. }| key);
                let op_keys = ops.iter().map(|op| match op {
                    BatchOp::Put { key, .. } | BatchOp::Delete { key } => key,
                });
                if condition_keys.chain(op_keys).any(|k| k.is_empty()) {
                    return invalid();
                }
                for (i, Condition::ValueIs { key, expected }) in conditions.iter().enumerate() {
                    if self.data.get(key) != expected.as_ref() {
                        return Ok(Outcome::Batch {
                            failed_condition: Some(i as u32),
                        });
                    }
                }
                for op in ops {
                    match op {
                        BatchOp::Put { key, value } => {
                            self.data.insert(key.clone(), value.clone());
                        }
                        BatchOp::Delete { key } => {
                            self.data.remove(key);
                        }
                    }
                }
                Ok(Outcome::Batch {
                    failed_condition: None,
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
            Command::Lock(_) | Command::Auth(_) | Command::As { .. } => {
                unreachable!("the generators make no lock or access-control commands")
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
                Ok(Outcome::Value(self.data.get(key).cloned()))
            }
            Query::MultiGet { keys } => {
                if keys.iter().any(Vec::is_empty) {
                    return invalid();
                }
                Ok(Outcome::Values(
                    keys.iter().map(|k| self.data.get(k).cloned()).collect(),
                ))
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
                let mut matching: Vec<(Vec<u8>, Vec<u8>)> = self
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
            raw.insert(keyspace::tagged(DATA, k), v.clone());
        }
        for (k, n) in &self.sequences {
            raw.insert(keyspace::tagged(SEQUENCE, k), n.to_be_bytes().to_vec());
        }
        // The clock cell exists once a successful command carried a stamp above 0.
        if self.clock > 0 {
            raw.insert(META_NOW.to_vec(), self.clock.to_be_bytes().to_vec());
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

fn condition() -> impl Strategy<Value = Condition> {
    (key_or_empty(), prop::option::of(value()))
        .prop_map(|(key, expected)| Condition::ValueIs { key, expected })
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
        2 => (key_or_empty(), prop::option::of(value()), value()).prop_map(
            |(key, expected, value)| Command::CompareAndPut { key, expected, value }
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
