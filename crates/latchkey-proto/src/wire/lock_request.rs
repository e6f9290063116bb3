//! Lock-service operations (sessions, acquires, releases, fenced writes and
//! lock reads) to their typed request messages and back.

use std::time::Duration;

use latchkey_core::lock::{LockCommand, LockQuery, Sequencer, SessionId, SessionSecret, Token};
use latchkey_core::{Command, Query};

use super::batch::{conditions_from_wire, conditions_to_wire, ops_from_wire, ops_to_wire};
use super::fault::invalid;
use super::lock_parts::{mode_from_wire, mode_to_wire, sequencer_from_wire, sequencer_to_wire};
use super::operation::Operation;
use crate::v1::{self, call::Request as Req};
use crate::ReplicaFailure;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long a replica holds an `Acquire` call whose `hold_ms` is 0 (not
/// set): a caller that asked to wait and said nothing about the hold gets a
/// call that waits, not an immediate `queued` that it would have to poll.
pub const DEFAULT_ACQUIRE_HOLD: Duration = Duration::from_secs(30);

/// `hold` as `hold_ms`: at least 1, since 0 on the wire means
/// [`DEFAULT_ACQUIRE_HOLD`].
pub(super) fn hold_ms(hold: Duration) -> u64 {
    millis(hold).max(1)
}

/// The typed request of a lock command; an acquire's call is held up to
/// `hold_ms`. What only the leader proposes is refused.
pub(super) fn command_to_wire(command: &LockCommand, hold_ms: u64) -> Result<Req, ReplicaFailure> {
    Ok(match command {
        // The replica draws the secret: the request has no room for one.
        LockCommand::OpenSession { ttl_ms, name, .. } => Req::OpenSession(v1::OpenSessionRequest {
            ttl_ms: *ttl_ms,
            name: name.clone(),
        }),
        LockCommand::CloseSession { session, secret } => {
            Req::CloseSession(v1::CloseSessionRequest {
                session: session.0,
                session_secret: secret.0.to_vec(),
            })
        }
        LockCommand::Acquire {
            session,
            secret,
            owner,
            request_id,
            name,
            mode,
            wait_ms,
            lease_ms,
            lock_delay_ms,
            value,
            permits,
        } => Req::Acquire(v1::AcquireRequest {
            session: session.0,
            session_secret: secret.0.to_vec(),
            owner: *owner,
            request_id: *request_id,
            name: name.clone(),
            mode: mode_to_wire(*mode) as i32,
            wait_ms: *wait_ms,
            lease_ms: *lease_ms,
            lock_delay_ms: *lock_delay_ms,
            hold_ms,
            value: value.clone(),
            permits: *permits,
        }),
        LockCommand::Release {
            session,
            secret,
            owner,
            request_id,
            name,
            token,
        } => Req::Release(v1::ReleaseRequest {
            session: session.0,
            session_secret: secret.0.to_vec(),
            owner: *owner,
            request_id: *request_id,
            name: name.clone(),
            token: token.0,
        }),
        LockCommand::CancelWait {
            session,
            secret,
            owner,
            name,
            request_id,
        } => Req::CancelWait(v1::CancelWaitRequest {
            session: session.0,
            session_secret: secret.0.to_vec(),
            owner: *owner,
            name: name.clone(),
            request_id: *request_id,
        }),
        LockCommand::Fenced {
            sequencer,
            secret,
            conditions,
            ops,
        } => Req::FencedWrite(v1::FencedWriteRequest {
            sequencer: Some(sequencer_to_wire(sequencer)),
            session_secret: secret.0.to_vec(),
            conditions: conditions_to_wire(conditions),
            ops: ops_to_wire(ops),
        }),
        LockCommand::EndSession { session } => {
            Req::EndSession(v1::EndSessionRequest { session: session.0 })
        }
        LockCommand::ForceRelease { name, token } => Req::ForceRelease(v1::ForceReleaseRequest {
            name: name.clone(),
            token: token.0,
        }),
        LockCommand::Proclaim {
            session,
            secret,
            owner,
            name,
            token,
            value,
        } => Req::Proclaim(v1::ProclaimRequest {
            session: session.0,
            session_secret: secret.0.to_vec(),
            owner: *owner,
            name: name.clone(),
            term: token.0,
            value: value.clone(),
        }),
        LockCommand::AcquireAll {
            session,
            secret,
            owner,
            request_id,
            names,
            mode,
            wait_ms,
            lease_ms,
            lock_delay_ms,
        } => Req::AcquireAll(v1::AcquireAllRequest {
            session: session.0,
            session_secret: secret.0.to_vec(),
            owner: *owner,
            request_id: *request_id,
            names: names.clone(),
            mode: mode_to_wire(*mode) as i32,
            wait_ms: *wait_ms,
            lease_ms: *lease_ms,
            lock_delay_ms: *lock_delay_ms,
            hold_ms,
        }),
        LockCommand::ReleaseAll {
            session,
            secret,
            owner,
            request_id,
            grants,
        } => Req::ReleaseAll(v1::ReleaseAllRequest {
            session: session.0,
            session_secret: secret.0.to_vec(),
            owner: *owner,
            request_id: *request_id,
            grants: grants
                .iter()
                .map(|(name, token)| v1::HeldGrant {
                    name: name.clone(),
                    token: token.0,
                })
                .collect(),
        }),
        LockCommand::ExpireSession { .. }
        | LockCommand::ExpireWait { .. }
        | LockCommand::ExpireLockLease { .. }
        | LockCommand::EndLockDelay { .. }
        | LockCommand::Checkpoint { .. } => {
            return Err(invalid(
                "session, wait and lock-lease expiry, lock-delay ends and countdown checkpoints \
                 are proposed by the leader alone, not by clients",
            ))
        }
    })
}

/// The typed request of a lock read. What only the replica reads itself is
/// refused.
pub(super) fn query_to_wire(query: &LockQuery, stale: bool) -> Result<Req, ReplicaFailure> {
    Ok(match query {
        LockQuery::CheckSequencer(sequencer) => Req::CheckSequencer(v1::CheckSequencerRequest {
            sequencer: Some(sequencer_to_wire(sequencer)),
            stale,
        }),
        LockQuery::Locks {
            prefix,
            start_after,
            limit,
        } => Req::ListLocks(v1::ListLocksRequest {
            prefix: prefix.clone(),
            start_after: start_after.clone(),
            limit: *limit,
            stale,
        }),
        LockQuery::Session { session } => Req::GetSession(v1::GetSessionRequest {
            session: session.0,
            stale,
        }),
        LockQuery::Sessions { start_after, limit } => Req::ListSessions(v1::ListSessionsRequest {
            start_after: start_after.map(|s| s.0),
            limit: *limit,
            stale,
        }),
        LockQuery::TimerState | LockQuery::SessionTimer { .. } | LockQuery::Census => {
            return Err(invalid(
                "the timer state and the census are read by the replica itself, not by clients",
            ))
        }
    })
}

/// The typed request of a keep-alive.
pub(super) fn keep_alive_to_wire(session: SessionId, secret: &SessionSecret) -> Req {
    Req::KeepAlive(v1::KeepAliveRequest {
        session: session.0,
        session_secret: secret.0.to_vec(),
    })
}

/// A typed keep-alive.
pub(super) fn keep_alive_from_wire(r: v1::KeepAliveRequest) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::KeepAlive {
        session: SessionId(r.session),
        secret: secret_from_wire(&r.session_secret)?,
    })
}

/// A typed session open.
pub(super) fn open_session_from_wire(r: v1::OpenSessionRequest) -> Operation {
    // A placeholder secret: the replica draws the real one when it
    // proposes the open (see `LockCommand::OpenSession`).
    Operation::Write(Command::Lock(LockCommand::OpenSession {
        ttl_ms: r.ttl_ms,
        secret: SessionSecret::default(),
        name: r.name,
    }))
}

/// A typed session close.
pub(super) fn close_session_from_wire(
    r: v1::CloseSessionRequest,
) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::Write(Command::Lock(LockCommand::CloseSession {
        session: SessionId(r.session),
        secret: secret_from_wire(&r.session_secret)?,
    })))
}

/// A typed operator's end of a session.
pub(super) fn end_session_from_wire(r: v1::EndSessionRequest) -> Operation {
    Operation::Write(Command::Lock(LockCommand::EndSession {
        session: SessionId(r.session),
    }))
}

/// A typed operator's forced release.
pub(super) fn force_release_from_wire(r: v1::ForceReleaseRequest) -> Operation {
    Operation::Write(Command::Lock(LockCommand::ForceRelease {
        name: r.name,
        token: Token(r.token),
    }))
}

/// A typed session listing.
pub(super) fn list_sessions_from_wire(r: v1::ListSessionsRequest) -> Operation {
    read(
        LockQuery::Sessions {
            start_after: r.start_after.map(SessionId),
            limit: r.limit,
        },
        r.stale,
    )
}

/// A typed session read.
pub(super) fn get_session_from_wire(r: v1::GetSessionRequest) -> Operation {
    read(
        LockQuery::Session {
            session: SessionId(r.session),
        },
        r.stale,
    )
}

/// A typed acquire: held for [`DEFAULT_ACQUIRE_HOLD`] when `hold_ms` is 0.
pub(super) fn acquire_from_wire(r: v1::AcquireRequest) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::Acquire {
        command: Command::Lock(LockCommand::Acquire {
            session: SessionId(r.session),
            secret: secret_from_wire(&r.session_secret)?,
            owner: r.owner,
            request_id: r.request_id,
            name: r.name,
            mode: mode_from_wire(r.mode, "mode")?,
            wait_ms: r.wait_ms,
            lease_ms: r.lease_ms,
            lock_delay_ms: r.lock_delay_ms,
            value: r.value,
            permits: r.permits,
        }),
        hold: match r.hold_ms {
            0 => DEFAULT_ACQUIRE_HOLD,
            ms => Duration::from_millis(ms),
        },
    })
}

/// A typed multi-lock acquire: held for [`DEFAULT_ACQUIRE_HOLD`] when
/// `hold_ms` is 0.
pub(super) fn acquire_all_from_wire(r: v1::AcquireAllRequest) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::Acquire {
        command: Command::Lock(LockCommand::AcquireAll {
            session: SessionId(r.session),
            secret: secret_from_wire(&r.session_secret)?,
            owner: r.owner,
            request_id: r.request_id,
            names: r.names,
            mode: mode_from_wire(r.mode, "mode")?,
            wait_ms: r.wait_ms,
            lease_ms: r.lease_ms,
            lock_delay_ms: r.lock_delay_ms,
        }),
        hold: match r.hold_ms {
            0 => DEFAULT_ACQUIRE_HOLD,
            ms => Duration::from_millis(ms),
        },
    })
}

/// A typed multi-lock release.
pub(super) fn release_all_from_wire(r: v1::ReleaseAllRequest) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::Write(Command::Lock(LockCommand::ReleaseAll {
        session: SessionId(r.session),
        secret: secret_from_wire(&r.session_secret)?,
        owner: r.owner,
        request_id: r.request_id,
        grants: r
            .grants
            .into_iter()
            .map(|g| (g.name, Token(g.token)))
            .collect(),
    })))
}

/// A typed proclamation of an election's leader.
pub(super) fn proclaim_from_wire(r: v1::ProclaimRequest) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::Write(Command::Lock(LockCommand::Proclaim {
        session: SessionId(r.session),
        secret: secret_from_wire(&r.session_secret)?,
        owner: r.owner,
        name: r.name,
        token: Token(r.term),
        value: r.value,
    })))
}

/// A typed release.
pub(super) fn release_from_wire(r: v1::ReleaseRequest) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::Write(Command::Lock(LockCommand::Release {
        session: SessionId(r.session),
        secret: secret_from_wire(&r.session_secret)?,
        owner: r.owner,
        request_id: r.request_id,
        name: r.name,
        token: Token(r.token),
    })))
}

/// A typed cancel of a queued acquire.
pub(super) fn cancel_wait_from_wire(r: v1::CancelWaitRequest) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::Write(Command::Lock(LockCommand::CancelWait {
        session: SessionId(r.session),
        secret: secret_from_wire(&r.session_secret)?,
        owner: r.owner,
        name: r.name,
        request_id: r.request_id,
    })))
}

/// A typed fenced write.
pub(super) fn fenced_write_from_wire(
    r: v1::FencedWriteRequest,
) -> Result<Operation, ReplicaFailure> {
    Ok(Operation::Write(Command::Lock(LockCommand::Fenced {
        sequencer: required_sequencer(r.sequencer)?,
        secret: secret_from_wire(&r.session_secret)?,
        conditions: conditions_from_wire(r.conditions)?,
        ops: ops_from_wire(r.ops)?,
    })))
}

/// A typed sequencer check.
pub(super) fn check_sequencer_from_wire(
    r: v1::CheckSequencerRequest,
) -> Result<Operation, ReplicaFailure> {
    Ok(read(
        LockQuery::CheckSequencer(required_sequencer(r.sequencer)?),
        r.stale,
    ))
}

/// A typed lock listing.
pub(super) fn list_locks_from_wire(r: v1::ListLocksRequest) -> Operation {
    read(
        LockQuery::Locks {
            prefix: r.prefix,
            start_after: r.start_after,
            limit: r.limit,
        },
        r.stale,
    )
}

fn read(query: LockQuery, stale: bool) -> Operation {
    Operation::Read {
        query: Query::Lock(query),
        stale,
    }
}

/// A request's `session_secret`: exactly [`SessionSecret::LEN`] bytes.
pub(super) fn secret_from_wire(bytes: &[u8]) -> Result<SessionSecret, ReplicaFailure> {
    SessionSecret::from_slice(bytes).ok_or_else(|| {
        invalid(format!(
            "`session_secret` must be the {} bytes the session's OpenSession reply gave, not {} \
             bytes",
            SessionSecret::LEN,
            bytes.len()
        ))
    })
}

fn required_sequencer(s: Option<v1::Sequencer>) -> Result<Sequencer, ReplicaFailure> {
    sequencer_from_wire(s.ok_or_else(|| invalid("`sequencer` is required"))?)
}
