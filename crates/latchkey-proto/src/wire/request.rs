//! Operations to typed requests and back: [`request_to_wire`] for what a
//! client sends, [`request_from_wire`] for what a replica receives. The
//! key-value requests are converted here; the lock service's are in
//! `lock_request.rs`.

use std::time::Duration;

use latchkey_core::lock::SessionId;
use latchkey_core::{Command, Query, ScanRange};

use super::batch::{
    conditions_from_wire, conditions_to_wire, ops_from_wire, ops_to_wire, put, test_from_wire,
    test_to_wire,
};
use super::fault::invalid;
use super::lock_request;
use super::operation::Operation;
use super::rpc::Rpc;
use crate::v1::{self, call::Request as Req};
use crate::ReplicaFailure;

/// The typed request of `op`, or why a client cannot send it.
pub fn request_to_wire(op: &Operation) -> Result<Req, ReplicaFailure> {
    use lock_request::hold_ms;
    Ok(match op {
        // An acquire proposed as a plain write does not wait for its grant.
        Operation::Write(command) => command_to_wire(command, hold_ms(Duration::ZERO))?,
        Operation::Acquire { command, hold } => command_to_wire(command, hold_ms(*hold))?,
        Operation::Read { query, stale } => query_to_wire(query, *stale)?,
        Operation::KeepAlive { session, secret } => {
            lock_request::keep_alive_to_wire(*session, secret)
        }
    })
}

/// The operation a typed request asks for, and the RPC whose reply answers
/// it. Refused with [`ReplicaFailure::InvalidArgument`] when a required
/// field is missing or an enum value is unknown.
pub fn request_from_wire(request: Req) -> Result<(Operation, Rpc), ReplicaFailure> {
    use lock_request as lock;
    let rpc = Rpc::of(&request);
    let write = |c: Command| Operation::Write(c);
    let read = |q: Query, stale: bool| Operation::Read { query: q, stale };
    let op = match request {
        Req::Get(r) => read(Query::Get { key: r.key }, r.stale),
        Req::MultiGet(r) => read(Query::MultiGet { keys: r.keys }, r.stale),
        Req::Scan(r) => read(
            Query::Scan(ScanRange {
                start: r.start,
                end: r.end,
                prefix: r.prefix,
                limit: r.limit,
                reverse: r.reverse,
            }),
            r.stale,
        ),
        Req::Put(r) if r.session == 0 && r.session_secret.is_empty() => write(retry_safe(
            r.once,
            Command::Put {
                key: r.key,
                value: r.value,
            },
        )?),
        Req::Put(r) => write(retry_safe(
            r.once,
            Command::PutBound {
                secret: lock::secret_from_wire(&r.session_secret)?,
                session: SessionId(r.session),
                key: r.key,
                value: r.value,
            },
        )?),
        Req::PutIfAbsent(r) => write(retry_safe(
            r.once,
            Command::PutIfAbsent {
                key: unbound(r.key, r.session, &r.session_secret)?,
                value: r.value,
            },
        )?),
        Req::GetAndPut(r) => write(retry_safe(
            r.once,
            Command::GetAndPut {
                key: unbound(r.key, r.session, &r.session_secret)?,
                value: r.value,
            },
        )?),
        Req::CompareAndPut(r) => write(retry_safe(
            r.once,
            Command::CompareAndPut {
                key: r.key,
                test: test_from_wire(r.test).map_err(invalid)?,
                value: r.value,
            },
        )?),
        Req::Delete(r) => write(retry_safe(r.once, Command::Delete { key: r.key })?),
        Req::DeleteRange(r) => write(retry_safe(
            r.once,
            Command::DeleteRange {
                start: r.start,
                end: r.end,
            },
        )?),
        Req::Batch(r) => write(retry_safe(
            r.once,
            Command::Batch {
                conditions: conditions_from_wire(r.conditions)?,
                ops: ops_from_wire(r.ops)?,
            },
        )?),
        Req::NextSequence(r) => write(retry_safe(
            r.once,
            Command::NextSequence {
                key: r.key,
                step: r.step,
            },
        )?),
        Req::OpenSession(r) => lock::open_session_from_wire(r),
        Req::KeepAlive(r) => lock::keep_alive_from_wire(r)?,
        Req::CloseSession(r) => lock::close_session_from_wire(r)?,
        Req::EndSession(r) => lock::end_session_from_wire(r),
        Req::ForceRelease(r) => lock::force_release_from_wire(r),
        Req::ListSessions(r) => lock::list_sessions_from_wire(r),
        Req::Proclaim(r) => lock::proclaim_from_wire(r)?,
        Req::GetSession(r) => lock::get_session_from_wire(r),
        Req::Acquire(r) => lock::acquire_from_wire(r)?,
        Req::Release(r) => lock::release_from_wire(r)?,
        Req::AcquireAll(r) => lock::acquire_all_from_wire(r)?,
        Req::ReleaseAll(r) => lock::release_all_from_wire(r)?,
        Req::CancelWait(r) => lock::cancel_wait_from_wire(r)?,
        Req::FencedWrite(r) => lock::fenced_write_from_wire(r)?,
        Req::CheckSequencer(r) => lock::check_sequencer_from_wire(r)?,
        Req::ListLocks(r) => lock::list_locks_from_wire(r),
    };
    Ok((op, rpc))
}

/// `command`, made retry-safe ([`Command::Once`]) when its request carries
/// a `once` tag.
fn retry_safe(tag: Option<v1::Once>, command: Command) -> Result<Command, ReplicaFailure> {
    let Some(tag) = tag else {
        return Ok(command);
    };
    Ok(Command::Once {
        session: SessionId(tag.session),
        secret: lock_request::secret_from_wire(&tag.session_secret)?,
        request_id: tag.request_id,
        command: Box::new(command),
    })
}

/// `req`, the typed request of a write, with the `once` tag of a
/// retry-safe write. Refused for a request that cannot carry one (only key-value
/// writes can).
fn with_once(mut req: Req, tag: v1::Once) -> Result<Req, ReplicaFailure> {
    let slot = match &mut req {
        Req::Put(r) | Req::PutIfAbsent(r) | Req::GetAndPut(r) => &mut r.once,
        Req::CompareAndPut(r) => &mut r.once,
        Req::Delete(r) => &mut r.once,
        Req::DeleteRange(r) => &mut r.once,
        Req::Batch(r) => &mut r.once,
        Req::NextSequence(r) => &mut r.once,
        _ => {
            return Err(invalid(
                "only a key-value write can be made retry-safe (lock calls carry their own \
                 request ids)",
            ))
        }
    };
    *slot = Some(tag);
    Ok(req)
}

/// `key`, refused when its request names a session: only a plain put binds
/// a key to a session.
fn unbound(key: Vec<u8>, session: u64, secret: &[u8]) -> Result<Vec<u8>, ReplicaFailure> {
    if session != 0 || !secret.is_empty() {
        return Err(ReplicaFailure::InvalidArgument(
            "only put binds a key to a session (not put-if-absent or get-and-put)".into(),
        ));
    }
    Ok(key)
}

/// The typed request of a write command; lock commands are converted by
/// `lock_request.rs`. What a client cannot send is refused.
fn command_to_wire(command: &Command, hold_ms: u64) -> Result<Req, ReplicaFailure> {
    Ok(match command {
        Command::Put { key, value } => Req::Put(put(key, value)),
        Command::PutBound {
            key,
            value,
            session,
            secret,
        } => Req::Put(v1::PutRequest {
            session: session.0,
            session_secret: secret.0.to_vec(),
            ..put(key, value)
        }),
        Command::PutIfAbsent { key, value } => Req::PutIfAbsent(put(key, value)),
        Command::GetAndPut { key, value } => Req::GetAndPut(put(key, value)),
        Command::CompareAndPut { key, test, value } => {
            Req::CompareAndPut(v1::CompareAndPutRequest {
                key: key.clone(),
                test: Some(test_to_wire(test)),
                value: value.clone(),
                once: None,
            })
        }
        Command::Delete { key } => Req::Delete(v1::DeleteRequest {
            key: key.clone(),
            once: None,
        }),
        Command::DeleteRange { start, end } => Req::DeleteRange(v1::DeleteRangeRequest {
            start: start.clone(),
            end: end.clone(),
            once: None,
        }),
        Command::Batch { conditions, ops } => Req::Batch(v1::BatchRequest {
            conditions: conditions_to_wire(conditions),
            ops: ops_to_wire(ops),
            once: None,
        }),
        Command::NextSequence { key, step } => Req::NextSequence(v1::NextSequenceRequest {
            key: key.clone(),
            step: *step,
            once: None,
        }),
        Command::Once {
            session,
            secret,
            request_id,
            command,
        } => with_once(
            command_to_wire(command, hold_ms)?,
            v1::Once {
                session: session.0,
                session_secret: secret.0.to_vec(),
                request_id: *request_id,
            },
        )?,
        Command::Lock(lock) => lock_request::command_to_wire(lock, hold_ms)?,
        Command::Group { .. } => {
            return Err(invalid(
                "a group of commands is the leader's own packing, not a client operation",
            ))
        }
        Command::Auth(_) => {
            return Err(invalid(
                "access-control changes travel on the Auth service, not as a client operation",
            ))
        }
        Command::As { .. } => {
            return Err(invalid(
                "`As` is formed by the replica that authenticated the caller",
            ))
        }
    })
}

/// The typed request of a read; lock reads are converted by
/// `lock_request.rs`. What a client cannot send is refused.
fn query_to_wire(query: &Query, stale: bool) -> Result<Req, ReplicaFailure> {
    Ok(match query {
        Query::Get { key } => Req::Get(v1::GetRequest {
            key: key.clone(),
            stale,
        }),
        Query::MultiGet { keys } => Req::MultiGet(v1::MultiGetRequest {
            keys: keys.clone(),
            stale,
        }),
        Query::Scan(range) => Req::Scan(v1::ScanRequest {
            start: range.start.clone(),
            end: range.end.clone(),
            prefix: range.prefix.clone(),
            limit: range.limit,
            reverse: range.reverse,
            stale,
        }),
        Query::Lock(lock) => lock_request::query_to_wire(lock, stale)?,
        Query::Auth(_) | Query::As { .. } => {
            return Err(invalid(
                "access-control reads travel on the Auth service, not as a client operation",
            ))
        }
    })
}
