//! Example-based tests of every KV command and query, of every limit, of the
//! keyspace layout and of the state machine's clock.

use latchkey_core::keyspace::{self, DATA, META, META_NOW, META_REVISION, SEQUENCE};
use latchkey_core::limits::*;
use latchkey_core::{
    apply, query, BatchOp, Command, CommandError, CommandResult, Condition, MemStore, Millis,
    Outcome, Query, Request, ScanRange, Test, Versioned,
};

// ---------------------------------------------------------------- helpers

fn run_at(store: &mut MemStore, now: Millis, command: Command) -> CommandResult {
    apply(store, &Request { now, command }).expect("MemStore never fails")
}

fn run(store: &mut MemStore, command: Command) -> CommandResult {
    run_at(store, 1, command)
}

fn ask(store: &MemStore, q: Query) -> CommandResult {
    query(store, &q).expect("MemStore never fails")
}

fn put(key: &[u8], value: &[u8]) -> Command {
    Command::Put {
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

fn put_if_absent(key: &[u8], value: &[u8]) -> Command {
    Command::PutIfAbsent {
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

fn cas(key: &[u8], expected: Option<&[u8]>, value: &[u8]) -> Command {
    Command::CompareAndPut {
        key: key.to_vec(),
        test: Test::ValueIs(expected.map(<[u8]>::to_vec)),
        value: value.to_vec(),
    }
}

fn get_and_put(key: &[u8], value: &[u8]) -> Command {
    Command::GetAndPut {
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

fn delete(key: &[u8]) -> Command {
    Command::Delete { key: key.to_vec() }
}

fn delete_range(start: &[u8], end: &[u8]) -> Command {
    Command::DeleteRange {
        start: start.to_vec(),
        end: end.to_vec(),
    }
}

fn next_seq(key: &[u8], step: u64) -> Command {
    Command::NextSequence {
        key: key.to_vec(),
        step,
    }
}

fn value_is(key: &[u8], expected: Option<&[u8]>) -> Condition {
    Condition::value_is(key, expected.map(<[u8]>::to_vec))
}

fn op_put(key: &[u8], value: &[u8]) -> BatchOp {
    BatchOp::Put {
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

fn op_delete(key: &[u8]) -> BatchOp {
    BatchOp::Delete { key: key.to_vec() }
}

/// The cluster's revision, as the stored counter holds it (0: absent).
fn revision(store: &MemStore) -> u64 {
    store.map.get(META_REVISION).map_or(0, |b| {
        keyspace::read_u64(b).expect("META_REVISION holds a u64")
    })
}

/// `key`'s value and revisions; the read answers at the store's revision.
fn get_versioned(store: &MemStore, key: &[u8]) -> Option<Versioned> {
    match ask(store, Query::Get { key: key.to_vec() }) {
        Ok(Outcome::Value { value, revision: r }) => {
            assert_eq!(r, revision(store), "get {key:?} read another revision");
            value
        }
        other => panic!("get {key:?}: unexpected {other:?}"),
    }
}

fn get(store: &MemStore, key: &[u8]) -> Option<Vec<u8>> {
    get_versioned(store, key).map(|v| v.value)
}

fn versioned(value: &[u8], create_revision: u64, mod_revision: u64, version: u64) -> Versioned {
    Versioned {
        value: value.to_vec(),
        create_revision,
        mod_revision,
        version,
    }
}

type Entries = Vec<(Vec<u8>, Vec<u8>)>;
type VersionedEntries = Vec<(Vec<u8>, Versioned)>;

/// A scan's entries with their revisions; the scan answers at the store's
/// revision.
fn scan_versioned(store: &MemStore, range: ScanRange) -> (VersionedEntries, bool) {
    match ask(store, Query::Scan(range.clone())) {
        Ok(Outcome::Entries {
            entries,
            more,
            revision: r,
        }) => {
            assert_eq!(r, revision(store), "scan {range:?} read another revision");
            (entries, more)
        }
        other => panic!("scan {range:?}: unexpected {other:?}"),
    }
}

fn scan(store: &MemStore, range: ScanRange) -> (Entries, bool) {
    let (entries, more) = scan_versioned(store, range);
    let entries = entries.into_iter().map(|(k, v)| (k, v.value)).collect();
    (entries, more)
}

/// No upper bound, for [`range`].
const NO_END: Option<&[u8]> = None;

fn range<E: AsRef<[u8]>>(
    start: &[u8],
    end: Option<E>,
    prefix: &[u8],
    limit: u32,
    reverse: bool,
) -> ScanRange {
    ScanRange {
        start: start.to_vec(),
        end: end.map(|e| e.as_ref().to_vec()),
        prefix: prefix.to_vec(),
        limit,
        reverse,
    }
}

/// Keys of a scan result, as strings for readable assertions.
fn keys(entries: &Entries) -> Vec<String> {
    entries
        .iter()
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
        .collect()
}

fn all_data(store: &MemStore) -> Entries {
    scan(store, range(b"", NO_END, b"", 0, false)).0
}

fn clock(store: &MemStore) -> Option<u64> {
    store
        .map
        .get(META_NOW)
        .map(|b| keyspace::read_u64(b).expect("META_NOW holds a u64"))
}

/// A store holding each of `keys` (value: the key), the i-th created at
/// revision i + 1.
fn store_with(keys: &[&str]) -> MemStore {
    let mut store = MemStore::default();
    for (k, revision) in keys.iter().zip(1..) {
        assert_eq!(
            run(&mut store, put(k.as_bytes(), k.as_bytes())),
            Ok(Outcome::Written { revision })
        );
    }
    store
}

fn assert_invalid(result: CommandResult) {
    assert!(
        matches!(result, Err(CommandError::InvalidArgument(_))),
        "expected InvalidArgument, got {result:?}"
    );
}

/// Apply `command` with a later clock than anything applied so far and check
/// that it is refused with `InvalidArgument` and that the store, including
/// its clock, is byte-for-byte unchanged.
fn assert_refused(store: &mut MemStore, command: Command) {
    let before = store.clone();
    let later = clock(store).unwrap_or(0) + 1_000;
    let result = run_at(store, later, command);
    assert_invalid(result);
    assert_eq!(*store, before, "a refused command must write nothing");
}

/// A store with data, a sequence and a clock, so "nothing written" is a
/// meaningful comparison. Its revision is 3 (the sequence raises none).
fn populated() -> MemStore {
    let mut store = store_with(&["a", "b", "c"]);
    assert!(run_at(&mut store, 10, next_seq(b"s", 5)).is_ok());
    store
}

// ---------------------------------------------------------------- put family

#[test]
fn put_sets_and_overwrites() {
    let mut store = MemStore::default();
    assert_eq!(
        run(&mut store, put(b"k", b"v1")),
        Ok(Outcome::Written { revision: 1 })
    );
    assert_eq!(get_versioned(&store, b"k"), Some(versioned(b"v1", 1, 1, 1)));
    assert_eq!(
        run(&mut store, put(b"k", b"v2")),
        Ok(Outcome::Written { revision: 2 })
    );
    assert_eq!(get_versioned(&store, b"k"), Some(versioned(b"v2", 1, 2, 2)));
    // Empty values are values, not deletions.
    assert_eq!(
        run(&mut store, put(b"k", b"")),
        Ok(Outcome::Written { revision: 3 })
    );
    assert_eq!(get_versioned(&store, b"k"), Some(versioned(b"", 1, 3, 3)));
    assert_eq!(all_data(&store), vec![(b"k".to_vec(), Vec::new())]);
}

#[test]
fn put_if_absent_writes_when_absent() {
    let mut store = MemStore::default();
    assert_eq!(
        run(&mut store, put_if_absent(b"k", b"v")),
        Ok(Outcome::Previous {
            previous: None,
            revision: 1
        })
    );
    assert_eq!(get_versioned(&store, b"k"), Some(versioned(b"v", 1, 1, 1)));
}

#[test]
fn put_if_absent_keeps_existing_value() {
    let mut store = store_with(&["k"]);
    let before = store.clone();
    assert_eq!(
        run(&mut store, put_if_absent(b"k", b"other")),
        Ok(Outcome::Previous {
            previous: Some(b"k".to_vec()),
            revision: 1
        })
    );
    assert_eq!(get(&store, b"k"), Some(b"k".to_vec()));
    assert_eq!(store, before, "same clock, no write: store unchanged");
}

#[test]
fn put_if_absent_counts_empty_value_as_present() {
    let mut store = MemStore::default();
    run(&mut store, put(b"k", b"")).unwrap();
    assert_eq!(
        run(&mut store, put_if_absent(b"k", b"v")),
        Ok(Outcome::Previous {
            previous: Some(Vec::new()),
            revision: 1
        })
    );
    assert_eq!(get(&store, b"k"), Some(Vec::new()));
}

#[test]
fn compare_and_put_swaps_on_match() {
    let mut store = store_with(&["k"]);
    assert_eq!(
        run(&mut store, cas(b"k", Some(b"k"), b"new")),
        Ok(Outcome::Swapped {
            succeeded: true,
            current: Some(versioned(b"new", 1, 2, 2)),
            revision: 2
        })
    );
    assert_eq!(get(&store, b"k"), Some(b"new".to_vec()));
}

#[test]
fn compare_and_put_refuses_on_mismatch() {
    let mut store = store_with(&["k"]);
    let before = store.clone();
    assert_eq!(
        run(&mut store, cas(b"k", Some(b"wrong"), b"new")),
        Ok(Outcome::Swapped {
            succeeded: false,
            current: Some(versioned(b"k", 1, 1, 1)),
            revision: 1
        })
    );
    assert_eq!(store, before);
}

#[test]
fn compare_and_put_expected_none_creates_absent_key() {
    let mut store = MemStore::default();
    assert_eq!(
        run(&mut store, cas(b"k", None, b"v")),
        Ok(Outcome::Swapped {
            succeeded: true,
            current: Some(versioned(b"v", 1, 1, 1)),
            revision: 1
        })
    );
    assert_eq!(get(&store, b"k"), Some(b"v".to_vec()));
}

#[test]
fn compare_and_put_expected_none_fails_on_present_key() {
    let mut store = store_with(&["k"]);
    let before = store.clone();
    assert_eq!(
        run(&mut store, cas(b"k", None, b"v")),
        Ok(Outcome::Swapped {
            succeeded: false,
            current: Some(versioned(b"k", 1, 1, 1)),
            revision: 1
        })
    );
    assert_eq!(store, before);
}

#[test]
fn compare_and_put_expected_some_fails_on_absent_key() {
    let mut store = MemStore::default();
    assert_eq!(
        run(&mut store, cas(b"k", Some(b""), b"v")),
        Ok(Outcome::Swapped {
            succeeded: false,
            current: None,
            revision: 0
        })
    );
    assert_eq!(get(&store, b"k"), None);
}

#[test]
fn compare_and_put_distinguishes_empty_value_from_absent() {
    let mut store = MemStore::default();
    run(&mut store, put(b"k", b"")).unwrap();
    assert_eq!(
        run(&mut store, cas(b"k", None, b"v")),
        Ok(Outcome::Swapped {
            succeeded: false,
            current: Some(versioned(b"", 1, 1, 1)),
            revision: 1
        })
    );
    assert_eq!(
        run(&mut store, cas(b"k", Some(b""), b"v")),
        Ok(Outcome::Swapped {
            succeeded: true,
            current: Some(versioned(b"v", 1, 2, 2)),
            revision: 2
        })
    );
}

#[test]
fn get_and_put_returns_previous() {
    let mut store = MemStore::default();
    assert_eq!(
        run(&mut store, get_and_put(b"k", b"v1")),
        Ok(Outcome::Previous {
            previous: None,
            revision: 1
        })
    );
    assert_eq!(
        run(&mut store, get_and_put(b"k", b"v2")),
        Ok(Outcome::Previous {
            previous: Some(b"v1".to_vec()),
            revision: 2
        })
    );
    assert_eq!(get_versioned(&store, b"k"), Some(versioned(b"v2", 1, 2, 2)));
}

// ---------------------------------------------------------------- deletes

#[test]
fn delete_present_key() {
    let mut store = store_with(&["a", "k", "z"]);
    assert_eq!(
        run(&mut store, delete(b"k")),
        Ok(Outcome::Deleted {
            count: 1,
            revision: 4
        })
    );
    assert_eq!(get(&store, b"k"), None);
    assert_eq!(keys(&all_data(&store)), ["a", "z"]);
}

#[test]
fn delete_absent_key_writes_nothing() {
    let mut store = store_with(&["a", "z"]);
    let before = store.clone();
    assert_eq!(
        run(&mut store, delete(b"k")),
        Ok(Outcome::Deleted {
            count: 0,
            revision: 2
        })
    );
    assert_eq!(store, before);
}

#[test]
fn delete_range_counts_and_keeps_end_exclusive() {
    let mut store = store_with(&["a", "b", "ba", "bz", "c", "ca", "d"]);
    assert_eq!(
        run(&mut store, delete_range(b"b", b"c")),
        Ok(Outcome::Deleted {
            count: 3,
            revision: 8
        })
    );
    assert_eq!(keys(&all_data(&store)), ["a", "c", "ca", "d"]);
    // The start is inclusive, the end exclusive.
    assert_eq!(
        run(&mut store, delete_range(b"c", b"d")),
        Ok(Outcome::Deleted {
            count: 2,
            revision: 9
        })
    );
    assert_eq!(keys(&all_data(&store)), ["a", "d"]);
}

#[test]
fn delete_range_with_nothing_inside() {
    let mut store = store_with(&["a", "d"]);
    let before = store.clone();
    assert_eq!(
        run(&mut store, delete_range(b"b", b"c")),
        Ok(Outcome::Deleted {
            count: 0,
            revision: 2
        })
    );
    assert_eq!(store, before);
}

#[test]
fn delete_range_from_empty_start_covers_the_lowest_keys() {
    let mut store = store_with(&["\u{1}", "a", "b"]);
    assert_eq!(
        run(&mut store, delete_range(b"", b"b")),
        Ok(Outcome::Deleted {
            count: 2,
            revision: 4
        })
    );
    assert_eq!(keys(&all_data(&store)), ["b"]);
}

#[test]
fn delete_range_up_to_all_ff_end() {
    let mut store = MemStore::default();
    for k in [&b"a"[..], &[0xfe], &[0xff], &[0xff, 0xff]] {
        run(&mut store, put(k, b"v")).unwrap();
    }
    assert_eq!(
        run(&mut store, delete_range(b"", &[0xff, 0xff])),
        Ok(Outcome::Deleted {
            count: 3,
            revision: 5
        })
    );
    assert_eq!(all_data(&store), vec![(vec![0xff, 0xff], b"v".to_vec())]);
}

#[test]
fn delete_range_leaves_sequences_and_meta_alone() {
    let mut store = store_with(&["a", "b"]);
    run_at(&mut store, 7, next_seq(b"a", 3)).unwrap();
    run_at(&mut store, 7, next_seq(b"b", 4)).unwrap();
    // Sequences and the clock stay; the revision counter moves on (from 2
    // to 3) and the watch history records it, as for any delete that
    // removes keys.
    let others = |store: &MemStore| -> Vec<_> {
        store
            .map
            .iter()
            .filter(|(k, _)| {
                k[0] != DATA
                    && k[0] != keyspace::HISTORY
                    && k.as_slice() != META_REVISION
                    && k.as_slice() != keyspace::META_HISTORY
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let sequences_before = others(&store);
    assert_eq!(revision(&store), 2);
    assert_eq!(
        run_at(&mut store, 7, delete_range(b"", &[0xff; 8])),
        Ok(Outcome::Deleted {
            count: 2,
            revision: 3
        })
    );
    assert!(store.map.keys().all(|k| k[0] != DATA));
    assert_eq!(others(&store), sequences_before);
    assert_eq!(revision(&store), 3);
    assert_eq!(
        run(&mut store, next_seq(b"a", 0)),
        Ok(Outcome::Sequence { start: 3, end: 3 })
    );
}

#[test]
fn delete_range_larger_than_one_chunk() {
    let mut store = MemStore::default();
    for i in 0..2_500u32 {
        run(&mut store, put(format!("k{i:05}").as_bytes(), b"v")).unwrap();
    }
    run(&mut store, put(b"l", b"outside")).unwrap();
    assert_eq!(
        run(&mut store, delete_range(b"k", b"l")),
        Ok(Outcome::Deleted {
            count: 2_500,
            revision: 2_502
        })
    );
    assert_eq!(keys(&all_data(&store)), ["l"]);
}

// ---------------------------------------------------------------- batch

#[test]
fn batch_applies_every_op_when_conditions_hold() {
    let mut store = store_with(&["a", "b"]);
    let result = run(
        &mut store,
        Command::Batch {
            conditions: vec![value_is(b"a", Some(b"a")), value_is(b"x", None)],
            ops: vec![op_put(b"x", b"1"), op_delete(b"b"), op_put(b"a", b"2")],
        },
    );
    // One command, one revision for every key it changed.
    assert_eq!(
        result,
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 3
        })
    );
    assert_eq!(
        scan_versioned(&store, range(b"", NO_END, b"", 0, false)).0,
        vec![
            (b"a".to_vec(), versioned(b"2", 1, 3, 2)),
            (b"x".to_vec(), versioned(b"1", 3, 3, 1))
        ]
    );
}

#[test]
fn batch_applies_ops_in_order() {
    let mut store = MemStore::default();
    let result = run(
        &mut store,
        Command::Batch {
            conditions: vec![],
            ops: vec![
                op_put(b"p", b"1"),
                op_delete(b"p"),
                op_delete(b"q"),
                op_put(b"q", b"2"),
                op_put(b"q", b"3"),
            ],
        },
    );
    assert_eq!(
        result,
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 1
        })
    );
    // Both puts of "q" count as writes, at the batch's one revision.
    assert_eq!(
        scan_versioned(&store, range(b"", NO_END, b"", 0, false)).0,
        vec![(b"q".to_vec(), versioned(b"3", 1, 1, 2))]
    );
}

#[test]
fn batch_checks_conditions_against_state_before_ops() {
    let mut store = MemStore::default();
    // The op would make the condition true, but conditions see the old state.
    let result = run(
        &mut store,
        Command::Batch {
            conditions: vec![value_is(b"k", Some(b"v"))],
            ops: vec![op_put(b"k", b"v")],
        },
    );
    assert_eq!(
        result,
        Ok(Outcome::Batch {
            failed_condition: Some(0),
            revision: 0
        })
    );
    assert_eq!(get(&store, b"k"), None);
}

#[test]
fn batch_with_failing_condition_writes_nothing() {
    let mut store = populated();
    let before = store.clone();
    let now = clock(&store).unwrap_or(0);
    let result = run_at(
        &mut store,
        now,
        Command::Batch {
            conditions: vec![
                value_is(b"a", Some(b"a")),
                value_is(b"b", None), // fails: b is present
                value_is(b"c", Some(b"wrong")),
            ],
            ops: vec![op_put(b"x", b"1"), op_delete(b"a"), op_put(b"b", b"2")],
        },
    );
    assert_eq!(
        result,
        Ok(Outcome::Batch {
            failed_condition: Some(1),
            revision: 3
        })
    );
    assert_eq!(store, before, "a failed batch writes nothing");
}

#[test]
fn batch_reports_first_failing_condition() {
    let mut store = store_with(&["a"]);
    let data_before = all_data(&store);
    let result = run_at(
        &mut store,
        500,
        Command::Batch {
            conditions: vec![
                value_is(b"a", Some(b"a")),
                value_is(b"a", Some(b"a")),
                value_is(b"zz", Some(b"1")),
                value_is(b"a", None),
            ],
            ops: vec![op_delete(b"a")],
        },
    );
    assert_eq!(
        result,
        Ok(Outcome::Batch {
            failed_condition: Some(2),
            revision: 1
        })
    );
    // A later clock may be recorded, but no data changes.
    assert_eq!(all_data(&store), data_before);
}

#[test]
fn empty_batch_succeeds() {
    let mut store = populated();
    let before = store.clone();
    let now = clock(&store).unwrap_or(0);
    assert_eq!(
        run_at(
            &mut store,
            now,
            Command::Batch {
                conditions: vec![],
                ops: vec![]
            }
        ),
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 3
        })
    );
    assert_eq!(store, before);
}

// ---------------------------------------------------------------- sequences

#[test]
fn sequence_starts_at_zero_and_increases() {
    let mut store = MemStore::default();
    assert_eq!(
        run(&mut store, next_seq(b"s", 10)),
        Ok(Outcome::Sequence { start: 0, end: 10 })
    );
    assert_eq!(
        run(&mut store, next_seq(b"s", 1)),
        Ok(Outcome::Sequence { start: 10, end: 11 })
    );
    let mut last_end = 11;
    for step in 1..50u64 {
        match run(&mut store, next_seq(b"s", step)) {
            Ok(Outcome::Sequence { start, end }) => {
                assert_eq!(start, last_end, "ranges are contiguous");
                assert_eq!(end, start + step);
                assert!(end > start);
                last_end = end;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn sequences_are_independent_per_key() {
    let mut store = MemStore::default();
    run(&mut store, next_seq(b"a", 5)).unwrap();
    assert_eq!(
        run(&mut store, next_seq(b"b", 2)),
        Ok(Outcome::Sequence { start: 0, end: 2 })
    );
    assert_eq!(
        run(&mut store, next_seq(b"a", 1)),
        Ok(Outcome::Sequence { start: 5, end: 6 })
    );
}

#[test]
fn sequence_step_zero_reads_without_writing() {
    let mut store = MemStore::default();
    let before = store.clone();
    assert_eq!(
        run_at(&mut store, 0, next_seq(b"s", 0)),
        Ok(Outcome::Sequence { start: 0, end: 0 })
    );
    assert_eq!(store, before, "reading an unused sequence creates nothing");

    run(&mut store, next_seq(b"s", 7)).unwrap();
    let before = store.clone();
    assert_eq!(
        run(&mut store, next_seq(b"s", 0)),
        Ok(Outcome::Sequence { start: 7, end: 7 })
    );
    assert_eq!(
        run(&mut store, next_seq(b"s", 0)),
        Ok(Outcome::Sequence { start: 7, end: 7 })
    );
    assert_eq!(store, before);
}

#[test]
fn sequence_runs_up_to_u64_max_then_is_exhausted() {
    let mut store = MemStore::default();
    assert_eq!(
        run(&mut store, next_seq(b"s", u64::MAX - 5)),
        Ok(Outcome::Sequence {
            start: 0,
            end: u64::MAX - 5
        })
    );
    assert_eq!(
        run(&mut store, next_seq(b"s", 5)),
        Ok(Outcome::Sequence {
            start: u64::MAX - 5,
            end: u64::MAX
        })
    );
    let before = store.clone();
    assert_eq!(
        run_at(&mut store, 9_999, next_seq(b"s", 1)),
        Err(CommandError::SequenceExhausted {
            key: "s".to_string(),
            step: 1
        })
    );
    assert_eq!(store, before, "an exhausted sequence writes nothing");
    assert_eq!(
        run(&mut store, next_seq(b"s", 0)),
        Ok(Outcome::Sequence {
            start: u64::MAX,
            end: u64::MAX
        })
    );
}

#[test]
fn sequence_overflow_writes_nothing() {
    let mut store = populated();
    run(&mut store, next_seq(b"s", 100)).unwrap();
    let before = store.clone();
    let result = run_at(&mut store, 1_000_000, next_seq(b"s", u64::MAX));
    assert!(
        matches!(result, Err(CommandError::SequenceExhausted { step, .. }) if step == u64::MAX),
        "{result:?}"
    );
    assert_eq!(store, before);
    // A fresh sequence can still allocate the whole range.
    assert_eq!(
        run(&mut store, next_seq(b"fresh", u64::MAX)),
        Ok(Outcome::Sequence {
            start: 0,
            end: u64::MAX
        })
    );
}

// ---------------------------------------------------------------- reads

#[test]
fn get_absent_and_present() {
    let store = store_with(&["k"]);
    assert_eq!(get(&store, b"k"), Some(b"k".to_vec()));
    assert_eq!(get(&store, b"kk"), None);
    assert_eq!(get(&store, b"j"), None);
}

#[test]
fn multi_get_answers_in_request_order() {
    let store = store_with(&["a", "c"]);
    let result = ask(
        &store,
        Query::MultiGet {
            keys: vec![b"c".to_vec(), b"b".to_vec(), b"a".to_vec(), b"c".to_vec()],
        },
    );
    assert_eq!(
        result,
        Ok(Outcome::Values {
            values: vec![
                Some(versioned(b"c", 2, 2, 1)),
                None,
                Some(versioned(b"a", 1, 1, 1)),
                Some(versioned(b"c", 2, 2, 1))
            ],
            revision: 2
        })
    );
    assert_eq!(
        ask(&store, Query::MultiGet { keys: vec![] }),
        Ok(Outcome::Values {
            values: vec![],
            revision: 2
        })
    );
}

fn scan_store() -> MemStore {
    store_with(&["a", "ab", "abc", "abd", "ac", "b", "ba", "c"])
}

#[test]
fn scan_everything() {
    let store = scan_store();
    let (entries, more) = scan(&store, range(b"", NO_END, b"", 0, false));
    assert_eq!(
        keys(&entries),
        ["a", "ab", "abc", "abd", "ac", "b", "ba", "c"]
    );
    assert!(!more);
    // Values come along with their keys.
    assert!(entries.iter().all(|(k, v)| k == v));
    // And so do their revisions: the i-th key was created at revision i + 1.
    let (entries, _) = scan_versioned(&store, range(b"", NO_END, b"", 0, false));
    for ((k, v), i) in entries.iter().zip(1..) {
        assert_eq!(*v, versioned(k, i, i, 1));
    }
    // A reverse scan carries the same revisions.
    let (back, _) = scan_versioned(&store, range(b"", NO_END, b"", 0, true));
    assert_eq!(back, entries.into_iter().rev().collect::<Vec<_>>());
}

#[test]
fn scan_with_start_and_end() {
    let store = scan_store();
    let k = |r| keys(&scan(&store, r).0);
    assert_eq!(
        k(range(b"ab", NO_END, b"", 0, false)),
        ["ab", "abc", "abd", "ac", "b", "ba", "c"]
    );
    assert_eq!(
        k(range(b"abb", NO_END, b"", 0, false)),
        ["abc", "abd", "ac", "b", "ba", "c"]
    );
    assert_eq!(k(range(b"", Some(b"ab"), b"", 0, false)), ["a"]);
    assert_eq!(
        k(range(b"ab", Some(b"b"), b"", 0, false)),
        ["ab", "abc", "abd", "ac"]
    );
    assert_eq!(
        k(range(b"ab", Some(b"ab"), b"", 0, false)),
        Vec::<String>::new()
    );
    assert_eq!(
        k(range(b"b", Some(b"a"), b"", 0, false)),
        Vec::<String>::new()
    );
    assert_eq!(
        k(range(b"", Some(b""), b"", 0, false)),
        Vec::<String>::new()
    );
    assert_eq!(k(range(b"d", NO_END, b"", 0, false)), Vec::<String>::new());
}

#[test]
fn scan_with_prefix() {
    let store = scan_store();
    let k = |r| keys(&scan(&store, r).0);
    assert_eq!(k(ScanRange::prefix("ab", 0)), ["ab", "abc", "abd"]);
    assert_eq!(
        k(ScanRange::prefix("a", 0)),
        ["a", "ab", "abc", "abd", "ac"]
    );
    assert_eq!(k(ScanRange::prefix("abz", 0)), Vec::<String>::new());
    assert_eq!(k(ScanRange::prefix("d", 0)), Vec::<String>::new());
}

#[test]
fn scan_combines_prefix_with_bounds() {
    let store = scan_store();
    let k = |r| keys(&scan(&store, r).0);
    // Start inside the prefix.
    assert_eq!(k(range(b"abc", NO_END, b"ab", 0, false)), ["abc", "abd"]);
    assert_eq!(k(range(b"abca", NO_END, b"ab", 0, false)), ["abd"]);
    // Start before the prefix: the prefix wins.
    assert_eq!(k(range(b"", NO_END, b"ab", 0, false)), ["ab", "abc", "abd"]);
    assert_eq!(
        k(range(b"a", NO_END, b"ab", 0, false)),
        ["ab", "abc", "abd"]
    );
    // Start after every key of the prefix.
    assert_eq!(
        k(range(b"ac", NO_END, b"ab", 0, false)),
        Vec::<String>::new()
    );
    // End inside the prefix.
    assert_eq!(k(range(b"", Some(b"abd"), b"ab", 0, false)), ["ab", "abc"]);
    // End after the prefix: the prefix wins.
    assert_eq!(
        k(range(b"", Some(b"c"), b"ab", 0, false)),
        ["ab", "abc", "abd"]
    );
    // End before the prefix.
    assert_eq!(
        k(range(b"", Some(b"aa"), b"ab", 0, false)),
        Vec::<String>::new()
    );
    // Both bounds inside.
    assert_eq!(k(range(b"abc", Some(b"abd"), b"ab", 0, false)), ["abc"]);
    // Reverse with both.
    assert_eq!(k(range(b"ab", Some(b"abd"), b"ab", 0, true)), ["abc", "ab"]);
}

#[test]
fn scan_prefix_of_ff_bytes() {
    let mut store = MemStore::default();
    for k in [
        &b"a"[..],
        &[0xfe, 1],
        &[0xff],
        &[0xff, 0],
        &[0xff, 0xff],
        &[0xff, 0xff, 3],
    ] {
        run(&mut store, put(k, b"v")).unwrap();
    }
    let k = |r| {
        scan(&store, r)
            .0
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        k(ScanRange::prefix(vec![0xff], 0)),
        vec![
            vec![0xff],
            vec![0xff, 0],
            vec![0xff, 0xff],
            vec![0xff, 0xff, 3]
        ]
    );
    assert_eq!(
        k(ScanRange::prefix(vec![0xff, 0xff], 0)),
        vec![vec![0xff, 0xff], vec![0xff, 0xff, 3]]
    );
    assert_eq!(
        k(range(&[0xff, 0], Some(&[0xff, 0xff, 3]), &[0xff], 0, true)),
        vec![vec![0xff, 0xff], vec![0xff, 0]]
    );
}

#[test]
fn scan_limit_and_more_flag() {
    let store = scan_store(); // 8 keys
    let (entries, more) = scan(&store, range(b"", NO_END, b"", 3, false));
    assert_eq!(keys(&entries), ["a", "ab", "abc"]);
    assert!(more);
    let (entries, more) = scan(&store, range(b"", NO_END, b"", 7, false));
    assert_eq!(entries.len(), 7);
    assert!(more);
    let (entries, more) = scan(&store, range(b"", NO_END, b"", 8, false));
    assert_eq!(entries.len(), 8);
    assert!(!more, "exactly `limit` matches: nothing more");
    let (entries, more) = scan(&store, range(b"", NO_END, b"", 9, false));
    assert_eq!(entries.len(), 8);
    assert!(!more);
    // `more` only counts keys that match the range, not keys beyond it.
    let (entries, more) = scan(&store, ScanRange::prefix("ab", 3));
    assert_eq!(keys(&entries), ["ab", "abc", "abd"]);
    assert!(!more);
    let (entries, more) = scan(&store, ScanRange::prefix("ab", 2));
    assert_eq!(keys(&entries), ["ab", "abc"]);
    assert!(more);
}

#[test]
fn scan_reverse() {
    let store = scan_store();
    let k = |r| {
        let (e, more) = scan(&store, r);
        (keys(&e), more)
    };
    assert_eq!(
        k(range(b"", NO_END, b"", 0, true)).0,
        ["c", "ba", "b", "ac", "abd", "abc", "ab", "a"]
    );
    assert_eq!(
        k(range(b"", NO_END, b"", 2, true)),
        (vec!["c".into(), "ba".into()], true)
    );
    assert_eq!(
        k(ScanRange {
            reverse: true,
            ..ScanRange::prefix("ab", 2)
        }),
        (vec!["abd".into(), "abc".into()], true)
    );
    assert_eq!(
        k(range(b"ab", Some(b"b"), b"", 0, true)).0,
        ["ac", "abd", "abc", "ab"]
    );
}

#[test]
fn scan_limit_zero_means_the_maximum() {
    let mut store = MemStore::default();
    let n = MAX_SCAN_LIMIT as usize + 1;
    for i in 0..n {
        run(&mut store, put(format!("{i:06}").as_bytes(), b"")).unwrap();
    }
    let (entries, more) = scan(&store, range(b"", NO_END, b"", 0, false));
    assert_eq!(entries.len(), MAX_SCAN_LIMIT as usize);
    assert!(more);
    let (entries, more) = scan(&store, range(b"", NO_END, b"", MAX_SCAN_LIMIT, true));
    assert_eq!(entries.len(), MAX_SCAN_LIMIT as usize);
    assert_eq!(entries[0].0, format!("{:06}", n - 1).into_bytes());
    assert!(more);
    run(&mut store, delete(b"000000")).unwrap();
    let (entries, more) = scan(&store, range(b"", NO_END, b"", 0, false));
    assert_eq!(entries.len(), MAX_SCAN_LIMIT as usize);
    assert!(!more);
}

// ---------------------------------------------------------------- limits

fn big(len: usize) -> Vec<u8> {
    vec![b'x'; len]
}

#[test]
fn empty_key_is_refused_everywhere() {
    let mut store = populated();
    for command in [
        put(b"", b"v"),
        put_if_absent(b"", b"v"),
        cas(b"", None, b"v"),
        Command::CompareAndPut {
            key: vec![],
            test: Test::mod_revision_is(1),
            value: b"v".to_vec(),
        },
        get_and_put(b"", b"v"),
        delete(b""),
        delete_range(b"", b""),
        next_seq(b"", 1),
        Command::Batch {
            conditions: vec![],
            ops: vec![op_put(b"ok", b"v"), op_put(b"", b"v")],
        },
        Command::Batch {
            conditions: vec![],
            ops: vec![op_put(b"ok", b"v"), op_delete(b"")],
        },
        Command::Batch {
            conditions: vec![value_is(b"", None)],
            ops: vec![op_put(b"ok", b"v")],
        },
        Command::Batch {
            conditions: vec![Condition::new("", Test::Exists(true))],
            ops: vec![op_put(b"ok", b"v")],
        },
    ] {
        assert_refused(&mut store, command);
    }
    assert_invalid(ask(&store, Query::Get { key: vec![] }));
    assert_invalid(ask(
        &store,
        Query::MultiGet {
            keys: vec![b"a".to_vec(), vec![]],
        },
    ));
}

#[test]
fn key_over_max_len_is_refused_everywhere() {
    let mut store = populated();
    let long = big(MAX_KEY_LEN + 1);
    for command in [
        put(&long, b"v"),
        put_if_absent(&long, b"v"),
        cas(&long, None, b"v"),
        get_and_put(&long, b"v"),
        delete(&long),
        delete_range(b"a", &long),
        delete_range(&long, &big(MAX_KEY_LEN + 2)),
        next_seq(&long, 1),
        Command::Batch {
            conditions: vec![],
            ops: vec![op_put(b"ok", b"v"), op_put(&long, b"v")],
        },
        Command::Batch {
            conditions: vec![],
            ops: vec![op_put(b"ok", b"v"), op_delete(&long)],
        },
        Command::Batch {
            conditions: vec![value_is(&long, None)],
            ops: vec![op_put(b"ok", b"v")],
        },
    ] {
        assert_refused(&mut store, command);
    }
    assert_invalid(ask(&store, Query::Get { key: long.clone() }));
    assert_invalid(ask(
        &store,
        Query::MultiGet {
            keys: vec![b"a".to_vec(), long.clone()],
        },
    ));
    for r in [
        range(&long, NO_END, b"", 0, false),
        range(b"", Some(&long), b"", 0, false),
        range(b"", NO_END, &long, 0, false),
    ] {
        assert_invalid(ask(&store, Query::Scan(r)));
    }
}

#[test]
fn key_of_max_len_is_accepted() {
    let mut store = MemStore::default();
    let longest = big(MAX_KEY_LEN);
    assert_eq!(
        run(&mut store, put(&longest, b"v")),
        Ok(Outcome::Written { revision: 1 })
    );
    assert_eq!(get(&store, &longest), Some(b"v".to_vec()));
    assert_eq!(
        run(&mut store, next_seq(&longest, 1)),
        Ok(Outcome::Sequence { start: 0, end: 1 })
    );
    let (entries, _) = scan(&store, ScanRange::prefix(longest.clone(), 0));
    assert_eq!(entries.len(), 1);
}

#[test]
fn value_over_max_len_is_refused() {
    let mut store = populated();
    let huge = big(MAX_VALUE_LEN + 1);
    for command in [
        put(b"k", &huge),
        put_if_absent(b"k", &huge),
        cas(b"k", None, &huge),
        cas(b"a", Some(&huge), b"v"),
        get_and_put(b"k", &huge),
        Command::Batch {
            conditions: vec![],
            ops: vec![op_put(b"ok", b"v"), op_put(b"k", &huge)],
        },
        Command::Batch {
            conditions: vec![value_is(b"a", Some(&huge))],
            ops: vec![op_put(b"ok", b"v")],
        },
    ] {
        assert_refused(&mut store, command);
    }
}

#[test]
fn value_of_max_len_is_accepted() {
    let mut store = MemStore::default();
    let largest = big(MAX_VALUE_LEN);
    assert_eq!(
        run(&mut store, put(b"k", &largest)),
        Ok(Outcome::Written { revision: 1 })
    );
    assert_eq!(get(&store, b"k"), Some(largest));
}

#[test]
fn command_over_max_total_bytes_is_refused() {
    let mut store = populated();
    let value = big(MAX_VALUE_LEN);
    let ops: Vec<_> = (0..MAX_COMMAND_BYTES / MAX_VALUE_LEN)
        .map(|i| op_put(format!("k{i}").as_bytes(), &value))
        .collect();
    assert_refused(
        &mut store,
        Command::Batch {
            conditions: vec![],
            ops,
        },
    );
}

#[test]
fn batch_with_too_many_ops_is_refused() {
    let mut store = populated();
    let ops = |n: usize| -> Vec<BatchOp> {
        (0..n)
            .map(|i| op_put(format!("k{i}").as_bytes(), b"v"))
            .collect()
    };
    assert_refused(
        &mut store,
        Command::Batch {
            conditions: vec![],
            ops: ops(MAX_BATCH_OPS + 1),
        },
    );
    assert_eq!(
        run(
            &mut store,
            Command::Batch {
                conditions: vec![],
                ops: ops(MAX_BATCH_OPS)
            }
        ),
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 4
        })
    );
}

#[test]
fn batch_with_too_many_conditions_is_refused() {
    let mut store = populated();
    let conditions = |n: usize| vec![value_is(b"a", Some(b"a")); n];
    assert_refused(
        &mut store,
        Command::Batch {
            conditions: conditions(MAX_BATCH_CONDITIONS + 1),
            ops: vec![op_put(b"k", b"v")],
        },
    );
    assert_eq!(
        run(
            &mut store,
            Command::Batch {
                conditions: conditions(MAX_BATCH_CONDITIONS),
                ops: vec![op_put(b"k", b"v")]
            }
        ),
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 4
        })
    );
}

#[test]
fn delete_range_with_start_not_below_end_is_refused() {
    let mut store = populated();
    assert_refused(&mut store, delete_range(b"b", b"b"));
    assert_refused(&mut store, delete_range(b"c", b"b"));
    assert_refused(&mut store, delete_range(b"ab", b"a"));
}

#[test]
fn scan_limit_above_maximum_is_refused() {
    let store = populated();
    assert_invalid(ask(
        &store,
        Query::Scan(range(b"", NO_END, b"", MAX_SCAN_LIMIT + 1, false)),
    ));
    assert_invalid(ask(
        &store,
        Query::Scan(range(b"", NO_END, b"", u32::MAX, true)),
    ));
    assert!(ask(
        &store,
        Query::Scan(range(b"", NO_END, b"", MAX_SCAN_LIMIT, false))
    )
    .is_ok());
}

#[test]
fn multi_get_with_too_many_keys_is_refused() {
    let store = populated();
    let keys = |n: usize| (0..n).map(|i| format!("k{i}").into_bytes()).collect();
    assert_invalid(ask(
        &store,
        Query::MultiGet {
            keys: keys(MAX_MULTI_GET + 1),
        },
    ));
    match ask(
        &store,
        Query::MultiGet {
            keys: keys(MAX_MULTI_GET),
        },
    ) {
        Ok(Outcome::Values {
            values,
            revision: 3,
        }) => assert_eq!(values.len(), MAX_MULTI_GET),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn validate_agrees_with_apply() {
    use latchkey_core::{validate_command, validate_query};
    assert!(validate_command(&put(b"k", b"v")).is_ok());
    assert!(matches!(
        validate_command(&put(b"", b"v")),
        Err(CommandError::InvalidArgument(_))
    ));
    assert!(matches!(
        validate_command(&delete_range(b"b", b"a")),
        Err(CommandError::InvalidArgument(_))
    ));
    assert!(validate_query(&Query::Get { key: b"k".to_vec() }).is_ok());
    assert!(matches!(
        validate_query(&Query::Scan(range(
            b"",
            NO_END,
            b"",
            MAX_SCAN_LIMIT + 1,
            false
        ))),
        Err(CommandError::InvalidArgument(_))
    ));
}

// ---------------------------------------------------------------- keyspace

#[test]
fn user_keys_and_sequences_do_not_see_each_other() {
    let mut store = MemStore::default();
    // A sequence first, then a user key of the same name.
    run(&mut store, next_seq(b"k", 42)).unwrap();
    assert_eq!(get(&store, b"k"), None);
    assert!(all_data(&store).is_empty());
    run(&mut store, put(b"k", &[0xff; 8])).unwrap();
    assert_eq!(
        run(&mut store, next_seq(b"k", 0)),
        Ok(Outcome::Sequence { start: 42, end: 42 })
    );
    // A user key first, then a sequence of the same name.
    run(&mut store, put(b"j", &5u64.to_be_bytes())).unwrap();
    assert_eq!(
        run(&mut store, next_seq(b"j", 1)),
        Ok(Outcome::Sequence { start: 0, end: 1 })
    );
    assert_eq!(get(&store, b"j"), Some(5u64.to_be_bytes().to_vec()));
    // Deleting the user key leaves the sequence.
    run(&mut store, delete(b"k")).unwrap();
    assert_eq!(
        run(&mut store, next_seq(b"k", 1)),
        Ok(Outcome::Sequence { start: 42, end: 43 })
    );
}

#[test]
fn user_keys_that_look_like_internal_keys_stay_user_keys() {
    let mut store = MemStore::default();
    run_at(&mut store, 100, next_seq(b"s", 3)).unwrap();
    let clock_before = clock(&store);
    // Keys spelled like the raw internal keys, and the meta name itself.
    let lookalikes: [&[u8]; 5] = [META_NOW, b"now", b"Qs", b"s", &[SEQUENCE]];
    for k in lookalikes {
        run_at(&mut store, 100, put(k, &u64::MAX.to_be_bytes())).unwrap();
    }
    assert_eq!(
        clock(&store),
        clock_before,
        "user data never moves the clock"
    );
    assert_eq!(
        run(&mut store, next_seq(b"s", 0)),
        Ok(Outcome::Sequence { start: 3, end: 3 })
    );
    // Every raw key is in its own room.
    for k in store.map.keys() {
        assert!(
            matches!(k[0], DATA | SEQUENCE | META | keyspace::HISTORY),
            "stray key {k:?}"
        );
    }
    assert!(store.map.contains_key(&keyspace::tagged(SEQUENCE, b"s")));
    let mut expected: Vec<Vec<u8>> = lookalikes.iter().map(|k| k.to_vec()).collect();
    expected.sort();
    let data_keys: Vec<_> = all_data(&store).into_iter().map(|(k, _)| k).collect();
    assert_eq!(data_keys, expected);
    // Deleting every user key leaves sequences and meta in place.
    run_at(&mut store, 100, delete_range(b"", &[0xff; 4])).unwrap();
    assert!(all_data(&store).is_empty());
    assert_eq!(clock(&store), clock_before);
    assert!(store.map.contains_key(&keyspace::tagged(SEQUENCE, b"s")));
}

#[test]
fn scans_never_see_sequences_or_meta() {
    let mut store = MemStore::default();
    run_at(&mut store, 5, next_seq(b"a", 1)).unwrap();
    run_at(&mut store, 6, next_seq(&[0xff, 0xff], 1)).unwrap();
    assert!(store.map.len() >= 3, "two sequences and the clock");
    for r in [
        range(b"", NO_END, b"", 0, false),
        range(b"", NO_END, b"", 0, true),
        range(b"", Some(&[0xff; 16]), b"", 0, true),
        ScanRange::prefix(vec![0xff], 0),
        ScanRange::prefix("now", 0),
        ScanRange::prefix("a", 0),
    ] {
        let (entries, more) = scan(&store, r);
        assert!(entries.is_empty());
        assert!(!more);
    }
    // And with one data key on each edge of the data room.
    run(&mut store, put(&[0], b"lo")).unwrap();
    run(&mut store, put(&[0xff; 5], b"hi")).unwrap();
    assert_eq!(
        all_data(&store),
        vec![(vec![0], b"lo".to_vec()), (vec![0xff; 5], b"hi".to_vec())]
    );
    let (entries, _) = scan(&store, range(b"", NO_END, b"", 0, true));
    assert_eq!(entries.len(), 2);
}

// ---------------------------------------------------------------- clock

#[test]
fn clock_never_goes_backwards() {
    let mut store = MemStore::default();
    assert_eq!(clock(&store), None);
    run_at(&mut store, 100, put(b"k", b"v")).unwrap();
    assert_eq!(clock(&store), Some(100));
    run_at(&mut store, 50, put(b"k", b"v")).unwrap();
    assert_eq!(clock(&store), Some(100), "a lower stamp does not rewind");
    run_at(&mut store, 0, delete(b"k")).unwrap();
    assert_eq!(clock(&store), Some(100));
    run_at(&mut store, 100, next_seq(b"s", 1)).unwrap();
    assert_eq!(clock(&store), Some(100));
    run_at(&mut store, 250, next_seq(b"s", 0)).unwrap();
    assert_eq!(
        clock(&store),
        Some(250),
        "a read of a sequence still advances time"
    );
    run_at(&mut store, u64::MAX, put(b"k", b"v")).unwrap();
    assert_eq!(clock(&store), Some(u64::MAX));
    run_at(&mut store, 1, put(b"k", b"v")).unwrap();
    assert_eq!(clock(&store), Some(u64::MAX));
}

#[test]
fn clock_advances_on_any_successful_command() {
    let mut store = store_with(&["a"]);
    let commands = [
        put(b"b", b"v"),
        put_if_absent(b"a", b"x"),
        cas(b"a", Some(b"nope"), b"x"),
        get_and_put(b"a", b"y"),
        delete(b"zzz"),
        delete_range(b"x", b"y"),
        Command::Batch {
            conditions: vec![value_is(b"missing", Some(b"v"))],
            ops: vec![],
        },
        next_seq(b"s", 0),
    ];
    for (i, command) in commands.into_iter().enumerate() {
        let now = 1_000 + i as u64;
        assert!(run_at(&mut store, now, command).is_ok());
        assert_eq!(clock(&store), Some(now));
    }
}

#[test]
fn refused_commands_do_not_move_the_clock() {
    let mut store = MemStore::default();
    run_at(&mut store, 10, put(b"k", b"v")).unwrap();
    assert_invalid(run_at(&mut store, 20, put(b"", b"v")));
    assert_eq!(clock(&store), Some(10));
    run_at(&mut store, 10, next_seq(b"s", u64::MAX)).unwrap();
    assert!(run_at(&mut store, 30, next_seq(b"s", 1)).is_err());
    assert_eq!(clock(&store), Some(10));
}

#[test]
fn delete_range_spanning_many_chunks_deletes_exactly_the_range() {
    // More keys than one internal chunk (1,024), alone and inside a group
    // (applied through the overlay, where deleted keys stay as tombstones).
    for grouped in [false, true] {
        let mut store = MemStore::default();
        for i in 0..3_000u32 {
            run(&mut store, put(format!("k{i:05}").as_bytes(), b"v")).expect("put applies");
        }
        let command = delete_range(b"k00100", b"k02900");
        let result = if grouped {
            match run(
                &mut store,
                Command::Group {
                    commands: vec![command, put(b"k00050", b"w")],
                },
            ) {
                Ok(Outcome::Group(results)) => {
                    // The put after the delete takes the next revision.
                    assert_eq!(results[1], Ok(Outcome::Written { revision: 3_002 }));
                    results.into_iter().next().expect("two results")
                }
                other => panic!("unexpected {other:?}"),
            }
        } else {
            run(&mut store, command)
        };
        assert_eq!(
            result,
            Ok(Outcome::Deleted {
                count: 2_800,
                revision: 3_001
            }),
            "grouped: {grouped}"
        );
        let left = all_data(&store);
        assert_eq!(left.len(), 200, "grouped: {grouped}");
        assert_eq!(keys(&left).first().map(String::as_str), Some("k00000"));
        assert_eq!(keys(&left).last().map(String::as_str), Some("k02999"));
        assert!(get(&store, b"k00099").is_some() && get(&store, b"k00100").is_none());
        assert!(get(&store, b"k02899").is_none() && get(&store, b"k02900").is_some());
    }
}
