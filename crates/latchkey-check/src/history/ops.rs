//! Convenience constructors for ops, so recorders and tests read naturally.
use super::{
    ChurnOp, ChurnRole, DurabilityOp, ElectionOp, FenceTarget, LockOp, Op, RegisterOp, SemaphoreOp,
    SeqRange, SequenceOp, WatchChange, WatchOp,
};

/// A register read; `value` is the result (ignored on the invocation).
pub fn read(key: &str, value: Option<&str>) -> Op {
    Op::Register(RegisterOp::Read {
        key: key.into(),
        value: value.map(Into::into),
    })
}

/// A register write.
pub fn write(key: &str, value: &str) -> Op {
    Op::Register(RegisterOp::Write {
        key: key.into(),
        value: value.into(),
    })
}

/// A compare-and-put; `succeeded` is the result (`None` on invocation).
pub fn cas(key: &str, expected: Option<&str>, new: &str, succeeded: Option<bool>) -> Op {
    Op::Register(RegisterOp::Cas {
        key: key.into(),
        expected: expected.map(Into::into),
        new: new.into(),
        succeeded,
    })
}

/// An acquire; `token` is the grant (`None` on invocation).
pub fn acquire(resource: &str, holder: &str, token: Option<u64>) -> Op {
    Op::Lock(LockOp::Acquire {
        resource: resource.into(),
        holder: holder.into(),
        token,
    })
}

/// The start of a client-side hold window.
pub fn hold_start(resource: &str, holder: &str, token: u64) -> Op {
    Op::Lock(LockOp::HoldStart {
        resource: resource.into(),
        holder: holder.into(),
        token,
    })
}

/// The end of a client-side hold window.
pub fn hold_end(resource: &str, holder: &str, token: u64) -> Op {
    Op::Lock(LockOp::HoldEnd {
        resource: resource.into(),
        holder: holder.into(),
        token,
    })
}

/// An acquire of a permit of `semaphore` (of `permits`); `token` is the
/// grant (`None` on invocation).
pub fn permit(semaphore: &str, permits: u32, holder: &str, token: Option<u64>) -> Op {
    Op::Semaphore(SemaphoreOp::Acquire {
        semaphore: semaphore.into(),
        permits,
        holder: holder.into(),
        token,
    })
}

/// A KV write to `key` fenced by the permit of `semaphore` with `token`.
pub fn permit_write(
    semaphore: &str,
    key: &str,
    holder: &str,
    token: u64,
    accepted: Option<bool>,
) -> Op {
    Op::Semaphore(SemaphoreOp::FencedWrite {
        semaphore: semaphore.into(),
        key: key.into(),
        holder: holder.into(),
        token,
        accepted,
    })
}

/// What an observer of `election` was told: `term` leads (`None`: nobody);
/// `skipped`: changes before it may have been missed.
pub fn observed(election: &str, term: Option<u64>, skipped: bool) -> Op {
    Op::Election(ElectionOp::Observed {
        election: election.into(),
        term,
        skipped,
    })
}

/// A write through the fence gate of `resource`.
pub fn gate_write(resource: &str, holder: &str, token: u64, accepted: Option<bool>) -> Op {
    Op::Lock(LockOp::FencedWrite {
        resource: resource.into(),
        target: FenceTarget::Gate,
        holder: holder.into(),
        token,
        accepted,
    })
}

/// A fenced KV put of `key`, guarded by lock `resource`.
pub fn kv_write(resource: &str, key: &str, holder: &str, token: u64, accepted: Option<bool>) -> Op {
    Op::Lock(LockOp::FencedWrite {
        resource: resource.into(),
        target: FenceTarget::Kv { key: key.into() },
        holder: holder.into(),
        token,
        accepted,
    })
}

/// `next_sequence(key, step)`; `range` is the result.
pub fn alloc(key: &str, step: u64, range: Option<(u64, u64)>) -> Op {
    Op::Sequence(SequenceOp::Alloc {
        key: key.into(),
        step,
        range: range.map(|(start, end)| SeqRange { start, end }),
    })
}

/// A durability put.
pub fn put(key: &str, value: &str) -> Op {
    Op::Durability(DurabilityOp::Put {
        key: key.into(),
        value: value.into(),
    })
}

/// The final read-all; `values` is the result (`None` on invocation).
pub fn read_all(values: Option<&[(&str, &str)]>) -> Op {
    Op::Durability(DurabilityOp::ReadAll {
        values: values.map(|vs| {
            vs.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }),
    })
}

/// A write of watched keys in one command: `(key, Some(value))` puts,
/// `(key, None)` deletes; `revision` is the result (`None` on invocation).
pub fn watch_write(changes: &[(&str, Option<&str>)], revision: Option<u64>) -> Op {
    Op::Watch(WatchOp::Write {
        changes: watch_change_list(changes),
        revision,
        session: None,
    })
}

/// A put of `key` = `value` bound to `session`; `revision` is the result.
pub fn watch_bound_put(key: &str, value: &str, session: u64, revision: Option<u64>) -> Op {
    Op::Watch(WatchOp::Write {
        changes: watch_change_list(&[(key, Some(value))]),
        revision,
        session: Some(session),
    })
}

/// A read of `key` after closing `session`; `present` is the result.
pub fn watch_gone(key: &str, session: u64, present: Option<bool>) -> Op {
    Op::Watch(WatchOp::Gone {
        key: key.into(),
        session,
        present,
    })
}

/// The run's last read of the bound keys' `prefix`, once every session
/// can only have ended; `keys` is the result (`None` on invocation).
pub fn watch_leftover(prefix: &str, keys: Option<&[&str]>) -> Op {
    Op::Watch(WatchOp::Leftover {
        prefix: prefix.into(),
        keys: keys.map(|ks| ks.iter().map(|k| (*k).to_owned()).collect()),
    })
}

/// A watcher's list of the prefix; `read` is the result: the revision and
/// the keys with their values (`None` on invocation).
pub fn watch_list(read: Option<(u64, &[(&str, &str)])>) -> Op {
    Op::Watch(WatchOp::List {
        revision: read.map(|(r, _)| r),
        values: read.map(|(_, vs)| {
            vs.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }),
    })
}

/// A watcher opens a watch from revision `from` (an instant).
pub fn watch_open(from: u64) -> Op {
    Op::Watch(WatchOp::Open { from })
}

/// A watch message of changes at `revision` (an instant); a `None` value
/// is a delete.
pub fn watch_changes(revision: u64, changes: &[(&str, Option<&str>)]) -> Op {
    Op::Watch(WatchOp::Changes {
        revision,
        changes: watch_change_list(changes),
    })
}

fn watch_change_list(changes: &[(&str, Option<&str>)]) -> Vec<WatchChange> {
    changes
        .iter()
        .map(|(k, v)| WatchChange {
            key: (*k).to_owned(),
            value: v.map(str::to_owned),
        })
        .collect()
}

/// A watch's progress notice at `revision` (an instant).
pub fn watch_progress(revision: u64) -> Op {
    Op::Watch(WatchOp::Progress { revision })
}

/// An acquire of the leader-churn phase's lock `resource` by `role`, in a
/// session of `ttl_ms`; `token` is the grant (`None` on invocation).
pub fn churn_acquire(
    resource: &str,
    holder: &str,
    role: ChurnRole,
    ttl_ms: u64,
    token: Option<u64>,
) -> Op {
    Op::Churn(ChurnOp::Acquire {
        resource: resource.into(),
        holder: holder.into(),
        role,
        ttl_ms,
        token,
    })
}

/// The churn holder's client vouches for its lease until `until_ns` (an
/// instant).
pub fn churn_vouched(resource: &str, holder: &str, until_ns: u64) -> Op {
    Op::Churn(ChurnOp::Vouched {
        resource: resource.into(),
        holder: holder.into(),
        until_ns,
    })
}

/// The churn holder was SIGKILLed (an instant).
pub fn churn_holder_killed(resource: &str, holder: &str) -> Op {
    Op::Churn(ChurnOp::HolderKilled {
        resource: resource.into(),
        holder: holder.into(),
    })
}

/// The leader, replica `node` in `term`, was SIGKILLed (an instant).
pub fn churn_leader_killed(node: u64, term: u64) -> Op {
    Op::Churn(ChurnOp::LeaderKilled { node, term })
}

/// Replica `node` leads in `term` and serves reads (an instant).
pub fn churn_leader_ready(node: u64, term: u64) -> Op {
    Op::Churn(ChurnOp::LeaderReady { node, term })
}

/// The leader-churn phase could not be carried out (an instant).
pub fn churn_skipped(reason: &str) -> Op {
    Op::Churn(ChurnOp::Skipped {
        reason: reason.into(),
    })
}
