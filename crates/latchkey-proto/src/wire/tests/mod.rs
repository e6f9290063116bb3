//! The wire's round trips, room by room: every client operation, result
//! and refusal goes to the wire and back unchanged, and what has no wire
//! form is refused. The fixtures here are shared by the rooms' tests.

use latchkey_core::lock::{HolderInfo, LockMode, Sequencer, SessionId, Token};

mod error;
mod reply;
mod request;

fn seq(name: &str, token: u64) -> Sequencer {
    Sequencer {
        name: name.into(),
        mode: LockMode::Exclusive,
        token: Token(token),
        session: SessionId(7),
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
