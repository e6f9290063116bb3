//! Retry-safe key-value writes ([`Command::Once`]): a write sent again
//! under its request id returns its first outcome and changes nothing.
//!
//! The property: over random writes, each sent one to three times with the
//! retries anywhere later in the log, the store stays byte for byte equal
//! to a store that saw each write only until it first succeeded, and every
//! retry of a succeeded write gets its first answer. The unit tests cover the refusals: another write under a
//! remembered id, a forgotten id, a dead or foreign session, a refused
//! write (not remembered), and what may not be wrapped.

use latchkey_core::limits::MAX_REMEMBERED_REQUESTS;
use latchkey_core::lock::{LockCommand, LockOutcome, SessionId, SessionSecret};
use latchkey_core::{
    apply, BatchOp, Command, CommandError, CommandResult, Condition, MemStore, Outcome, Request,
    Test,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

const SECRET: SessionSecret = SessionSecret([7; 16]);

fn config(cases: u32) -> Config {
    fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
        std::env::var(name).ok().and_then(|s| s.parse().ok())
    }
    Config {
        cases: env("LATCHKEY_CASES").unwrap_or(cases),
        rng_seed: RngSeed::Fixed(env("LATCHKEY_SEED").unwrap_or(0x0_0ce5)),
        ..Config::default()
    }
}

/// Apply `command` at a fixed time (so that a retry, which writes nothing,
/// cannot even move the stored clock).
fn run(store: &mut MemStore, command: Command) -> CommandResult {
    apply(store, &Request { now: 1, command }).expect("MemStore never fails")
}

/// A store with session 1 open.
fn with_session() -> MemStore {
    let mut store = MemStore::default();
    let opened = run(
        &mut store,
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 10_000,
            secret: SECRET,
            name: String::new(),
        }),
    );
    assert!(
        matches!(opened, Ok(Outcome::Lock(LockOutcome::SessionOpened { .. }))),
        "{opened:?}"
    );
    store
}

fn once(request_id: u64, command: Command) -> Command {
    Command::Once {
        session: SessionId(1),
        secret: SECRET,
        request_id,
        command: Box::new(command),
    }
}

fn put(key: &str, value: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: value.into(),
    }
}

fn revision(result: &CommandResult) -> u64 {
    match result {
        Ok(Outcome::Written { revision }) => *revision,
        other => panic!("not a written put: {other:?}"),
    }
}

#[test]
fn a_retried_put_returns_its_first_revision_and_writes_nothing() {
    let mut store = with_session();
    let first = run(&mut store, once(1, put("k", "v1")));
    let r1 = revision(&first);
    let after_first = store.clone();
    let again = run(&mut store, once(1, put("k", "v1")));
    assert_eq!(again, first);
    assert_eq!(store, after_first, "a retry changed the store");
    // A later write still takes the next revision: the retry raised nothing.
    let next = run(&mut store, once(2, put("k", "v2")));
    assert_eq!(revision(&next), r1 + 1);
}

#[test]
fn a_retried_get_and_put_returns_the_first_previous_value() {
    let mut store = with_session();
    revision(&run(&mut store, put("k", "old")));
    let swap = || {
        once(
            1,
            Command::GetAndPut {
                key: b"k".to_vec(),
                value: b"new".to_vec(),
            },
        )
    };
    let first = run(&mut store, swap());
    assert!(
        matches!(&first, Ok(Outcome::Previous { previous: Some(p), .. }) if p == b"old"),
        "{first:?}"
    );
    assert_eq!(run(&mut store, swap()), first);
}

#[test]
fn another_write_under_a_remembered_id_is_refused() {
    let mut store = with_session();
    revision(&run(&mut store, once(1, put("k", "v1"))));
    let before = store.clone();
    let reused = run(&mut store, once(1, put("k", "v2")));
    assert_eq!(reused, Err(CommandError::RequestIdReused { request_id: 1 }));
    assert_eq!(store, before);
}

#[test]
fn a_write_cannot_reuse_the_id_of_a_lock_request() {
    let mut store = with_session();
    let acquire = Command::Lock(LockCommand::Acquire {
        session: SessionId(1),
        secret: SECRET,
        owner: 0,
        request_id: 1,
        name: "l".into(),
        mode: latchkey_core::lock::LockMode::Exclusive,
        wait_ms: None,
        lease_ms: None,
        lock_delay_ms: None,
        value: Vec::new(),
        permits: None,
    });
    assert!(run(&mut store, acquire).is_ok());
    let reused = run(&mut store, once(1, put("k", "v")));
    assert_eq!(reused, Err(CommandError::RequestIdReused { request_id: 1 }));
}

#[test]
fn a_refused_write_is_not_remembered() {
    let mut store = with_session();
    // A revision test on an absent key is refused.
    let guarded = || {
        once(
            1,
            Command::CompareAndPut {
                key: b"k".to_vec(),
                test: Test::mod_revision_is(1),
                value: b"v".to_vec(),
            },
        )
    };
    let before = store.clone();
    let refused = run(&mut store, guarded());
    assert!(
        matches!(refused, Err(CommandError::KeyAbsent { .. })),
        "{refused:?}"
    );
    assert_eq!(store, before, "a refused write left memory behind");
    // Judged afresh once the key exists.
    let r = revision(&run(&mut store, put("k", "v0")));
    let swapped = run(
        &mut store,
        once(
            1,
            Command::CompareAndPut {
                key: b"k".to_vec(),
                test: Test::mod_revision_is(r),
                value: b"v".to_vec(),
            },
        ),
    );
    assert!(
        matches!(
            swapped,
            Ok(Outcome::Swapped {
                succeeded: true,
                ..
            })
        ),
        "{swapped:?}"
    );
}

#[test]
fn a_write_of_a_dead_or_foreign_session_is_refused_and_writes_nothing() {
    let mut store = with_session();
    let before = store.clone();
    let unknown = Command::Once {
        session: SessionId(9),
        secret: SECRET,
        request_id: 1,
        command: Box::new(put("k", "v")),
    };
    assert_eq!(
        run(&mut store, unknown),
        Err(CommandError::UnknownSession {
            session: SessionId(9)
        })
    );
    let foreign = Command::Once {
        session: SessionId(1),
        secret: SessionSecret([8; 16]),
        request_id: 1,
        command: Box::new(put("k", "v")),
    };
    assert_eq!(
        run(&mut store, foreign),
        Err(CommandError::WrongSessionSecret {
            session: SessionId(1)
        })
    );
    assert_eq!(store, before);
    // Once the session ends, so does its memory: a retry is refused, not
    // answered or applied again.
    revision(&run(&mut store, once(1, put("k", "v"))));
    let closed = run(
        &mut store,
        Command::Lock(LockCommand::CloseSession {
            session: SessionId(1),
            secret: SECRET,
        }),
    );
    assert!(closed.is_ok(), "{closed:?}");
    let after_close = store.clone();
    assert_eq!(
        run(&mut store, once(1, put("k", "v"))),
        Err(CommandError::SessionEnded {
            session: SessionId(1)
        })
    );
    assert_eq!(store, after_close);
}

#[test]
fn only_a_key_value_write_can_be_made_retry_safe() {
    let mut store = with_session();
    let close = Command::Lock(LockCommand::CloseSession {
        session: SessionId(1),
        secret: SECRET,
    });
    let nested = once(2, put("k", "v"));
    let zero = Command::Once {
        session: SessionId(0),
        secret: SECRET,
        request_id: 1,
        command: Box::new(put("k", "v")),
    };
    for bad in [once(1, close), once(3, nested), zero] {
        let refused = run(&mut store, bad);
        assert!(
            matches!(refused, Err(CommandError::InvalidArgument(_))),
            "{refused:?}"
        );
    }
}

#[test]
fn a_forgotten_id_is_refused_as_too_old() {
    let mut store = with_session();
    let bound = u64::from(MAX_REMEMBERED_REQUESTS);
    for id in 1..=bound + 1 {
        let written = run(&mut store, once(id, put("k", &id.to_string())));
        assert!(written.is_ok(), "{written:?}");
    }
    let before = store.clone();
    assert_eq!(
        run(&mut store, once(1, put("k", "1"))),
        Err(CommandError::RequestTooOld {
            request_id: 1,
            oldest: 2
        })
    );
    assert_eq!(store, before);
    // The newest is still answered.
    let last = bound + 1;
    assert!(run(&mut store, once(last, put("k", &last.to_string()))).is_ok());
    assert_eq!(store, before);
}

/// The writes the property draws: every kind [`Command::Once`] takes, on a
/// handful of keys so that they interfere.
fn write() -> impl Strategy<Value = Command> {
    let key = (0u8..4).prop_map(|k| vec![b'k', b'0' + k]);
    let value = any::<u8>().prop_map(|v| vec![v]);
    prop_oneof![
        3 => (key.clone(), value.clone()).prop_map(|(key, value)| Command::Put { key, value }),
        1 => (key.clone(), value.clone())
            .prop_map(|(key, value)| Command::PutIfAbsent { key, value }),
        1 => (key.clone(), value.clone())
            .prop_map(|(key, value)| Command::GetAndPut { key, value }),
        1 => (key.clone(), value.clone(), 0u64..12).prop_map(|(key, value, r)| {
            Command::CompareAndPut { key, test: Test::mod_revision_is(r), value }
        }),
        1 => key.clone().prop_map(|key| Command::Delete { key }),
        1 => Just(Command::DeleteRange { start: b"k1".to_vec(), end: b"k3".to_vec() }),
        1 => (key.clone(), key.clone(), value.clone()).prop_map(|(a, b, value)| {
            Command::Batch {
                conditions: vec![Condition::new(a.clone(), Test::Exists(true))],
                ops: vec![BatchOp::Put { key: b, value }, BatchOp::Delete { key: a }],
            }
        }),
        1 => (key, 0u64..3).prop_map(|(key, step)| Command::NextSequence { key, step }),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// Every write applies once however often it is sent: the store with
    /// retries equals the store without, and each retry gets the first
    /// answer.
    #[test]
    fn a_retried_write_applies_once(
        writes in prop::collection::vec(write(), 1..40),
        // For each write: how many retries, and how far later each lands.
        retries in prop::collection::vec(prop::collection::vec(0usize..20, 0..3), 40),
    ) {
        // The log with retries: (position, request id), sorted by position;
        // a first send comes before its retries.
        let mut log: Vec<(usize, u64)> = Vec::new();
        for (i, later) in retries.iter().take(writes.len()).enumerate() {
            log.push((i * 20, i as u64 + 1));
            for (n, delay) in later.iter().enumerate() {
                log.push((i * 20 + delay + n + 1, i as u64 + 1));
            }
        }
        log.sort();

        // `reference` sees each write until it succeeds once; `retried`
        // sees every send. A refused write is not remembered, so its
        // retry is judged afresh in both.
        let mut reference = with_session();
        let mut retried = with_session();
        let mut answered: Vec<Option<CommandResult>> = vec![None; writes.len()];
        for (_, id) in log {
            let i = usize::try_from(id - 1).unwrap_or(usize::MAX);
            let answer = run(&mut retried, once(id, writes[i].clone()));
            match &answered[i] {
                Some(first) => {
                    prop_assert_eq!(&answer, first, "request {} answered anew", id);
                }
                None => {
                    let expected = run(&mut reference, once(id, writes[i].clone()));
                    prop_assert_eq!(&answer, &expected);
                    if answer.is_ok() {
                        answered[i] = Some(answer);
                    }
                }
            }
            prop_assert_eq!(&retried, &reference);
        }
    }
}
