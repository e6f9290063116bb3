//! The RocksDB state machine computes exactly what the core computes over a
//! `MemStore`, whatever the commands and however they are split into apply
//! batches.

mod common;
#[path = "../../latchkey-core/tests/strategies/mod.rs"]
mod strategies;

use std::ops::Bound;

use common::*;
use latchkey_core::{BatchOp, Command, Condition, MemStore, Query, ScanRange, Store, Test};
use latchkey_storage::{open, StorageOptions};

use proptest::prelude::*;

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop::sample::select(vec![b'a', b'b', b'c', 0u8, 0xff]),
        1..3,
    )
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..4)
}

/// A test of a key: its value, its existence, or a revision near the
/// ones a short run makes (the core's own strategy, shared).
fn test() -> impl Strategy<Value = Test> {
    strategies::key_test(value(), 0u64..8)
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (key(), value()).prop_map(|(key, value)| Command::Put { key, value }),
        (key(), value()).prop_map(|(key, value)| Command::PutIfAbsent { key, value }),
        (key(), test(), value()).prop_map(|(key, test, value)| Command::CompareAndPut {
            key,
            test,
            value
        }),
        (key(), value()).prop_map(|(key, value)| Command::GetAndPut { key, value }),
        key().prop_map(|key| Command::Delete { key }),
        (prop::collection::vec(any::<u8>(), 0..2), key())
            .prop_map(|(start, end)| Command::DeleteRange { start, end }),
        (
            prop::collection::vec((key(), test()), 0..2),
            prop::collection::vec(
                prop_oneof![
                    (key(), value()).prop_map(|(key, value)| BatchOp::Put { key, value }),
                    key().prop_map(|key| BatchOp::Delete { key }),
                ],
                0..4
            )
        )
            .prop_map(|(conds, ops)| Command::Batch {
                conditions: conds
                    .into_iter()
                    .map(|(key, test)| Condition::new(key, test))
                    .collect(),
                ops,
            }),
        (key(), 0u64..5).prop_map(|(key, step)| Command::NextSequence { key, step }),
    ]
}

fn scan() -> impl Strategy<Value = Query> {
    (
        prop::collection::vec(any::<u8>(), 0..2),
        prop::option::of(key()),
        prop::collection::vec(prop::sample::select(vec![b'a', b'b', 0xff]), 0..2),
        0u32..5,
        any::<bool>(),
    )
        .prop_map(|(start, end, prefix, limit, reverse)| {
            Query::Scan(ScanRange {
                start,
                end,
                prefix,
                limit,
                reverse,
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn rocksdb_state_machine_matches_memstore(
        commands in prop::collection::vec(command(), 1..40),
        splits in prop::collection::vec(1usize..8, 1..10),
        scans in prop::collection::vec(scan(), 1..8),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime();
        let (_log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let reader = sm.reader();
        let mut model = MemStore::default();

        let mut entries: Vec<_> = commands
            .iter()
            .enumerate()
            .map(|(i, c)| command_entry(i as u64 + 1, c.clone()))
            .collect();
        let mut want = Vec::new();
        for (i, c) in commands.iter().enumerate() {
            let request = latchkey_core::Request { now: i as u64 + 1, command: c.clone() };
            want.push(latchkey_core::apply(&mut model, &request).unwrap());
        }

        let mut got = Vec::new();
        let mut split = splits.iter().cycle();
        while !entries.is_empty() {
            let n = (*split.next().unwrap()).min(entries.len());
            let rest = entries.split_off(n);
            got.extend(rt.block_on(sm.apply_entries(entries)).unwrap());
            entries = rest;
        }
        prop_assert_eq!(got, want);
        prop_assert_eq!(reader.last_applied_index(), Some(commands.len() as u64));

        let stored = reader.scan(Bound::Unbounded, Bound::Unbounded, false, usize::MAX).unwrap();
        let expected: Vec<_> = model.map.clone().into_iter().collect();
        prop_assert_eq!(stored, expected);
        for q in &scans {
            prop_assert_eq!(reader.query(q).unwrap(), latchkey_core::query(&model, q).unwrap());
        }
    }
}

fn command_entry(index: u64, c: Command) -> latchkey_storage::types::Entry {
    common::command(1, index, index, c)
}
