//! Refusals to the wire's typed `Error` and back: a command's
//! [`CommandError`] ([`command_error_to_wire`]) and a replica's
//! [`ReplicaFailure`] (`From<ReplicaFailure> for v1::Error`), both read by
//! [`error_from_wire`].

use latchkey_core::lock::{SessionId, TimerKind, Token};
use latchkey_core::CommandError;

use super::lock_parts::{holder_from_wire, holder_to_wire};
use crate::v1::{self, ErrorKind};
use crate::ReplicaFailure;

fn error(kind: ErrorKind, message: String) -> v1::Error {
    v1::Error {
        kind: kind as i32,
        message,
        retryable: matches!(
            kind,
            ErrorKind::NotLeader
                | ErrorKind::Unavailable
                | ErrorKind::Busy
                | ErrorKind::QueueFull
                | ErrorKind::TooManySessions
        ),
        outcome_unknown: kind == ErrorKind::UnknownOutcome,
        ..Default::default()
    }
}

impl From<ReplicaFailure> for v1::Error {
    fn from(f: ReplicaFailure) -> Self {
        let message = f.to_string();
        match f {
            ReplicaFailure::NotLeader { leader } => {
                let (leader_id, leader_addr) = leader.unwrap_or((0, String::new()));
                v1::Error {
                    leader_id,
                    leader_addr,
                    ..error(ErrorKind::NotLeader, message)
                }
            }
            ReplicaFailure::InvalidArgument(_) => error(ErrorKind::InvalidArgument, message),
            ReplicaFailure::Unavailable(_) => error(ErrorKind::Unavailable, message),
            ReplicaFailure::UnknownOutcome(_) => error(ErrorKind::UnknownOutcome, message),
        }
    }
}

fn timer_to_wire(t: TimerKind) -> v1::TimerKind {
    match t {
        TimerKind::Wait => v1::TimerKind::Wait,
        TimerKind::Lease => v1::TimerKind::Lease,
        TimerKind::LockDelay => v1::TimerKind::LockDelay,
    }
}

fn usize_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The typed form of a command's refusal.
pub fn command_error_to_wire(e: &CommandError) -> v1::Error {
    use CommandError as E;
    let message = e.to_string();
    let base = |kind| error(kind, message.clone());
    match e.clone() {
        E::InvalidArgument(_) => base(ErrorKind::InvalidArgument),
        E::SequenceExhausted { key, step } => v1::Error {
            name: key,
            value: step,
            ..base(ErrorKind::SequenceExhausted)
        },
        E::KeyAbsent { key } => v1::Error {
            name: key,
            ..base(ErrorKind::KeyAbsent)
        },
        E::TooManySessionKeys { session, max } => v1::Error {
            session: session.0,
            max,
            ..base(ErrorKind::TooManySessionKeys)
        },
        // 0 stands for "a lock": a semaphore has at least one permit.
        E::PermitsMismatch {
            name,
            permits,
            asked,
        } => v1::Error {
            name,
            max: permits.map_or(0, u64::from),
            value: asked.map_or(0, u64::from),
            ..base(ErrorKind::PermitsMismatch)
        },
        E::UnknownSession { session } => v1::Error {
            session: session.0,
            ..base(ErrorKind::UnknownSession)
        },
        E::WrongSessionSecret { session } => v1::Error {
            session: session.0,
            ..base(ErrorKind::WrongSessionSecret)
        },
        E::SessionEnded { session } => v1::Error {
            session: session.0,
            ..base(ErrorKind::SessionEnded)
        },
        E::InvalidLockName { len, max } => v1::Error {
            value: usize_u64(len),
            max: usize_u64(max),
            ..base(ErrorKind::InvalidLockName)
        },
        E::TtlOutOfRange { ttl_ms, min, max } => v1::Error {
            value: ttl_ms,
            min,
            max,
            ..base(ErrorKind::TtlOutOfRange)
        },
        E::DurationOutOfRange {
            what,
            value,
            min,
            max,
        } => v1::Error {
            timer: timer_to_wire(what) as i32,
            value,
            min,
            max,
            ..base(ErrorKind::DurationOutOfRange)
        },
        E::NotHolder { name } => v1::Error {
            name,
            ..base(ErrorKind::NotHolder)
        },
        E::StaleToken {
            name,
            token,
            current,
        } => v1::Error {
            name,
            token: token.0,
            current_token: Some(current.0),
            ..base(ErrorKind::StaleToken)
        },
        E::UpgradeNotAllowed { name } => v1::Error {
            name,
            ..base(ErrorKind::UpgradeNotAllowed)
        },
        E::DowngradeNotAllowed { name } => v1::Error {
            name,
            ..base(ErrorKind::DowngradeNotAllowed)
        },
        E::Busy {
            name,
            holder,
            holders,
            waiters,
            lock_delay,
        } => v1::Error {
            name,
            holder: holder.map(holder_to_wire),
            holders,
            waiters,
            lock_delay,
            ..base(ErrorKind::Busy)
        },
        E::AlreadyWaiting { name, request_id } => v1::Error {
            name,
            request_id,
            ..base(ErrorKind::AlreadyWaiting)
        },
        E::QueueFull { name, max } => v1::Error {
            name,
            max: u64::from(max),
            ..base(ErrorKind::QueueFull)
        },
        E::StaleFence {
            name,
            token,
            current,
        } => v1::Error {
            name,
            token: token.0,
            current_token: current.map(|t| t.0),
            ..base(ErrorKind::StaleFence)
        },
        E::RequestTooOld { request_id, oldest } => v1::Error {
            request_id,
            min: oldest,
            ..base(ErrorKind::RequestTooOld)
        },
        E::RequestIdReused { request_id } => v1::Error {
            request_id,
            ..base(ErrorKind::RequestIdReused)
        },
        E::WaitCancelled { name, request_id } => v1::Error {
            name,
            request_id,
            ..base(ErrorKind::WaitCancelled)
        },
        E::CounterExhausted { counter } => v1::Error {
            name: counter,
            ..base(ErrorKind::CounterExhausted)
        },
        E::PermissionDenied {
            user,
            permission,
            on,
        } => v1::Error {
            user,
            permission: permission.to_string(),
            resource: on,
            ..base(ErrorKind::PermissionDenied)
        },
        E::AuthRequired => base(ErrorKind::AuthRequired),
        E::TooManySessions { max } => v1::Error {
            max,
            ..base(ErrorKind::TooManySessions)
        },
    }
}

/// What a typed error means: a refused command ([`CommandError`]), or the
/// replica's refusal to run it ([`ReplicaFailure`]; an invalid argument is
/// always reported so, whichever side found it). An error kind this client
/// does not know is an unknown outcome: a newer replica may have executed
/// the call.
pub fn error_from_wire(e: v1::Error) -> Result<CommandError, ReplicaFailure> {
    use CommandError as E;
    let kind = ErrorKind::try_from(e.kind).unwrap_or(ErrorKind::Unspecified);
    let name = e.name;
    let to_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let to_u32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    Ok(match kind {
        ErrorKind::NotLeader => {
            return Err(ReplicaFailure::NotLeader {
                leader: (e.leader_id != 0 && !e.leader_addr.is_empty())
                    .then_some((e.leader_id, e.leader_addr)),
            })
        }
        ErrorKind::InvalidArgument => {
            return Err(ReplicaFailure::InvalidArgument(strip(
                e.message,
                "invalid argument: ",
            )))
        }
        ErrorKind::Unavailable => {
            return Err(ReplicaFailure::Unavailable(strip(
                e.message,
                "unavailable: ",
            )))
        }
        ErrorKind::UnknownOutcome => {
            return Err(ReplicaFailure::UnknownOutcome(strip(
                e.message,
                "outcome unknown: ",
            )))
        }
        ErrorKind::Unspecified => {
            return Err(ReplicaFailure::UnknownOutcome(format!(
                "an error of a kind this client does not know ({}): {}",
                e.kind, e.message
            )))
        }
        // A watch's own ends (read by `watch_reply_from_wire`): never the
        // answer to a call.
        ErrorKind::Compacted
        | ErrorKind::FutureRevision
        | ErrorKind::WatchTooSlow
        | ErrorKind::TooManyWatches => {
            return Err(ReplicaFailure::UnknownOutcome(format!(
                "a watch's error answered a call: {}",
                e.message
            )))
        }
        ErrorKind::SequenceExhausted => E::SequenceExhausted {
            key: name,
            step: e.value,
        },
        ErrorKind::KeyAbsent => E::KeyAbsent { key: name },
        ErrorKind::UnknownSession => E::UnknownSession {
            session: SessionId(e.session),
        },
        ErrorKind::WrongSessionSecret => E::WrongSessionSecret {
            session: SessionId(e.session),
        },
        ErrorKind::SessionEnded => E::SessionEnded {
            session: SessionId(e.session),
        },
        ErrorKind::InvalidLockName => E::InvalidLockName {
            len: to_usize(e.value),
            max: to_usize(e.max),
        },
        ErrorKind::TtlOutOfRange => E::TtlOutOfRange {
            ttl_ms: e.value,
            min: e.min,
            max: e.max,
        },
        ErrorKind::DurationOutOfRange => E::DurationOutOfRange {
            what: match v1::TimerKind::try_from(e.timer) {
                Ok(v1::TimerKind::Lease) => TimerKind::Lease,
                Ok(v1::TimerKind::LockDelay) => TimerKind::LockDelay,
                _ => TimerKind::Wait,
            },
            value: e.value,
            min: e.min,
            max: e.max,
        },
        ErrorKind::NotHolder => E::NotHolder { name },
        ErrorKind::StaleToken => E::StaleToken {
            name,
            token: Token(e.token),
            current: Token(e.current_token.unwrap_or(0)),
        },
        ErrorKind::UpgradeNotAllowed => E::UpgradeNotAllowed { name },
        ErrorKind::DowngradeNotAllowed => E::DowngradeNotAllowed { name },
        ErrorKind::Busy => E::Busy {
            name,
            holder: e.holder.map(holder_from_wire).transpose()?,
            holders: e.holders,
            waiters: e.waiters,
            lock_delay: e.lock_delay,
        },
        ErrorKind::AlreadyWaiting => E::AlreadyWaiting {
            name,
            request_id: e.request_id,
        },
        ErrorKind::QueueFull => E::QueueFull {
            name,
            max: to_u32(e.max),
        },
        ErrorKind::StaleFence => E::StaleFence {
            name,
            token: Token(e.token),
            current: e.current_token.map(Token),
        },
        ErrorKind::RequestTooOld => E::RequestTooOld {
            request_id: e.request_id,
            oldest: e.min,
        },
        ErrorKind::RequestIdReused => E::RequestIdReused {
            request_id: e.request_id,
        },
        ErrorKind::WaitCancelled => E::WaitCancelled {
            name,
            request_id: e.request_id,
        },
        ErrorKind::CounterExhausted => E::CounterExhausted { counter: name },
        ErrorKind::TooManySessions => E::TooManySessions { max: e.max },
        ErrorKind::TooManySessionKeys => E::TooManySessionKeys {
            session: SessionId(e.session),
            max: e.max,
        },
        ErrorKind::PermitsMismatch => {
            let count = |n: u64| (n != 0).then(|| to_u32(n));
            E::PermitsMismatch {
                name,
                permits: count(e.max),
                asked: count(e.value),
            }
        }
        ErrorKind::PermissionDenied => match e.permission.parse() {
            Ok(permission) => E::PermissionDenied {
                user: e.user,
                permission,
                on: e.resource,
            },
            Err(_) => {
                return Err(ReplicaFailure::InvalidArgument(strip(
                    e.message,
                    "invalid argument: ",
                )))
            }
        },
        ErrorKind::AuthRequired => E::AuthRequired,
    })
}

/// `message` without the prefix its error type adds again when printed.
fn strip(message: String, prefix: &str) -> String {
    match message.strip_prefix(prefix) {
        Some(rest) => rest.to_string(),
        None => message,
    }
}
