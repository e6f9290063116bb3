//! Command results to typed replies and back: [`reply_to_wire`], shaped by
//! the [`Rpc`] that was called, [`reply_from_wire`], and [`error_reply`]
//! for a call that ended with an error alone. The key-value replies are
//! converted here; the lock service's are in `lock_reply.rs`.

use latchkey_core::{CommandResult, Outcome};

use super::batch::{key_value_from_wire, key_value_to_wire};
use super::error::{command_error_to_wire, error_from_wire};
use super::lock_reply;
use super::rpc::Rpc;
use crate::v1::{self, call_reply::Reply as Rep};
use crate::ReplicaFailure;

/// The typed reply of a call of `rpc` that ended with `result`.
pub fn reply_to_wire(rpc: Rpc, result: Result<CommandResult, ReplicaFailure>) -> Rep {
    match result {
        Ok(Ok(outcome)) => outcome_to_wire(rpc, outcome),
        Ok(Err(e)) => error_reply(rpc, command_error_to_wire(&e)),
        Err(failure) => error_reply(rpc, failure.into()),
    }
}

/// What a typed reply says: the result, or the replica's refusal. A reply
/// that breaks the schema (a required part missing) is a
/// [`ReplicaFailure::UnknownOutcome`]: the call may have been executed.
pub fn reply_from_wire(reply: Rep) -> Result<CommandResult, ReplicaFailure> {
    use lock_reply as lock;
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
            Outcome::Value {
                value: r.kv.map(|kv| key_value_from_wire(kv).1),
                revision: r.revision,
            }
        }
        Rep::MultiGet(r) => {
            checked!(r);
            Outcome::Values {
                values: r
                    .values
                    .into_iter()
                    .map(|v| v.kv.map(|kv| key_value_from_wire(kv).1))
                    .collect(),
                revision: r.revision,
            }
        }
        Rep::Scan(r) => {
            checked!(r);
            Outcome::Entries {
                entries: r.entries.into_iter().map(key_value_from_wire).collect(),
                more: r.more,
                revision: r.revision,
            }
        }
        Rep::Put(r) => {
            checked!(r);
            Outcome::Written {
                revision: r.revision,
            }
        }
        Rep::PutIfAbsent(r) | Rep::GetAndPut(r) => {
            checked!(r);
            Outcome::Previous {
                previous: r.previous,
                revision: r.revision,
            }
        }
        Rep::CompareAndPut(r) => {
            checked!(r);
            Outcome::Swapped {
                succeeded: r.succeeded,
                current: r.current.map(|kv| key_value_from_wire(kv).1),
                revision: r.revision,
            }
        }
        Rep::Delete(r) | Rep::DeleteRange(r) => {
            checked!(r);
            Outcome::Deleted {
                count: r.deleted,
                revision: r.revision,
            }
        }
        Rep::Batch(r) | Rep::FencedWrite(r) => {
            checked!(r);
            Outcome::Batch {
                failed_condition: r.failed_condition,
                revision: r.revision,
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
            Outcome::Lock(lock::session_opened_from_wire(r)?)
        }
        Rep::KeepAlive(r) | Rep::GetSession(r) => {
            checked!(r);
            Outcome::Lock(lock::session_from_wire(r))
        }
        Rep::CloseSession(r) | Rep::EndSession(r) => {
            checked!(r);
            Outcome::Lock(lock::session_ended_from_wire(r))
        }
        Rep::Proclaim(r) => {
            checked!(r);
            Outcome::Lock(latchkey_core::lock::LockOutcome::Proclaimed {
                term: latchkey_core::lock::Token(r.term),
            })
        }
        Rep::Acquire(r) => {
            checked!(r);
            Outcome::Lock(lock::acquire_from_wire(r)?)
        }
        Rep::Release(r) => {
            checked!(r);
            Outcome::Lock(lock::released_from_wire(r))
        }
        Rep::AcquireAll(r) => {
            checked!(r);
            Outcome::Lock(lock::acquire_all_from_wire(r)?)
        }
        Rep::ReleaseAll(r) => {
            checked!(r);
            Outcome::Lock(lock::released_all_from_wire(r))
        }
        Rep::CancelWait(r) => {
            checked!(r);
            Outcome::Lock(lock::wait_cancel_from_wire(r)?)
        }
        Rep::CheckSequencer(r) => {
            checked!(r);
            Outcome::Lock(lock::sequencer_check_from_wire(r))
        }
        Rep::ListLocks(r) => {
            checked!(r);
            Outcome::Lock(lock::locks_from_wire(r)?)
        }
        Rep::ForceRelease(r) => {
            checked!(r);
            Outcome::Lock(lock::force_released_from_wire(r)?)
        }
        Rep::ListSessions(r) => {
            checked!(r);
            Outcome::Lock(lock::sessions_from_wire(r)?)
        }
    };
    Ok(Ok(outcome))
}

/// The reply of a call of `rpc` that produced `outcome`: key-value
/// outcomes here, lock outcomes in `lock_reply.rs`.
fn outcome_to_wire(rpc: Rpc, outcome: Outcome) -> Rep {
    match (rpc, outcome) {
        (Rpc::Get, Outcome::Value { value, revision }) => Rep::Get(v1::GetReply {
            error: None,
            kv: value.map(|v| key_value_to_wire(Vec::new(), v)),
            revision,
        }),
        (Rpc::MultiGet, Outcome::Values { values, revision }) => Rep::MultiGet(v1::MultiGetReply {
            error: None,
            values: values
                .into_iter()
                .map(|value| v1::MaybeKeyValue {
                    kv: value.map(|v| key_value_to_wire(Vec::new(), v)),
                })
                .collect(),
            revision,
        }),
        (
            Rpc::Scan,
            Outcome::Entries {
                entries,
                more,
                revision,
            },
        ) => Rep::Scan(v1::ScanReply {
            error: None,
            entries: entries
                .into_iter()
                .map(|(key, value)| key_value_to_wire(key, value))
                .collect(),
            more,
            revision,
        }),
        (Rpc::Put, Outcome::Written { revision }) => Rep::Put(v1::PutReply {
            error: None,
            revision,
        }),
        (Rpc::PutIfAbsent, Outcome::Previous { previous, revision }) => {
            Rep::PutIfAbsent(v1::PreviousReply {
                error: None,
                previous,
                revision,
            })
        }
        (Rpc::GetAndPut, Outcome::Previous { previous, revision }) => {
            Rep::GetAndPut(v1::PreviousReply {
                error: None,
                previous,
                revision,
            })
        }
        (
            Rpc::CompareAndPut,
            Outcome::Swapped {
                succeeded,
                current,
                revision,
            },
        ) => Rep::CompareAndPut(v1::CompareAndPutReply {
            error: None,
            succeeded,
            current: current.map(|v| key_value_to_wire(Vec::new(), v)),
            revision,
        }),
        (Rpc::Delete, Outcome::Deleted { count, revision }) => Rep::Delete(v1::DeletedReply {
            error: None,
            deleted: count,
            revision,
        }),
        (Rpc::DeleteRange, Outcome::Deleted { count, revision }) => {
            Rep::DeleteRange(v1::DeletedReply {
                error: None,
                deleted: count,
                revision,
            })
        }
        (
            Rpc::Batch,
            Outcome::Batch {
                failed_condition,
                revision,
            },
        ) => Rep::Batch(v1::BatchReply {
            error: None,
            failed_condition,
            revision,
        }),
        (
            Rpc::FencedWrite,
            Outcome::Batch {
                failed_condition,
                revision,
            },
        ) => Rep::FencedWrite(v1::BatchReply {
            error: None,
            failed_condition,
            revision,
        }),
        (Rpc::NextSequence, Outcome::Sequence { start, end }) => {
            Rep::NextSequence(v1::SequenceReply {
                error: None,
                start,
                end,
            })
        }
        (rpc, Outcome::Lock(outcome)) => lock_reply::outcome_to_wire(rpc, outcome)
            .unwrap_or_else(|other| mismatch(rpc, Outcome::Lock(other))),
        (rpc, other) => mismatch(rpc, other),
    }
}

/// The reply to a call whose outcome does not answer it.
fn mismatch(rpc: Rpc, other: Outcome) -> Rep {
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
        Rpc::Put => Rep::Put(v1::PutReply {
            error,
            ..Default::default()
        }),
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
        Rpc::EndSession => Rep::EndSession(v1::CloseSessionReply {
            error,
            ..Default::default()
        }),
        Rpc::Proclaim => Rep::Proclaim(v1::ProclaimReply {
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
        Rpc::AcquireAll => Rep::AcquireAll(v1::AcquireAllReply {
            error,
            ..Default::default()
        }),
        Rpc::ReleaseAll => Rep::ReleaseAll(v1::ReleaseAllReply {
            error,
            ..Default::default()
        }),
        Rpc::ForceRelease => Rep::ForceRelease(v1::ForceReleaseReply {
            error,
            ..Default::default()
        }),
        Rpc::ListSessions => Rep::ListSessions(v1::ListSessionsReply {
            error,
            ..Default::default()
        }),
    }
}
