//! The lock parts that requests, replies and errors all carry (a lock's
//! mode, a sequencer, a holder), to their typed messages and back.

use latchkey_core::lock::{HolderInfo, LockMode, Sequencer, SessionId, Token};

use super::fault::{invalid, malformed};
use crate::v1;
use crate::ReplicaFailure;

/// A lock mode's typed form.
pub(super) fn mode_to_wire(mode: LockMode) -> v1::LockMode {
    match mode {
        LockMode::Exclusive => v1::LockMode::Exclusive,
        LockMode::Shared => v1::LockMode::Shared,
    }
}

/// A request's lock mode, read from its `field`: unspecified or unknown is
/// an invalid argument.
pub(super) fn mode_from_wire(mode: i32, field: &str) -> Result<LockMode, ReplicaFailure> {
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

/// A sequencer's typed form.
pub(super) fn sequencer_to_wire(s: &Sequencer) -> v1::Sequencer {
    v1::Sequencer {
        name: s.name.clone(),
        mode: mode_to_wire(s.mode) as i32,
        token: s.token.0,
        session: s.session.0,
    }
}

/// A typed sequencer; its mode must be a known one.
pub(super) fn sequencer_from_wire(s: v1::Sequencer) -> Result<Sequencer, ReplicaFailure> {
    Ok(Sequencer {
        mode: mode_from_wire(s.mode, "sequencer.mode")?,
        name: s.name,
        token: Token(s.token),
        session: SessionId(s.session),
    })
}

/// A holder's typed form.
pub(super) fn holder_to_wire(h: HolderInfo) -> v1::Holder {
    v1::Holder {
        session: h.session.0,
        owner: h.owner,
        mode: mode_to_wire(h.mode) as i32,
        token: h.token.0,
        hold_count: h.hold_count,
        lease_ms: h.lease_ms,
    }
}

/// A replica's typed holder; a malformed mode is a malformed reply.
pub(super) fn holder_from_wire(h: v1::Holder) -> Result<HolderInfo, ReplicaFailure> {
    Ok(HolderInfo {
        session: SessionId(h.session),
        owner: h.owner,
        mode: reply_mode(h.mode)?,
        token: Token(h.token),
        hold_count: h.hold_count,
        lease_ms: h.lease_ms,
    })
}

/// A lock mode in a reply: anything but a known mode is a malformed reply.
pub(super) fn reply_mode(mode: i32) -> Result<LockMode, ReplicaFailure> {
    mode_from_wire(mode, "mode").map_err(|e| malformed(&format!("a malformed lock mode ({e})")))
}
