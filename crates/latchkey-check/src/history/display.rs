//! How events and operations print: one line each, for witnesses.

use std::fmt;

use super::{
    ChurnOp, ChurnRole, DurabilityOp, ElectionOp, Event, EventKind, FenceTarget, LockOp, Op,
    RegisterOp, SemaphoreOp, SequenceOp, Value, WatchChange, WatchOp,
};

fn opt(v: &Option<Value>) -> &str {
    v.as_deref().unwrap_or("<absent>")
}

impl fmt::Display for Op {
    /// The call with its results, e.g. `cas "x" 1 -> 2 (swapped)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.render(f, true)
    }
}

impl Op {
    fn render(&self, f: &mut fmt::Formatter<'_>, results: bool) -> fmt::Result {
        if !results {
            return match self {
                Op::Register(RegisterOp::Read { key, .. }) => write!(f, "read {key:?}"),
                Op::Register(RegisterOp::Cas {
                    key, expected, new, ..
                }) => write!(f, "cas {key:?} {} -> {new}", opt(expected)),
                Op::Lock(LockOp::Acquire {
                    resource, holder, ..
                }) => write!(f, "acquire {resource:?} by {holder}"),
                Op::Lock(LockOp::FencedWrite {
                    resource,
                    target,
                    holder,
                    token,
                    ..
                }) => {
                    let op = Op::Lock(LockOp::FencedWrite {
                        resource: resource.clone(),
                        target: target.clone(),
                        holder: holder.clone(),
                        token: *token,
                        accepted: None,
                    });
                    op.render(f, true)
                }
                Op::Semaphore(SemaphoreOp::Acquire {
                    semaphore,
                    permits,
                    holder,
                    ..
                }) => write!(f, "acquire a permit of {semaphore:?}/{permits} by {holder}"),
                Op::Semaphore(SemaphoreOp::FencedWrite {
                    semaphore,
                    key,
                    holder,
                    token,
                    ..
                }) => write!(
                    f,
                    "write {key:?} fenced by a permit of {semaphore:?} by {holder} token {token}"
                ),
                Op::Sequence(SequenceOp::Alloc { key, step, .. }) => {
                    write!(f, "next_sequence {key:?} step {step}")
                }
                Op::Durability(DurabilityOp::ReadAll { .. }) => write!(f, "read-all"),
                Op::Watch(WatchOp::Write {
                    changes, session, ..
                }) => {
                    write!(f, "write")?;
                    changes_text(f, changes)?;
                    bound_text(f, *session)
                }
                Op::Watch(WatchOp::Gone { key, session, .. }) => {
                    write!(f, "read {key:?} after closing session {session}")
                }
                Op::Watch(WatchOp::List { .. }) => write!(f, "list"),
                Op::Watch(WatchOp::Leftover { prefix, .. }) => {
                    write!(f, "final read of {prefix:?}")
                }
                other => other.render(f, true),
            };
        }
        match self {
            Op::Register(RegisterOp::Read { key, value }) => {
                write!(f, "read {key:?} -> {}", opt(value))
            }
            Op::Register(RegisterOp::Write { key, value }) => write!(f, "write {key:?} = {value}"),
            Op::Register(RegisterOp::Cas {
                key,
                expected,
                new,
                succeeded,
            }) => {
                write!(f, "cas {key:?} {} -> {new}", opt(expected))?;
                match succeeded {
                    Some(true) => write!(f, " (swapped)"),
                    Some(false) => write!(f, " (mismatch)"),
                    None => Ok(()),
                }
            }
            Op::Lock(LockOp::Acquire {
                resource,
                holder,
                token,
            }) => {
                write!(f, "acquire {resource:?} by {holder}")?;
                match token {
                    Some(t) => write!(f, " -> token {t}"),
                    None => Ok(()),
                }
            }
            Op::Lock(LockOp::HoldStart {
                resource,
                holder,
                token,
            }) => write!(f, "hold-start {resource:?} by {holder} token {token}"),
            Op::Lock(LockOp::HoldEnd {
                resource,
                holder,
                token,
            }) => write!(f, "hold-end {resource:?} by {holder} token {token}"),
            Op::Lock(LockOp::FencedWrite {
                resource,
                target,
                holder,
                token,
                accepted,
            }) => {
                match target {
                    FenceTarget::Gate => write!(f, "gate write {resource:?}")?,
                    FenceTarget::Kv { key } => {
                        write!(f, "kv write {key:?} fenced by {resource:?}")?
                    }
                }
                write!(f, " by {holder} token {token}")?;
                match accepted {
                    Some(true) => write!(f, " (accepted)"),
                    Some(false) => write!(f, " (refused)"),
                    None => Ok(()),
                }
            }
            Op::Sequence(SequenceOp::Alloc { key, step, range }) => {
                write!(f, "next_sequence {key:?} step {step}")?;
                match range {
                    Some(r) => write!(f, " -> [{}, {})", r.start, r.end),
                    None => Ok(()),
                }
            }
            Op::Durability(DurabilityOp::Put { key, value }) => write!(f, "put {key:?} = {value}"),
            Op::Durability(DurabilityOp::ReadAll { values }) => match values {
                Some(v) => write!(f, "read-all -> {v:?}"),
                None => write!(f, "read-all"),
            },
            Op::Watch(op) => op.render(f),
            Op::Semaphore(SemaphoreOp::Acquire {
                semaphore,
                permits,
                holder,
                token,
            }) => {
                write!(f, "acquire a permit of {semaphore:?}/{permits} by {holder}")?;
                match token {
                    Some(t) => write!(f, " -> token {t}"),
                    None => Ok(()),
                }
            }
            Op::Semaphore(SemaphoreOp::FencedWrite {
                semaphore,
                key,
                holder,
                token,
                accepted,
            }) => {
                write!(
                    f,
                    "write {key:?} fenced by a permit of {semaphore:?} by {holder} token {token}"
                )?;
                match accepted {
                    Some(true) => write!(f, " (accepted)"),
                    Some(false) => write!(f, " (refused)"),
                    None => Ok(()),
                }
            }
            Op::Election(ElectionOp::Observed {
                election,
                term,
                skipped,
            }) => {
                match term {
                    Some(t) => write!(f, "observed {election:?} led by term {t}")?,
                    None => write!(f, "observed {election:?} without a leader")?,
                }
                if *skipped {
                    write!(f, " (after a gap)")?;
                }
                Ok(())
            }
            Op::Churn(op) => op.render(f),
        }
    }
}

impl ChurnOp {
    fn render(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChurnOp::Acquire {
                resource,
                holder,
                role,
                ttl_ms,
                token,
            } => {
                let role = match role {
                    ChurnRole::Holder => "holder",
                    ChurnRole::Waiter => "waiter",
                };
                write!(
                    f,
                    "acquire {resource:?} by {role} {holder} (session TTL {ttl_ms} ms)"
                )?;
                match token {
                    Some(t) => write!(f, " -> token {t}"),
                    None => Ok(()),
                }
            }
            ChurnOp::Vouched {
                resource,
                holder,
                until_ns,
            } => write!(
                f,
                "{holder} vouches for its lease of {resource:?} until t={until_ns}ns"
            ),
            ChurnOp::HolderKilled { resource, holder } => {
                write!(f, "kill -9 {holder}, holder of {resource:?}")
            }
            ChurnOp::LeaderKilled { node, term } => {
                write!(f, "kill -9 the leader n{node} (term {term})")
            }
            ChurnOp::LeaderReady { node, term } => {
                write!(f, "n{node} leads in term {term} and serves reads")
            }
            ChurnOp::Skipped { reason } => write!(f, "leader churn skipped: {reason}"),
        }
    }
}

/// ` "k" = v` per change; a delete shows as `<absent>`.
fn changes_text(f: &mut fmt::Formatter<'_>, changes: &[WatchChange]) -> fmt::Result {
    for WatchChange { key, value } in changes {
        write!(f, " {key:?} = {}", opt(value))?;
    }
    Ok(())
}

/// ` bound to session S`, if bound.
fn bound_text(f: &mut fmt::Formatter<'_>, session: Option<u64>) -> fmt::Result {
    match session {
        Some(s) => write!(f, " bound to session {s}"),
        None => Ok(()),
    }
}

impl WatchOp {
    fn render(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchOp::Write {
                changes,
                revision,
                session,
            } => {
                write!(f, "write")?;
                changes_text(f, changes)?;
                bound_text(f, *session)?;
                match revision {
                    Some(r) => write!(f, " at revision {r}"),
                    None => Ok(()),
                }
            }
            WatchOp::List { revision, values } => match (revision, values) {
                (Some(r), Some(v)) => write!(f, "list at revision {r} -> {v:?}"),
                _ => write!(f, "list"),
            },
            WatchOp::Gone {
                key,
                session,
                present,
            } => {
                write!(f, "read {key:?} after closing session {session}")?;
                match present {
                    Some(true) => write!(f, " -> present"),
                    Some(false) => write!(f, " -> absent"),
                    None => Ok(()),
                }
            }
            WatchOp::Leftover { prefix, keys } => {
                write!(f, "final read of {prefix:?}")?;
                match keys {
                    Some(keys) => write!(f, " -> {keys:?}"),
                    None => Ok(()),
                }
            }
            WatchOp::Open { from } => write!(f, "watch from revision {from}"),
            WatchOp::Changes { revision, changes } => {
                write!(f, "changes at revision {revision}:")?;
                changes_text(f, changes)
            }
            WatchOp::Progress { revision } => write!(f, "progress at revision {revision}"),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            EventKind::Invoke => "invoke",
            EventKind::Ok => "ok",
            EventKind::Fail => "fail",
            EventKind::Unknown => "unknown",
        };
        write!(
            f,
            "#{} t={}ns p{} {kind:<7} ",
            self.index, self.time_ns, self.process
        )?;
        self.op.render(f, self.kind == EventKind::Ok)
    }
}
