//! The typed client API (`latchkey.v1`) and the core's types, converted
//! both ways in this one module.
//!
//! A client hands an [`Operation`] (a core [`Command`] or [`Query`], an
//! acquire that may wait, or a keep-alive) to [`request_to_wire`]; the
//! replica turns the typed request back with [`request_from_wire`], runs it,
//! and answers with [`reply_to_wire`], shaped by the [`Rpc`] that was
//! called; the client reads the reply with [`reply_from_wire`]. The unary
//! RPCs and the `Pipeline.Calls` stream carry the very same messages, so one
//! conversion serves both.
//!
//! Conversions are exact: a command or result that goes to the wire and
//! back is unchanged (tested below). Only what a client may send has a wire
//! form: commands the leader proposes itself (session expiry, lock-lease and
//! lock-delay ends), the leader's packing of writes into one entry, and the
//! timer query stay internal, and [`request_to_wire`] refuses them.
//!
//! A request that the typed schema accepts but that breaks a rule the schema
//! cannot state (a required message missing, an unknown enum value) is
//! refused here with a [`ReplicaFailure::InvalidArgument`] naming the field;
//! the limits of [`latchkey_core::limits`] are checked afterwards by the
//! replica, as for every command.

use std::time::Duration;

use latchkey_core::lock::{
    HolderInfo, LockCommand, LockDelayTimer, LockInfo, LockMode, LockOutcome, LockQuery, Sequencer,
    SessionId, SessionInfo, SessionSecret, TimerKind, Token, WaitCancel,
};
use latchkey_core::{
    BatchOp, Command, CommandError, CommandResult, Condition, Outcome, Query, ScanRange,
};

use crate::v1::{self, call::Request as Req, call_reply::Reply as Rep, ErrorKind};
use crate::ReplicaFailure;

/// One client operation, as the in-process path and the wire both carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// Propose a write command.
    Write(Command),
    /// Serve a query: linearizable (confirmed by the leader) unless `stale`.
    Read {
        /// What to read.
        query: Query,
        /// Serve from the answering replica's state without confirming the
        /// leadership.
        stale: bool,
    },
    /// Propose an acquire and, if it queues, hold the call up to `hold`
    /// for the grant.
    Acquire {
        /// A [`LockCommand::Acquire`].
        command: Command,
        /// Longest time the replica holds the call.
        hold: Duration,
    },
    /// Extend a session's lease (writes nothing).
    KeepAlive {
        /// The session.
        session: SessionId,
        /// Its secret, from its open.
        secret: SessionSecret,
    },
}

/// Which RPC a request came by: it decides the shape of the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Rpc {
    Get,
    MultiGet,
    Scan,
    Put,
    PutIfAbsent,
    CompareAndPut,
    GetAndPut,
    Delete,
    DeleteRange,
    Batch,
    NextSequence,
    OpenSession,
    KeepAlive,
    CloseSession,
    GetSession,
    Acquire,
    Release,
    CancelWait,
    FencedWrite,
    CheckSequencer,
    ListLocks,
}

impl Rpc {
    /// The RPC's name in snake case (`put`, `fenced_write`), for metrics
    /// and logs.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::Get => "get",
            Rpc::MultiGet => "multi_get",
            Rpc::Scan => "scan",
            Rpc::Put => "put",
            Rpc::PutIfAbsent => "put_if_absent",
            Rpc::CompareAndPut => "compare_and_put",
            Rpc::GetAndPut => "get_and_put",
            Rpc::Delete => "delete",
            Rpc::DeleteRange => "delete_range",
            Rpc::Batch => "batch",
            Rpc::NextSequence => "next_sequence",
            Rpc::OpenSession => "open_session",
            Rpc::KeepAlive => "keep_alive",
            Rpc::CloseSession => "close_session",
            Rpc::GetSession => "get_session",
            Rpc::Acquire => "acquire",
            Rpc::Release => "release",
            Rpc::CancelWait => "cancel_wait",
            Rpc::FencedWrite => "fenced_write",
            Rpc::CheckSequencer => "check_sequencer",
            Rpc::ListLocks => "list_locks",
        }
    }

    /// Whether a call of this RPC may change state: its reply, if lost,
    /// leaves the outcome unknown.
    pub fn is_write(self) -> bool {
        !matches!(
            self,
            Rpc::Get
                | Rpc::MultiGet
                | Rpc::Scan
                | Rpc::KeepAlive
                | Rpc::GetSession
                | Rpc::CheckSequencer
                | Rpc::ListLocks
        )
    }

    /// The RPC of a typed request.
    pub fn of(request: &Req) -> Rpc {
        match request {
            Req::Get(_) => Rpc::Get,
            Req::MultiGet(_) => Rpc::MultiGet,
            Req::Scan(_) => Rpc::Scan,
            Req::Put(_) => Rpc::Put,
            Req::PutIfAbsent(_) => Rpc::PutIfAbsent,
            Req::CompareAndPut(_) => Rpc::CompareAndPut,
            Req::GetAndPut(_) => Rpc::GetAndPut,
            Req::Delete(_) => Rpc::Delete,
            Req::DeleteRange(_) => Rpc::DeleteRange,
            Req::Batch(_) => Rpc::Batch,
            Req::NextSequence(_) => Rpc::NextSequence,
            Req::OpenSession(_) => Rpc::OpenSession,
            Req::KeepAlive(_) => Rpc::KeepAlive,
            Req::CloseSession(_) => Rpc::CloseSession,
            Req::GetSession(_) => Rpc::GetSession,
            Req::Acquire(_) => Rpc::Acquire,
            Req::Release(_) => Rpc::Release,
            Req::CancelWait(_) => Rpc::CancelWait,
            Req::FencedWrite(_) => Rpc::FencedWrite,
            Req::CheckSequencer(_) => Rpc::CheckSequencer,
            Req::ListLocks(_) => Rpc::ListLocks,
        }
    }
}

// ---------------------------------------------------------------------------
// Requests.

fn invalid(msg: impl Into<String>) -> ReplicaFailure {
    ReplicaFailure::InvalidArgument(msg.into())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long a replica holds an `Acquire` call whose `hold_ms` is 0 (not
/// set): a caller that asked to wait and said nothing about the hold gets a
/// call that waits, not an immediate `queued` that it would have to poll.
pub const DEFAULT_ACQUIRE_HOLD: Duration = Duration::from_secs(30);

/// `hold` as `hold_ms`: at least 1, since 0 on the wire means
/// [`DEFAULT_ACQUIRE_HOLD`].
fn hold_ms(hold: Duration) -> u64 {
    millis(hold).max(1)
}

/// The typed request of `op`, or why a client cannot send it.
pub fn request_to_wire(op: &Operation) -> Result<Req, ReplicaFailure> {
    Ok(match op {
        // An acquire proposed as a plain write does not wait for its grant.
        Operation::Write(command) => command_to_wire(command, hold_ms(Duration::ZERO))?,
        Operation::Acquire { command, hold } => command_to_wire(command, hold_ms(*hold))?,
        Operation::Read { query, stale } => query_to_wire(query, *stale)?,
        Operation::KeepAlive { session, secret } => Req::KeepAlive(v1::KeepAliveRequest {
            session: session.0,
            session_secret: secret.0.to_vec(),
        }),
    })
}

fn put(key: &[u8], value: &[u8]) -> v1::PutRequest {
    v1::PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

fn command_to_wire(command: &Command, hold_ms: u64) -> Result<Req, ReplicaFailure> {
    Ok(match command {
        Command::Put { key, value } => Req::Put(put(key, value)),
        Command::PutIfAbsent { key, value } => Req::PutIfAbsent(put(key, value)),
        Command::GetAndPut { key, value } => Req::GetAndPut(put(key, value)),
        Command::CompareAndPut {
            key,
            expected,
            value,
        } => Req::CompareAndPut(v1::CompareAndPutRequest {
            key: key.clone(),
            expected: expected.clone(),
            value: value.clone(),
        }),
        Command::Delete { key } => Req::Delete(v1::DeleteRequest { key: key.clone() }),
        Command::DeleteRange { start, end } => Req::DeleteRange(v1::DeleteRangeRequest {
            start: start.clone(),
            end: end.clone(),
        }),
        Command::Batch { conditions, ops } => Req::Batch(v1::BatchRequest {
            conditions: conditions_to_wire(conditions),
            ops: ops_to_wire(ops),
        }),
        Command::NextSequence { key, step } => Req::NextSequence(v1::NextSequenceRequest {
            key: key.clone(),
            step: *step,
        }),
        Command::Lock(lock) => lock_command_to_wire(lock, hold_ms)?,
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

fn lock_command_to_wire(command: &LockCommand, hold_ms: u64) -> Result<Req, ReplicaFailure> {
    Ok(match command {
        // The replica draws the secret: the request has no room for one.
        LockCommand::OpenSession { ttl_ms, .. } => {
            Req::OpenSession(v1::OpenSessionRequest { ttl_ms: *ttl_ms })
        }
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
        LockCommand::ExpireSession { .. }
        | LockCommand::ExpireWait { .. }
        | LockCommand::ExpireLockLease { .. }
        | LockCommand::EndLockDelay { .. } => {
            return Err(invalid(
                "session, wait and lock-lease expiry and lock-delay ends are proposed by the \
                 leader alone, not by clients",
            ))
        }
    })
}

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
        Query::Lock(LockQuery::CheckSequencer(sequencer)) => {
            Req::CheckSequencer(v1::CheckSequencerRequest {
                sequencer: Some(sequencer_to_wire(sequencer)),
                stale,
            })
        }
        Query::Lock(LockQuery::Locks {
            prefix,
            start_after,
            limit,
        }) => Req::ListLocks(v1::ListLocksRequest {
            prefix: prefix.clone(),
            start_after: start_after.clone(),
            limit: *limit,
            stale,
        }),
        Query::Lock(LockQuery::Session { session }) => Req::GetSession(v1::GetSessionRequest {
            session: session.0,
            stale,
        }),
        Query::Lock(LockQuery::TimerState | LockQuery::SessionTimer { .. } | LockQuery::Census) => {
            return Err(invalid(
                "the timer state and the census are read by the replica itself, not by clients",
            ))
        }
        Query::Auth(_) | Query::As { .. } => {
            return Err(invalid(
                "access-control reads travel on the Auth service, not as a client operation",
            ))
        }
    })
}

fn conditions_to_wire(conditions: &[Condition]) -> Vec<v1::Condition> {
    conditions
        .iter()
        .map(|Condition::ValueIs { key, expected }| v1::Condition {
            key: key.clone(),
            expected: expected.clone(),
        })
        .collect()
}

fn ops_to_wire(ops: &[BatchOp]) -> Vec<v1::BatchOp> {
    ops.iter()
        .map(|op| v1::BatchOp {
            op: Some(match op {
                BatchOp::Put { key, value } => v1::batch_op::Op::Put(put(key, value)),
                BatchOp::Delete { key } => {
                    v1::batch_op::Op::Delete(v1::DeleteRequest { key: key.clone() })
                }
            }),
        })
        .collect()
}

fn mode_to_wire(mode: LockMode) -> v1::LockMode {
    match mode {
        LockMode::Exclusive => v1::LockMode::Exclusive,
        LockMode::Shared => v1::LockMode::Shared,
    }
}

fn sequencer_to_wire(s: &Sequencer) -> v1::Sequencer {
    v1::Sequencer {
        name: s.name.clone(),
        mode: mode_to_wire(s.mode) as i32,
        token: s.token.0,
        session: s.session.0,
    }
}

/// The operation a typed request asks for, and the RPC whose reply answers
/// it. Refused with [`ReplicaFailure::InvalidArgument`] when a required
/// field is missing or an enum value is unknown.
pub fn request_from_wire(request: Req) -> Result<(Operation, Rpc), ReplicaFailure> {
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
        Req::Put(r) => write(Command::Put {
            key: r.key,
            value: r.value,
        }),
        Req::PutIfAbsent(r) => write(Command::PutIfAbsent {
            key: r.key,
            value: r.value,
        }),
        Req::GetAndPut(r) => write(Command::GetAndPut {
            key: r.key,
            value: r.value,
        }),
        Req::CompareAndPut(r) => write(Command::CompareAndPut {
            key: r.key,
            expected: r.expected,
            value: r.value,
        }),
        Req::Delete(r) => write(Command::Delete { key: r.key }),
        Req::DeleteRange(r) => write(Command::DeleteRange {
            start: r.start,
            end: r.end,
        }),
        Req::Batch(r) => write(Command::Batch {
            conditions: conditions_from_wire(r.conditions),
            ops: ops_from_wire(r.ops)?,
        }),
        Req::NextSequence(r) => write(Command::NextSequence {
            key: r.key,
            step: r.step,
        }),
        // A placeholder secret: the replica draws the real one when it
        // proposes the open (see `LockCommand::OpenSession`).
        Req::OpenSession(r) => write(Command::Lock(LockCommand::OpenSession {
            ttl_ms: r.ttl_ms,
            secret: SessionSecret::default(),
        })),
        Req::KeepAlive(r) => Operation::KeepAlive {
            session: SessionId(r.session),
            secret: secret_from_wire(&r.session_secret)?,
        },
        Req::CloseSession(r) => write(Command::Lock(LockCommand::CloseSession {
            session: SessionId(r.session),
            secret: secret_from_wire(&r.session_secret)?,
        })),
        Req::GetSession(r) => read(
            Query::Lock(LockQuery::Session {
                session: SessionId(r.session),
            }),
            r.stale,
        ),
        Req::Acquire(r) => Operation::Acquire {
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
            }),
            hold: match r.hold_ms {
                0 => DEFAULT_ACQUIRE_HOLD,
                ms => Duration::from_millis(ms),
            },
        },
        Req::Release(r) => write(Command::Lock(LockCommand::Release {
            session: SessionId(r.session),
            secret: secret_from_wire(&r.session_secret)?,
            owner: r.owner,
            request_id: r.request_id,
            name: r.name,
            token: Token(r.token),
        })),
        Req::CancelWait(r) => write(Command::Lock(LockCommand::CancelWait {
            session: SessionId(r.session),
            secret: secret_from_wire(&r.session_secret)?,
            owner: r.owner,
            name: r.name,
            request_id: r.request_id,
        })),
        Req::FencedWrite(r) => write(Command::Lock(LockCommand::Fenced {
            sequencer: required_sequencer(r.sequencer)?,
            secret: secret_from_wire(&r.session_secret)?,
            conditions: conditions_from_wire(r.conditions),
            ops: ops_from_wire(r.ops)?,
        })),
        Req::CheckSequencer(r) => read(
            Query::Lock(LockQuery::CheckSequencer(required_sequencer(r.sequencer)?)),
            r.stale,
        ),
        Req::ListLocks(r) => read(
            Query::Lock(LockQuery::Locks {
                prefix: r.prefix,
                start_after: r.start_after,
                limit: r.limit,
            }),
            r.stale,
        ),
    };
    Ok((op, rpc))
}

fn conditions_from_wire(conditions: Vec<v1::Condition>) -> Vec<Condition> {
    conditions
        .into_iter()
        .map(|c| Condition::ValueIs {
            key: c.key,
            expected: c.expected,
        })
        .collect()
}

fn ops_from_wire(ops: Vec<v1::BatchOp>) -> Result<Vec<BatchOp>, ReplicaFailure> {
    ops.into_iter()
        .enumerate()
        .map(|(i, op)| match op.op {
            Some(v1::batch_op::Op::Put(p)) => Ok(BatchOp::Put {
                key: p.key,
                value: p.value,
            }),
            Some(v1::batch_op::Op::Delete(d)) => Ok(BatchOp::Delete { key: d.key }),
            None => Err(invalid(format!("ops[{i}] has neither `put` nor `delete`"))),
        })
        .collect()
}

fn mode_from_wire(mode: i32, field: &str) -> Result<LockMode, ReplicaFailure> {
    match v1::LockMode::try_from(mode) {
        Ok(v1::LockMode::Exclusive) => Ok(LockMode::Exclusive),
        Ok(v1::LockMode::Shared) => Ok(LockMode::Shared),
        Ok(v1::LockMode::Unspecified) => Err(invalid(format!(
            "`{field}` is required: LOCK_MODE_EXCLUSIVE or LOCK_MODE_SHARED"
        ))),
        Err(_) => Err(invalid(format!(
            "`{field}` is {mode}, not a LockMode: use LOCK_MODE_EXCLUSIVE or LOCK_MODE_SHARED"
        ))),
    }
}

fn sequencer_from_wire(s: v1::Sequencer) -> Result<Sequencer, ReplicaFailure> {
    Ok(Sequencer {
        mode: mode_from_wire(s.mode, "sequencer.mode")?,
        name: s.name,
        token: Token(s.token),
        session: SessionId(s.session),
    })
}

/// A request's `session_secret`: exactly [`SessionSecret::LEN`] bytes.
fn secret_from_wire(bytes: &[u8]) -> Result<SessionSecret, ReplicaFailure> {
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

// ---------------------------------------------------------------------------
// Replies.

/// The typed reply of a call of `rpc` that ended with `result`.
pub fn reply_to_wire(rpc: Rpc, result: Result<CommandResult, ReplicaFailure>) -> Rep {
    match result {
        Ok(Ok(outcome)) => outcome_to_wire(rpc, outcome),
        Ok(Err(e)) => error_reply(rpc, command_error_to_wire(&e)),
        Err(failure) => error_reply(rpc, failure.into()),
    }
}

fn outcome_to_wire(rpc: Rpc, outcome: Outcome) -> Rep {
    use LockOutcome as L;
    match (rpc, outcome) {
        (Rpc::Get, Outcome::Value(value)) => Rep::Get(v1::GetReply { error: None, value }),
        (Rpc::MultiGet, Outcome::Values(values)) => Rep::MultiGet(v1::MultiGetReply {
            error: None,
            values: values
                .into_iter()
                .map(|value| v1::MaybeValue { value })
                .collect(),
        }),
        (Rpc::Scan, Outcome::Entries { entries, more }) => Rep::Scan(v1::ScanReply {
            error: None,
            entries: entries
                .into_iter()
                .map(|(key, value)| v1::Entry { key, value })
                .collect(),
            more,
        }),
        (Rpc::Put, Outcome::Done) => Rep::Put(v1::PutReply { error: None }),
        (Rpc::PutIfAbsent, Outcome::Previous(previous)) => Rep::PutIfAbsent(v1::PreviousReply {
            error: None,
            previous,
        }),
        (Rpc::GetAndPut, Outcome::Previous(previous)) => Rep::GetAndPut(v1::PreviousReply {
            error: None,
            previous,
        }),
        (Rpc::CompareAndPut, Outcome::Swapped { succeeded, current }) => {
            Rep::CompareAndPut(v1::CompareAndPutReply {
                error: None,
                succeeded,
                current,
            })
        }
        (Rpc::Delete, Outcome::Deleted(deleted)) => Rep::Delete(v1::DeletedReply {
            error: None,
            deleted,
        }),
        (Rpc::DeleteRange, Outcome::Deleted(deleted)) => Rep::DeleteRange(v1::DeletedReply {
            error: None,
            deleted,
        }),
        (Rpc::Batch, Outcome::Batch { failed_condition }) => Rep::Batch(v1::BatchReply {
            error: None,
            failed_condition,
        }),
        (Rpc::FencedWrite, Outcome::Batch { failed_condition }) => {
            Rep::FencedWrite(v1::BatchReply {
                error: None,
                failed_condition,
            })
        }
        (Rpc::NextSequence, Outcome::Sequence { start, end }) => {
            Rep::NextSequence(v1::SequenceReply {
                error: None,
                start,
                end,
            })
        }
        (
            Rpc::OpenSession,
            Outcome::Lock(L::SessionOpened {
                session,
                ttl_ms,
                secret,
            }),
        ) => Rep::OpenSession(v1::SessionReply {
            error: None,
            session: session.0,
            ttl_ms,
            live: true,
            secret: secret.0.to_vec(),
        }),
        (Rpc::KeepAlive, Outcome::Lock(L::Session(info))) => Rep::KeepAlive(session_reply(info)),
        (Rpc::GetSession, Outcome::Lock(L::Session(info))) => Rep::GetSession(session_reply(info)),
        (
            Rpc::CloseSession,
            Outcome::Lock(L::SessionEnded {
                session,
                released,
                cancelled,
            }),
        ) => Rep::CloseSession(v1::CloseSessionReply {
            error: None,
            session: session.0,
            released,
            cancelled,
        }),
        (
            Rpc::Acquire,
            Outcome::Lock(L::Granted {
                sequencer,
                hold_count,
            }),
        ) => Rep::Acquire(v1::AcquireReply {
            error: None,
            result: Some(v1::acquire_reply::Result::Granted(v1::Granted {
                sequencer: Some(sequencer_to_wire(&sequencer)),
                hold_count,
            })),
        }),
        (
            Rpc::Acquire,
            Outcome::Lock(L::Queued {
                name,
                request_id,
                position,
            }),
        ) => Rep::Acquire(v1::AcquireReply {
            error: None,
            result: Some(v1::acquire_reply::Result::Queued(v1::Queued {
                name,
                request_id,
                position,
            })),
        }),
        (
            Rpc::Release,
            Outcome::Lock(L::Released {
                name,
                token,
                remaining,
            }),
        ) => Rep::Release(v1::ReleaseReply {
            error: None,
            name,
            token: token.0,
            remaining,
        }),
        (Rpc::CancelWait, Outcome::Lock(L::WaitCancel(w))) => {
            use v1::cancel_wait_reply::Result as R;
            Rep::CancelWait(v1::CancelWaitReply {
                error: None,
                result: Some(match w {
                    WaitCancel::Cancelled => R::Cancelled(true),
                    WaitCancel::AlreadyGranted(s) => R::AlreadyGranted(sequencer_to_wire(&s)),
                    WaitCancel::NotWaiting => R::NotWaiting(true),
                }),
            })
        }
        (Rpc::CheckSequencer, Outcome::Lock(L::SequencerCheck { current })) => {
            Rep::CheckSequencer(v1::CheckSequencerReply {
                error: None,
                current,
            })
        }
        (Rpc::ListLocks, Outcome::Lock(L::Locks { locks, more })) => {
            Rep::ListLocks(v1::ListLocksReply {
                error: None,
                locks: locks.into_iter().map(lock_info_to_wire).collect(),
                more,
            })
        }
        (rpc, other) => {
            // The replica's own mistake, never the client's: report it as
            // a write of unknown outcome (it may have been applied).
            tracing::error!(?rpc, outcome = ?other, "an outcome that does not answer its call");
            let failure = if rpc.is_write() {
                ReplicaFailure::UnknownOutcome(format!(
                    "the replica produced an outcome that does not answer a {rpc:?} call"
                ))
            } else {
                ReplicaFailure::Unavailable(format!(
                    "the replica produced an outcome that does not answer a {rpc:?} call"
                ))
            };
            error_reply(rpc, failure.into())
        }
    }
}

fn session_reply(info: Option<SessionInfo>) -> v1::SessionReply {
    match info {
        Some(info) => v1::SessionReply {
            error: None,
            session: info.session.0,
            ttl_ms: info.ttl_ms,
            live: true,
            secret: Vec::new(),
        },
        None => v1::SessionReply::default(),
    }
}

fn holder_to_wire(h: HolderInfo) -> v1::Holder {
    v1::Holder {
        session: h.session.0,
        owner: h.owner,
        mode: mode_to_wire(h.mode) as i32,
        token: h.token.0,
        hold_count: h.hold_count,
        lease_ms: h.lease_ms,
    }
}

fn lock_info_to_wire(l: LockInfo) -> v1::LockInfo {
    v1::LockInfo {
        name: l.name,
        mode: l
            .mode
            .map_or(v1::LockMode::Unspecified, mode_to_wire)
            .into(),
        holders: l.holders.into_iter().map(holder_to_wire).collect(),
        waiters: l.waiters,
        lock_delay: l.lock_delay.map(|d| v1::LockDelay {
            token: d.token.0,
            delay_ms: d.delay_ms,
        }),
    }
}

/// The reply of a call of `rpc` that ended with `error` and nothing else.
pub fn error_reply(rpc: Rpc, error: v1::Error) -> Rep {
    let error = Some(error);
    match rpc {
        Rpc::Get => Rep::Get(v1::GetReply {
            error,
            ..Default::default()
        }),
        Rpc::MultiGet => Rep::MultiGet(v1::MultiGetReply {
            error,
            ..Default::default()
        }),
        Rpc::Scan => Rep::Scan(v1::ScanReply {
            error,
            ..Default::default()
        }),
        Rpc::Put => Rep::Put(v1::PutReply { error }),
        Rpc::PutIfAbsent => Rep::PutIfAbsent(v1::PreviousReply {
            error,
            ..Default::default()
        }),
        Rpc::GetAndPut => Rep::GetAndPut(v1::PreviousReply {
            error,
            ..Default::default()
        }),
        Rpc::CompareAndPut => Rep::CompareAndPut(v1::CompareAndPutReply {
            error,
            ..Default::default()
        }),
        Rpc::Delete => Rep::Delete(v1::DeletedReply {
            error,
            ..Default::default()
        }),
        Rpc::DeleteRange => Rep::DeleteRange(v1::DeletedReply {
            error,
            ..Default::default()
        }),
        Rpc::Batch => Rep::Batch(v1::BatchReply {
            error,
            ..Default::default()
        }),
        Rpc::FencedWrite => Rep::FencedWrite(v1::BatchReply {
            error,
            ..Default::default()
        }),
        Rpc::NextSequence => Rep::NextSequence(v1::SequenceReply {
            error,
            ..Default::default()
        }),
        Rpc::OpenSession => Rep::OpenSession(v1::SessionReply {
            error,
            ..Default::default()
        }),
        Rpc::KeepAlive => Rep::KeepAlive(v1::SessionReply {
            error,
            ..Default::default()
        }),
        Rpc::GetSession => Rep::GetSession(v1::SessionReply {
            error,
            ..Default::default()
        }),
        Rpc::CloseSession => Rep::CloseSession(v1::CloseSessionReply {
            error,
            ..Default::default()
        }),
        Rpc::Acquire => Rep::Acquire(v1::AcquireReply {
            error,
            ..Default::default()
        }),
        Rpc::Release => Rep::Release(v1::ReleaseReply {
            error,
            ..Default::default()
        }),
        Rpc::CancelWait => Rep::CancelWait(v1::CancelWaitReply {
            error,
            ..Default::default()
        }),
        Rpc::CheckSequencer => Rep::CheckSequencer(v1::CheckSequencerReply {
            error,
            ..Default::default()
        }),
        Rpc::ListLocks => Rep::ListLocks(v1::ListLocksReply {
            error,
            ..Default::default()
        }),
    }
}

/// What a typed reply says: the result, or the replica's refusal. A reply
/// that breaks the schema (a required part missing) is a
/// [`ReplicaFailure::UnknownOutcome`]: the call may have been executed.
pub fn reply_from_wire(reply: Rep) -> Result<CommandResult, ReplicaFailure> {
    use LockOutcome as L;
    macro_rules! checked {
        ($r:expr) => {
            if let Some(e) = $r.error {
                return error_from_wire(e).map(Err);
            }
        };
    }
    let outcome = match reply {
        Rep::Error(e) => return error_from_wire(e).map(Err),
        Rep::Get(r) => {
            checked!(r);
            Outcome::Value(r.value)
        }
        Rep::MultiGet(r) => {
            checked!(r);
            Outcome::Values(r.values.into_iter().map(|v| v.value).collect())
        }
        Rep::Scan(r) => {
            checked!(r);
            Outcome::Entries {
                entries: r.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                more: r.more,
            }
        }
        Rep::Put(r) => {
            checked!(r);
            Outcome::Done
        }
        Rep::PutIfAbsent(r) | Rep::GetAndPut(r) => {
            checked!(r);
            Outcome::Previous(r.previous)
        }
        Rep::CompareAndPut(r) => {
            checked!(r);
            Outcome::Swapped {
                succeeded: r.succeeded,
                current: r.current,
            }
        }
        Rep::Delete(r) | Rep::DeleteRange(r) => {
            checked!(r);
            Outcome::Deleted(r.deleted)
        }
        Rep::Batch(r) | Rep::FencedWrite(r) => {
            checked!(r);
            Outcome::Batch {
                failed_condition: r.failed_condition,
            }
        }
        Rep::NextSequence(r) => {
            checked!(r);
            Outcome::Sequence {
                start: r.start,
                end: r.end,
            }
        }
        Rep::OpenSession(r) => {
            checked!(r);
            Outcome::Lock(L::SessionOpened {
                session: SessionId(r.session),
                ttl_ms: r.ttl_ms,
                secret: SessionSecret::from_slice(&r.secret)
                    .ok_or_else(|| malformed("a session without a 16-byte secret"))?,
            })
        }
        Rep::KeepAlive(r) | Rep::GetSession(r) => {
            checked!(r);
            Outcome::Lock(L::Session(r.live.then_some(SessionInfo {
                session: SessionId(r.session),
                ttl_ms: r.ttl_ms,
            })))
        }
        Rep::CloseSession(r) => {
            checked!(r);
            Outcome::Lock(L::SessionEnded {
                session: SessionId(r.session),
                released: r.released,
                cancelled: r.cancelled,
            })
        }
        Rep::Acquire(r) => {
            checked!(r);
            match r.result {
                Some(v1::acquire_reply::Result::Granted(g)) => Outcome::Lock(L::Granted {
                    sequencer: reply_sequencer(g.sequencer)?,
                    hold_count: g.hold_count,
                }),
                Some(v1::acquire_reply::Result::Queued(q)) => Outcome::Lock(L::Queued {
                    name: q.name,
                    request_id: q.request_id,
                    position: q.position,
                }),
                None => return Err(malformed("an acquire reply with no result")),
            }
        }
        Rep::Release(r) => {
            checked!(r);
            Outcome::Lock(L::Released {
                name: r.name,
                token: Token(r.token),
                remaining: r.remaining,
            })
        }
        Rep::CancelWait(r) => {
            checked!(r);
            use v1::cancel_wait_reply::Result as R;
            Outcome::Lock(L::WaitCancel(match r.result {
                Some(R::Cancelled(_)) => WaitCancel::Cancelled,
                Some(R::AlreadyGranted(s)) => WaitCancel::AlreadyGranted(reply_sequencer(Some(s))?),
                Some(R::NotWaiting(_)) => WaitCancel::NotWaiting,
                None => return Err(malformed("a cancel-wait reply with no result")),
            }))
        }
        Rep::CheckSequencer(r) => {
            checked!(r);
            Outcome::Lock(L::SequencerCheck { current: r.current })
        }
        Rep::ListLocks(r) => {
            checked!(r);
            let locks = r
                .locks
                .into_iter()
                .map(lock_info_from_wire)
                .collect::<Result<_, _>>()?;
            Outcome::Lock(L::Locks {
                locks,
                more: r.more,
            })
        }
    };
    Ok(Ok(outcome))
}

fn malformed(what: &str) -> ReplicaFailure {
    ReplicaFailure::UnknownOutcome(format!("the replica answered {what}"))
}

fn reply_sequencer(s: Option<v1::Sequencer>) -> Result<Sequencer, ReplicaFailure> {
    let s = s.ok_or_else(|| malformed("a grant without a sequencer"))?;
    sequencer_from_wire(s).map_err(|e| malformed(&format!("a malformed sequencer ({e})")))
}

fn reply_mode(mode: i32) -> Result<LockMode, ReplicaFailure> {
    mode_from_wire(mode, "mode").map_err(|e| malformed(&format!("a malformed lock mode ({e})")))
}

fn holder_from_wire(h: v1::Holder) -> Result<HolderInfo, ReplicaFailure> {
    Ok(HolderInfo {
        session: SessionId(h.session),
        owner: h.owner,
        mode: reply_mode(h.mode)?,
        token: Token(h.token),
        hold_count: h.hold_count,
        lease_ms: h.lease_ms,
    })
}

fn lock_info_from_wire(l: v1::LockInfo) -> Result<LockInfo, ReplicaFailure> {
    let mode = match v1::LockMode::try_from(l.mode) {
        Ok(v1::LockMode::Unspecified) => None,
        _ => Some(reply_mode(l.mode)?),
    };
    Ok(LockInfo {
        mode,
        holders: l
            .holders
            .into_iter()
            .map(holder_from_wire)
            .collect::<Result<_, _>>()?,
        waiters: l.waiters,
        lock_delay: l.lock_delay.map(|d| LockDelayTimer {
            name: l.name.clone(),
            token: Token(d.token),
            delay_ms: d.delay_ms,
        }),
        name: l.name,
    })
}

// ---------------------------------------------------------------------------
// Errors.

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
        ErrorKind::SequenceExhausted => E::SequenceExhausted {
            key: name,
            step: e.value,
        },
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

/// An access-control grant in its typed form.
pub fn grant_to_wire(grant: latchkey_core::auth::Grant) -> v1::Grant {
    use latchkey_core::auth::Permission as P;
    v1::Grant {
        permission: match grant.permission {
            P::Read => v1::Permission::Read,
            P::Write => v1::Permission::Write,
            P::Lock => v1::Permission::Lock,
            P::Admin => v1::Permission::Admin,
        } as i32,
        prefix: grant.prefix,
    }
}

/// A typed grant; an unknown or missing permission is an invalid argument.
pub fn grant_from_wire(grant: v1::Grant) -> Result<latchkey_core::auth::Grant, ReplicaFailure> {
    use latchkey_core::auth::Permission as P;
    let permission = match v1::Permission::try_from(grant.permission) {
        Ok(v1::Permission::Read) => P::Read,
        Ok(v1::Permission::Write) => P::Write,
        Ok(v1::Permission::Lock) => P::Lock,
        Ok(v1::Permission::Admin) => P::Admin,
        Ok(v1::Permission::Unspecified) | Err(_) => {
            return Err(ReplicaFailure::InvalidArgument(
                "a grant's permission must be READ, WRITE, LOCK or ADMIN".into(),
            ))
        }
    };
    Ok(latchkey_core::auth::Grant {
        permission,
        prefix: grant.prefix,
    })
}

/// `message` without the prefix its error type adds again when printed.
fn strip(message: String, prefix: &str) -> String {
    match message.strip_prefix(prefix) {
        Some(rest) => rest.to_string(),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(name: &str, token: u64) -> Sequencer {
        Sequencer {
            name: name.into(),
            mode: LockMode::Exclusive,
            token: Token(token),
            session: SessionId(7),
        }
    }

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
        })
    }

    /// Every operation a client can send, each variant at least once.
    fn operations() -> Vec<Operation> {
        let k = || b"k".to_vec();
        let conditions = vec![
            Condition::ValueIs {
                key: k(),
                expected: None,
            },
            Condition::ValueIs {
                key: b"c".to_vec(),
                expected: Some(Vec::new()),
            },
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
                expected: Some(b"old".to_vec()),
                value: b"new".to_vec(),
            },
            Command::CompareAndPut {
                key: k(),
                expected: None,
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
            }),
            Command::Lock(LockCommand::CloseSession {
                session: SessionId(4),
                secret: SessionSecret([3; 16]),
            }),
            Command::Lock(LockCommand::Release {
                session: SessionId(3),
                secret: SessionSecret([3; 16]),
                owner: 1,
                request_id: 12,
                name: "jobs/a".into(),
                token: Token(40),
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
        let mut all: Vec<Operation> = writes.into_iter().map(Operation::Write).collect();
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

    #[test]
    fn leader_only_commands_have_no_wire_form() {
        let internal = [
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
        ];
        for op in internal {
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
            }),
            Req::FencedWrite(v1::FencedWriteRequest {
                sequencer: Some(v1::Sequencer {
                    mode: -1,
                    ..Default::default()
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

    fn holder() -> HolderInfo {
        HolderInfo {
            session: SessionId(3),
            owner: 1,
            mode: LockMode::Exclusive,
            token: Token(40),
            hold_count: 2,
            lease_ms: Some(9_000),
        }
    }

    /// Every result of every RPC, each outcome variant at least once.
    fn results() -> Vec<(Rpc, CommandResult)> {
        use LockOutcome as L;
        let some = |v: &[u8]| Some(v.to_vec());
        vec![
            (Rpc::Get, Ok(Outcome::Value(None))),
            (Rpc::Get, Ok(Outcome::Value(some(b"")))),
            (Rpc::MultiGet, Ok(Outcome::Values(vec![None, some(b"v")]))),
            (
                Rpc::Scan,
                Ok(Outcome::Entries {
                    entries: vec![(b"a".to_vec(), b"1".to_vec())],
                    more: true,
                }),
            ),
            (Rpc::Put, Ok(Outcome::Done)),
            (Rpc::PutIfAbsent, Ok(Outcome::Previous(None))),
            (Rpc::GetAndPut, Ok(Outcome::Previous(some(b"old")))),
            (
                Rpc::CompareAndPut,
                Ok(Outcome::Swapped {
                    succeeded: false,
                    current: some(b"x"),
                }),
            ),
            (Rpc::Delete, Ok(Outcome::Deleted(1))),
            (Rpc::DeleteRange, Ok(Outcome::Deleted(17))),
            (
                Rpc::Batch,
                Ok(Outcome::Batch {
                    failed_condition: Some(1),
                }),
            ),
            (
                Rpc::FencedWrite,
                Ok(Outcome::Batch {
                    failed_condition: None,
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
                })))),
            ),
            (Rpc::GetSession, Ok(Outcome::Lock(L::Session(None)))),
            (
                Rpc::CloseSession,
                Ok(Outcome::Lock(L::SessionEnded {
                    session: SessionId(3),
                    released: 2,
                    cancelled: 1,
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
        let reply = reply_to_wire(Rpc::Put, Ok(Ok(Outcome::Value(None))));
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
}
