//! Requests: every client operation round-trips, and what only the replica
//! proposes has no wire form.

use std::time::Duration;

use latchkey_core::lock::{LockCommand, LockMode, LockQuery, SessionId, SessionSecret, Token};
use latchkey_core::{BatchOp, Command, Compare, Condition, Query, RevisionField, ScanRange, Test};

use super::seq;
use crate::v1::{self, call::Request as Req};
use crate::wire::{request_from_wire, request_to_wire, Operation, Rpc, DEFAULT_ACQUIRE_HOLD};
use crate::ReplicaFailure;

fn acquire(wait_ms: Option<u64>) -> Command {
    Command::Lock(LockCommand::Acquire {
        session: SessionId(3),
        secret: SessionSecret([3; 16]),
        owner: 9,
        request_id: 11,
        name: "jobs/a".into(),
        mode: LockMode::Shared,
        wait_ms,
        lease_ms: Some(5_000),
        lock_delay_ms: None,
        value: Vec::new(),
        permits: None,
    })
}

/// Every operation a client can send, each variant at least once.
fn operations() -> Vec<Operation> {
    let k = || b"k".to_vec();
    let conditions = vec![
        Condition::value_is(k(), None),
        Condition::value_is("c", Some(Vec::new())),
        Condition::new("e", Test::Exists(true)),
        Condition::new("f", Test::Exists(false)),
        Condition::new(
            "g",
            Test::Revision {
                field: RevisionField::Create,
                compare: Compare::NotEqual,
                value: 3,
            },
        ),
        Condition::new(
            "h",
            Test::Revision {
                field: RevisionField::Version,
                compare: Compare::Less,
                value: 4,
            },
        ),
        Condition::new(
            "i",
            Test::Revision {
                field: RevisionField::Mod,
                compare: Compare::Greater,
                value: 5,
            },
        ),
    ];
    let ops = vec![
        BatchOp::Put {
            key: k(),
            value: b"v".to_vec(),
        },
        BatchOp::Delete { key: b"d".to_vec() },
    ];
    let writes = [
        Command::Put {
            key: k(),
            value: Vec::new(),
        },
        Command::PutIfAbsent {
            key: k(),
            value: b"v".to_vec(),
        },
        Command::GetAndPut {
            key: k(),
            value: b"v".to_vec(),
        },
        Command::CompareAndPut {
            key: k(),
            test: Test::ValueIs(Some(b"old".to_vec())),
            value: b"new".to_vec(),
        },
        Command::CompareAndPut {
            key: k(),
            test: Test::ValueIs(None),
            value: b"new".to_vec(),
        },
        Command::CompareAndPut {
            key: k(),
            test: Test::mod_revision_is(41),
            value: b"new".to_vec(),
        },
        Command::Delete { key: k() },
        Command::DeleteRange {
            start: b"a".to_vec(),
            end: b"z".to_vec(),
        },
        Command::Batch {
            conditions: conditions.clone(),
            ops: ops.clone(),
        },
        Command::NextSequence { key: k(), step: 5 },
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 10_000,
            secret: SessionSecret::default(),
            name: String::new(),
        }),
        Command::Lock(LockCommand::CloseSession {
            session: SessionId(4),
            secret: SessionSecret([3; 16]),
        }),
        Command::Lock(LockCommand::EndSession {
            session: SessionId(6),
        }),
        Command::Lock(LockCommand::Proclaim {
            session: SessionId(3),
            secret: SessionSecret([3; 16]),
            owner: 2,
            name: "latchkey.election/sched".into(),
            token: Token(41),
            value: b"10.0.0.8:80".to_vec(),
        }),
        Command::Lock(LockCommand::Release {
            session: SessionId(3),
            secret: SessionSecret([3; 16]),
            owner: 1,
            request_id: 12,
            name: "jobs/a".into(),
            token: Token(40),
        }),
        Command::Lock(LockCommand::ReleaseAll {
            session: SessionId(3),
            secret: SessionSecret([3; 16]),
            owner: 2,
            request_id: 13,
            grants: vec![("jobs/b".into(), Token(42)), ("jobs/a".into(), Token(43))],
        }),
        Command::Lock(LockCommand::CancelWait {
            session: SessionId(3),
            secret: SessionSecret([3; 16]),
            owner: 1,
            name: "jobs/a".into(),
            request_id: 12,
        }),
        Command::Lock(LockCommand::Fenced {
            sequencer: seq("jobs/a", 40),
            secret: SessionSecret([3; 16]),
            conditions,
            ops,
        }),
    ];
    let reads = [
        Query::Get { key: k() },
        Query::MultiGet {
            keys: vec![k(), Vec::new()],
        },
        Query::Scan(ScanRange {
            start: b"a".to_vec(),
            end: Some(b"b".to_vec()),
            prefix: b"a/".to_vec(),
            limit: 10,
            reverse: true,
        }),
        Query::Scan(ScanRange::prefix("p", 0)),
        Query::Lock(LockQuery::CheckSequencer(seq("x", 1))),
        Query::Lock(LockQuery::Locks {
            prefix: "jobs/".into(),
            start_after: Some("jobs/a".into()),
            limit: 5,
        }),
        Query::Lock(LockQuery::Locks {
            prefix: String::new(),
            start_after: None,
            limit: 0,
        }),
        Query::Lock(LockQuery::Session {
            session: SessionId(3),
        }),
    ];
    // Every key-value write also travels retry-safe.
    let once: Vec<Command> = writes
        .iter()
        .filter(|c| !matches!(c, Command::Lock(_)))
        .enumerate()
        .map(|(i, c)| Command::Once {
            session: SessionId(9),
            secret: SessionSecret([9; 16]),
            request_id: i as u64 + 1,
            command: Box::new(c.clone()),
        })
        .collect();
    assert!(
        once.len() >= 9,
        "every kind of key-value write is made retry-safe"
    );
    let mut all: Vec<Operation> = writes
        .into_iter()
        .chain(once)
        .map(Operation::Write)
        .collect();
    for stale in [false, true] {
        all.extend(reads.iter().map(|q| Operation::Read {
            query: q.clone(),
            stale,
        }));
    }
    all.push(Operation::Acquire {
        command: acquire(Some(1_000)),
        hold: Duration::from_millis(250),
    });
    all.push(Operation::Acquire {
        command: acquire(None),
        hold: Duration::from_millis(1),
    });
    // A semaphore's permit.
    all.push(Operation::Acquire {
        command: Command::Lock(LockCommand::Acquire {
            session: SessionId(3),
            secret: SessionSecret([3; 16]),
            owner: 4,
            request_id: 14,
            name: "pool".into(),
            mode: LockMode::Shared,
            wait_ms: Some(1_000),
            lease_ms: None,
            lock_delay_ms: None,
            value: Vec::new(),
            permits: Some(4),
        }),
        hold: Duration::from_millis(250),
    });
    // A multi-lock, waiting and not.
    for wait_ms in [Some(2_000), None] {
        all.push(Operation::Acquire {
            command: Command::Lock(LockCommand::AcquireAll {
                session: SessionId(3),
                secret: SessionSecret([3; 16]),
                owner: 5,
                request_id: 15,
                names: vec!["jobs/b".into(), "jobs/a".into()],
                mode: LockMode::Exclusive,
                wait_ms,
                lease_ms: Some(5_000),
                lock_delay_ms: Some(100),
            }),
            hold: Duration::from_millis(250),
        });
    }
    // A campaign: an acquire of an election's lock with a value.
    all.push(Operation::Acquire {
        command: Command::Lock(LockCommand::Acquire {
            session: SessionId(3),
            secret: SessionSecret([3; 16]),
            owner: 2,
            request_id: 13,
            name: "latchkey.election/sched".into(),
            mode: LockMode::Exclusive,
            wait_ms: Some(1_000),
            lease_ms: None,
            lock_delay_ms: Some(500),
            value: b"10.0.0.7:80".to_vec(),
            permits: None,
        }),
        hold: Duration::from_millis(250),
    });
    all.push(Operation::KeepAlive {
        session: SessionId(3),
        secret: SessionSecret([3; 16]),
    });
    all
}

#[test]
fn every_client_operation_round_trips() {
    for op in operations() {
        let wire = request_to_wire(&op).expect("a client operation");
        let (back, _) = request_from_wire(wire).expect("decodes");
        assert_eq!(back, op);
    }
}

#[test]
fn an_acquire_sent_as_a_plain_write_arrives_as_an_acquire_that_barely_holds() {
    for op in [
        Operation::Write(acquire(Some(5))),
        Operation::Acquire {
            command: acquire(Some(5)),
            hold: Duration::ZERO,
        },
    ] {
        let wire = request_to_wire(&op).expect("encodes");
        let (back, rpc) = request_from_wire(wire).expect("decodes");
        assert_eq!(rpc, Rpc::Acquire);
        assert_eq!(
            back,
            Operation::Acquire {
                command: acquire(Some(5)),
                hold: Duration::from_millis(1)
            }
        );
    }
}

#[test]
fn an_acquire_without_a_hold_is_held_for_the_default() {
    let wire = Req::Acquire(v1::AcquireRequest {
        mode: v1::LockMode::Exclusive as i32,
        wait_ms: Some(10_000),
        session_secret: vec![0; 16],
        ..Default::default()
    });
    let (op, _) = request_from_wire(wire).expect("decodes");
    assert!(
        matches!(op, Operation::Acquire { hold, .. } if hold == DEFAULT_ACQUIRE_HOLD),
        "{op:?}"
    );
}

/// What only the replica itself proposes or reads.
fn internal_operations() -> Vec<Operation> {
    vec![
        Operation::Write(Command::Lock(LockCommand::ExpireSession {
            session: SessionId(1),
        })),
        Operation::Write(Command::Lock(LockCommand::ExpireLockLease {
            name: "a".into(),
            token: Token(1),
        })),
        Operation::Write(Command::Lock(LockCommand::EndLockDelay {
            name: "a".into(),
            token: Token(1),
        })),
        Operation::Write(Command::Lock(LockCommand::Checkpoint {
            sessions: Vec::new(),
            leases: Vec::new(),
        })),
        Operation::Write(Command::Group {
            commands: Vec::new(),
        }),
        Operation::Read {
            query: Query::Lock(LockQuery::TimerState),
            stale: false,
        },
        Operation::Read {
            query: Query::Lock(LockQuery::Census),
            stale: false,
        },
    ]
}

#[test]
fn leader_only_commands_have_no_wire_form() {
    for op in internal_operations() {
        assert!(matches!(
            request_to_wire(&op),
            Err(ReplicaFailure::InvalidArgument(_))
        ));
    }
}

#[test]
fn missing_parts_and_unknown_enums_are_invalid_arguments() {
    let cases = [
        Req::FencedWrite(v1::FencedWriteRequest::default()),
        Req::CheckSequencer(v1::CheckSequencerRequest::default()),
        Req::Acquire(v1::AcquireRequest::default()),
        Req::Acquire(v1::AcquireRequest {
            mode: 42,
            ..Default::default()
        }),
        Req::Batch(v1::BatchRequest {
            conditions: Vec::new(),
            ops: vec![v1::BatchOp { op: None }],
            once: None,
        }),
        // A batch's op cannot be retry-safe on its own.
        Req::Batch(v1::BatchRequest {
            conditions: Vec::new(),
            ops: vec![v1::BatchOp {
                op: Some(v1::batch_op::Op::Delete(v1::DeleteRequest {
                    key: b"k".to_vec(),
                    once: Some(v1::Once::default()),
                })),
            }],
            once: None,
        }),
        Req::FencedWrite(v1::FencedWriteRequest {
            sequencer: Some(v1::Sequencer {
                mode: -1,
                ..Default::default()
            }),
            ..Default::default()
        }),
        // A compare-and-put or a condition without a test, or with a
        // revision test missing its field or comparison.
        Req::CompareAndPut(v1::CompareAndPutRequest::default()),
        Req::CompareAndPut(v1::CompareAndPutRequest {
            test: Some(v1::Test { test: None }),
            ..Default::default()
        }),
        Req::Batch(v1::BatchRequest {
            conditions: vec![v1::Condition {
                key: b"k".to_vec(),
                test: None,
            }],
            ops: Vec::new(),
            once: None,
        }),
        Req::CompareAndPut(v1::CompareAndPutRequest {
            test: Some(v1::Test {
                test: Some(v1::test::Test::Revision(v1::RevisionTest {
                    field: 0,
                    comparison: v1::Comparison::Equal as i32,
                    value: 1,
                })),
            }),
            ..Default::default()
        }),
        Req::CompareAndPut(v1::CompareAndPutRequest {
            test: Some(v1::Test {
                test: Some(v1::test::Test::Revision(v1::RevisionTest {
                    field: v1::RevisionField::Mod as i32,
                    comparison: 99,
                    value: 1,
                })),
            }),
            ..Default::default()
        }),
    ];
    for case in cases {
        let shown = format!("{case:?}");
        match request_from_wire(case) {
            Err(ReplicaFailure::InvalidArgument(msg)) => assert!(!msg.is_empty()),
            other => panic!("{shown}: {other:?}"),
        }
    }
}

#[test]
fn an_operation_names_the_rpc_it_travels_as_without_being_encoded() {
    for op in operations().into_iter().chain(internal_operations()) {
        let encoded = request_to_wire(&op).ok().map(|request| Rpc::of(&request));
        assert_eq!(Rpc::of_operation(&op), encoded, "{op:?}");
    }
}
