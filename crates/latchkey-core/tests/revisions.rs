//! Revisions: the cluster's one counter, and each key's create revision,
//! mod revision and version.
//!
//! - The revision rises by exactly one for each applied command that
//!   changes at least one key, and by nothing otherwise: failed tests,
//!   deletes of absent keys, sequences, lock-only commands and refused
//!   commands (invalid input, `KeyAbsent`, stale fences) leave it, and the
//!   store, as they were.
//! - Every key a command changes takes that command's revision as its mod
//!   revision; its version counts its writes since it was created; its
//!   create revision survives rewrites and starts again after a delete.
//! - Compare-and-put and conditions test values, existence and revisions;
//!   a revision test on an absent key is refused with `KeyAbsent`.
//! - Reads answer at the current revision, with each key's revisions.
//! - A group gives each changing command its own consecutive revision.
//!
//! The checks read the raw rows themselves (`D` + key: create, mod, version
//! as u64 big-endian, then the value; `Mrev`: the counter) rather than
//! trusting the crate's decoder.

use std::collections::BTreeMap;

mod strategies;

use latchkey_core::keyspace::{self, DATA, META_NOW, META_REVISION};
use latchkey_core::lock::{
    LockCommand, LockMode, LockOutcome, Sequencer, SessionId, SessionSecret, Token,
};
use latchkey_core::{
    apply, codec, query, BatchOp, Command, CommandError, CommandResult, Compare, Condition,
    MemStore, Outcome, Query, Request, RevisionField, ScanRange, Test, Versioned,
};
use proptest::prelude::*;

// ---------------------------------------------------------------- helpers

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn run_at(store: &mut MemStore, now: u64, command: Command) -> CommandResult {
    apply(store, &Request { now, command }).expect("MemStore never fails")
}

fn run(store: &mut MemStore, command: Command) -> CommandResult {
    run_at(store, 1, command)
}

fn put(key: &str, value: &str) -> Command {
    Command::Put {
        key: b(key),
        value: b(value),
    }
}

fn delete(key: &str) -> Command {
    Command::Delete { key: b(key) }
}

fn cas(key: &str, test: Test, value: &str) -> Command {
    Command::CompareAndPut {
        key: b(key),
        test,
        value: b(value),
    }
}

fn batch(conditions: Vec<Condition>, ops: Vec<BatchOp>) -> Command {
    Command::Batch { conditions, ops }
}

fn op_put(key: &str, value: &str) -> BatchOp {
    BatchOp::Put {
        key: b(key),
        value: b(value),
    }
}

fn op_delete(key: &str) -> BatchOp {
    BatchOp::Delete { key: b(key) }
}

fn revision_test(field: RevisionField, compare: Compare, value: u64) -> Test {
    Test::Revision {
        field,
        compare,
        value,
    }
}

fn versioned(value: &str, create_revision: u64, mod_revision: u64, version: u64) -> Versioned {
    Versioned {
        value: b(value),
        create_revision,
        mod_revision,
        version,
    }
}

/// The stored revision counter, read raw (0 when absent).
fn raw_revision(store: &MemStore) -> u64 {
    store.map.get(META_REVISION).map_or(0, |cell| {
        keyspace::read_u64(cell).expect("the revision cell holds a u64")
    })
}

/// Every user key's row, decoded here from the raw bytes.
fn raw_data(store: &MemStore) -> BTreeMap<Vec<u8>, Versioned> {
    store
        .map
        .iter()
        .filter(|(k, _)| k.first() == Some(&DATA))
        .map(|(k, row)| {
            assert!(row.len() >= 32, "data row {k:?} shorter than its header");
            let field =
                |i: usize| u64::from_be_bytes(row[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            let v = Versioned {
                create_revision: field(0),
                mod_revision: field(1),
                version: field(2),
                value: row[32..].to_vec(),
            };
            (k[1..].to_vec(), v)
        })
        .collect()
}

/// `key`'s value and revisions by `Query::Get`, which must answer at the
/// stored revision.
fn get(store: &MemStore, key: &str) -> Option<Versioned> {
    match query(store, &Query::Get { key: b(key) }).expect("MemStore never fails") {
        Ok(Outcome::Value { value, revision }) => {
            assert_eq!(
                revision,
                raw_revision(store),
                "Get answered another revision"
            );
            value
        }
        other => panic!("get {key:?}: unexpected {other:?}"),
    }
}

/// The revision a write's outcome reports (the one after the command).
fn outcome_revision(outcome: &Outcome) -> Option<u64> {
    match outcome {
        Outcome::Written { revision }
        | Outcome::Previous { revision, .. }
        | Outcome::Swapped { revision, .. }
        | Outcome::Deleted { revision, .. }
        | Outcome::Batch { revision, .. } => Some(*revision),
        _ => None,
    }
}

/// "k" created at revision 1, "other" at 2, "k" rewritten at 3: "k" holds
/// create 1, mod 3, version 2, three different numbers.
fn three_revisions() -> MemStore {
    let mut store = MemStore::default();
    for (command, revision) in [
        (put("k", "v1"), 1),
        (put("other", "o"), 2),
        (put("k", "v2"), 3),
    ] {
        assert_eq!(run(&mut store, command), Ok(Outcome::Written { revision }));
    }
    assert_eq!(get(&store, "k"), Some(versioned("v2", 1, 3, 2)));
    store
}

// ---------------------------------------------------------------- per-key revisions

#[test]
fn each_changed_key_takes_the_commands_revision() {
    let mut store = MemStore::default();
    assert_eq!(
        run(&mut store, put("a", "1")),
        Ok(Outcome::Written { revision: 1 })
    );
    assert_eq!(
        run(
            &mut store,
            Command::PutIfAbsent {
                key: b("b"),
                value: b("1"),
            }
        ),
        Ok(Outcome::Previous {
            previous: None,
            revision: 2
        })
    );
    assert_eq!(
        run(
            &mut store,
            Command::GetAndPut {
                key: b("a"),
                value: b("2"),
            }
        ),
        Ok(Outcome::Previous {
            previous: Some(b("1")),
            revision: 3
        })
    );
    assert_eq!(
        run(&mut store, cas("b", Test::ValueIs(Some(b("1"))), "2")),
        Ok(Outcome::Swapped {
            succeeded: true,
            current: Some(versioned("2", 2, 4, 2)),
            revision: 4
        })
    );
    // A batch: every key it writes takes its one revision; keys it does not
    // touch keep theirs.
    assert_eq!(
        run(
            &mut store,
            batch(vec![], vec![op_put("a", "3"), op_put("c", "1")])
        ),
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 5
        })
    );
    assert_eq!(get(&store, "a"), Some(versioned("3", 1, 5, 3)));
    assert_eq!(get(&store, "b"), Some(versioned("2", 2, 4, 2)));
    assert_eq!(get(&store, "c"), Some(versioned("1", 5, 5, 1)));
    assert_eq!(raw_revision(&store), 5);
}

#[test]
fn the_create_revision_survives_rewrites_and_starts_again_after_a_delete() {
    let mut store = MemStore::default();
    for revision in 1..=4 {
        run(&mut store, put("k", "v")).expect("put applies");
        assert_eq!(
            get(&store, "k"),
            Some(versioned("v", 1, revision, revision))
        );
    }
    assert_eq!(
        run(&mut store, delete("k")),
        Ok(Outcome::Deleted {
            count: 1,
            revision: 5
        })
    );
    assert_eq!(get(&store, "k"), None);
    assert_eq!(
        run(&mut store, put("k", "again")),
        Ok(Outcome::Written { revision: 6 })
    );
    assert_eq!(get(&store, "k"), Some(versioned("again", 6, 6, 1)));
    // A delete-range and a put-if-absent: the same.
    assert_eq!(
        run(
            &mut store,
            Command::DeleteRange {
                start: b("a"),
                end: b("z"),
            }
        ),
        Ok(Outcome::Deleted {
            count: 1,
            revision: 7
        })
    );
    assert_eq!(
        run(
            &mut store,
            Command::PutIfAbsent {
                key: b("k"),
                value: b("third"),
            }
        ),
        Ok(Outcome::Previous {
            previous: None,
            revision: 8
        })
    );
    assert_eq!(get(&store, "k"), Some(versioned("third", 8, 8, 1)));
}

#[test]
fn a_batch_that_deletes_and_puts_a_key_creates_it_again() {
    let mut store = three_revisions();
    assert_eq!(
        run(
            &mut store,
            batch(
                vec![],
                vec![op_delete("k"), op_put("k", "new"), op_put("other", "p")]
            )
        ),
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 4
        })
    );
    assert_eq!(get(&store, "k"), Some(versioned("new", 4, 4, 1)));
    assert_eq!(get(&store, "other"), Some(versioned("p", 2, 4, 2)));
    // A put then a delete of a new key changes it (and leaves nothing): the
    // command still takes a revision.
    assert_eq!(
        run(
            &mut store,
            batch(vec![], vec![op_put("gone", "x"), op_delete("gone")])
        ),
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 5
        })
    );
    assert_eq!(get(&store, "gone"), None);
    assert_eq!(raw_revision(&store), 5);
}

// ---------------------------------------------------------------- what raises nothing

#[test]
fn commands_that_change_no_key_raise_no_revision() {
    let mut store = three_revisions();
    let nothing_changes = [
        // A failed compare-and-put of each kind.
        cas("k", Test::ValueIs(Some(b("nope"))), "x"),
        cas("k", Test::Exists(false), "x"),
        cas("absent", Test::Exists(true), "x"),
        cas("k", Test::mod_revision_is(2), "x"),
        // A put-if-absent of a present key.
        Command::PutIfAbsent {
            key: b("k"),
            value: b("x"),
        },
        // Deletes of nothing.
        delete("absent"),
        Command::DeleteRange {
            start: b("x"),
            end: b("y"),
        },
        // A batch whose condition fails, one with no ops, one deleting only
        // absent keys.
        batch(
            vec![Condition::new("k", Test::Exists(false))],
            vec![op_put("k", "x")],
        ),
        batch(vec![Condition::new("k", Test::mod_revision_is(3))], vec![]),
        batch(vec![], vec![op_delete("absent"), op_delete("absent2")]),
        // Sequences are not keys.
        Command::NextSequence {
            key: b("k"),
            step: 5,
        },
    ];
    for command in nothing_changes {
        let shown = format!("{command:?}");
        let data_before = raw_data(&store);
        let result = run_at(&mut store, 50, command).expect("applies");
        assert_eq!(outcome_revision(&result).unwrap_or(3), 3, "{shown}");
        assert_eq!(raw_revision(&store), 3, "{shown}");
        assert_eq!(raw_data(&store), data_before, "{shown}");
    }
}

#[test]
fn refused_commands_write_nothing_not_even_the_revision() {
    let mut store = three_revisions();
    let refused = [
        // Invalid input.
        put("", "v"),
        Command::DeleteRange {
            start: b("b"),
            end: b("a"),
        },
        batch(vec![], vec![op_put("ok", "v"), op_put("", "v")]),
        // A revision test on an absent key.
        cas("absent", Test::mod_revision_is(1), "v"),
        batch(
            vec![Condition::new(
                "absent",
                revision_test(RevisionField::Version, Compare::Greater, 0),
            )],
            vec![op_put("ok", "v")],
        ),
        // A sequence past u64::MAX.
        Command::NextSequence {
            key: b("s"),
            step: u64::MAX,
        },
    ];
    run(
        &mut store,
        Command::NextSequence {
            key: b("s"),
            step: 1,
        },
    )
    .expect("applies");
    for command in refused {
        let shown = format!("{command:?}");
        let before = store.clone();
        let result = run_at(&mut store, 1_000, command);
        assert!(result.is_err(), "{shown}: {result:?}");
        assert_eq!(store, before, "{shown}: a refused command wrote");
    }
    assert_eq!(
        run(&mut store, put("k", "next")),
        Ok(Outcome::Written { revision: 4 })
    );
}

// ---------------------------------------------------------------- tests

/// (compare, value - actual, holds): each comparison below, at and above
/// the key's number.
const COMPARISONS: [(Compare, i64, bool); 12] = [
    (Compare::Equal, -1, false),
    (Compare::Equal, 0, true),
    (Compare::Equal, 1, false),
    (Compare::NotEqual, -1, true),
    (Compare::NotEqual, 0, false),
    (Compare::NotEqual, 1, true),
    (Compare::Less, -1, false),
    (Compare::Less, 0, false),
    (Compare::Less, 1, true),
    (Compare::Greater, -1, true),
    (Compare::Greater, 0, false),
    (Compare::Greater, 1, false),
];

/// "k"'s numbers in [`three_revisions`]: create 1, mod 3, version 2.
const FIELDS: [(RevisionField, u64); 3] = [
    (RevisionField::Create, 1),
    (RevisionField::Mod, 3),
    (RevisionField::Version, 2),
];

fn offset(actual: u64, by: i64) -> u64 {
    actual.checked_add_signed(by).expect("small numbers")
}

#[test]
fn compare_and_put_by_each_revision_and_comparison() {
    for (field, actual) in FIELDS {
        for (compare, by, holds) in COMPARISONS {
            let value = offset(actual, by);
            let case = format!("{field:?} {compare:?} {value} (actual {actual})");
            let mut store = three_revisions();
            let before = store.clone();
            let result = run(
                &mut store,
                cas("k", revision_test(field, compare, value), "new"),
            );
            if holds {
                assert_eq!(
                    result,
                    Ok(Outcome::Swapped {
                        succeeded: true,
                        current: Some(versioned("new", 1, 4, 3)),
                        revision: 4
                    }),
                    "{case}"
                );
                assert_eq!(get(&store, "k"), Some(versioned("new", 1, 4, 3)), "{case}");
            } else {
                assert_eq!(
                    result,
                    Ok(Outcome::Swapped {
                        succeeded: false,
                        current: Some(versioned("v2", 1, 3, 2)),
                        revision: 3
                    }),
                    "{case}"
                );
                assert_eq!(store, before, "{case}: a failed test wrote");
            }
        }
    }
}

#[test]
fn batch_conditions_by_each_revision_and_comparison() {
    for (field, actual) in FIELDS {
        for (compare, by, holds) in COMPARISONS {
            let value = offset(actual, by);
            let case = format!("{field:?} {compare:?} {value} (actual {actual})");
            let mut store = three_revisions();
            let before = store.clone();
            // A condition that holds first, so the index is the second's.
            let result = run(
                &mut store,
                batch(
                    vec![
                        Condition::new("other", Test::Exists(true)),
                        Condition::new("k", revision_test(field, compare, value)),
                    ],
                    vec![op_put("k", "new"), op_put("fresh", "f")],
                ),
            );
            if holds {
                assert_eq!(
                    result,
                    Ok(Outcome::Batch {
                        failed_condition: None,
                        revision: 4
                    }),
                    "{case}"
                );
                assert_eq!(get(&store, "k"), Some(versioned("new", 1, 4, 3)), "{case}");
                assert_eq!(
                    get(&store, "fresh"),
                    Some(versioned("f", 4, 4, 1)),
                    "{case}"
                );
            } else {
                assert_eq!(
                    result,
                    Ok(Outcome::Batch {
                        failed_condition: Some(1),
                        revision: 3
                    }),
                    "{case}"
                );
                assert_eq!(store, before, "{case}: a failed condition wrote");
            }
        }
    }
}

#[test]
fn tests_by_existence_and_value() {
    // (key, test, holds) against "k" = "v2" and an absent key.
    let cases = [
        ("k", Test::Exists(true), true),
        ("k", Test::Exists(false), false),
        ("absent", Test::Exists(true), false),
        ("absent", Test::Exists(false), true),
        ("k", Test::ValueIs(Some(b("v2"))), true),
        ("k", Test::ValueIs(Some(b("v1"))), false),
        ("k", Test::ValueIs(None), false),
        ("absent", Test::ValueIs(None), true),
        ("absent", Test::ValueIs(Some(Vec::new())), false),
    ];
    for (key, test, holds) in cases {
        let case = format!("{key} {test:?}");
        // Compare-and-put.
        let mut store = three_revisions();
        let before = store.clone();
        let current = get(&store, key);
        let result = run(&mut store, cas(key, test.clone(), "new"));
        if holds {
            let created = if current.is_some() {
                versioned("new", 1, 4, 3)
            } else {
                versioned("new", 4, 4, 1)
            };
            assert_eq!(
                result,
                Ok(Outcome::Swapped {
                    succeeded: true,
                    current: Some(created.clone()),
                    revision: 4
                }),
                "{case}"
            );
            assert_eq!(get(&store, key), Some(created), "{case}");
        } else {
            assert_eq!(
                result,
                Ok(Outcome::Swapped {
                    succeeded: false,
                    current,
                    revision: 3
                }),
                "{case}"
            );
            assert_eq!(store, before, "{case}");
        }
        // The same test as a batch condition.
        let mut store = three_revisions();
        let before = store.clone();
        let result = run(
            &mut store,
            batch(vec![Condition::new(key, test)], vec![op_put("other", "q")]),
        );
        if holds {
            assert_eq!(
                result,
                Ok(Outcome::Batch {
                    failed_condition: None,
                    revision: 4
                }),
                "{case}"
            );
            assert_eq!(
                get(&store, "other"),
                Some(versioned("q", 2, 4, 2)),
                "{case}"
            );
        } else {
            assert_eq!(
                result,
                Ok(Outcome::Batch {
                    failed_condition: Some(0),
                    revision: 3
                }),
                "{case}"
            );
            assert_eq!(store, before, "{case}");
        }
    }
}

#[test]
fn a_revision_test_on_an_absent_key_is_refused_and_writes_nothing() {
    let mut store = three_revisions();
    // A key that existed and was deleted is absent too.
    run(&mut store, put("was", "here")).expect("applies");
    run(&mut store, delete("was")).expect("applies");
    run_at(
        &mut store,
        10,
        Command::NextSequence {
            key: b("s"),
            step: 2,
        },
    )
    .expect("applies");
    assert_eq!(raw_revision(&store), 5);
    for key in ["absent", "was"] {
        for (field, _) in FIELDS {
            for (compare, _, _) in COMPARISONS {
                let test = revision_test(field, compare, 0);
                let refused = Err(CommandError::KeyAbsent { key: key.into() });
                let case = format!("{key} {test:?}");
                let before = store.clone();
                // A later clock: a refusal must not even record it.
                assert_eq!(
                    run_at(&mut store, 100, cas(key, test.clone(), "v")),
                    refused,
                    "{case}"
                );
                assert_eq!(store, before, "{case}");
                assert_eq!(
                    run_at(
                        &mut store,
                        100,
                        batch(
                            vec![
                                Condition::new("k", Test::Exists(true)),
                                Condition::new(key, test),
                            ],
                            vec![op_put("k", "x")],
                        )
                    ),
                    refused,
                    "{case}"
                );
                assert_eq!(store, before, "{case}");
            }
        }
    }
    assert_eq!(store.map.get(META_NOW), Some(&10u64.to_be_bytes().to_vec()));
    // The error names the key and says what to do.
    let message = CommandError::KeyAbsent {
        key: "absent".into(),
    }
    .to_string();
    assert!(
        message.contains("\"absent\"") && message.contains("existence"),
        "{message}"
    );
}

#[test]
fn conditions_are_checked_in_order_a_failure_before_an_absent_key_wins() {
    let mut store = three_revisions();
    let before = store.clone();
    // The first condition fails: the batch fails there, before the revision
    // test on the absent key is looked at.
    assert_eq!(
        run(
            &mut store,
            batch(
                vec![
                    Condition::new("k", Test::Exists(false)),
                    Condition::new("absent", Test::mod_revision_is(1)),
                ],
                vec![op_put("k", "x")],
            )
        ),
        Ok(Outcome::Batch {
            failed_condition: Some(0),
            revision: 3
        })
    );
    assert_eq!(store, before);
}

// ---------------------------------------------------------------- reads

#[test]
fn reads_answer_at_the_current_revision_with_each_keys_revisions() {
    let mut store = MemStore::default();
    assert_eq!(
        query(&store, &Query::Get { key: b("a") }).expect("reads"),
        Ok(Outcome::Value {
            value: None,
            revision: 0
        })
    );
    run(&mut store, put("a", "1")).expect("applies"); // 1
    run(&mut store, put("b", "1")).expect("applies"); // 2
    run(&mut store, put("a", "2")).expect("applies"); // 3
    run(&mut store, put("c", "1")).expect("applies"); // 4
    run(&mut store, delete("b")).expect("applies"); // 5
    run(&mut store, put("b", "2")).expect("applies"); // 6
                                                      // Commands that change nothing leave the revision reads see.
    run(&mut store, delete("zzz")).expect("applies");
    run(&mut store, cas("a", Test::mod_revision_is(1), "x")).expect("applies");
    let a = versioned("2", 1, 3, 2);
    let b_ = versioned("2", 6, 6, 1);
    let c = versioned("1", 4, 4, 1);
    assert_eq!(
        query(&store, &Query::Get { key: b("a") }).expect("reads"),
        Ok(Outcome::Value {
            value: Some(a.clone()),
            revision: 6
        })
    );
    assert_eq!(
        query(
            &store,
            &Query::MultiGet {
                keys: vec![b("c"), b("zzz"), b("b"), b("a")],
            }
        )
        .expect("reads"),
        Ok(Outcome::Values {
            values: vec![Some(c.clone()), None, Some(b_.clone()), Some(a.clone())],
            revision: 6
        })
    );
    assert_eq!(
        query(&store, &Query::Scan(ScanRange::prefix(Vec::new(), 0))).expect("reads"),
        Ok(Outcome::Entries {
            entries: vec![(b("a"), a.clone()), (b("b"), b_.clone()), (b("c"), c)],
            more: false,
            revision: 6
        })
    );
    assert_eq!(
        query(
            &store,
            &Query::Scan(ScanRange {
                reverse: true,
                ..ScanRange::prefix(Vec::new(), 2)
            })
        )
        .expect("reads"),
        Ok(Outcome::Entries {
            entries: vec![(b("c"), versioned("1", 4, 4, 1)), (b("b"), b_)],
            more: true,
            revision: 6
        })
    );
    // An empty scan still says where it read.
    assert_eq!(
        query(&store, &Query::Scan(ScanRange::prefix("nothing", 0))).expect("reads"),
        Ok(Outcome::Entries {
            entries: vec![],
            more: false,
            revision: 6
        })
    );
}

// ---------------------------------------------------------------- groups

#[test]
fn a_group_gives_each_changing_command_its_own_consecutive_revision() {
    let mut store = three_revisions();
    let commands = vec![
        put("a", "1"),                                           // 4
        cas("a", Test::mod_revision_is(3), "x"),                 // fails: 4
        put("b", "1"),                                           // 5
        delete("absent"),                                        // nothing: 5
        put("", "invalid"),                                      // refused
        cas("absent", Test::mod_revision_is(1), "x"),            // KeyAbsent
        batch(vec![], vec![op_put("c", "1"), op_put("d", "1")]), // 6
        Command::NextSequence {
            key: b("s"),
            step: 1,
        },
        cas("a", Test::mod_revision_is(4), "2"), // 7
        delete("b"),                             // 8
    ];
    let mut one_by_one = store.clone();
    let want: Vec<CommandResult> = commands
        .iter()
        .map(|c| run_at(&mut one_by_one, 5, c.clone()))
        .collect();
    let results = match run_at(&mut store, 5, Command::Group { commands }) {
        Ok(Outcome::Group(results)) => results,
        other => panic!("a group answered {other:?}"),
    };
    assert_eq!(results, want);
    assert_eq!(store, one_by_one);
    let revisions: Vec<Option<u64>> = results
        .iter()
        .map(|r| r.as_ref().ok().and_then(outcome_revision))
        .collect();
    assert_eq!(
        revisions,
        [
            Some(4),
            Some(4),
            Some(5),
            Some(5),
            None,
            None,
            Some(6),
            None,
            Some(7),
            Some(8)
        ]
    );
    assert!(matches!(results[4], Err(CommandError::InvalidArgument(_))));
    assert_eq!(
        results[5],
        Err(CommandError::KeyAbsent {
            key: "absent".into()
        })
    );
    assert_eq!(raw_revision(&store), 8);
    assert_eq!(get(&store, "a"), Some(versioned("2", 4, 7, 2)));
    assert_eq!(get(&store, "b"), None);
    assert_eq!(get(&store, "c"), Some(versioned("1", 6, 6, 1)));
    assert_eq!(get(&store, "d"), Some(versioned("1", 6, 6, 1)));
}

// ---------------------------------------------------------------- locks

/// A store with session 1 (secret [7; 16]) holding "f" exclusively with
/// token 1; lock commands only.
fn locked() -> (MemStore, Sequencer, SessionSecret) {
    let secret = SessionSecret([7; 16]);
    let mut store = MemStore::default();
    let opened = run(
        &mut store,
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 10_000,
            secret,
            name: String::new(),
        }),
    );
    assert!(
        matches!(opened, Ok(Outcome::Lock(LockOutcome::SessionOpened { session, .. })) if session == SessionId(1)),
        "{opened:?}"
    );
    let granted = run(&mut store, acquire("f", 1));
    let sequencer = match granted {
        Ok(Outcome::Lock(LockOutcome::Granted { sequencer, .. })) => sequencer,
        other => panic!("acquire answered {other:?}"),
    };
    assert_eq!(sequencer.token, Token(1));
    (store, sequencer, secret)
}

fn acquire(name: &str, request_id: u64) -> Command {
    Command::Lock(LockCommand::Acquire {
        session: SessionId(1),
        secret: SessionSecret([7; 16]),
        owner: 1,
        request_id,
        name: name.into(),
        mode: LockMode::Exclusive,
        wait_ms: None,
        lease_ms: None,
        lock_delay_ms: None,
        value: Vec::new(),
        permits: None,
    })
}

fn fenced(
    sequencer: &Sequencer,
    secret: SessionSecret,
    conditions: Vec<Condition>,
    ops: Vec<BatchOp>,
) -> Command {
    Command::Lock(LockCommand::Fenced {
        sequencer: sequencer.clone(),
        secret,
        conditions,
        ops,
    })
}

#[test]
fn lock_commands_raise_no_revision_and_fenced_writes_raise_one() {
    let (mut store, sequencer, secret) = locked();
    assert_eq!(raw_revision(&store), 0);
    assert_eq!(
        run(
            &mut store,
            fenced(&sequencer, secret, vec![], vec![op_put("k", "1")])
        ),
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 1
        })
    );
    // More lock commands: a second lock, its release. Nothing raised.
    let granted = run(&mut store, acquire("g", 2));
    let token = match granted {
        Ok(Outcome::Lock(LockOutcome::Granted { sequencer, .. })) => sequencer.token,
        other => panic!("acquire answered {other:?}"),
    };
    run(
        &mut store,
        Command::Lock(LockCommand::Release {
            session: SessionId(1),
            secret,
            owner: 1,
            request_id: 3,
            name: "g".into(),
            token,
        }),
    )
    .expect("releases");
    assert_eq!(raw_revision(&store), 1);
    // A fenced write by revision: holds, then fails, then is refused on an
    // absent key; only the first raises the revision.
    assert_eq!(
        run(
            &mut store,
            fenced(
                &sequencer,
                secret,
                vec![Condition::new("k", Test::mod_revision_is(1))],
                vec![op_put("k", "2"), op_put("j", "1")],
            )
        ),
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 2
        })
    );
    assert_eq!(get(&store, "k"), Some(versioned("2", 1, 2, 2)));
    assert_eq!(get(&store, "j"), Some(versioned("1", 2, 2, 1)));
    let before = store.clone();
    assert_eq!(
        run(
            &mut store,
            fenced(
                &sequencer,
                secret,
                vec![Condition::new("k", Test::mod_revision_is(1))],
                vec![op_put("k", "3")],
            )
        ),
        Ok(Outcome::Batch {
            failed_condition: Some(0),
            revision: 2
        })
    );
    assert_eq!(store, before);
    assert_eq!(
        run_at(
            &mut store,
            99,
            fenced(
                &sequencer,
                secret,
                vec![Condition::new("absent", Test::mod_revision_is(1))],
                vec![op_put("k", "3")],
            )
        ),
        Err(CommandError::KeyAbsent {
            key: "absent".into()
        })
    );
    assert_eq!(store, before);
    // A stale fence: refused, nothing raised.
    let stale = Sequencer {
        token: Token(99),
        ..sequencer
    };
    assert!(matches!(
        run_at(
            &mut store,
            99,
            fenced(&stale, secret, vec![], vec![op_put("k", "4")])
        ),
        Err(CommandError::StaleFence { .. })
    ));
    assert_eq!(store, before);
}

// ---------------------------------------------------------------- property

const KEYS: [&str; 5] = ["a", "ab", "b", "c", "d"];

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        12 => prop::sample::select(KEYS.to_vec()).prop_map(b),
        1 => Just(Vec::new()),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec!["", "x", "y"]).prop_map(b)
}

fn arb_test() -> impl Strategy<Value = Test> {
    strategies::key_test(value(), prop_oneof![0u64..5, 0u64..40])
}

fn arb_condition() -> impl Strategy<Value = Condition> {
    (key(), arb_test()).prop_map(|(key, test)| Condition { key, test })
}

fn arb_op() -> impl Strategy<Value = BatchOp> {
    prop_oneof![
        2 => (key(), value()).prop_map(|(key, value)| BatchOp::Put { key, value }),
        1 => key().prop_map(|key| BatchOp::Delete { key }),
    ]
}

fn arb_conditions_and_ops() -> impl Strategy<Value = (Vec<Condition>, Vec<BatchOp>)> {
    (
        prop::collection::vec(arb_condition(), 0..3),
        prop::collection::vec(arb_op(), 0..4),
    )
}

/// A KV command, a fenced write (by the holder of "f", or stale), or a lock
/// command that touches no key.
fn arb_single(sequencer: Sequencer, secret: SessionSecret) -> impl Strategy<Value = Command> {
    let stale = Sequencer {
        token: Token(sequencer.token.0 + 1),
        ..sequencer.clone()
    };
    prop_oneof![
        3 => (key(), value()).prop_map(|(key, value)| Command::Put { key, value }),
        2 => (key(), value()).prop_map(|(key, value)| Command::PutIfAbsent { key, value }),
        4 => (key(), arb_test(), value())
            .prop_map(|(key, test, value)| Command::CompareAndPut { key, test, value }),
        2 => (key(), value()).prop_map(|(key, value)| Command::GetAndPut { key, value }),
        2 => key().prop_map(|key| Command::Delete { key }),
        1 => (key(), key()).prop_map(|(start, end)| Command::DeleteRange { start, end }),
        3 => arb_conditions_and_ops()
            .prop_map(|(conditions, ops)| Command::Batch { conditions, ops }),
        2 => (any::<bool>(), arb_conditions_and_ops()).prop_map(
            move |(current, (conditions, ops))| {
                let s = if current { sequencer.clone() } else { stale.clone() };
                fenced(&s, secret, conditions, ops)
            }
        ),
        1 => (key(), 0u64..3).prop_map(|(key, step)| Command::NextSequence { key, step }),
        1 => (1u64..4).prop_map(|n| acquire(["f", "g", "h"][n as usize - 1], 100 + n)),
    ]
}

fn arb_command(sequencer: Sequencer, secret: SessionSecret) -> impl Strategy<Value = Command> {
    prop_oneof![
        6 => arb_single(sequencer.clone(), secret),
        1 => prop::collection::vec(arb_single(sequencer, secret), 0..6)
            .prop_map(|commands| Command::Group { commands }),
    ]
}

/// Puts of `key` in `command` after its last delete there, and whether it
/// deletes `key` at all (a batch or a fenced write may do both).
fn writes_of(command: &Command, key: &[u8]) -> (u64, bool) {
    let ops: Vec<BatchOp> = match command {
        Command::Put { key: k, value }
        | Command::PutIfAbsent { key: k, value }
        | Command::GetAndPut { key: k, value }
        | Command::CompareAndPut { key: k, value, .. } => vec![BatchOp::Put {
            key: k.clone(),
            value: value.clone(),
        }],
        Command::Delete { key: k } => vec![BatchOp::Delete { key: k.clone() }],
        Command::DeleteRange { start, end } => {
            if key >= start.as_slice() && key < end.as_slice() {
                vec![BatchOp::Delete { key: key.to_vec() }]
            } else {
                vec![]
            }
        }
        Command::Batch { ops, .. } | Command::Lock(LockCommand::Fenced { ops, .. }) => ops.clone(),
        _ => vec![],
    };
    let (mut puts, mut deleted) = (0, false);
    for op in ops {
        match op {
            BatchOp::Put { key: k, .. } if k == key => puts += 1,
            BatchOp::Delete { key: k } if k == key => {
                puts = 0;
                deleted = true;
            }
            _ => {}
        }
    }
    (puts, deleted)
}

/// Whether an applied command changed a key, judged from the data rows
/// before and after it and its outcome: any row differs, or a batch put a
/// key it then deleted again.
fn changed_a_key(
    command: &Command,
    result: &CommandResult,
    before: &BTreeMap<Vec<u8>, Versioned>,
    after: &BTreeMap<Vec<u8>, Versioned>,
) -> bool {
    let put_in_batch = match (command, result) {
        (
            Command::Batch { ops, .. } | Command::Lock(LockCommand::Fenced { ops, .. }),
            Ok(Outcome::Batch {
                failed_condition: None,
                ..
            }),
        ) => ops.iter().any(|op| matches!(op, BatchOp::Put { .. })),
        _ => false,
    };
    before != after || put_in_batch
}

/// Check the revision rules on one applied (non-group) `command`, which
/// turned `before_store` into `store` and answered `result`: returns the
/// revision after it.
fn check_one(
    store: &MemStore,
    command: &Command,
    result: &CommandResult,
    before_store: &MemStore,
) -> Result<u64, TestCaseError> {
    let shown = format!("{command:?} -> {result:?}");
    let before = raw_data(before_store);
    let after = raw_data(store);
    let (rev_before, rev_after) = (raw_revision(before_store), raw_revision(store));
    if result.is_err() {
        prop_assert_eq!(store, before_store, "a refusal wrote: {}", shown);
        return Ok(rev_after);
    }
    let changed = changed_a_key(command, result, &before, &after);
    prop_assert_eq!(
        rev_after,
        rev_before + u64::from(changed),
        "changed a key: {}; {}",
        changed,
        shown
    );
    if let Ok(outcome) = result {
        if let Some(r) = outcome_revision(outcome) {
            prop_assert_eq!(r, rev_after, "the outcome's revision: {}", shown);
        }
    }
    // Every key whose row changed: stamped with this revision, its version
    // and create revision carried on or started again.
    for (k, now_v) in &after {
        if before.get(k) == Some(now_v) {
            continue;
        }
        prop_assert_eq!(now_v.mod_revision, rev_after, "{:?}: {}", k, shown);
        let (puts, deleted) = writes_of(command, k);
        match before.get(k) {
            Some(old) if !deleted => {
                prop_assert_eq!(
                    now_v.create_revision,
                    old.create_revision,
                    "{:?}: {}",
                    k,
                    shown
                );
                prop_assert_eq!(now_v.version, old.version + puts, "{:?}: {}", k, shown);
            }
            _ => {
                prop_assert_eq!(now_v.create_revision, rev_after, "{:?}: {}", k, shown);
                prop_assert_eq!(now_v.version, puts, "{:?}: {}", k, shown);
            }
        }
    }
    Ok(rev_after)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Over random commands (single or grouped): the revision never goes
    /// down, rises by exactly one for each command that changed a key and
    /// by nothing otherwise (refusals included, which write nothing at
    /// all), each changed key is stamped with it, and a second replica fed
    /// the same log ends byte-identical, with the same answers.
    #[test]
    fn the_revision_counts_the_commands_that_change_keys(
        commands in {
            let (_, sequencer, secret) = locked();
            prop::collection::vec(arb_command(sequencer, secret), 1..40)
        }
    ) {
        let (mut store, _, _) = locked();
        let mut replica = store.clone();
        let mut high = raw_revision(&store);
        prop_assert_eq!(high, 0, "lock commands raised the revision");
        for (i, command) in commands.iter().enumerate() {
            let now = 10 + i as u64;
            let request = Request { now, command: command.clone() };
            let got = match command {
                Command::Group { commands: inner } => {
                    // Each command of the group, checked one at a time on a
                    // shadow store, must match the group as a whole.
                    let mut shadow = store.clone();
                    let mut want = Vec::new();
                    for c in inner {
                        let before = shadow.clone();
                        let r = run_at(&mut shadow, now, c.clone());
                        check_one(&shadow, c, &r, &before)?;
                        want.push(r);
                    }
                    let got = apply(&mut store, &request).expect("MemStore never fails");
                    prop_assert_eq!(&got, &Ok(Outcome::Group(want)), "step {}", i);
                    prop_assert_eq!(&store, &shadow, "step {}", i);
                    got
                }
                _ => {
                    let before = store.clone();
                    let got = apply(&mut store, &request).expect("MemStore never fails");
                    check_one(&store, command, &got, &before)?;
                    got
                }
            };
            let revision = raw_revision(&store);
            prop_assert!(revision >= high, "the revision went down at step {}", i);
            high = revision;
            // Reads see it.
            let all = query(&store, &Query::Scan(ScanRange::prefix(Vec::new(), 0)))
                .expect("MemStore never fails");
            let want_entries: Vec<(Vec<u8>, Versioned)> = raw_data(&store).into_iter().collect();
            prop_assert_eq!(
                all,
                Ok(Outcome::Entries { entries: want_entries, more: false, revision }),
                "scan after step {}", i
            );
            // The replica decodes its own copy of the entry.
            let entry = codec::encode(&request).expect("encodes");
            let copy: Request = codec::decode(&entry).expect("decodes");
            let theirs = apply(&mut replica, &copy).expect("MemStore never fails");
            prop_assert_eq!(
                codec::encode(&theirs).expect("encodes"),
                codec::encode(&got).expect("encodes"),
                "the replica answered otherwise at step {}", i
            );
        }
        let raw = |s: &MemStore| codec::encode(&s.map.iter().collect::<Vec<_>>()).expect("encodes");
        prop_assert_eq!(raw(&replica), raw(&store));
        prop_assert_eq!(&replica, &store);
    }
}
