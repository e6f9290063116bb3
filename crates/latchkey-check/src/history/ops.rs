//! Convenience constructors for ops, so recorders and tests read naturally.
use super::{DurabilityOp, FenceTarget, LockOp, Op, RegisterOp, SeqRange, SequenceOp};

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
