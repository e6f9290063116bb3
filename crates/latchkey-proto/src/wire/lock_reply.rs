//! Lock-service outcomes (sessions, grants, queued waits, releases, lock
//! reads) to their typed reply messages and back.

use latchkey_core::lock::{
    ForcedReleases, HeldLock, LockDelayTimer, LockInfo, LockOutcome, Sequencer, SessionId,
    SessionInfo, SessionListing, SessionSecret, Token, WaitCancel,
};

use super::fault::malformed;
use super::lock_parts::{
    holder_from_wire, holder_to_wire, mode_to_wire, reply_mode, sequencer_from_wire,
    sequencer_to_wire,
};
use super::rpc::Rpc;
use crate::v1::{self, call_reply::Reply as Rep};
use crate::ReplicaFailure;

/// The reply of a call of `rpc` that produced a lock-service `outcome`, or
/// the outcome back when it does not answer such a call.
pub(super) fn outcome_to_wire(rpc: Rpc, outcome: LockOutcome) -> Result<Rep, LockOutcome> {
    use LockOutcome as L;
    Ok(match (rpc, outcome) {
        (
            Rpc::OpenSession,
            L::SessionOpened {
                session,
                ttl_ms,
                secret,
            },
        ) => Rep::OpenSession(v1::SessionReply {
            error: None,
            session: session.0,
            ttl_ms,
            live: true,
            secret: secret.0.to_vec(),
            forced_total: 0,
            forced: Vec::new(),
        }),
        (Rpc::KeepAlive, L::Session(info)) => Rep::KeepAlive(session_reply(info)),
        (Rpc::GetSession, L::Session(info)) => Rep::GetSession(session_reply(info)),
        (
            rpc @ (Rpc::CloseSession | Rpc::EndSession),
            L::SessionEnded {
                session,
                released,
                cancelled,
            },
        ) => {
            let reply = v1::CloseSessionReply {
                error: None,
                session: session.0,
                released,
                cancelled,
            };
            if rpc == Rpc::CloseSession {
                Rep::CloseSession(reply)
            } else {
                Rep::EndSession(reply)
            }
        }
        (
            Rpc::Acquire,
            L::Granted {
                sequencer,
                hold_count,
            },
        ) => Rep::Acquire(v1::AcquireReply {
            error: None,
            result: Some(v1::acquire_reply::Result::Granted(v1::Granted {
                sequencer: Some(sequencer_to_wire(&sequencer)),
                hold_count,
            })),
        }),
        (
            Rpc::Acquire,
            L::Queued {
                name,
                request_id,
                position,
            },
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
            L::Released {
                name,
                token,
                remaining,
            },
        ) => Rep::Release(v1::ReleaseReply {
            error: None,
            name,
            token: token.0,
            remaining,
        }),
        (Rpc::Proclaim, L::Proclaimed { term }) => Rep::Proclaim(v1::ProclaimReply {
            error: None,
            term: term.0,
        }),
        (Rpc::AcquireAll, L::GrantedAll { sequencers }) => Rep::AcquireAll(v1::AcquireAllReply {
            error: None,
            result: Some(v1::acquire_all_reply::Result::Granted(sequencers_to_wire(
                &sequencers,
            ))),
        }),
        (
            Rpc::AcquireAll,
            L::Queued {
                name,
                request_id,
                position,
            },
        ) => Rep::AcquireAll(v1::AcquireAllReply {
            error: None,
            result: Some(v1::acquire_all_reply::Result::Queued(v1::Queued {
                name,
                request_id,
                position,
            })),
        }),
        (Rpc::ReleaseAll, L::ReleasedAll { released, gone }) => {
            Rep::ReleaseAll(v1::ReleaseAllReply {
                error: None,
                released,
                gone,
            })
        }
        (Rpc::CancelWait, L::WaitCancel(w)) => {
            use v1::cancel_wait_reply::Result as R;
            Rep::CancelWait(v1::CancelWaitReply {
                error: None,
                result: Some(match w {
                    WaitCancel::Cancelled => R::Cancelled(true),
                    WaitCancel::AlreadyGranted(s) => R::AlreadyGranted(sequencer_to_wire(&s)),
                    WaitCancel::NotWaiting => R::NotWaiting(true),
                    WaitCancel::AlreadyGrantedAll(all) => {
                        R::AlreadyGrantedAll(sequencers_to_wire(&all))
                    }
                }),
            })
        }
        (Rpc::CheckSequencer, L::SequencerCheck { current }) => {
            Rep::CheckSequencer(v1::CheckSequencerReply {
                error: None,
                current,
            })
        }
        (Rpc::ListLocks, L::Locks { locks, more }) => Rep::ListLocks(v1::ListLocksReply {
            error: None,
            locks: locks.into_iter().map(lock_info_to_wire).collect(),
            more,
        }),
        (Rpc::ForceRelease, L::ForceReleased { released }) => {
            Rep::ForceRelease(v1::ForceReleaseReply {
                error: None,
                released: released.into_iter().map(holder_to_wire).collect(),
            })
        }
        (Rpc::ListSessions, L::Sessions { sessions, more }) => {
            Rep::ListSessions(v1::ListSessionsReply {
                error: None,
                sessions: sessions.into_iter().map(listing_to_wire).collect(),
                more,
            })
        }
        (_, other) => return Err(other),
    })
}

/// A typed session open's outcome; a secret of the wrong length is a
/// malformed reply.
pub(super) fn session_opened_from_wire(r: v1::SessionReply) -> Result<LockOutcome, ReplicaFailure> {
    Ok(LockOutcome::SessionOpened {
        session: SessionId(r.session),
        ttl_ms: r.ttl_ms,
        secret: SessionSecret::from_slice(&r.secret)
            .ok_or_else(|| malformed("a session without a 16-byte secret"))?,
    })
}

fn session_reply(info: Option<SessionInfo>) -> v1::SessionReply {
    match info {
        Some(info) => v1::SessionReply {
            error: None,
            session: info.session.0,
            ttl_ms: info.ttl_ms,
            live: true,
            secret: Vec::new(),
            forced_total: info.forced.total,
            forced: info.forced.recent.iter().map(|t| t.0).collect(),
        },
        None => v1::SessionReply::default(),
    }
}

/// A typed keep-alive's or session read's outcome: the session, if live.
pub(super) fn session_from_wire(r: v1::SessionReply) -> LockOutcome {
    LockOutcome::Session(r.live.then_some(SessionInfo {
        session: SessionId(r.session),
        ttl_ms: r.ttl_ms,
        forced: ForcedReleases {
            total: r.forced_total,
            recent: r.forced.into_iter().map(Token).collect(),
        },
    }))
}

/// A typed forced release's outcome.
pub(super) fn force_released_from_wire(
    r: v1::ForceReleaseReply,
) -> Result<LockOutcome, ReplicaFailure> {
    Ok(LockOutcome::ForceReleased {
        released: r
            .released
            .into_iter()
            .map(holder_from_wire)
            .collect::<Result<_, _>>()?,
    })
}

/// A typed session listing's outcome.
pub(super) fn sessions_from_wire(r: v1::ListSessionsReply) -> Result<LockOutcome, ReplicaFailure> {
    Ok(LockOutcome::Sessions {
        sessions: r
            .sessions
            .into_iter()
            .map(listing_from_wire)
            .collect::<Result<_, _>>()?,
        more: r.more,
    })
}

fn listing_to_wire(l: SessionListing) -> v1::SessionListing {
    v1::SessionListing {
        session: l.session.0,
        name: l.name,
        ttl_ms: l.ttl_ms,
        held: l
            .held
            .into_iter()
            .map(|h| v1::HeldLock {
                name: h.name,
                owner: h.owner,
                mode: mode_to_wire(h.mode).into(),
                token: h.token.0,
                permits: h.permits,
            })
            .collect(),
        holds: l.holds,
        waiting: l.waiting,
        waits: l.waits,
        keys: l.keys,
        forced: l.forced,
        left_ms: l.left_ms,
    }
}

fn listing_from_wire(l: v1::SessionListing) -> Result<SessionListing, ReplicaFailure> {
    Ok(SessionListing {
        session: SessionId(l.session),
        name: l.name,
        ttl_ms: l.ttl_ms,
        held: l
            .held
            .into_iter()
            .map(|h| {
                Ok(HeldLock {
                    mode: reply_mode(h.mode)?,
                    name: h.name,
                    owner: h.owner,
                    token: Token(h.token),
                    permits: h.permits,
                })
            })
            .collect::<Result<_, ReplicaFailure>>()?,
        holds: l.holds,
        waiting: l.waiting,
        waits: l.waits,
        keys: l.keys,
        forced: l.forced,
        left_ms: l.left_ms,
    })
}

/// A typed session close's outcome.
pub(super) fn session_ended_from_wire(r: v1::CloseSessionReply) -> LockOutcome {
    LockOutcome::SessionEnded {
        session: SessionId(r.session),
        released: r.released,
        cancelled: r.cancelled,
    }
}

/// A typed acquire's outcome: granted or queued; neither is a malformed
/// reply.
pub(super) fn acquire_from_wire(r: v1::AcquireReply) -> Result<LockOutcome, ReplicaFailure> {
    use LockOutcome as L;
    Ok(match r.result {
        Some(v1::acquire_reply::Result::Granted(g)) => L::Granted {
            sequencer: reply_sequencer(g.sequencer)?,
            hold_count: g.hold_count,
        },
        Some(v1::acquire_reply::Result::Queued(q)) => L::Queued {
            name: q.name,
            request_id: q.request_id,
            position: q.position,
        },
        None => return Err(malformed("an acquire reply with no result")),
    })
}

/// A typed multi-lock acquire's outcome: granted or queued; neither is a
/// malformed reply.
pub(super) fn acquire_all_from_wire(r: v1::AcquireAllReply) -> Result<LockOutcome, ReplicaFailure> {
    use v1::acquire_all_reply::Result as R;
    Ok(match r.result {
        Some(R::Granted(all)) => LockOutcome::GrantedAll {
            sequencers: sequencers_from_wire(all)?,
        },
        Some(R::Queued(q)) => LockOutcome::Queued {
            name: q.name,
            request_id: q.request_id,
            position: q.position,
        },
        None => return Err(malformed("a multi-lock acquire reply with no result")),
    })
}

/// A typed multi-lock release's outcome.
pub(super) fn released_all_from_wire(r: v1::ReleaseAllReply) -> LockOutcome {
    LockOutcome::ReleasedAll {
        released: r.released,
        gone: r.gone,
    }
}

fn sequencers_to_wire(all: &[Sequencer]) -> v1::Sequencers {
    v1::Sequencers {
        sequencers: all.iter().map(sequencer_to_wire).collect(),
    }
}

fn sequencers_from_wire(all: v1::Sequencers) -> Result<Vec<Sequencer>, ReplicaFailure> {
    all.sequencers
        .into_iter()
        .map(|s| reply_sequencer(Some(s)))
        .collect()
}

/// A typed release's outcome.
pub(super) fn released_from_wire(r: v1::ReleaseReply) -> LockOutcome {
    LockOutcome::Released {
        name: r.name,
        token: Token(r.token),
        remaining: r.remaining,
    }
}

/// A typed cancel-wait's outcome; no result is a malformed reply.
pub(super) fn wait_cancel_from_wire(r: v1::CancelWaitReply) -> Result<LockOutcome, ReplicaFailure> {
    use v1::cancel_wait_reply::Result as R;
    Ok(LockOutcome::WaitCancel(match r.result {
        Some(R::Cancelled(_)) => WaitCancel::Cancelled,
        Some(R::AlreadyGranted(s)) => WaitCancel::AlreadyGranted(reply_sequencer(Some(s))?),
        Some(R::NotWaiting(_)) => WaitCancel::NotWaiting,
        Some(R::AlreadyGrantedAll(all)) => {
            WaitCancel::AlreadyGrantedAll(sequencers_from_wire(all)?)
        }
        None => return Err(malformed("a cancel-wait reply with no result")),
    }))
}

/// A typed sequencer check's outcome.
pub(super) fn sequencer_check_from_wire(r: v1::CheckSequencerReply) -> LockOutcome {
    LockOutcome::SequencerCheck { current: r.current }
}

/// A typed lock listing's outcome.
pub(super) fn locks_from_wire(r: v1::ListLocksReply) -> Result<LockOutcome, ReplicaFailure> {
    let locks = r
        .locks
        .into_iter()
        .map(lock_info_from_wire)
        .collect::<Result<_, _>>()?;
    Ok(LockOutcome::Locks {
        locks,
        more: r.more,
    })
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
        permits: l.permits,
    }
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
        permits: l.permits,
        name: l.name,
    })
}

fn reply_sequencer(s: Option<v1::Sequencer>) -> Result<Sequencer, ReplicaFailure> {
    let s = s.ok_or_else(|| malformed("a grant without a sequencer"))?;
    sequencer_from_wire(s).map_err(|e| malformed(&format!("a malformed sequencer ({e})")))
}
