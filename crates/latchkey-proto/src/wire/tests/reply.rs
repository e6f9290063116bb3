//! Replies: every result of every RPC round-trips, and a reply that cannot
//! be trusted is an unknown outcome or unavailable, never a result.

use latchkey_core::lock::{
    LockDelayTimer, LockInfo, LockMode, LockOutcome, SessionId, SessionInfo, SessionSecret, Token,
    WaitCancel,
};
use latchkey_core::{CommandResult, Outcome, Versioned};

use super::{holder, seq};
use crate::v1::{self, call_reply::Reply as Rep};
use crate::wire::{reply_from_wire, reply_to_wire, Rpc};
use crate::ReplicaFailure;

/// Every result of every RPC, each outcome variant at least once.
fn results() -> Vec<(Rpc, CommandResult)> {
    use LockOutcome as L;
    let some = |v: &[u8]| Some(v.to_vec());
    // Each revision field different, so a swap of two is caught.
    let versioned = |v: &[u8]| {
        Some(Versioned {
            value: v.to_vec(),
            create_revision: 3,
            mod_revision: 5,
            version: 2,
        })
    };
    vec![
        (
            Rpc::Get,
            Ok(Outcome::Value {
                value: None,
                revision: 0,
            }),
        ),
        (
            Rpc::Get,
            Ok(Outcome::Value {
                value: versioned(b""),
                revision: 9,
            }),
        ),
        (
            Rpc::MultiGet,
            Ok(Outcome::Values {
                values: vec![None, versioned(b"v")],
                revision: 9,
            }),
        ),
        (
            Rpc::Scan,
            Ok(Outcome::Entries {
                entries: vec![(b"a".to_vec(), versioned(b"1").expect("some"))],
                more: true,
                revision: 12,
            }),
        ),
        (Rpc::Put, Ok(Outcome::Written { revision: 7 })),
        (
            Rpc::PutIfAbsent,
            Ok(Outcome::Previous {
                previous: None,
                revision: 8,
            }),
        ),
        (
            Rpc::GetAndPut,
            Ok(Outcome::Previous {
                previous: some(b"old"),
                revision: 8,
            }),
        ),
        (
            Rpc::CompareAndPut,
            Ok(Outcome::Swapped {
                succeeded: false,
                current: versioned(b"x"),
                revision: 4,
            }),
        ),
        (
            Rpc::CompareAndPut,
            Ok(Outcome::Swapped {
                succeeded: false,
                current: None,
                revision: 4,
            }),
        ),
        (
            Rpc::Delete,
            Ok(Outcome::Deleted {
                count: 1,
                revision: 2,
            }),
        ),
        (
            Rpc::DeleteRange,
            Ok(Outcome::Deleted {
                count: 17,
                revision: 3,
            }),
        ),
        (
            Rpc::Batch,
            Ok(Outcome::Batch {
                failed_condition: Some(1),
                revision: 5,
            }),
        ),
        (
            Rpc::FencedWrite,
            Ok(Outcome::Batch {
                failed_condition: None,
                revision: 6,
            }),
        ),
        (
            Rpc::NextSequence,
            Ok(Outcome::Sequence { start: 5, end: 10 }),
        ),
        (
            Rpc::OpenSession,
            Ok(Outcome::Lock(L::SessionOpened {
                session: SessionId(3),
                ttl_ms: 10_000,
                secret: SessionSecret([3; 16]),
            })),
        ),
        (
            Rpc::KeepAlive,
            Ok(Outcome::Lock(L::Session(Some(SessionInfo {
                session: SessionId(3),
                ttl_ms: 10_000,
                forced: latchkey_core::lock::ForcedReleases {
                    total: 5,
                    recent: vec![
                        latchkey_core::lock::Token(8),
                        latchkey_core::lock::Token(11),
                    ],
                },
            })))),
        ),
        (Rpc::GetSession, Ok(Outcome::Lock(L::Session(None)))),
        (
            Rpc::ForceRelease,
            Ok(Outcome::Lock(L::ForceReleased {
                released: vec![latchkey_core::lock::HolderInfo {
                    session: SessionId(3),
                    owner: 2,
                    mode: latchkey_core::lock::LockMode::Shared,
                    token: latchkey_core::lock::Token(9),
                    hold_count: 1,
                    lease_ms: Some(4_000),
                }],
            })),
        ),
        (
            Rpc::ListSessions,
            Ok(Outcome::Lock(L::Sessions {
                sessions: vec![latchkey_core::lock::SessionListing {
                    session: SessionId(3),
                    name: "worker (pid 7 on db-1)".into(),
                    ttl_ms: 10_000,
                    held: vec![latchkey_core::lock::HeldLock {
                        name: "pool".into(),
                        owner: 2,
                        mode: latchkey_core::lock::LockMode::Shared,
                        token: latchkey_core::lock::Token(9),
                        permits: Some(3),
                    }],
                    holds: 1,
                    waiting: vec!["jobs".into()],
                    waits: 1,
                    keys: 4,
                    forced: 5,
                    left_ms: Some(7_250),
                }],
                more: true,
            })),
        ),
        (
            Rpc::CloseSession,
            Ok(Outcome::Lock(L::SessionEnded {
                session: SessionId(3),
                released: 2,
                cancelled: 1,
            })),
        ),
        (
            Rpc::Proclaim,
            Ok(Outcome::Lock(L::Proclaimed { term: Token(41) })),
        ),
        (
            Rpc::EndSession,
            Ok(Outcome::Lock(L::SessionEnded {
                session: SessionId(5),
                released: 1,
                cancelled: 0,
            })),
        ),
        (
            Rpc::Acquire,
            Ok(Outcome::Lock(L::Granted {
                sequencer: seq("a", 40),
                hold_count: 1,
            })),
        ),
        (
            Rpc::Acquire,
            Ok(Outcome::Lock(L::Queued {
                name: "a".into(),
                request_id: 11,
                position: 3,
            })),
        ),
        (
            Rpc::Release,
            Ok(Outcome::Lock(L::Released {
                name: "a".into(),
                token: Token(40),
                remaining: 0,
            })),
        ),
        (
            Rpc::CancelWait,
            Ok(Outcome::Lock(L::WaitCancel(WaitCancel::Cancelled))),
        ),
        (
            Rpc::CancelWait,
            Ok(Outcome::Lock(L::WaitCancel(WaitCancel::AlreadyGranted(
                seq("a", 41),
            )))),
        ),
        (
            Rpc::CancelWait,
            Ok(Outcome::Lock(L::WaitCancel(WaitCancel::NotWaiting))),
        ),
        (
            Rpc::CancelWait,
            Ok(Outcome::Lock(L::WaitCancel(WaitCancel::AlreadyGrantedAll(
                vec![seq("b", 42), seq("a", 43)],
            )))),
        ),
        (
            Rpc::AcquireAll,
            Ok(Outcome::Lock(L::GrantedAll {
                sequencers: vec![seq("b", 42), seq("a", 43)],
            })),
        ),
        (
            Rpc::AcquireAll,
            Ok(Outcome::Lock(L::Queued {
                name: "b".into(),
                request_id: 12,
                position: 1,
            })),
        ),
        (
            Rpc::ReleaseAll,
            Ok(Outcome::Lock(L::ReleasedAll {
                released: vec!["b".into()],
                gone: vec!["a".into()],
            })),
        ),
        (
            Rpc::CheckSequencer,
            Ok(Outcome::Lock(L::SequencerCheck { current: true })),
        ),
        (
            Rpc::ListLocks,
            Ok(Outcome::Lock(L::Locks {
                locks: vec![
                    LockInfo {
                        name: "a".into(),
                        mode: Some(LockMode::Exclusive),
                        holders: vec![holder()],
                        waiters: 2,
                        lock_delay: None,
                        permits: None,
                    },
                    LockInfo {
                        name: "b".into(),
                        mode: None,
                        holders: Vec::new(),
                        waiters: 0,
                        lock_delay: Some(LockDelayTimer {
                            name: "b".into(),
                            token: Token(8),
                            delay_ms: 500,
                        }),
                        permits: Some(3),
                    },
                ],
                more: false,
            })),
        ),
    ]
}

#[test]
fn every_result_round_trips() {
    for (rpc, result) in results() {
        let back = reply_from_wire(reply_to_wire(rpc, Ok(result.clone())));
        assert_eq!(back, Ok(result), "{rpc:?}");
    }
}

#[test]
fn a_failure_answers_in_the_shape_of_its_call() {
    for (rpc, _) in results() {
        let reply = reply_to_wire(rpc, Err(ReplicaFailure::Unavailable("x".into())));
        assert_eq!(
            reply_from_wire(reply),
            Err(ReplicaFailure::Unavailable("x".into()))
        );
    }
}

#[test]
fn an_outcome_that_does_not_answer_the_call_is_not_passed_off_as_one() {
    let reply = reply_to_wire(
        Rpc::Put,
        Ok(Ok(Outcome::Value {
            value: None,
            revision: 1,
        })),
    );
    assert!(matches!(
        reply_from_wire(reply),
        Err(ReplicaFailure::UnknownOutcome(_))
    ));
    let reply = reply_to_wire(Rpc::Get, Ok(Ok(Outcome::Done)));
    assert!(matches!(
        reply_from_wire(reply),
        Err(ReplicaFailure::Unavailable(_))
    ));
}

#[test]
fn a_reply_missing_its_result_is_an_unknown_outcome() {
    let reply = Rep::Acquire(v1::AcquireReply::default());
    assert!(matches!(
        reply_from_wire(reply),
        Err(ReplicaFailure::UnknownOutcome(_))
    ));
}
