//! Errors: every command error and replica failure round-trips with its
//! message, and says whether to retry.

use latchkey_core::lock::{SessionId, TimerKind, Token};
use latchkey_core::CommandError;

use super::holder;
use crate::v1;
use crate::wire::{command_error_to_wire, error_from_wire};
use crate::ReplicaFailure;

fn command_errors() -> Vec<CommandError> {
    use CommandError as E;
    vec![
        E::SequenceExhausted {
            key: "seq".into(),
            step: 3,
        },
        E::UnknownSession {
            session: SessionId(9),
        },
        E::SessionEnded {
            session: SessionId(9),
        },
        E::InvalidLockName { len: 0, max: 256 },
        E::TtlOutOfRange {
            ttl_ms: 1,
            min: 3_000,
            max: 600_000,
        },
        E::DurationOutOfRange {
            what: TimerKind::Wait,
            value: 0,
            min: 1,
            max: 2,
        },
        E::DurationOutOfRange {
            what: TimerKind::Lease,
            value: 0,
            min: 1,
            max: 2,
        },
        E::DurationOutOfRange {
            what: TimerKind::LockDelay,
            value: 0,
            min: 1,
            max: 2,
        },
        E::NotHolder { name: "a".into() },
        E::StaleToken {
            name: "a".into(),
            token: Token(3),
            current: Token(4),
        },
        E::UpgradeNotAllowed { name: "a".into() },
        E::DowngradeNotAllowed { name: "a".into() },
        E::Busy {
            name: "a".into(),
            holder: Some(holder()),
            holders: 1,
            waiters: 4,
            lock_delay: true,
        },
        E::Busy {
            name: "a".into(),
            holder: None,
            holders: 0,
            waiters: 0,
            lock_delay: true,
        },
        E::AlreadyWaiting {
            name: "a".into(),
            request_id: 5,
        },
        E::QueueFull {
            name: "a".into(),
            max: 1_024,
        },
        E::PermitsMismatch {
            name: "pool".into(),
            permits: Some(4),
            asked: None,
        },
        E::PermitsMismatch {
            name: "pool".into(),
            permits: None,
            asked: Some(2),
        },
        E::StaleFence {
            name: "a".into(),
            token: Token(3),
            current: Some(Token(4)),
        },
        E::StaleFence {
            name: "a".into(),
            token: Token(3),
            current: None,
        },
        E::RequestTooOld {
            request_id: 1,
            oldest: 300,
        },
        E::RequestIdReused { request_id: 6 },
        E::WaitCancelled {
            name: "a".into(),
            request_id: 6,
        },
        E::CounterExhausted {
            counter: "fencing tokens".into(),
        },
        E::PermissionDenied {
            user: "app".into(),
            permission: latchkey_core::auth::Permission::Write,
            on: "key \"billing/1\"".into(),
        },
        E::AuthRequired,
        E::TooManySessions { max: 100_000 },
        E::KeyAbsent {
            key: "config".into(),
        },
    ]
}

#[test]
fn every_command_error_round_trips_with_its_message() {
    for e in command_errors() {
        let wire = command_error_to_wire(&e);
        assert_eq!(wire.message, e.to_string());
        assert_eq!(error_from_wire(wire), Ok(e));
    }
}

#[test]
fn an_invalid_command_arrives_as_an_invalid_argument() {
    let e = CommandError::invalid("key must not be empty");
    assert_eq!(
        error_from_wire(command_error_to_wire(&e)),
        Err(ReplicaFailure::InvalidArgument(
            "key must not be empty".into()
        ))
    );
}

#[test]
fn failures_round_trip_and_say_whether_to_retry() {
    let cases = [
        (
            ReplicaFailure::NotLeader {
                leader: Some((2, "127.0.0.1:7102".into())),
            },
            true,
        ),
        (ReplicaFailure::NotLeader { leader: None }, true),
        (ReplicaFailure::InvalidArgument("bad".into()), false),
        (ReplicaFailure::Unavailable("no quorum".into()), true),
        (
            ReplicaFailure::UnknownOutcome("leader changed".into()),
            false,
        ),
    ];
    for (failure, retryable) in cases {
        let wire = v1::Error::from(failure.clone());
        assert_eq!(wire.retryable, retryable, "{failure:?}");
        assert_eq!(
            wire.outcome_unknown,
            matches!(failure, ReplicaFailure::UnknownOutcome(_))
        );
        assert_eq!(error_from_wire(wire), Err(failure));
    }
}

#[test]
fn an_unknown_error_kind_is_an_unknown_outcome() {
    let e = v1::Error {
        kind: 999,
        message: "from a newer replica".into(),
        ..Default::default()
    };
    assert!(matches!(
        error_from_wire(e),
        Err(ReplicaFailure::UnknownOutcome(_))
    ));
}
