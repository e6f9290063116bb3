//! [`Rpc`]: which RPC a call travels as, its name, and whether it may
//! write.

use latchkey_core::lock::{LockCommand, LockQuery};
use latchkey_core::{Command, Query};

use super::operation::Operation;
use crate::v1::call::Request as Req;

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
    EndSession,
    Proclaim,
    AcquireAll,
    ReleaseAll,
    ForceRelease,
    ListSessions,
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
            Rpc::EndSession => "end_session",
            Rpc::Proclaim => "proclaim",
            Rpc::AcquireAll => "acquire_all",
            Rpc::ReleaseAll => "release_all",
            Rpc::ForceRelease => "force_release",
            Rpc::ListSessions => "list_sessions",
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
                | Rpc::ListSessions
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
            Req::EndSession(_) => Rpc::EndSession,
            Req::Proclaim(_) => Rpc::Proclaim,
            Req::AcquireAll(_) => Rpc::AcquireAll,
            Req::ReleaseAll(_) => Rpc::ReleaseAll,
            Req::ForceRelease(_) => Rpc::ForceRelease,
            Req::ListSessions(_) => Rpc::ListSessions,
        }
    }

    /// The RPC an in-process operation would travel as over gRPC, without
    /// encoding it; `None` for what no client can send (a leader's own
    /// expiries, access-control changes, the replica's own reads). The
    /// in-process path labels its request metrics with it, like the gRPC
    /// path does with [`Rpc::of`].
    pub fn of_operation(op: &Operation) -> Option<Rpc> {
        match op {
            Operation::Write(command) | Operation::Acquire { command, .. } => {
                Self::of_command(command)
            }
            Operation::Read { query, .. } => Self::of_query(query),
            Operation::KeepAlive { .. } => Some(Rpc::KeepAlive),
        }
    }

    fn of_command(command: &Command) -> Option<Rpc> {
        Some(match command {
            Command::Put { .. } | Command::PutBound { .. } => Rpc::Put,
            Command::PutIfAbsent { .. } => Rpc::PutIfAbsent,
            Command::GetAndPut { .. } => Rpc::GetAndPut,
            Command::CompareAndPut { .. } => Rpc::CompareAndPut,
            Command::Delete { .. } => Rpc::Delete,
            Command::DeleteRange { .. } => Rpc::DeleteRange,
            Command::Batch { .. } => Rpc::Batch,
            Command::NextSequence { .. } => Rpc::NextSequence,
            Command::Lock(lock) => match lock {
                LockCommand::OpenSession { .. } => Rpc::OpenSession,
                LockCommand::CloseSession { .. } => Rpc::CloseSession,
                LockCommand::Acquire { .. } => Rpc::Acquire,
                LockCommand::Release { .. } => Rpc::Release,
                LockCommand::CancelWait { .. } => Rpc::CancelWait,
                LockCommand::Fenced { .. } => Rpc::FencedWrite,
                LockCommand::EndSession { .. } => Rpc::EndSession,
                LockCommand::Proclaim { .. } => Rpc::Proclaim,
                LockCommand::AcquireAll { .. } => Rpc::AcquireAll,
                LockCommand::ReleaseAll { .. } => Rpc::ReleaseAll,
                LockCommand::ForceRelease { .. } => Rpc::ForceRelease,
                LockCommand::ExpireSession { .. }
                | LockCommand::ExpireWait { .. }
                | LockCommand::ExpireLockLease { .. }
                | LockCommand::EndLockDelay { .. }
                | LockCommand::Checkpoint { .. } => return None,
            },
            Command::Once { command, .. } => return Self::of_command(command),
            Command::Group { .. } | Command::Auth(_) | Command::As { .. } => return None,
        })
    }

    fn of_query(query: &Query) -> Option<Rpc> {
        Some(match query {
            Query::Get { .. } => Rpc::Get,
            Query::MultiGet { .. } => Rpc::MultiGet,
            Query::Scan(_) => Rpc::Scan,
            Query::Lock(lock) => match lock {
                LockQuery::CheckSequencer(_) => Rpc::CheckSequencer,
                LockQuery::Locks { .. } => Rpc::ListLocks,
                LockQuery::Session { .. } => Rpc::GetSession,
                LockQuery::Sessions { .. } => Rpc::ListSessions,
                LockQuery::TimerState | LockQuery::SessionTimer { .. } | LockQuery::Census => {
                    return None
                }
            },
            Query::Auth(_) | Query::As { .. } => return None,
        })
    }
}
